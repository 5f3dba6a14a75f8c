"""Running one stored job with the engine, inside a worker process."""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

from znni.engine.agglomerate.job import AgglomerateJob, AgglomerateReport
from znni.engine.agglomerate.run import agglomerate
from znni.engine.job import ProgressEvent, SegmentCancelled, SegmentJob
from znni.engine.location import Location
from znni.engine.segment import check_and_plan, segment
from znni.jobs import agglomeration, stages
from znni.jobs.agglomeration import Site
from znni.jobs.catalogue import Model, ModelOptions, NetworkCatalogue
from znni.jobs.current import Current
from znni.jobs.events import log_event
from znni.jobs.paths import relative_to_root
from znni.jobs.settings import Settings
from znni.jobs.store import JobRecord, JobStore
from znni.jobs.submission import locate_mask, segment_job
from znni.planner.plan import Plan

log = logging.getLogger("znni.server")

MAX_ATTEMPTS = 5  # a job that killed its worker this often is failed, not retried forever
# what a finished run leaves: (report, summary for JobStore.complete, stages or None)
Outcome = tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]] | None]


class JobRunner:
    def __init__(self, settings: Settings, slot: int, current: Current) -> None:
        self.settings = settings
        self.slot = slot
        self.current = current
        self.store = JobStore(settings.db)
        self.catalogue = NetworkCatalogue(settings.models)

    def run_next(self) -> bool:
        """Claim and run one job; False when the queue is empty."""
        record = self.store.claim(self.slot)
        if record is None:
            return False
        with self.current.lock:
            if not self.current.shutdown:
                self.current.cancel.clear()
            self.current.job_id = record.id
        try:
            self._run(record)
        finally:
            with self.current.lock:
                self.current.job_id = None
        return True

    def _run(self, record: JobRecord) -> None:
        resumed = record.attempts > 1
        log_event("job.resumed" if resumed else "job.started", record.id, attempt=record.attempts)
        if record.cancel_requested:  # cancelled while its worker was down
            self.store.finish(record.id, "cancelled")
            log_event("job.cancelled", record.id)
            return
        try:
            if record.attempts > MAX_ATTEMPTS:
                raise ValueError(f"the job was interrupted {MAX_ATTEMPTS} times; giving up")
            if record.kind == agglomeration.KIND:
                work = self._agglomeration(record, resumed)
            else:
                work = self._segmentation(record, resumed)
        except (ValueError, TypeError, FileNotFoundError) as e:
            self._fail(record, e)
            return
        try:
            report, summary, done_stages = work()
        except SegmentCancelled:
            if self.current.shutdown:
                self.store.finish(record.id, "queued")
                log_event("job.requeued", record.id, reason="server shutdown")
            else:
                self.store.finish(record.id, "cancelled")
                log_event("job.cancelled", record.id)
        except Exception as e:  # noqa: BLE001 - any failure of a job is reported on the job
            log.exception("job %d failed", record.id)
            self._fail(record, e)
        else:
            self.store.complete(record.id, report, summary=summary, stages=done_stages)
            log_event(
                "job.succeeded",
                record.id,
                blocks_computed=summary["blocks_computed"],
                blocks_total=summary["blocks_total"],
                elapsed_s=round(summary["elapsed_s"], 3),
                voxels_per_second=round(summary["voxels_per_second"], 1),
            )

    def _segmentation(self, record: JobRecord, resumed: bool) -> Callable[[], Outcome]:
        """The segment job's run, and its agglomeration stage after it where it has one."""
        network = self._network(record)
        job = self._job(record, network, resumed)
        plan = self._plan(record, job)
        section = record.parameters.get("agglomerate")
        stage = None if section is None else agglomeration.engine_job(
            self._site(), job.output_path, agglomeration.stage_params(record.parameters))
        name = None if stage is None else stages.NETWORK  # a plain job's progress: its row

        def work() -> Outcome:
            report = segment(
                job,
                quiet=True,
                progress=self._progress_callback(record, name),
                cancel=self.current.cancel,
                plan=plan,
                on_plan=None if plan is not None else self._store_summary(record),
            )
            values = dataclasses.asdict(report)
            if stage is None:
                return values, values, None
            done = self._agglomerate(record, stage, resumed)
            summary, done_stages = agglomeration.finished(done, report)
            values["agglomerate"] = agglomeration.report_values(done, self.settings.data_root)
            return values, summary, done_stages

        return work

    def _agglomeration(self, record: JobRecord, resumed: bool) -> Callable[[], Outcome]:
        """An agglomeration job's run on existing affinities."""
        affinities = Location.parse(record.input_path, "affinities")  # stored confined
        job = agglomeration.engine_job(self._site(), affinities, record.parameters)

        def work() -> Outcome:
            report = self._agglomerate(record, job, resumed)
            summary, done_stages = agglomeration.finished(report)
            values = agglomeration.report_values(report, self.settings.data_root)
            return values, summary, done_stages

        return work

    def _agglomerate(self, record: JobRecord, job: AgglomerateJob, resumed: bool
                     ) -> AgglomerateReport:
        """The engine's agglomeration with this job's progress and cancel flag."""
        run = agglomeration.resume_job(job) if resumed else job
        return agglomerate(dataclasses.replace(run, progress=self._stages_callback(record),
                                               cancel=self.current.cancel))

    def _site(self) -> Site:
        return Site(self.settings.data_root, self.settings.allow_url, self.settings.scheduler)

    def _fail(self, record: JobRecord, error: BaseException) -> None:
        text = relative_to_root(self.settings.data_root, f"{error}") or type(error).__name__
        self.store.finish(record.id, "failed", error=text)
        log_event("job.failed", record.id, error=text, level=logging.WARNING)

    def _network(self, record: JobRecord) -> Model:
        network = self.catalogue.get(record.network, ModelOptions.from_params(record.parameters))
        if network.digest != record.network_digest:
            raise ValueError(
                f"network {record.network!r} changed on disk since the job was submitted "
                "(spec, weights or ONNX file differ); submit the job again"
            )
        return network

    def _job(self, record: JobRecord, network: Model, resumed: bool) -> SegmentJob:
        """The submitted job; a resumed overwrite job continues its own ledger if it can."""
        job = segment_job(
            network,
            Location.parse(record.input_path, "input"),  # stored as confined text
            Location.parse(record.output_path, "output"),
            record.parameters,
            scheduler=self.settings.scheduler,
            mask_path=locate_mask(self.settings.data_root, self.settings.allow_url,
                                  record.parameters),
        )
        if resumed and job.overwrite:
            keep = dataclasses.replace(job, overwrite=False)
            try:
                check_and_plan(keep)  # passes when the output holds this job's own partial run
            except ValueError:
                return job
            return keep
        return job

    def _plan(self, record: JobRecord, job: SegmentJob) -> Plan | None:
        """The job's plan: the stored one on resume, else the planner's for this job.

        None for a graph model: it has no planner's plan (the engine chooses its window or
        tile, or reads the one its output's ledger recorded; its run summary is stored as
        the job's plan once made, `_store_summary`, and is not a Plan).
        """
        if record.plan is not None and "algorithm" in record.plan:  # a planner.Plan
            return Plan.from_dict(record.plan)
        plan = check_and_plan(job)
        if plan is not None:
            self.store.set_plan(record.id, plan.to_dict())
        return plan

    def _store_summary(self, record: JobRecord) -> Any:
        """A graph model's run summary (window, its whole-run prediction), stored as the
        job's plan when the run has made it: the ETA starts from its prediction."""
        def store(summary: dict[str, Any]) -> None:
            try:
                self.store.set_plan(record.id, summary)
            except sqlite3.Error as e:  # a busy database must not fail the computation
                log.warning("job %d: plan not recorded (%s)", record.id, e)

        return store

    def _progress_callback(self, record: JobRecord, stage: str | None = None) -> Any:
        def progress(event: ProgressEvent) -> None:
            self._on_progress(record, event, stage)

        return progress

    def _stages_callback(self, record: JobRecord) -> Any:
        def progress(stage: str, event: ProgressEvent) -> None:
            self._on_progress(record, event, stage)

        return progress

    def _on_progress(self, record: JobRecord, event: ProgressEvent, stage: str | None) -> None:
        try:
            flagged = self._record(record, event, stage)
        except sqlite3.Error as e:  # a busy database must not fail the computation
            log.warning("job %d: progress not recorded (%s)", record.id, e)
            return
        if flagged:
            self.current.cancel.set()  # the engine stops before its next block

    def _record(self, record: JobRecord, event: ProgressEvent, stage: str | None) -> bool:
        return self.store.record_progress(
            record.id,
            record.attempts,
            blocks_done=event.blocks_done,
            blocks_total=event.blocks_total,
            voxels_done=event.voxels_done,
            voxels_total=event.voxels_total,
            elapsed_s=event.elapsed_s,
            voxels_per_second=event.voxels_per_second,
            stage=stage,
        )

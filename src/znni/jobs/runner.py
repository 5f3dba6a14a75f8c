"""Running one stored job with the engine, inside a worker process."""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
from typing import Any

from znni.engine.job import ProgressEvent, SegmentCancelled, SegmentJob
from znni.engine.location import Location
from znni.engine.segment import check_and_plan, segment
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
            network = self._network(record)
            job = self._job(record, network, resumed)
            plan = self._plan(record, job)
        except (ValueError, TypeError, FileNotFoundError) as e:
            self._fail(record, e)
            return
        try:
            report = segment(
                job,
                quiet=True,
                progress=self._progress_callback(record),
                cancel=self.current.cancel,
                plan=plan,
                on_plan=None if plan is not None else self._store_summary(record),
            )
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
            values = dataclasses.asdict(report)
            self.store.complete(record.id, values)
            log_event(
                "job.succeeded",
                record.id,
                blocks_computed=report.blocks_computed,
                blocks_total=report.blocks_total,
                elapsed_s=round(report.elapsed_s, 3),
                voxels_per_second=round(report.voxels_per_second, 1),
            )

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

    def _progress_callback(self, record: JobRecord) -> Any:
        def progress(event: ProgressEvent) -> None:
            try:
                flagged = self._record(record, event)
            except sqlite3.Error as e:  # a busy database must not fail the computation
                log.warning("job %d: progress not recorded (%s)", record.id, e)
                return
            if flagged:
                self.current.cancel.set()  # the engine stops before its next block

        return progress

    def _record(self, record: JobRecord, event: ProgressEvent) -> bool:
        return self.store.record_progress(
            record.id,
            record.attempts,
            blocks_done=event.blocks_done,
            blocks_total=event.blocks_total,
            voxels_done=event.voxels_done,
            voxels_total=event.voxels_total,
            elapsed_s=event.elapsed_s,
            voxels_per_second=event.voxels_per_second,
        )

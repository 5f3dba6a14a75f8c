"""A segmentation job on a batch cluster (`--scheduler slurm:N`, pbs, lsf, sge): its workers
sized from the run, and everything they need sent as values, before anything is written.

- Memory: the run's budget is each worker's memory: `--memory-limit`, else the user's
  `jobqueue.KIND.memory`, which then becomes the run's memory limit, so the plan is made
  for the worker that will run it (not for this host's free memory). Neither is a
  refusal naming both.
- Cores: `jobqueue.KIND.cores` (the node share the user asks for), else the cores the plan
  assumes (this machine's, `compute/execution.planning_machine`).
- `for_workers`: what a Dask worker on another host receives: local paths absolute (a batch
  job may start in another directory) and, on a batch or tcp:// cluster, an ONNX model's
  files as bytes (`OnnxModel.carried`), and with them int8's quantized IR (`carried_ir`:
  its cache folder is this host's); a sequential network's weights are arrays already.
  Input, output and mask stay locations: every node must reach the same volumes (a shared
  file system or an object store, whose options travel in the job's `StoreContext`).
"""

from __future__ import annotations

from dataclasses import replace

from znni.engine.compute.execution import planning_machine
from znni.engine.job import SegmentJob
from znni.engine.location import Location
from znni.engine.output.form import OutputForm
from znni.engine.scheduler import LOCAL
from znni.engine.sweep.batch import size_workers
from znni.model.carried import CarriedFiles, openvino_ir_files
from znni.model.onnx_model import OnnxModel


def sized_for_cluster(job: SegmentJob) -> SegmentJob:
    """`job` with its batch workers sized and its memory limit the workers' (module
    docstring); ValueError of one sentence when they cannot be; other jobs as they are."""
    scheduler = job.scheduler
    if scheduler is None or not scheduler.is_batch:
        return job
    sized = size_workers(scheduler, job.memory_limit_bytes, planning_machine().cores)
    return replace(job, memory_limit_bytes=sized.worker_memory_bytes, scheduler=sized)


def for_workers(job: SegmentJob, form: OutputForm | None
                ) -> tuple[SegmentJob, OutputForm | None]:
    """`job` and its output form (the mask's location) as Dask workers elsewhere receive
    them (module docstring). A LocalCluster's workers, on this host, read the model's own
    files."""
    elsewhere = job.scheduler is not None and job.scheduler.kind != LOCAL
    network = job.network
    if elsewhere and isinstance(network, OnnxModel):
        network = network.carried()
    mask_path = None if job.mask_path is None else _absolute(job.mask_path)
    job = replace(job, network=network, input_path=_absolute(job.input_path),
                  output_path=_absolute(job.output_path), mask_path=mask_path)
    if form is not None and form.mask is not None:
        form = replace(form, mask=replace(form.mask, path=_absolute(form.mask.path)))
    return job, form


def carried_ir(net: OnnxModel, compiled_path: str) -> CarriedFiles | None:
    """The IR a compiled worker runs (`compiled_path`, int8's) as bytes where the model
    travels as bytes (`for_workers`), else None: the workers read it where it is."""
    if not net.files or not compiled_path:
        return None
    return CarriedFiles(openvino_ir_files(compiled_path))


def _absolute(location: Location) -> Location:
    return location.resolved() if location.is_local else location

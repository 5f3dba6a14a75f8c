"""What the sweep runs: a `Stage` (a picklable description of block work) and the
`BlockWork` each process makes from it (read, compute and write one block).

The sweep (`run.sweep`) knows nothing else about the work: inference (the network specs of
`engine/workers/`), pyramids, agglomeration or evaluation are stages alike. A stage is
sent once to every Dask worker process, which makes its own `BlockWork` from it
(`make_worker`) and keeps it for the job's blocks; a local sweep may be handed one made
already (inference makes it with its backend and starts reading before the output exists).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from znni.engine.geometry import Block

# The sweep's call after a block's write returned: (block, the values written, or None
# when they stayed on a Dask worker). The ledger record happens in it (or after it).
OnDone = Callable[[Block, np.ndarray | None], None]


class Stage(Protocol):
    """A picklable description of block work: what to read, how to compute a block, where
    to write it. Nothing opened: each process opens what it needs in `make_worker`."""

    def make_worker(self) -> BlockWork:
        """This process's worker for the stage's blocks (a Dask worker calls it once per
        job and keeps the worker)."""
        ...


class BlockWork(Protocol):
    """One process's means to compute any block of a stage.

    `read` runs on the reader thread (ahead of the compute), `write` on the writer thread;
    a block counts as done only after its `write` returned. Optional: a `skipped` set of
    the keys of blocks written without compute (they count as done, not towards the rate);
    `threads` > 1: that many blocks compute at once in a local sweep (a thread-safe compute
    that releases the GIL: `local.run_threaded`).
    """

    @property
    def spec(self) -> Stage:
        """The stage this worker was made from (a Dask worker's cache checks it)."""
        ...

    def read(self, block: Block) -> Any:
        """The block's input, whatever `compute` takes (the reader thread calls it)."""
        ...

    def compute(self, block: Block, raw: Any) -> Any:
        """The block's output values, as `write` stores them (an array for a stage that
        lands in a pyramid; anything a stage's own `write` takes otherwise)."""
        ...

    def write(self, block: Block, values: Any) -> None:
        """Store the block's values; durable (as the store makes it) when it returns."""
        ...


class Landing(Protocol):
    """Where finished blocks land beyond the write (`engine/output/target.OutputTarget`:
    an OME pyramid's levels updated from each block before it is recorded)."""

    def track(self, blocks: Sequence[Block], done: frozenset[str],
              record: Callable[[Block], None]) -> OnDone:
        """The sweep's on_done: `record(block)` once the block has landed everywhere."""
        ...

    def close(self) -> None:
        """Finish what every landed block allows (the sweep's `finally`)."""
        ...

    def check(self) -> None:
        """Raise a failure that happened while landing, if any (after a whole sweep)."""
        ...

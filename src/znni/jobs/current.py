"""The job a worker process runs now, shared by its runner and its watchdog thread.

Its own module so that `worker` (imported by the API process) and `runner`
(which imports the engine, only inside worker processes) both use it without
importing each other.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class Current:
    """The running job's id, its cancel flag, and whether the worker is shutting down."""

    job_id: int | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    shutdown: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

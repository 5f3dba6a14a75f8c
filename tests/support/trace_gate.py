"""A run held mid-way, without a volume big or a network slow enough to still be running:
its ZNNI_ENGINE_TRACE (every computed block's key, written with one open() per block) is a
FIFO. While the gate's reader is open, blocks go through and their keys are read here;
`hold()` puts a new FIFO, with no reader, in the old one's place, so the run's next open()
waits for good (at most a block that had already opened the old one still goes through).
The old reader stays open until `close()`, after the run is gone: a write into it never
meets a closed pipe. A held run is then killed, or asked for its lock, as a test needs, or
let go on (`release()`: a reader on the new FIFO too)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


class TraceGate:
    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self.fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.released: list[int] = []  # readers of the FIFOs put in by hold()
        self.text = b""

    def env(self) -> dict[str, str]:
        """The variable that sends a run's trace through the gate."""
        return {"ZNNI_ENGINE_TRACE": str(self.path)}

    def keys(self) -> list[str]:
        """The keys of the blocks through the gate so far."""
        self._drain()
        return [line.split()[1] for line in self.text.decode().splitlines()]

    def wait_for(self, run: subprocess.Popen, n: int, timeout_s: float = 120.0) -> None:
        """Until `n` blocks went through (or `run` ended, or the timeout passed)."""
        deadline = time.monotonic() + timeout_s
        while len(self.keys()) < n and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)

    def hold(self) -> None:
        """From now on the run's next trace waits (module docstring)."""
        tmp = self.path.with_name(self.path.name + ".held")
        os.mkfifo(tmp)
        os.replace(tmp, self.path)

    def release(self) -> None:
        """A held run goes on: its next open() meets a reader again (kept until close())."""
        self.released.append(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK))

    def close(self) -> None:
        for fd in ([self.fd] if self.fd is not None else []) + self.released:
            os.close(fd)
        self.fd, self.released = None, []

    def _drain(self) -> None:
        for fd in ([self.fd] if self.fd is not None else []) + self.released:
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not chunk:  # no writer at the moment
                    break
                self.text += chunk

"""Counting a kernel's temporaries against the workspace its memory model promised.

The backend sizes sub-batches from each kernel's `*_workspace_bytes` model and
reserves that much on the device. Kernels register every sizeable array they
create here, so a model that underestimates fails loudly in CI (on the
stand-in) instead of overflowing a real GPU later.
"""

from __future__ import annotations

from typing import Any


class WorkspaceOverflow(RuntimeError):
    """A kernel used more workspace than its memory model said (a bug in the model)."""


class Workspace:
    """Running total and peak of a kernel's temporaries, refused past `limit_bytes`."""

    def __init__(self, limit_bytes: int, what: str) -> None:
        self.limit_bytes = int(limit_bytes)
        self.what = what
        self.in_use_bytes = 0
        self.peak_bytes = 0

    def take(self, arr: Any) -> Any:
        """Count `arr` (just created by the kernel) and return it."""
        self.in_use_bytes += int(arr.nbytes)
        self.peak_bytes = max(self.peak_bytes, self.in_use_bytes)
        if self.in_use_bytes > self.limit_bytes:
            raise WorkspaceOverflow(
                f"{self.what} used {self.in_use_bytes} bytes of workspace but its model "
                f"reserved {self.limit_bytes}"
            )
        return arr

    def give(self, *arrays: Any) -> None:
        """Stop counting arrays the kernel no longer references."""
        for arr in arrays:
            self.in_use_bytes -= int(arr.nbytes)

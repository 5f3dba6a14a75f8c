"""The durable record of finished blocks, kept inside the output array directory.

A JSON-lines file (in the level-0 array of an OME-Zarr output): the first line
is the header (job fingerprint, its parts, the block shape), then one line per
finished block, appended and fsync'ed after the block's output is written. A torn last line (a kill
mid-append) is ignored, so the block is simply recomputed. A new header is
written to a temporary file and atomically renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from znni.engine.ome import is_group, ome_level

LEDGER_NAME = "znni-ledger.jsonl"
LEDGER_VERSION = 1


def fingerprint_parts(
    network_digest: str, input_path: str, input_shape: tuple[int, ...], input_dtype: str,
    region: str, border: str, dtype: str,
) -> dict[str, Any]:
    """What determines the output values; a resume must agree on all of it."""
    return {
        "network": network_digest,
        "input": str(Path(input_path).resolve()),
        "input_shape": list(input_shape),
        "input_dtype": input_dtype,
        "roi": region,
        "border": border,
        "dtype": dtype,
    }


def fingerprint(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def ledger_path(output_path: str) -> Path:
    """Inside the output array; for an OME-Zarr output, inside its level-0 array, where
    listings of the image group (which warn about unknown files) do not see it."""
    p = Path(output_path)
    if is_group(p):
        try:
            return Path(ome_level(output_path, 0).array_path) / LEDGER_NAME
        except ValueError:
            pass
    return p / LEDGER_NAME


def read_ledger(output_path: str) -> tuple[dict[str, Any] | None, set[str]]:
    """(header or None, keys of finished blocks) of an output; tolerates a torn last line."""
    path = ledger_path(output_path)
    if not path.is_file():
        return None, set()
    header: dict[str, Any] | None = None
    done: set[str] = set()
    with open(path) as f:
        for line in f:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(entry, dict):
                continue
            if header is None and "fingerprint" in entry:
                header = entry
            elif "block" in entry:
                done.add(str(entry["block"]))
    return header, done


def mismatch_sentence(output_path: str, header: dict[str, Any], parts: dict[str, Any]) -> str:
    """Why an existing ledger belongs to another job, as one sentence."""
    old = header.get("parts", {})
    names = {"network": "network or weights"}
    differing = [names.get(k, k) for k in sorted(parts) if old.get(k) != parts[k]] or ["job"]
    return (
        f"output {output_path} holds a run of a different job "
        f"({', '.join(differing)} {'differs' if len(differing) == 1 else 'differ'}); "
        "use --overwrite to recompute it, or choose another output path"
    )


class Ledger:
    """Appends finished block keys durably; one writer (the process that runs segment)."""

    def __init__(self, output_path: str) -> None:
        self.path = ledger_path(output_path)

    def start(self, parts: dict[str, Any], block_shape: tuple[int, int, int]) -> None:
        """Write a fresh header (atomically), forgetting any earlier blocks."""
        header = {
            "version": LEDGER_VERSION,
            "fingerprint": fingerprint(parts),
            "parts": parts,
            "block_shape": list(block_shape),
            "created": time.time(),
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(header) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)

    def resume(self) -> None:
        """Terminate a torn last line so later appends start on a line of their own."""
        with open(self.path, "rb+") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())

    def record(self, keys: list[str]) -> None:
        """Append finished blocks; durable when this returns."""
        if not keys:
            return
        now = time.time()
        text = "".join(json.dumps({"block": k, "t": now}) + "\n" for k in keys)
        with open(self.path, "a") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""The durable record of finished blocks, kept inside the output array (for an OME-Zarr
output, inside its level-0 array). `open_ledger(output)` gives one of two kinds behind one
interface (`read`, `start`, `resume`, `record`):

- `Ledger`, for local outputs: a JSON-lines file. The first line is the header (job
  fingerprint, its parts, the block shape), then one line per finished block, appended and
  fsync'ed after the block's output is written. A torn last line (a kill mid-append) is
  ignored, so the block is simply recomputed. A new header is written to a temporary file
  and atomically renamed into place.
- `ObjectLedger`, for s3:// and gs:// outputs, whose objects can be neither appended to nor
  renamed: `znni-ledger/header.json` (the header plus a random run id) and one small object
  `znni-ledger/<run>/<block>` per finished block, put after the block's chunks. Each put is
  atomic, so a kill leaves every block recorded or not, never half; recording a block twice
  writes the same object. A new header (a new run id) makes earlier block objects stale;
  they are deleted after it lands.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

from znni.engine.context import StoreContext
from znni.engine.io.faults import write_fault
from znni.engine.io.ome import is_group, ome_level
from znni.engine.io.stores import list_names, read_bytes, remove_tree, write_bytes
from znni.engine.location import Location

LEDGER_NAME = "znni-ledger.jsonl"
OBJECT_LEDGER = "znni-ledger"  # the prefix of an object-store ledger
HEADER_OBJECT = "header.json"
LEDGER_VERSION = 1


def fingerprint_parts(
    network_digest: str, input_path: Location, input_shape: tuple[int, ...], input_dtype: str,
    region: str, border: str, dtype: str, *, labels: str | None = None,
    mask: Location | None = None, skip_empty: float | None = None,
) -> dict[str, Any]:
    """What determines the output values; a resume must agree on all of it. Labels, the
    mask and --skip-empty enter only when set, so earlier outputs' ledgers still match."""
    parts: dict[str, Any] = {
        "network": network_digest,
        "input": str(input_path.resolved()),
        "input_shape": list(input_shape),
        "input_dtype": input_dtype,
        "roi": region,
        "border": border,
        "dtype": dtype,
    }
    extra = {"labels": labels, "mask": None if mask is None else str(mask.resolved()),
             "skip_empty": skip_empty}
    return {**parts, **{k: v for k, v in extra.items() if v is not None}}


def fingerprint(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def ledger_home(output_path: Location, *, ctx: StoreContext) -> Location:
    """The array that holds the ledger: the output, or an OME-Zarr output's level 0, where
    listings of the image group (which warn about unknown files) do not see it. A
    precomputed:// output's is its folder or prefix, beside its `info`."""
    output_path = output_path.bare()
    if is_group(output_path, ctx=ctx):
        try:
            return ome_level(output_path, 0, ctx=ctx).array_location
        except ValueError:
            pass
    return output_path


def ledger_path(output_path: Location, *, ctx: StoreContext) -> Path:
    """The JSON-lines file of a local output's ledger."""
    return Path(ledger_home(output_path, ctx=ctx).url) / LEDGER_NAME


class BlockLedger(Protocol):
    """What `segment` needs of a ledger, whatever holds it."""

    def read(self) -> tuple[dict[str, Any] | None, set[str]]: ...
    def start(self, parts: dict[str, Any], block_shape: tuple[int, int, int]) -> None: ...
    def resume(self) -> None: ...
    def record(self, keys: list[str]) -> None: ...
    def note_bad_chunks(self, keys: list[str]) -> None: ...
    def bad_chunks(self) -> list[str]: ...


def open_ledger(output_path: Location, *, ctx: StoreContext) -> BlockLedger:
    """The ledger of an output: a JSON-lines file locally, objects in an object store."""
    if output_path.is_remote:
        return ObjectLedger(output_path, ctx=ctx)
    return Ledger(output_path, ctx=ctx)


def read_ledger(output_path: Location, *,
                ctx: StoreContext) -> tuple[dict[str, Any] | None, set[str]]:
    """(header or None, keys of finished blocks) of an output; tolerates a torn last line."""
    return open_ledger(output_path, ctx=ctx).read()


def _header(parts: dict[str, Any], block_shape: tuple[int, int, int]) -> dict[str, Any]:
    return {
        "version": LEDGER_VERSION,
        "fingerprint": fingerprint(parts),
        "parts": parts,
        "block_shape": list(block_shape),
        "created": time.time(),
    }


def mismatch_sentence(output_path: Location, header: dict[str, Any], parts: dict[str, Any]) -> str:
    """Why an existing ledger belongs to another job, as one sentence."""
    old = header.get("parts", {})
    names = {"network": "network or weights"}
    differing = [names.get(k, k) for k in sorted(set(parts) | set(old))
                 if old.get(k) != parts.get(k)] or ["job"]
    return (
        f"output {output_path} holds a run of a different job "
        f"({', '.join(differing)} {'differs' if len(differing) == 1 else 'differ'}); "
        "use --overwrite to recompute it, or choose another output path"
    )


class Ledger:
    """Appends finished block keys durably; one writer (the process that runs segment)."""

    def __init__(self, output_path: Location, *, ctx: StoreContext) -> None:
        self.path = ledger_path(output_path, ctx=ctx)

    def read(self) -> tuple[dict[str, Any] | None, set[str]]:
        if not self.path.is_file():
            return None, set()
        header: dict[str, Any] | None = None
        done: set[str] = set()
        with open(self.path) as f:
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

    def start(self, parts: dict[str, Any], block_shape: tuple[int, int, int]) -> None:
        """Write a fresh header (atomically), forgetting any earlier blocks."""
        header = _header(parts, block_shape)
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
        self._append("".join(json.dumps({"block": k, "t": now}) + "\n" for k in keys),
                     keys[0])

    def note_bad_chunks(self, keys: list[str]) -> None:
        """Append input chunks filled with the fill value (a resumed run does not read again
        the chunks of blocks already done: the list is kept here)."""
        if keys:
            self._append("".join(json.dumps({"bad_chunk": k}) + "\n" for k in keys), keys[0])

    def bad_chunks(self) -> list[str]:
        """Every input chunk this job's runs filled with the fill value."""
        seen: set[str] = set()
        if not self.path.is_file():
            return []
        with open(self.path) as f:
            for line in f:
                if '"bad_chunk"' in line:
                    try:
                        seen.add(str(json.loads(line)["bad_chunk"]))
                    except (ValueError, KeyError, TypeError):
                        continue
        return sorted(seen)

    def _append(self, text: str, key: str) -> None:
        try:
            with open(self.path, "a") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise write_fault(e, Location.parse(self.path), key, "ledger entry of block") from e


def _object_name(key: str) -> str:
    """A block key ('0:16,16:32,0:20') as an object name ('0-16_16-32_0-20')."""
    return key.replace(":", "-").replace(",", "_")


def _block_key(name: str) -> str:
    return name.replace("-", ":").replace("_", ",")


class ObjectLedger:
    """One object per finished block under `znni-ledger/<run>/`, named by `header.json`."""

    def __init__(self, output_path: Location, *, ctx: StoreContext) -> None:
        self.prefix = ledger_home(output_path, ctx=ctx).join(OBJECT_LEDGER)
        self.ctx = ctx
        self.run: str | None = None

    def _read_header(self) -> dict[str, Any] | None:
        raw = read_bytes(self.prefix.join(HEADER_OBJECT), "output", ctx=self.ctx)
        try:
            header = json.loads(raw) if raw is not None else None
        except ValueError:
            return None
        return header if isinstance(header, dict) and "fingerprint" in header else None

    def read(self) -> tuple[dict[str, Any] | None, set[str]]:
        header = self._read_header()
        if header is None or not isinstance(header.get("run"), str):
            return None, set()
        self.run = header["run"]
        names = list_names(self.prefix.join(self.run), ctx=self.ctx)
        return header, {_block_key(n) for n in names}

    def start(self, parts: dict[str, Any], block_shape: tuple[int, int, int]) -> None:
        """Put a fresh header with a new run id (one atomic put), then drop stale runs."""
        self.run = uuid.uuid4().hex
        header = {**_header(parts, block_shape), "run": self.run}
        body = (json.dumps(header) + "\n").encode()
        write_bytes(self.prefix.join(HEADER_OBJECT), body, ctx=self.ctx)
        for name in list_names(self.prefix, ctx=self.ctx):
            if name not in (HEADER_OBJECT, self.run, f"bad-{self.run}.json"):
                remove_tree(self.prefix.join(name), ctx=self.ctx)

    def resume(self) -> None:
        """Continue the recorded run (puts are whole: there is nothing torn to repair)."""
        if self.run is None:
            self.read()
        if self.run is None:
            raise ValueError(f"output ledger {self.prefix} has no header to resume")

    def record(self, keys: list[str]) -> None:
        """Put one object per finished block; durable when this returns."""
        assert self.run is not None, "start or resume the ledger first"
        for key in keys:
            body = json.dumps({"block": key, "t": time.time()}).encode()
            write_bytes(self.prefix.join(self.run, _object_name(key)), body, ctx=self.ctx)

    def note_bad_chunks(self, keys: list[str]) -> None:
        """Input chunks filled with the fill value, added to `bad-<run>.json`."""
        seen = set(self.bad_chunks())
        if set(keys) - seen:
            write_bytes(self._bad_name(), json.dumps(sorted(seen | set(keys))).encode(),
                        ctx=self.ctx)

    def bad_chunks(self) -> list[str]:
        """Every input chunk this job's runs filled with the fill value."""
        raw = read_bytes(self._bad_name(), "output", ctx=self.ctx)
        try:
            keys = json.loads(raw) if raw is not None else []
        except ValueError:
            return []
        return sorted(str(k) for k in keys) if isinstance(keys, list) else []

    def _bad_name(self) -> Location:
        assert self.run is not None, "start or resume the ledger first"
        return self.prefix.join(f"bad-{self.run}.json")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

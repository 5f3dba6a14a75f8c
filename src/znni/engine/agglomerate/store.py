"""The region graph on disk: one SQLite file in the job's work folder, one row per block's
graph (its arrays in NumPy's .npz format) and one per threshold's segment table.

A block's row is written in one transaction before the ledger records the block, so a
process killed mid-write leaves either the whole row or none, and a rerun that computes the
block again replaces it. Block processes on one machine (a local Dask cluster) write through
SQLite's own locking (WAL, a generous busy timeout); the file is local to the job's host.
"""

from __future__ import annotations

import io
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from znni.engine.agglomerate.graph import BlockGraph

GRAPH_FILE = "graph.sqlite"
INNER = "inner "  # a block's row of inner edges: INNER + its key
FACES = "faces "  # ... of the edges across its lower faces
BUSY_TIMEOUT_S = 120.0
_FIELDS = ("u", "v", "affinity_sum", "count", "joined_u", "joined_v")
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS block_graph (block TEXT PRIMARY KEY, data BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS segments (threshold REAL NOT NULL, fingerprint TEXT NOT NULL, "
    "data BLOB NOT NULL, PRIMARY KEY (threshold, fingerprint))",
    "CREATE TABLE IF NOT EXISTS summary (fingerprint TEXT PRIMARY KEY, data TEXT NOT NULL)",
)


def pack(graph: BlockGraph) -> bytes:
    """A block's graph as .npz bytes."""
    buffer = io.BytesIO()
    np.savez(buffer, **{name: getattr(graph, name) for name in _FIELDS})
    return buffer.getvalue()


def unpack(data: bytes) -> BlockGraph:
    with np.load(io.BytesIO(data)) as arrays:
        return BlockGraph(**{name: arrays[name] for name in _FIELDS})


class GraphStore:
    """The job's SQLite file (created on first use)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db: sqlite3.Connection | None = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, never torn
            for statement in _SCHEMA:
                db.execute(statement)
            db.commit()
            self._db = db
        return self._db

    def put_block(self, key: str, data: bytes) -> None:
        with self.db:  # one transaction
            self.db.execute("INSERT OR REPLACE INTO block_graph VALUES (?, ?)", (key, data))

    def blocks(self, keys: list[str]) -> Iterator[BlockGraph]:
        """The graphs of these rows (INNER or FACES + a block's key), each read when it is
        asked for (the whole file is never in memory at once); ValueError naming one that is
        missing, before any is read."""
        present = {key for (key,) in self.db.execute("SELECT block FROM block_graph")}
        missing = [k for k in keys if k not in present]
        if missing:
            raise ValueError(f"the region graph in {self.path} lacks {len(missing)} blocks "
                             f"(e.g. {missing[0]}); rerun with --overwrite")
        return (unpack(self._row(k)) for k in keys)

    def _row(self, key: str) -> bytes:
        row = self.db.execute("SELECT data FROM block_graph WHERE block = ?", (key,)).fetchone()
        if row is None:
            raise ValueError(f"the region graph in {self.path} lost block {key!r} while it "
                             "was read; rerun with --overwrite")
        return bytes(row[0])

    def put_segments(self, threshold: float, fingerprint: str, fragments: np.ndarray,
                     segments: np.ndarray) -> None:
        buffer = io.BytesIO()
        np.savez(buffer, fragments=fragments, segments=segments)
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO segments VALUES (?, ?, ?)",
                            (threshold, fingerprint, buffer.getvalue()))

    def segments(self, threshold: float, fingerprint: str
                 ) -> tuple[np.ndarray, np.ndarray] | None:
        """(fragments ascending, their segment ids) of a threshold, None if not computed."""
        row = self.db.execute("SELECT data FROM segments WHERE threshold = ? AND "
                              "fingerprint = ?", (threshold, fingerprint)).fetchone()
        if row is None:
            return None
        with np.load(io.BytesIO(row[0])) as arrays:
            return arrays["fragments"], arrays["segments"]

    def put_summary(self, fingerprint: str, summary: dict[str, object]) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO summary VALUES (?, ?)",
                            (fingerprint, json.dumps(summary)))

    def summary(self, fingerprint: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT data FROM summary WHERE fingerprint = ?",
                              (fingerprint,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __getstate__(self) -> dict[str, object]:  # a connection does not travel to workers
        return {"path": self.path, "_db": None}

"""A model's files as values, for Dask workers on hosts that cannot see the model's path.

`read_files` takes the ONNX file and the external data files it names (torch's dynamo
export keeps weights in a `.onnx.data` beside it) as (name relative to the model's folder,
bytes). `write_files`, on the worker, writes them once per content into this host's
temporary folder (`znni-models/<sha256>/`, each file renamed into place, so workers of
one node sharing the folder see whole files) and gives the model file's path there.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from znni.model.onnx_import import external_data_files

Files = tuple[tuple[str, bytes], ...]


def read_files(path: str | Path) -> Files:
    """The model file first, then its external data files, each (relative name, bytes)."""
    model = Path(path)
    found = [model, *external_data_files(model)]
    return tuple((f.relative_to(model.parent).as_posix(), f.read_bytes()) for f in found)


def write_files(files: Files, root: Path | None = None) -> str:
    """The path of the model file (the first of `files`) written under `root` (default
    this host's temporary folder) in a folder named by the files' content."""
    if not files:
        raise ValueError("a carried model has no files")
    digest = hashlib.sha256()
    for name, body in files:
        digest.update(name.encode() + b"\0" + len(body).to_bytes(8, "little"))
        digest.update(body)
    folder = (root or Path(tempfile.gettempdir())) / "znni-models" / digest.hexdigest()[:32]
    for name, body in files:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"a carried model file {name!r} names a place outside its folder")
        target = folder / name
        if target.is_file() and target.stat().st_size == len(body):
            continue  # this content, written here before
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(body)
        os.replace(tmp, target)
    return str(folder / files[0][0])

"""A model's files as values, for Dask workers on hosts that cannot see the model's path.

`read_files` takes the ONNX file and the external data files it names (torch's dynamo
export keeps weights in a `.onnx.data` beside it) as (name relative to the model's folder,
bytes). `write_files`, on the worker, writes them once per content into this host's
temporary folder (`znni-models/<sha256>/`, each file renamed into place, so workers of
one node sharing the folder see whole files) and gives the model file's path there.
`CarriedFiles` does the same for a file the run made on the submitting host (int8's
quantized OpenVINO IR: `openvino_ir_files`), written on a worker when it asks for `path()`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
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


def openvino_ir_files(xml_path: str | Path) -> Files:
    """An OpenVINO IR as files: its `.xml`, then the `.bin` of its weights beside it."""
    xml = Path(xml_path)
    weights = xml.with_suffix(".bin")
    if not xml.is_file() or not weights.is_file():
        raise ValueError(f"the OpenVINO network {xml} (with {weights.name} beside it) is not "
                         "on this host to be sent to the workers")
    return ((xml.name, xml.read_bytes()), (weights.name, weights.read_bytes()))


@dataclass(frozen=True)
class CarriedFiles:
    """Files sent to workers as values (`Files`); `path()` is the first file's path in
    this host's copy, written on first use (write_files: once per content and node)."""

    files: Files

    def path(self) -> str:
        return write_files(self.files)

    def __repr__(self) -> str:  # never the bytes
        return f"CarriedFiles({[name for name, _ in self.files]})"

"""The one interface every volume format implements (`VolumeFormat`), and the values it
takes and gives: the opened input (`InputVolume`), what a run writes (`OutputRequest`) and
the output it gets to write into (`OutputArrays`).

A format is a stateless object; the registry (`formats/__init__.py`) holds one of each and
says which one a `Location` is. Adding a format is one module here and one registry line.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from znni.engine.context import StoreContext
from znni.engine.geometry import Box, Triple
from znni.engine.io.chunk_cache import ChunkCache, ChunkedReader
from znni.engine.io.faults import BadChunks
from znni.engine.location import Location

if TYPE_CHECKING:
    from znni.engine.io.ome import OmeLevel
    from znni.engine.io.pyramid import Factors

Shape4 = tuple[int, int, int, int]  # (c, z, y, x)
PROVENANCE_ATTR = "znni"  # where an output keeps its run's record (`output/provenance.py`)


@dataclass(frozen=True)
class InputVolume:
    """An opened input array and how its axes map to (C, Z, Y, X)."""

    path: Location
    array: Any
    channels: int
    shape: Triple  # spatial (z, y, x)
    dtype: np.dtype[Any]
    has_channel_axis: bool
    ome: OmeLevel | None = None  # the OME-Zarr level read (voxel size, units); None: plain
    # reads through decoded chunks kept between blocks (`chunk_cache.py`); None: straight
    reader: ChunkedReader | None = field(default=None, compare=False, repr=False)
    # the policy for chunks that do not decode, and those filled (`faults.py`)
    bad_chunks: BadChunks = field(default_factory=BadChunks, compare=False, repr=False)

    @property
    def array_location(self) -> Location:
        """Where the array read lives (an OME-Zarr image's level array, else the input)."""
        return self.ome.array_location if self.ome is not None else self.path

    def read(self, box: Box) -> np.ndarray:
        """Raw (C, Z, Y, X) values of a box inside the volume; a chunk that fails to read
        raises a `VolumeFault` naming it (or is filled, `bad_chunks.policy` 'fill')."""
        if self.reader is not None:
            return self.reader.read(box)
        try:
            if self.has_channel_axis:
                return np.asarray(self.array[(slice(None), *box.slices())])
            return np.asarray(self.array[box.slices()])[None]
        except Exception:  # noqa: BLE001 - read through chunks to name the one that failed
            return ChunkedReader(self.array, self.has_channel_axis, ChunkCache(0),
                                 self.array_location, self.bad_chunks).read(box)


@dataclass(frozen=True)
class OutputRequest:
    """What a run writes: the level-0 array, its pyramid and what describes it."""

    shape: Shape4
    dtype: str
    chunks: Triple  # spatial chunks of level 0
    steps: Factors  # the pyramid's halving steps (level k from level k-1); [] for none
    source: InputVolume  # whose voxel size, offset and units the output carries
    provenance: dict[str, Any]  # the run's record (`output/provenance.py`)
    labels: str | None = None  # --labels: the label image's name (a segmentation volume)
    channel_names: tuple[str, ...] = ()  # a bioimage.io package's output channels


@dataclass
class OutputArrays:
    """An opened output: level 0 for the block writers, the coarser levels for the pyramid."""

    level0: Any
    level0_location: Location  # where a worker opens level 0 itself (Dask)
    levels: list[Any] = field(default_factory=list)


class VolumeFormat(ABC):
    """A volume format: how znni reads, checks, creates and opens volumes of it for writing.

    Blocks are written through the opened array itself (`volume.write_box`: every format's
    array takes `array[:, z0:z1, y0:y1, x0:x1] = values` in (c, z, y, x)), so a block write
    costs no format lookup."""

    name: str  # as --output-format and the registry spell it
    writable: bool = True

    @abstractmethod
    def open_input(self, loc: Location, in_channels: int, *, ctx: StoreContext) -> InputVolume:
        """The volume at `loc` opened for reading and checked against the network's input
        channels; ValueError of one sentence naming it otherwise."""

    @abstractmethod
    def open_level0(self, loc: Location, what: str, *, ctx: StoreContext) -> Any:
        """An existing volume's full-resolution array, read-only (results read back)."""

    @abstractmethod
    def check_existing(self, loc: Location, shape: Shape4, dtype: str, labels: str | None, *,
                       ctx: StoreContext) -> Triple | None:
        """The spatial chunks of an existing output at `loc` that fits a run writing `shape`
        of `dtype`, None when there is none; ValueError when one conflicts."""

    @abstractmethod
    def pyramid(self, loc: Location, source: InputVolume, shape: Shape4, dtype: str,
                levels: int | None, *, exists: bool, check: bool,
                ctx: StoreContext) -> Factors:
        """The halving steps of the output's pyramid (`levels`, else an existing output's
        own depth, else the format's default), checked against an existing output's
        levels when `check`; ValueError (one sentence), nothing written."""

    @abstractmethod
    def create_or_open(self, loc: Location, request: OutputRequest, *,
                       ctx: StoreContext) -> OutputArrays:
        """The output for writing: created when missing (its metadata and pyramid levels),
        opened when present; the run's provenance recorded on it."""

    @abstractmethod
    def open_for_writing(self, loc: Location, *, ctx: StoreContext) -> Any:
        """An existing output's level-0 array opened for block writes (`loc` as
        `OutputArrays.level0_location` gives it)."""

    def holds_data(self, loc: Location, *, ctx: StoreContext) -> bool:
        """Whether anything is at `loc` (an output that exists, a volume to read)."""
        from znni.engine.io.stores import exists

        return exists(loc, ctx=ctx)


def plain_input(loc: Location, arr: Any, in_channels: int) -> InputVolume:
    """An array read as (z, y, x) for one channel or (c, z, y, x), checked against the
    network's input channels (any format without axis metadata of its own)."""
    shape = tuple(int(s) for s in arr.shape)
    dtype = np.dtype(arr.dtype)
    check_input_dtype(loc, dtype)
    if len(shape) == 3:
        if in_channels != 1:
            raise ValueError(
                f"input {loc} is 3D {shape} (one channel) but the network expects "
                f"{in_channels} input channels as a 4D (c, z, y, x) array"
            )
        return InputVolume(loc, arr, 1, (shape[0], shape[1], shape[2]), dtype, False)
    if len(shape) == 4:
        if shape[0] != in_channels:
            raise ValueError(
                f"input {loc} has {shape[0]} channels (shape {shape}) but the network "
                f"expects {in_channels}"
            )
        return InputVolume(loc, arr, shape[0], (shape[1], shape[2], shape[3]), dtype, True)
    raise ValueError(
        f"input {loc} has {len(shape)} dimensions {shape}; expected 3 (z, y, x) or 4 (c, z, y, x)"
    )


def check_input_dtype(loc: Location, dtype: np.dtype[Any]) -> None:
    if dtype.kind not in "iuf":
        raise ValueError(f"input {loc} has dtype {dtype}; expected an integer or float type")


def fitting_chunks(loc: Location, arr: Any, shape: Shape4, dtype: str) -> Triple:
    """The spatial chunks of an existing (c, z, y, x) output array that has the run's shape
    and dtype; ValueError (one sentence) otherwise."""
    check_shape_dtype(loc, tuple(int(s) for s in arr.shape), arr.dtype, shape, dtype)
    chunks = tuple(int(c) for c in arr.chunks)
    return (chunks[1], chunks[2], chunks[3])


def check_shape_dtype(loc: Location, found_shape: tuple[int, ...], found_dtype: Any,
                      shape: Shape4, dtype: str) -> None:
    """An existing output array must have the run's shape and dtype."""
    if found_shape != shape:
        raise ValueError(
            f"existing output {loc} has shape {found_shape}, expected {shape}; "
            "remove it or choose another output path"
        )
    if np.dtype(found_dtype) != np.dtype(dtype):
        raise ValueError(
            f"existing output {loc} has dtype {found_dtype}, expected {dtype}; "
            "remove it or choose another output path"
        )

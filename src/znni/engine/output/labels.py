"""Label outputs (`--labels`): argmax over classes or a threshold of one channel, per block.

Labels are computed from a block's blended float output just before it is written, so
the float volume never exists beyond one block. The stored output has one channel:
argmax is uint8 for up to 256 classes (uint16 beyond), a threshold is uint8 0/1. A
`LabelSpec` is a small frozen value, pickled to Dask workers with the block spec.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("argmax", "threshold")
UINT8_CLASSES = 256


@dataclass(frozen=True)
class LabelSpec:
    """What `--labels` asks for: `argmax`, or `threshold` at `value` on `channel`."""

    kind: str
    value: float = 0.0
    channel: int = 0

    def text(self) -> str:
        """The option string this spec was parsed from, canonically (fingerprint, provenance)."""
        if self.kind == "argmax":
            return "argmax"
        return f"threshold:{self.value!r}:{self.channel}"

    @property
    def name(self) -> str:
        """The NGFF label image's name under an OME-Zarr output's `labels/`."""
        return self.kind

    def dtype(self, channels: int) -> str:
        """The stored dtype for a network with `channels` output channels."""
        if self.kind == "argmax" and channels > UINT8_CLASSES:
            return "uint16"
        return "uint8"

    def check(self, channels: int) -> None:
        """ValueError (one sentence) when the labels do not fit a `channels`-channel output."""
        if self.kind == "argmax" and channels < 2:
            raise ValueError(
                "--labels argmax needs at least 2 output channels and the network has 1; "
                "use --labels threshold:T to label that channel"
            )
        if self.kind == "argmax" and channels > 65536:
            raise ValueError(f"--labels argmax stores uint16, and {channels} classes do not fit")
        if self.kind == "threshold" and not 0 <= self.channel < channels:
            raise ValueError(
                f"--labels threshold channel {self.channel} is out of range: the network has "
                f"{channels} output channel{'s' * (channels != 1)} (0 to {channels - 1})"
            )

    def apply(self, values: np.ndarray) -> np.ndarray:
        """(C, Z, Y, X) float output -> (1, Z, Y, X) labels in the stored dtype."""
        if self.kind == "argmax":
            out = np.argmax(values, axis=0)  # (Z, Y, X); ties go to the lowest class
            return out.astype(self.dtype(values.shape[0]))[None]  # (1, Z, Y, X)
        return (values[self.channel] > np.float32(self.value)).astype(np.uint8)[None]


def parse_labels(text: str) -> LabelSpec:
    """`argmax` or `threshold:T[:CHANNEL]` -> a LabelSpec; ValueError naming the bad text."""
    kind, _, rest = text.strip().partition(":")
    if kind == "argmax" and not rest:
        return LabelSpec("argmax")
    if kind != "threshold":
        raise ValueError(
            f"--labels {text!r} is not one of argmax, threshold:T or threshold:T:CHANNEL"
        )
    value, _, channel = rest.partition(":")
    try:
        t = float(value)
    except ValueError:
        raise ValueError(
            f"--labels {text!r} needs a number after threshold:, e.g. threshold:0.5"
        ) from None
    if not np.isfinite(t):
        raise ValueError(f"--labels {text!r} needs a finite threshold")
    if not channel:
        return LabelSpec("threshold", t, 0)
    if not channel.isdigit():
        raise ValueError(
            f"--labels {text!r} has channel {channel!r}; give a channel index 0, 1, ..."
        )
    return LabelSpec("threshold", t, int(channel))


def stored_dtype(labels: str | None, dtype: str, channels: int) -> str:
    """The output array's dtype: the labels' when `labels` is set, else `dtype`."""
    return dtype if labels is None else parse_labels(labels).dtype(channels)


def stored_channels(labels: str | None, channels: int) -> int:
    """The output array's channel count: 1 for labels, else the network's."""
    return channels if labels is None else 1


def check_labels(labels: str | None, dtype: str, channels: int) -> LabelSpec | None:
    """The job's LabelSpec, checked against its output dtype and channel count."""
    if labels is None:
        return None
    spec = parse_labels(labels)
    if dtype != "float32":
        raise ValueError(
            f"--labels {labels} sets the output dtype itself ({spec.dtype(channels)}); "
            f"leave out --dtype {dtype}"
        )
    spec.check(channels)
    return spec


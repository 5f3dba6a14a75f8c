"""Synthetic ground truth and affinities, for the agglomeration's tests and benchmarks.

`synthetic_cells(shape)` returns a labelled volume (uint64, 0 = background) and affinities
(float32, (3, z, y, x)) predicted from it by a stand-in for a network: what a blockwise
agglomeration is checked against (whole-volume waterz, and the ground truth) without a
network or an EM volume. The labels are

- cells: a Voronoi tessellation of jittered grid seeds in an anisotropic metric (cells of
  about `cell_size` voxels, coarser in z as in EM), computed with one Euclidean distance
  transform (exact, and faster than a k-d tree query over every voxel);
- a thin (one voxel) extracellular gap, label 0, on about an eighth of the cell interfaces,
  so that the background is present but boundaries come mostly from label changes;
- `tubes` thin neurites: smooth random curves that run from one face of the volume to the
  opposite one, painted over the cells with their own ids, so that objects cross many
  blocks (what a seam-free agglomeration has to get right);

relabelled into 6-connected components (a painted tube may cut a cell in two) with specks
of fewer than `MIN_VOXELS` voxels set to background. The affinities are those of the labels
(`affinities_from_labels`) made realistic: smeared boundaries, leaky patches in them,
and noise (see `synthetic_cells`). Everything is drawn from
`np.random.default_rng(seed)`: the same arguments give the same arrays.
"""

from __future__ import annotations

import math

import cc3d
import fastremap
import numpy as np
import numpy.typing as npt
from scipy import ndimage
from scipy.interpolate import CubicSpline

Labels = npt.NDArray[np.uint64]
Affinities = npt.NDArray[np.float32]
Triple = tuple[int, int, int]

MIN_VOXELS = 8  # connected pieces smaller than this become background (specks, not objects)
GAP_FRACTION = 0.125  # about this fraction of the cell interfaces get a background gap
LEAK_RADIUS = 2.5  # leaky patches: balls of this radius (voxels)
SHOULDER = 0.4  # smearing: how much the edges next to a boundary lose (see _smear)
TUBE_CONTROL_POINTS = 5  # control points of a tube's spline (its bends)


def synthetic_cells(
    shape: tuple[int, int, int],
    *,
    seed: int = 0,
    cell_size: tuple[float, float, float] = (12.0, 24.0, 24.0),
    tubes: int = 6,
    tube_radius: float = 3.0,
    leak: float = 0.02,
    noise: float = 0.1,
    blur: float = 1.0,
) -> tuple[Labels, Affinities]:
    """(ground truth uint64 (z, y, x), 0 = background/extracellular, affinities float32
    (3, z, y, x)).

    The labels: cells of about `cell_size` voxels (z, y, x; the default's z is coarser, as
    in EM), a one-voxel background gap on about an eighth of their interfaces, and `tubes`
    neurites of radius `tube_radius` voxels, each from one face of the volume to the
    opposite one (see the module's docstring). The affinities start as
    `affinities_from_labels(gt)` (1 inside an object, 0 across a boundary or into the
    background) and are then, in this order:

    - smeared: a gaussian (sigma `blur` voxels) of the boundary voxels lowers the edges
      near a boundary, to 1 - SHOULDER (0.6) next to a flat one, fading over about `blur`
      voxels; the edges across a boundary stay 0 (see `_smear` for why not a plain blur of
      the affinity channels: it opens boundaries at the usual thresholds);
    - leaky: about a fraction `leak` of the zero edges (of `affinities_from_labels`) are
      raised to a high affinity, uniform in [0.75, 1] (one value per patch), in small
      balls (radius LEAK_RADIUS voxels) centred on boundary voxels, so that a naive
      threshold merges neighbours, as a network's holes in a membrane do;
    - noisy: additive gaussian noise of standard deviation `noise`, clipped to [0, 1].

    The first plane along each channel (no neighbour inside the volume) stays 0; with
    `blur=0, leak=0, noise=0` the affinities are exactly `affinities_from_labels(gt)`. At
    the defaults, whole-volume waterz at threshold 0.5 is neither perfect nor hopeless
    (on 64x96x96 voxels: VOI split about 0.3, merge about 0.4-0.6, adapted Rand error
    0.15-0.25; perfect without leak and noise).
    """
    _check_arguments(shape, cell_size, tubes, tube_radius, leak, noise, blur)
    rng = np.random.default_rng(seed)
    labels = _voronoi_cells(shape, cell_size, rng)
    _extracellular_gaps(labels, rng)
    _paint_tubes(labels, rng, tubes, tube_radius)
    gt = _connected_relabel(labels)
    affs = affinities_from_labels(gt)
    zero = _zero_edges(affs)
    _smear(affs, blur)
    _add_leaks(affs, zero, rng, leak)
    _add_noise(affs, rng, noise)
    return gt, affs


def affinities_from_labels(labels: npt.NDArray[np.integer]) -> Affinities:
    """float32 (3, z, y, x): channel c links voxel v to v - e_c (c=0: z, 1: y, 2: x); 1
    where both voxels carry the same non-zero label, else 0; the first plane along c (no
    v - e_c inside the volume) is 0. The convention of waterz (and of the networks it is
    fed by): what a perfect network would predict for these labels."""
    if labels.ndim != 3:
        raise ValueError(f"labels must be 3D (z, y, x), not of shape {labels.shape}")
    affs = np.zeros((3, *labels.shape), dtype=np.float32)
    for c in range(3):
        here, before = _shifted(c)
        same = labels[here] == labels[before]
        same &= labels[here] != 0
        affs[c][here] = same
    return affs


def _shifted(c: int) -> tuple[tuple[slice, ...], tuple[slice, ...]]:
    """Index expressions of the voxels v (from the second plane along c on) and of their
    neighbours v - e_c."""
    here = [slice(None)] * 3
    before = [slice(None)] * 3
    here[c], before[c] = slice(1, None), slice(None, -1)
    return tuple(here), tuple(before)


def _check_arguments(
    shape: tuple[int, int, int],
    cell_size: tuple[float, float, float],
    tubes: int,
    tube_radius: float,
    leak: float,
    noise: float,
    blur: float,
) -> None:
    """A ValueError naming the first argument that is out of range."""
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"shape must be three positive sizes (z, y, x), not {shape}")
    if len(cell_size) != 3 or min(cell_size) <= 0:
        raise ValueError(f"cell_size must be three positive sizes, not {cell_size}")
    if tubes < 0 or tube_radius <= 0:
        raise ValueError(f"need tubes >= 0 and tube_radius > 0, not {tubes}, {tube_radius}")
    if not 0 <= leak <= 1:
        raise ValueError(f"leak is a fraction of the boundary edges, in [0, 1], not {leak}")
    if noise < 0 or blur < 0:
        raise ValueError(f"noise and blur must be >= 0, not {noise}, {blur}")


def _voronoi_cells(
    shape: Triple, cell_size: tuple[float, float, float], rng: np.random.Generator
) -> Labels:
    """Labels 1..n: each voxel gets its nearest seed in the metric that makes `cell_size`
    isotropic. Seeds: one per cell-sized box of a grid, jittered within its box (cells of
    fairly even size, no slivers from two seeds side by side); a box whose seed falls
    outside the volume has none. One Euclidean feature transform (its `sampling` is the
    anisotropy) finds every voxel's nearest seed."""
    boxes = [math.ceil(n / s) for n, s in zip(shape, cell_size, strict=True)]
    corners = np.stack(np.meshgrid(*(np.arange(b) for b in boxes), indexing="ij"), axis=-1)
    jitter = rng.uniform(0.1, 0.9, size=corners.shape)
    seeds = np.floor((corners + jitter).reshape(-1, 3) * np.asarray(cell_size)).astype(np.intp)
    seeds = seeds[np.all(seeds < np.asarray(shape), axis=1)]
    seeds = np.unique(seeds, axis=0)  # two seeds on one voxel: one cell
    if len(seeds) == 0:  # a volume smaller than a cell whose one seed fell outside
        seeds = np.zeros((1, 3), dtype=np.intp)
    at_seed = np.zeros(shape, dtype=np.uint64)
    at_seed[tuple(seeds.T)] = np.arange(1, len(seeds) + 1, dtype=np.uint64)
    nearest = ndimage.distance_transform_edt(
        at_seed == 0,
        sampling=[1.0 / s for s in cell_size],
        return_distances=False,
        return_indices=True,
    )
    labels: Labels = at_seed[tuple(nearest)]
    return labels


def _extracellular_gaps(labels: Labels, rng: np.random.Generator) -> None:
    """Set to 0 the voxels on one side of about GAP_FRACTION of the interfaces between
    cells (a one-voxel extracellular gap): each cell draws u in [0, 1), and the interface
    of cells a, b gets a gap where u_a + u_b > 2 - sqrt(2 GAP_FRACTION) (a pair's
    probability GAP_FRACTION)."""
    u = rng.random(int(labels.max()) + 1)
    limit = 2.0 - math.sqrt(2.0 * GAP_FRACTION)
    for c in range(3):
        here, before = _shifted(c)
        a, b = labels[here], labels[before]
        where = np.nonzero(a != b)
        pairs_a, pairs_b = a[where], b[where]
        gap = (pairs_a != 0) & (pairs_b != 0) & (u[pairs_a] + u[pairs_b] > limit)
        a[tuple(w[gap] for w in where)] = 0  # a is a view of labels


def _paint_tubes(labels: Labels, rng: np.random.Generator, tubes: int, radius: float) -> None:
    """Paint `tubes` neurites (radius `radius` voxels) over the labels, ids after the
    cells'. Where a tube crosses one painted before, the earlier one stays whole and the
    later one is cut (two objects after relabelling, each still long)."""
    first = int(labels.max()) + 1
    stencil = _ball(radius)
    shape = np.asarray(labels.shape)
    for k in range(tubes):
        centre = np.unique(np.rint(_tube_path(labels.shape, rng)).astype(np.intp), axis=0)
        voxels = (centre[:, None, :] + stencil[None, :, :]).reshape(-1, 3)
        voxels = voxels[np.all((voxels >= 0) & (voxels < shape), axis=1)]
        index = tuple(voxels.T)
        free = labels[index] < first
        labels[tuple(v[free] for v in index)] = first + k


def _tube_path(shape: Triple, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """Points (n, 3) along a smooth random curve, a quarter voxel apart along its main axis,
    from one face of the volume to the opposite one. The main axis is drawn in proportion to
    the volume's extents; across it the curve wanders (a cubic spline through points of a
    random walk, kept between 10% and 90% of the volume)."""
    sizes = np.asarray(shape, dtype=np.float64)
    axis = int(rng.choice(3, p=sizes / sizes.sum()))
    across = [a for a in range(3) if a != axis]
    knots = np.linspace(0.0, sizes[axis], TUBE_CONTROL_POINTS)
    steps = rng.normal(0.0, 0.1, size=(TUBE_CONTROL_POINTS, 2))
    steps[0] = rng.uniform(0.25, 0.75, size=2)
    walk = np.clip(np.cumsum(steps, axis=0), 0.1, 0.9) * sizes[across]
    along = np.arange(0.0, sizes[axis], 0.25)
    points = np.empty((len(along), 3))
    points[:, axis] = along
    points[:, across] = CubicSpline(knots, walk)(along)
    return points


def _ball(radius: float) -> npt.NDArray[np.intp]:
    """Offsets (n, 3) of the voxels within `radius` (at least the 6-neighbourhood) of the
    origin."""
    span = np.arange(-math.floor(max(radius, 1.0)), math.floor(max(radius, 1.0)) + 1)
    grid = np.stack(np.meshgrid(span, span, span, indexing="ij"), axis=-1).reshape(-1, 3)
    inside = (grid**2).sum(axis=1) <= max(radius, 1.0) ** 2
    offsets: npt.NDArray[np.intp] = grid[inside].astype(np.intp)
    return offsets


def _connected_relabel(labels: Labels) -> Labels:
    """Each 6-connected piece of one label becomes an object (ids 1..n, raster order);
    pieces of fewer than MIN_VOXELS voxels become background. Objects are then exactly the
    pieces that the affinities connect."""
    pieces = cc3d.connected_components(labels, connectivity=6, out_dtype=np.uint64)
    pieces = cc3d.dust(pieces, MIN_VOXELS, connectivity=6, in_place=True, precomputed_ccl=True)
    gt, _ = fastremap.renumber(pieces, preserve_zero=True, in_place=True)
    relabelled: Labels = gt.astype(np.uint64, copy=False)
    return relabelled


def _zero_edges(affs: Affinities) -> npt.NDArray[np.uint8]:
    """Per voxel v, the number of channels c whose edge (v - e_c, v) exists and is 0."""
    count = np.zeros(affs.shape[1:], dtype=np.uint8)
    for c in range(3):
        here, _ = _shifted(c)
        count[here] += affs[c][here] == 0
    return count


def _add_leaks(
    affs: Affinities, zero: npt.NDArray[np.uint8], rng: np.random.Generator, leak: float
) -> None:
    """Raise about a fraction `leak` of the zero edges (`zero`: their count per voxel, as
    `_zero_edges` gives) to a high affinity, in balls of radius LEAK_RADIUS centred on
    voxels with a zero edge, each with one value drawn from [0.75, 1]. Balls are drawn in
    random order until the zero edges they cover (counted ball by ball: overlaps count
    twice) reach the fraction."""
    if leak == 0:
        return
    flat = np.flatnonzero(zero)
    target = leak * float(zero.sum(dtype=np.int64))
    stencil = _ball(LEAK_RADIUS)
    top = np.asarray(zero.shape) - 1
    centres = np.empty((0, 3), dtype=np.intp)
    covered = 0.0
    while covered < target and len(flat):
        batch = np.stack(np.unravel_index(rng.choice(flat, size=1024), zero.shape), axis=1)
        voxels = np.clip(batch[:, None, :] + stencil[None, :, :], 0, top)
        counts = zero[tuple(voxels.reshape(-1, 3).T)].reshape(len(batch), -1)
        total = covered + np.cumsum(counts.sum(axis=1, dtype=np.int64))
        take = min(len(batch), int(np.searchsorted(total, target)) + 1)
        centres = np.concatenate([centres, batch[:take]])
        covered = float(total[take - 1])
    value = np.repeat(rng.uniform(0.75, 1.0, size=len(centres)).astype(np.float32), len(stencil))
    voxels = (centres[:, None, :] + stencil[None, :, :]).reshape(-1, 3)
    inside = np.all((voxels >= 0) & (voxels <= top), axis=1)
    index = tuple(voxels[inside].T)
    for c in range(3):
        affs[c][index] = np.maximum(affs[c][index], value[inside])
        affs[c][_first_plane(c)] = 0  # no edge there to leak through


def _first_plane(c: int) -> tuple[slice, ...]:
    """Index expression of the first plane along axis c (whose edges along c do not exist)."""
    return tuple(slice(0, 1) if a == c else slice(None) for a in range(3))


def _smear(affs: Affinities, blur: float) -> None:
    """Smear the boundaries: the voxels with a zero edge (both sides of every boundary) are
    blurred (gaussian, sigma `blur` voxels) and scaled so that a flat boundary's voxels
    get SHOULDER (clipped there): a boundary map s; an edge (u, v) then gets
    min(affinity, 1 - max(s(u), s(v))). Crossing edges stay 0; the edges next to a
    boundary drop to 1 - SHOULDER, and the drop fades over about `blur` voxels, whatever
    the boundary's orientation. Why not blur the affinity channels themselves: that lifts
    a flat one-voxel sheet of zeros to about 0.6 (sigma 1), an oblique one (its zeros
    spread over channels) higher, so boundaries would open at the usual thresholds; and
    why not 0 next to a boundary: its voxels would be cut off from their object (waterz
    would leave them out, or make specks of them)."""
    if blur == 0:
        return
    edge = np.zeros(affs.shape[1:], dtype=bool)
    for c in range(3):
        here, before = _shifted(c)
        zero = affs[c][here] == 0
        edge[here] |= zero
        edge[before] |= zero
    kernel = np.zeros(8 * math.ceil(blur) + 2)
    kernel[len(kernel) // 2 - 1 : len(kernel) // 2 + 1] = 1.0  # a flat two-voxel boundary
    peak = float(ndimage.gaussian_filter1d(kernel, blur, mode="constant")[len(kernel) // 2])
    boundary = ndimage.gaussian_filter(edge.astype(np.float32), blur, mode="nearest")
    boundary *= SHOULDER / peak
    np.clip(boundary, 0.0, SHOULDER, out=boundary)
    np.subtract(1.0, boundary, out=boundary)  # now the cap of an edge's voxels
    for c in range(3):
        here, before = _shifted(c)
        cap = np.minimum(boundary[here], boundary[before])
        np.minimum(affs[c][here], cap, out=affs[c][here])


def _add_noise(affs: Affinities, rng: np.random.Generator, noise: float) -> None:
    """Add gaussian noise (standard deviation `noise`), clip to [0, 1], keep the first
    planes 0."""
    if noise == 0:
        return
    for c in range(3):
        channel = affs[c]
        channel += noise * rng.standard_normal(channel.shape, dtype=np.float32)
        np.clip(channel, 0.0, 1.0, out=channel)
        channel[_first_plane(c)] = 0

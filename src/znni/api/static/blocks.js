// The block map: the job's block grid coloured by state, one small grid per z slice, or
// (for deep or large grids) projected over z, a cell's shade the fraction finished.

import { el, fill, svg } from "./dom.js";

const WIDTH = 720;
const MAX_SLICE_CELLS = 4096;
const MAX_SLICES = 16;
const MAX_CELLS = 10000;  // projected cells drawn at most; larger grids are binned
const TODO = [217, 222, 229];
const DONE = [46, 158, 107];

function shade(fraction) {
  const c = TODO.map((t, i) => Math.round(t + (DONE[i] - t) * fraction));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// An SVG of its natural size, scaled down (never up) to the panel by the stylesheet.
function sized(width, height, label) {
  return svg("svg", { class: "blockmap", viewBox: `0 0 ${width} ${height}`, width, height,
    role: "img", "aria-label": label });
}

// One z slice (or the projection) as rects: `value(y, x)` is the fraction done.
function cells(rows, cols, size, ox, oy, value) {
  const parts = [];
  for (let y = 0; y < rows; y += 1) {
    for (let x = 0; x < cols; x += 1) {
      const f = value(y, x);
      parts.push(svg("rect", { class: f >= 1 ? "cell done" : "cell", x: ox + x * size,
        y: oy + y * size, width: Math.max(1, size - 1), height: Math.max(1, size - 1),
        fill: shade(f) }));
    }
  }
  return parts;
}

function slices(map) {
  const [nz, ny, nx] = map.grid;
  const size = Math.max(3, Math.min(22, Math.floor(120 / Math.max(ny, nx))));
  const gap = 14;
  const cols = Math.min(nz, Math.max(1, Math.floor((WIDTH + gap) / (nx * size + gap))));
  const rows = Math.ceil(nz / cols);
  const sliceH = ny * size + 18;
  const root = sized(cols * (nx * size + gap) - gap, rows * sliceH,
    "blocks by state, one grid per z slice");
  for (let z = 0; z < nz; z += 1) {
    const ox = (z % cols) * (nx * size + gap);
    const oy = Math.floor(z / cols) * sliceH;
    root.append(svg("text", { class: "tick", x: ox, y: oy + 11 }, `z ${z}`));
    root.append(...cells(ny, nx, size, ox, oy + 15,
      (y, x) => (map.state[(z * ny + y) * nx + x] === "1" ? 1 : 0)));
  }
  return root;
}

// Fractions done per (y, x) over z, in bins of `bin` × `bin` cells.
function projection(map, bin) {
  const [, ny, nx] = map.grid;
  const rows = Math.ceil(ny / bin);
  const cols = Math.ceil(nx / bin);
  const done = new Float64Array(rows * cols);
  const count = new Float64Array(rows * cols);
  for (let i = 0; i < map.state.length; i += 1) {
    const x = i % nx;
    const y = Math.floor(i / nx) % ny;
    const k = Math.floor(y / bin) * cols + Math.floor(x / bin);
    count[k] += 1;
    if (map.state[i] === "1") done[k] += 1;
  }
  return { rows, cols, value: (y, x) => done[y * cols + x] / Math.max(1, count[y * cols + x]) };
}

function projected(map) {
  const [, ny, nx] = map.grid;
  const bin = Math.max(1, Math.ceil(Math.sqrt((ny * nx) / MAX_CELLS)));
  const p = projection(map, bin);
  const size = Math.max(1, Math.min(16, Math.floor(Math.min(WIDTH / p.cols, 320 / p.rows))));
  const root = sized(p.cols * size, p.rows * size,
    "fraction of blocks finished, projected over z");
  root.append(...cells(p.rows, p.cols, size, 0, 0, p.value));
  return root;
}

function caption(map, how) {
  const [nz, ny, nx] = map.grid;
  return el("p", { class: "muted caption" },
    `${map.done} of ${map.total} blocks finished · grid ${nz} × ${ny} × ${nx} of ` +
    `${map.step.join(" × ")} voxels${how}`);
}

export function drawBlocks(host, map) {
  if (map.state === null) {
    fill(host, caption(map, ` (more than ${map.max_blocks} blocks: counts only)`));
    return;
  }
  const [nz] = map.grid;
  if (nz <= MAX_SLICES && map.total <= MAX_SLICE_CELLS) {
    fill(host, slices(map), caption(map, " · green: finished, grey: not yet"));
  } else {
    fill(host, projected(map), caption(map, " · projected over z: greener = more finished"));
  }
}

// The z index through the middle of the layer of blocks that holds the last finished block
// (blocks run in z, y, x order): where the output is landing now; null before any.
export function landingZ(map) {
  const last = map.state === null ? -1 : map.state.lastIndexOf("1");
  if (last < 0) return null;
  const [, ny, nx] = map.grid;
  const layer = Math.floor(last / (ny * nx));
  const [lo, hi] = map.region[0];
  const step = map.step[0];
  // the cuts of the engine's grid: the planned layout's (a remainder merged), else lo,
  // then multiples of step
  const starts = map.edges ? map.edges[0].slice(0, -1) : [lo];
  if (!map.edges) {
    for (let c = (Math.floor(lo / step) + 1) * step; c < hi; c += step) starts.push(c);
  }
  const top = layer + 1 < starts.length ? starts[layer + 1] : hi;
  return Math.floor((starts[layer] + top - 1) / 2);
}

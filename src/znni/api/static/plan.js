// The job's plan: device algorithm, patch or window, batch, per-layer primitives, and the
// whole run's predicted time and rate beside the measured ones (a pass's steady-state rate
// is labelled as such, apart from them).

import { el, fill } from "./dom.js";
import { bytes, duration, rate, si, triple } from "./format.js";

// Fields shown as facts (label, how), in this order; the rest of a plan's plain values follow.
const FACTS = [
  ["mode", "mode", String],
  ["algorithm", "device algorithm", String],
  ["device", "device", String],
  ["precision", "precision", String],
  ["input_size", "patch input", triple],
  ["output_size", "patch output", triple],
  ["window", "window", triple],
  ["tile", "tile", triple],
  ["tile_output", "tile output", triple],
  ["overlap", "overlap", String],
  ["blend", "blend", String],
  ["windows", "windows", String],
  ["batch", "batch", String],
  ["split_op", "first op after the split", String],
  ["block_shape", "block", triple],
  ["peak_bytes", "host memory peak", bytes],
  ["gpu_peak_bytes", "GPU memory peak", bytes],
  ["machine", "machine profile", String],
];
const SKIP = new Set(["network", "layers", "primitives", "alternatives",
  "predicted_voxels_per_second", "memory_limit_bytes", "gpu_memory_limit_bytes",
  "predicted_patch_s", "predicted_window_s", "spectra_cache_bytes", "workspace_cache_bytes",
  "gpu_sub_batches"]);

const NO_PLAN = {
  queued: "Planned when a worker starts the job.",
  running: "A windowed model's window is chosen as the job runs; it shows here when it ends.",
  failed: "The job ended before a plan was stored.",
  cancelled: "The job ended before a plan was stored.",
};

function facts(plan) {
  const list = el("dl", { class: "facts" });
  const shown = new Set();
  for (const [key, label, how] of FACTS) {
    if (plan[key] === undefined || plan[key] === null) continue;
    list.append(el("dt", {}, label), el("dd", {}, how(plan[key])));
    shown.add(key);
  }
  for (const [key, value] of Object.entries(plan)) {
    if (shown.has(key) || SKIP.has(key) || value === null || typeof value === "object") continue;
    list.append(el("dt", {}, key.replaceAll("_", " ")), el("dd", {}, String(value)));
  }
  return list;
}

// The whole run predicted (planner/jobtime.py) against the whole run measured, time and
// output voxels/s, and their ratio; then the planner's steady-state rate of one pass,
// labelled, which is not the whole run's.
function speeds(plan, job) {
  const predicted = job.predicted_s;
  const measured = job.elapsed_s;
  const voxels = job.progress ? job.progress.voxels_total : 0;
  const whole = (s) => (s > 0 ? `${duration(s)}${voxels > 0 ? `, ${rate(voxels / s)}` : ""}` : "–");
  const done = job.status === "succeeded" && measured > 0;
  const ratio = done && predicted > 0 ? ` (${(measured / predicted).toFixed(2)}x predicted)` : "";
  const list = el("dl", { class: "facts speeds" },
    el("dt", {}, "whole run, predicted"), el("dd", { class: "predicted" }, whole(predicted)),
    el("dt", {}, done ? "whole run, measured" : "running for"),
    el("dd", { class: "measured" }, `${done ? whole(measured) : duration(measured)}${ratio}`));
  if (plan.predicted_voxels_per_second > 0) {
    list.append(el("dt", {}, "steady state (one pass, not the whole run)"),
      el("dd", { class: "steady" }, rate(plan.predicted_voxels_per_second)));
  }
  return list;
}

function layerTable(layers) {
  const head = el("tr", {}, ...["op", "kind", "device", "primitive", "predicted s", "bytes"]
    .map((h) => el("th", {}, h)));
  const rows = layers.map((l) => el("tr", {},
    el("td", {}, l.index), el("td", {}, l.kind), el("td", {}, l.device || "–"),
    el("td", { class: "primitive" }, l.primitive || "–"),
    el("td", {}, l.predicted_s ? si(l.predicted_s) : "–"),
    el("td", {}, l.predicted_bytes ? bytes(l.predicted_bytes) : "–")));
  return el("table", { class: "layers" }, el("thead", {}, head), el("tbody", {}, ...rows));
}

// Graph plans list primitives by op index or as a mapping of node to primitive.
function primitiveTable(primitives) {
  const entries = Array.isArray(primitives)
    ? primitives.map((p, i) => [i, p]).filter(([, p]) => p !== null)
    : Object.entries(primitives);
  const rows = entries.map(([node, p]) => el("tr", {}, el("td", {}, node),
    el("td", { class: "primitive" }, typeof p === "object" ? JSON.stringify(p) : String(p))));
  return el("table", { class: "layers" },
    el("thead", {}, el("tr", {}, el("th", {}, "conv"), el("th", {}, "primitive"))),
    el("tbody", {}, ...rows));
}

export function renderPlan(host, job) {
  const plan = job.plan || (job.report && job.report.plan);
  if (job.kind === "agglomerate") {
    fill(host, el("p", { class: "muted" }, "An agglomeration runs no network, so it has no "
      + "plan; its stages show its progress."));
    return;
  }
  if (!plan) {
    fill(host, el("p", { class: "muted" }, NO_PLAN[job.status] || NO_PLAN.running));
    return;
  }
  const parts = [speeds(plan, job), facts(plan)];
  if (Array.isArray(plan.layers) && plan.layers.length) parts.push(layerTable(plan.layers));
  else if (plan.primitives) parts.push(primitiveTable(plan.primitives));
  fill(host, ...parts);
}

// The job's plan: device algorithm, patch or window, batch, per-layer primitives, and the
// planner's predicted voxels/s beside the measured ones.

import { el, fill } from "./dom.js";
import { bytes, rate, si, triple } from "./format.js";

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

// Predicted against measured voxels/s, and their ratio.
function speeds(plan, job) {
  const predicted = plan.predicted_voxels_per_second;
  const measured = job.voxels_per_second;
  const ratio = predicted > 0 && measured > 0
    ? ` (${Number(((measured / predicted) * 100).toPrecision(2))}% of predicted)` : "";
  return el("dl", { class: "facts speeds" },
    el("dt", {}, "predicted"), el("dd", { class: "predicted" }, rate(predicted)),
    el("dt", {}, "measured"), el("dd", { class: "measured" }, `${rate(measured)}${ratio}`));
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

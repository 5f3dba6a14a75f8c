// The machine panel: CPU, memory, GPUs, workers and the queue, from GET /v1/machine.

import { el, fill, progressBar, setProgress } from "./dom.js";
import { bytes, percent } from "./format.js";

function meter(used, total, text) {
  const bar = progressBar();
  setProgress(bar, total ? used / total : 0, text);
  return bar.node;
}

function item(label, ...value) {
  return el("div", { class: "item" }, el("span", { class: "label" }, label),
    el("span", { class: "value" }, ...value));
}

function memory(m) {
  if (!m.memory_total_bytes) return item("memory", "–");
  const used = m.memory_total_bytes - (m.memory_available_bytes || 0);
  return item("memory", meter(used, m.memory_total_bytes,
    `${bytes(used)} of ${bytes(m.memory_total_bytes)} in use`));
}

function gpu(g) {
  const util = g.utilization_percent === null ? "" : ` · ${g.utilization_percent}% busy`;
  return item(`GPU ${g.index}`, `${g.name} `, meter(g.memory_used_bytes, g.memory_total_bytes,
    `${bytes(g.memory_used_bytes)} of ${bytes(g.memory_total_bytes)}${util}`));
}

export function renderMachine(host, m) {
  const load = m.load_1m === null ? "" : ` · load ${m.load_1m.toFixed(2)} (${percent(m.load_1m / m.cores)})`;
  const gpus = m.gpus.length ? m.gpus.map(gpu) : [item("GPU", "none found (nvidia-smi)")];
  fill(host,
    item("host", m.hostname),
    item("CPU", `${m.cpu_model || "unknown"} · ${m.cores} cores${load}`),
    memory(m),
    ...gpus,
    item("processes", `server ${bytes(m.server_rss_bytes)} · workers ${bytes(m.workers_rss_bytes)}`),
    item("workers", `${m.workers_alive} of ${m.workers} alive`),
    item("queue", `${m.jobs_queued} queued · ${m.jobs_running} running`));
  host.dataset.loaded = "1";
}

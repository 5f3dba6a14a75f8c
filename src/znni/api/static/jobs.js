// The jobs table: one row per job, updated in place on every poll.

import { el, fill, progressBar, setProgress, setText } from "./dom.js";
import { duration, percent, rate, when } from "./format.js";
import { currentStage, stageFraction, stageProgressText, staged } from "./stages.js";

const ACTIVE = new Set(["queued", "running"]);

// What the job is: its network, "agglomerate" on existing affinities, or both in stages.
export function jobName(job) {
  if (job.kind === "agglomerate") return "agglomerate";
  return staged(job) ? `${job.network} + agglomerate` : job.network;
}

// What a job runs on: the requested device, the planned algorithm, the precision.
export function deviceText(job) {
  if (job.kind === "agglomerate") return "cpu";  // the agglomeration runs on the CPU
  const params = job.parameters || {};
  const plan = job.plan || (job.report && job.report.plan) || {};
  const ran = plan.algorithm || plan.device;  // a planner's plan, or a windowed run's report
  const algorithm = ran ? ` → ${ran}` : "";
  return `${params.device || "auto"}${algorithm} · ${params.precision || "fp32"}`;
}

export function fraction(job) {
  if (staged(job)) return stageFraction(currentStage(job));
  const p = job.progress;
  if (p.voxels_total > 0) return p.voxels_done / p.voxels_total;
  if (p.total > 0) return p.done / p.total;
  return job.status === "succeeded" ? 1 : 0;
}

export function progressText(job) {
  if (staged(job)) return stageProgressText(job);
  const p = job.progress;
  const blocks = p.total > 0 ? ` · ${p.done}/${p.total} blocks` : "";
  return `${percent(fraction(job))}${blocks}`;
}

export function statusText(job) {
  return job.cancel_requested && job.status === "running" ? "cancelling" : job.status;
}

// A cancel button for a queued or running job not already being cancelled, else nothing.
export function cancelButton(job, onCancel) {
  if (!ACTIVE.has(job.status) || job.cancel_requested) return null;
  const button = el("button", { type: "button", class: "cancel", "data-job": job.id },
    "Cancel");
  button.addEventListener("click", () => {
    button.disabled = true;
    onCancel(job.id);
  });
  return button;
}

function makeRow(job) {
  const cells = {};
  const names = ["id", "network", "paths", "device", "status", "progress", "now", "average",
    "eta", "started", "finished", "action"];
  const row = el("tr", { id: `job-${job.id}`, "data-job": job.id });
  for (const name of names) {
    cells[name] = el("td", { class: `c-${name}` });
    row.append(cells[name]);
  }
  const link = el("a", { href: `#job=${job.id}` });
  cells.network.append(link);
  const progress = progressBar();
  cells.progress.append(progress.node);
  return { row, cells, link, progress, action: "" };
}

function updateRow(refs, job, rateNow, onCancel) {
  const { cells } = refs;
  refs.row.dataset.status = job.status;
  setText(cells.id, job.id);
  setText(refs.link, jobName(job));
  setText(cells.paths, `${job.input} → ${job.output}`);
  cells.paths.title = `${job.input} → ${job.output}`;
  setText(cells.device, deviceText(job));
  setText(cells.status, statusText(job));
  cells.status.className = `c-status status-${job.status}`;
  setProgress(refs.progress, fraction(job), progressText(job));
  setText(cells.now, job.status === "running" ? rate(rateNow) : "–");
  setText(cells.average, rate(job.voxels_per_second));
  setText(cells.eta, job.status === "running" ? duration(job.eta_s) : "–");
  setText(cells.started, when(job.started_at));
  setText(cells.finished, when(job.finished_at));
  const action = `${job.status}/${job.cancel_requested}`;
  if (refs.action !== action) {  // rebuilt only when it changes: a click is never lost
    refs.action = action;
    fill(cells.action, cancelButton(job, onCancel));
  }
}

export class JobsTable {
  constructor(tbody, onCancel) {
    this.tbody = tbody;
    this.onCancel = onCancel;
    this.rows = new Map();
  }

  // Show `jobs` (newest first); `rates` maps a running job's id to its voxels/s now.
  render(jobs, rates) {
    const seen = new Set();
    const ordered = [...jobs].sort((a, b) => b.id - a.id);
    ordered.forEach((job, i) => {
      let refs = this.rows.get(job.id);
      if (!refs) {
        refs = makeRow(job);
        this.rows.set(job.id, refs);
      }
      updateRow(refs, job, rates.get(job.id), this.onCancel);
      if (this.tbody.children[i] !== refs.row) this.tbody.insertBefore(refs.row, this.tbody.children[i] || null);
      seen.add(job.id);
    });
    for (const [id, refs] of this.rows) {
      if (!seen.has(id)) {
        refs.row.remove();
        this.rows.delete(id);
      }
    }
  }

  clear() {
    this.tbody.replaceChildren();
    this.rows.clear();
  }
}

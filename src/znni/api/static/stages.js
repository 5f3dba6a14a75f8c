// A job's stages (its network's, then an agglomeration's): one progress bar each.

import { el, fill, progressBar, setProgress, setText } from "./dom.js";
import { duration, percent, triple } from "./format.js";

// A job with more than one stage (a plain segment job has one, its network's).
export function staged(job) {
  return Array.isArray(job.stages) && job.stages.length > 1;
}

export function stageFraction(stage) {
  const p = stage.progress;
  if (stage.status === "done") return 1;
  if (p.voxels_total > 0) return p.voxels_done / p.voxels_total;
  if (p.total > 0) return p.done / p.total;
  return 0;
}

export function stageText(stage) {
  const p = stage.progress;
  const blocks = p.total > 0 ? ` · ${p.done}/${p.total} blocks` : "";
  return `${percent(stageFraction(stage))}${blocks}`;
}

// The stage a job is at: the running (or stopped) one, else the last done, else the first.
export function currentStage(job) {
  const stages = job.stages || [];
  const active = stages.find((s) => s.status === "running" || s.status === "stopped");
  if (active) return active;
  const done = stages.filter((s) => s.status === "done");
  return done.length ? done[done.length - 1] : stages[0];
}

// "2/5 graph · 40% · 16/40 blocks": where a staged job is, for the jobs table and its page.
export function stageProgressText(job) {
  const stage = currentStage(job);
  return `${job.stages.indexOf(stage) + 1}/${job.stages.length} ${stage.name} · ${stageText(stage)}`;
}

function makeRow(stage) {
  const cells = { name: el("td", { class: "c-stage" }, stage.name), progress: el("td", {}),
    status: el("td", {}), eta: el("td", { class: "c-eta" }), elapsed: el("td", {}) };
  const bar = progressBar();
  cells.progress.append(bar.node);
  const row = el("tr", { "data-stage": stage.name }, cells.name, cells.progress, cells.status,
    cells.eta, cells.elapsed);
  return { row, cells, bar };
}

// The agglomeration's thresholds and block, and once done its graph and segments.
export function agglomerationText(job) {
  const own = job.kind === "agglomerate";
  const params = (own ? job.parameters : job.parameters.agglomerate) || {};
  const report = own ? job.report : job.report && job.report.agglomerate;
  const parts = [`thresholds ${(params.thresholds || [0.5]).join(", ")}`,
    `block ${params.block ? triple(params.block) : "128 × 128 × 128 (clipped)"}`];
  if (report && Array.isArray(report.segments)) {
    parts.push(`${report.fragments.toLocaleString()} fragments, ${report.basins.toLocaleString()}`
      + ` basins, ${report.edges.toLocaleString()} edges`);
    parts.push(`segments ${report.thresholds.map((t, i) => `${t}: ${report.segments[i]
      .toLocaleString()}`).join(", ")}`);
  }
  return parts.join(" · ");
}

// The stage table of a job's page, its rows made once and updated in place.
export class StageList {
  constructor(host) {
    this.host = host;
    this.names = null;
    this.rows = [];
    this.caption = el("p", { class: "muted caption" });
  }

  render(job) {
    const { stages } = job;
    const names = stages.map((s) => s.name).join("\n");
    if (names !== this.names) {
      this.names = names;
      this.rows = stages.map(makeRow);
      const head = el("tr", {}, ...["stage", "progress", "status", "ETA", "elapsed"].map(
        (h) => el("th", {}, h)));
      fill(this.host, el("table", { class: "stages" }, el("thead", {}, head),
        el("tbody", {}, ...this.rows.map((r) => r.row))), this.caption);
    }
    setText(this.caption, agglomerationText(job));
    stages.forEach((stage, i) => {
      const { cells, bar } = this.rows[i];
      setProgress(bar, stageFraction(stage), stageText(stage));
      setText(cells.status, stage.status);
      cells.status.className = `c-status status-${stage.status}`;
      setText(cells.eta, stage.status === "running" ? duration(stage.eta_s) : "–");
      setText(cells.elapsed, duration(stage.elapsed_s));
    });
  }
}

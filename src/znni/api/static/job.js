// One job's page: summary, error, throughput chart, block map, preview and plan.

import { ApiError, getBlob, getJson } from "./api.js";
import { drawBlocks, landingZ } from "./blocks.js";
import { drawChart } from "./chart.js";
import { el, fill, progressBar, setProgress, setText } from "./dom.js";
import { duration, rate, when } from "./format.js";
import { cancelButton, deviceText, fraction, jobName, progressText, statusText } from "./jobs.js";
import { renderPlan } from "./plan.js";
import { StageList, staged } from "./stages.js";

const PREVIEW_EVERY_MS = 2500;  // a preview is drawn by the server (matplotlib): not per poll
const BLOCKS_EVERY_MS = 3000;  // the block map reads the output's whole ledger
const FINISHED = new Set(["succeeded", "failed", "cancelled"]);
const SUMMARY = ["input", "output", "device · precision", "progress", "voxels", "voxels/s now",
  "average", "ETA", "elapsed", "submitted", "started", "finished", "attempts"];

// A finished job that ended before its first block (its output may not exist).
function neverWrote(job) {
  return FINISHED.has(job.status) && job.progress.done === 0;
}

function panel(title, cls, ...body) {
  return el("section", { class: `panel ${cls}` }, el("h3", {}, title), ...body);
}

function skeleton(id) {
  const refs = { title: el("span", {}), status: el("span", { class: "badge" }),
    action: el("span", {}), summary: el("dl", { class: "facts summary" }), values: {},
    progress: progressBar(), error: el("pre", { class: "error-text" }),
    chart: el("div", { class: "chart-host" }), blocks: el("div", { class: "blocks-host" }),
    stages: el("div", { class: "stages-host" }),
    plan: el("div", { class: "plan-host" }), previewNote: el("p", { class: "muted caption" }),
    preview: el("img", { class: "preview", alt: `preview of job ${id}'s output`, hidden: true }) };
  for (const name of SUMMARY) {
    refs.values[name] = el("dd", {});
    refs.summary.append(el("dt", {}, name), refs.values[name]);
  }
  refs.values.progress.append(refs.progress.node);
  refs.errorPanel = panel("Error", "error-panel", refs.error);
  refs.errorPanel.hidden = true;
  refs.stagesPanel = panel("Stages", "stages-panel", refs.stages);
  refs.stagesPanel.hidden = true;  // a job with an agglomeration: one bar per stage
  refs.root = el("div", { class: "job-page", "data-job": id },
    el("p", {}, el("a", { href: "#", class: "back" }, "← all jobs")),
    el("h2", {}, refs.title, " ", refs.status, " ", refs.action),
    el("div", { class: "job-grid" }, panel("Job", "summary-panel", refs.summary),
      refs.errorPanel, refs.stagesPanel, panel("Throughput", "chart-panel", refs.chart),
      panel("Blocks", "blocks-panel", refs.blocks),
      panel("Output preview", "preview-panel", refs.preview, refs.previewNote),
      panel("Plan", "plan-panel", refs.plan)));
  return refs;
}

export class JobPage {
  constructor(host, id, onCancel) {
    this.id = id;
    this.onCancel = onCancel;
    this.refs = skeleton(id);
    this.stageList = new StageList(this.refs.stages);
    this.seen = { done: -1, status: "", plan: "", action: "", final: false };
    this.previewAt = 0;
    this.previewStamp = "";
    this.blocksAt = 0;
    this.blocksStamp = "";
    this.previewUrl = null;
    fill(host, this.refs.root);
  }

  async refresh() {
    const job = await getJson(`/v1/jobs/${this.id}`);
    if (this.seen.final) return;
    const changed = job.progress.done !== this.seen.done || job.status !== this.seen.status;
    const points = await this.throughput(job, changed);
    this.summary(job, points);
    this.planOnce(job);
    await this.blocks(job);
    await this.preview(job);
    this.seen.done = job.progress.done;
    this.seen.status = job.status;
    const stamp = `${job.progress.done}/${job.status}`;
    this.seen.final = FINISHED.has(job.status) && this.previewStamp === stamp
      && this.blocksStamp === stamp;
  }

  async throughput(job, changed) {
    if (!changed && this.points) return this.points;
    this.points = (await getJson(`/v1/jobs/${this.id}/throughput`)).points;
    drawChart(this.refs.chart, this.points);
    return this.points;
  }

  summary(job, points) {
    const v = this.refs.values;
    const last = points.length ? points[points.length - 1] : null;
    setText(this.refs.title, `Job ${job.id} · ${jobName(job)}`);
    setText(this.refs.status, statusText(job));
    this.refs.status.className = `badge status-${job.status}`;
    setText(v.input, job.input);
    setText(v.output, job.output);
    setText(v["device · precision"], deviceText(job));
    setProgress(this.refs.progress, fraction(job), progressText(job));
    setText(v.voxels, `${job.progress.voxels_done.toLocaleString()} of ${job.progress.voxels_total.toLocaleString()}`);
    setText(v["voxels/s now"], job.status === "running" && last ? rate(last.rate) : "–");
    setText(v.average, rate(job.voxels_per_second));
    setText(v.ETA, job.status === "running" ? duration(job.eta_s) : "–");
    setText(v.elapsed, duration(job.elapsed_s));
    setText(v.submitted, when(job.created_at));
    setText(v.started, when(job.started_at));
    setText(v.finished, when(job.finished_at));
    setText(v.attempts, job.attempts);
    this.refs.stagesPanel.hidden = !staged(job);
    if (staged(job)) this.stageList.render(job);
    this.errorAndAction(job);
  }

  errorAndAction(job) {
    this.refs.errorPanel.hidden = !job.error;
    setText(this.refs.error, job.error || "");
    const action = `${job.status}/${job.cancel_requested}`;
    if (this.seen.action !== action) {
      this.seen.action = action;
      fill(this.refs.action, cancelButton(job, this.onCancel));
    }
  }

  planOnce(job) {
    const key = JSON.stringify([job.plan, job.report && job.report.plan, job.voxels_per_second]);
    if (key === this.seen.plan) return;
    this.seen.plan = key;
    renderPlan(this.refs.plan, job);
  }

  // The block map again when blocks landed since the last one, at most every BLOCKS_EVERY_MS.
  async blocks(job) {
    const stamp = `${job.progress.done}/${job.status}`;
    const due = Date.now() - this.blocksAt >= BLOCKS_EVERY_MS || FINISHED.has(job.status);
    if (stamp === this.blocksStamp || !due) return;
    this.blocksStamp = stamp;
    this.blocksAt = Date.now();
    if (neverWrote(job)) {
      fill(this.refs.blocks, el("p", { class: "muted" }, "No block was written."));
      return;
    }
    try {
      const map = await getJson(`/v1/jobs/${this.id}/blocks`);
      drawBlocks(this.refs.blocks, map);
      this.landing = landingZ(map);
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      fill(this.refs.blocks, el("p", { class: "muted" }, job.started_at ? e.message
        : "Not started yet."));
    }
  }

  // The preview again when blocks landed since the last one, at most every PREVIEW_EVERY_MS.
  async preview(job) {
    const stamp = `${job.progress.done}/${job.status}`;
    if (stamp === this.previewStamp) return;
    if (neverWrote(job)) {
      setText(this.refs.previewNote, "No output was written.");
      this.previewStamp = stamp;
      return;
    }
    const due = Date.now() - this.previewAt >= PREVIEW_EVERY_MS || FINISHED.has(job.status);
    if (job.progress.done === 0 || !due) return;  // nothing to see yet, or drawn just now
    this.previewAt = Date.now();
    const z = job.status === "running" ? this.landing : null;  // else the middle slice
    const query = z === null || z === undefined ? "" : `?axis=z&index=${z}`;
    try {
      this.showPreview(await getBlob(`/v1/jobs/${this.id}/preview.png${query}`), job, z);
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      setText(this.refs.previewNote, e.message);
      if (!FINISHED.has(job.status)) return;  // no output yet: asked again later
    }
    this.previewStamp = stamp;
  }

  showPreview(blob, job, z) {
    const old = this.previewUrl;
    this.previewUrl = URL.createObjectURL(blob);
    this.refs.preview.src = this.previewUrl;
    this.refs.preview.hidden = false;
    if (old) URL.revokeObjectURL(old);
    const where = z === null || z === undefined ? "the middle z slice"
      : `z slice ${z}, through the latest blocks`;
    setText(this.refs.previewNote, `${where}; ${job.progress.done} of ` +
      `${job.progress.total} blocks written (refreshed as blocks land)`);
  }

  close() {
    if (this.previewUrl) URL.revokeObjectURL(this.previewUrl);
  }
}

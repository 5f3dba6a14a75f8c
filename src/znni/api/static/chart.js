// The throughput chart: output voxels/s now and on average over the job's life, as SVG.

import { el, fill, svg } from "./dom.js";
import { duration, si } from "./format.js";

const W = 720;
const H = 240;
const M = { left: 64, right: 16, top: 26, bottom: 34 };
const X_TICKS = 5;

// The axis top: the smallest 1, 2, 2.5 or 5 times a power of ten at or above v, and how
// many steps divide it evenly (5 ticks of 0.5 for 2.5, 4 of 0.5 for 2, ...).
export function niceTop(v) {
  if (!(v > 0)) return { top: 1, steps: 5 };
  const p = 10 ** Math.floor(Math.log10(v));
  const m = [1, 2, 2.5, 5, 10].find((k) => k * p >= v);
  return { top: m * p, steps: m === 2 ? 4 : 5 };
}

function scales(points) {
  const t0 = points[0].t;
  const span = points.length > 1 ? points[points.length - 1].t - t0 : 0;
  const t1 = t0 + (span > 0 ? span : 1);
  const { top, steps } = niceTop(Math.max(...points.map((p) => Math.max(p.rate, p.average))));
  const x = (t) => M.left + ((t - t0) / (t1 - t0)) * (W - M.left - M.right);
  const y = (v) => H - M.bottom - (v / top) * (H - M.top - M.bottom);
  return { t0, t1, top, steps, x, y };
}

function yAxis(s) {
  const parts = [];
  for (let i = 0; i <= s.steps; i += 1) {
    const v = (s.top * i) / s.steps;
    const y = s.y(v);
    parts.push(svg("line", { class: "grid", x1: M.left, x2: W - M.right, y1: y, y2: y }));
    parts.push(svg("text", { class: "tick", x: M.left - 6, y: y + 4, "text-anchor": "end" },
      si(v)));
  }
  parts.push(svg("text", { class: "axis-label", x: 8, y: 12 }, "output voxels/s"));
  return parts;
}

function xAxis(s) {
  const parts = [];
  for (let i = 0; i <= X_TICKS; i += 1) {
    const t = s.t0 + ((s.t1 - s.t0) * i) / X_TICKS;
    const x = s.x(t);
    const anchor = i === 0 ? "start" : i === X_TICKS ? "end" : "middle";
    parts.push(svg("line", { class: "grid", x1: x, x2: x, y1: M.top, y2: H - M.bottom }));
    parts.push(svg("text", { class: "tick", x, y: H - M.bottom + 16, "text-anchor": anchor },
      i === 0 ? "first block" : `+${duration(t - s.t0)}`));
  }
  return parts;
}

// One polyline per attempt (a resumed job's rates start again), plus its points when few.
function lines(points, s, key, cls) {
  const runs = [];
  for (const p of points) {
    const last = runs[runs.length - 1];
    if (last && last[0].attempt === p.attempt) last.push(p);
    else runs.push([p]);
  }
  const parts = runs.map((run) => svg("polyline", { class: cls,
    points: run.map((p) => `${s.x(p.t).toFixed(1)},${s.y(p[key]).toFixed(1)}`).join(" ") }));
  if (points.length <= 40) {
    for (const p of points) {
      parts.push(svg("circle", { class: `${cls} dot`, cx: s.x(p.t), cy: s.y(p[key]), r: 2.5 }));
    }
  }
  return parts;
}

function legend() {
  const x = W - M.right - 250;
  return [
    svg("line", { class: "line-now", x1: x, x2: x + 18, y1: 8, y2: 8 }),
    svg("text", { class: "legend", x: x + 24, y: 12 }, "now (10 s average)"),
    svg("line", { class: "line-average", x1: x + 150, x2: x + 168, y1: 8, y2: 8 }),
    svg("text", { class: "legend", x: x + 174, y: 12 }, "run average"),
  ];
}

export function drawChart(host, points) {
  if (!points.length) {
    fill(host, el("p", { class: "muted" }, "No finished block yet."));
    return;
  }
  const s = scales(points);
  const root = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": "output voxels per second over time" });
  root.append(...yAxis(s), ...xAxis(s), ...lines(points, s, "average", "line-average"),
    ...lines(points, s, "rate", "line-now"), ...legend());
  fill(host, root);
}

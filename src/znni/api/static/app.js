// The dashboard's entry point: the token, the route (#job=ID or the list) and the polling.

import { ApiError, Unauthorized, getJson, postJson } from "./api.js";
import { byId, setText } from "./dom.js";
import { JobPage } from "./job.js";
import { JobsTable } from "./jobs.js";
import { renderMachine } from "./machine.js";
import { forgetToken, getToken, setToken, takeTokenFromFragment } from "./token.js";

const POLL_MS = 1500;
const LIST_LIMIT = 200;

const state = { table: null, page: null, pageId: null, total: 0, timer: null, live: false,
  gen: 0 };

// The job id of `#job=ID`, or null for the list.
function route() {
  const id = new URLSearchParams(location.hash.replace(/^#/, "")).get("job");
  return id !== null && /^[1-9][0-9]{0,17}$/.test(id) ? id : null;
}

function notice(text) {
  const node = byId("notice");
  setText(node, text);
  node.hidden = !text;
}

// Nothing of the jobs stays on the page without an accepted token.
function showLogin(message) {
  clearTimeout(state.timer);
  state.live = false;
  state.table.clear();
  closePage();
  byId("job-view").replaceChildren();
  byId("machine").replaceChildren();
  byId("app").hidden = true;
  byId("forget").hidden = true;
  notice("");
  setText(byId("conn"), "");
  byId("login").hidden = false;
  setText(byId("login-error"), message);
  byId("token").focus();
}

function showApp() {
  state.live = true;
  byId("login").hidden = true;
  byId("app").hidden = false;
  byId("forget").hidden = !getToken();
}

function closePage() {
  if (state.page) state.page.close();
  state.page = null;
  state.pageId = null;
}

async function nowRates(jobs) {
  const rates = new Map();
  const running = jobs.filter((j) => j.status === "running");
  const answers = await Promise.all(running.map((j) =>
    getJson(`/v1/jobs/${j.id}/throughput?last=1`).catch((e) => {
      if (e instanceof Unauthorized) throw e;
      return { job: j.id, points: [] };
    })));
  for (const a of answers) {
    if (a.points.length) rates.set(a.job, a.points[a.points.length - 1].rate);
  }
  return rates;
}

// The latest LIST_LIMIT jobs (the API lists oldest first: ask from the right offset).
async function refreshList() {
  let offset = Math.max(0, state.total - LIST_LIMIT);
  let list = await getJson(`/v1/jobs?limit=${LIST_LIMIT}&offset=${offset}`);
  if (list.total - offset > LIST_LIMIT) {
    offset = list.total - LIST_LIMIT;
    list = await getJson(`/v1/jobs?limit=${LIST_LIMIT}&offset=${offset}`);
  }
  state.total = list.total;
  state.table.render(list.jobs, await nowRates(list.jobs));
  byId("jobs-empty").hidden = list.total > 0;
  setText(byId("jobs-count"), list.total > list.jobs.length
    ? `(latest ${list.jobs.length} of ${list.total})` : `(${list.total})`);
}

async function refreshJob(id) {
  if (state.pageId !== id) {
    closePage();
    state.page = new JobPage(byId("job-view"), id, cancel);
    state.pageId = id;
  }
  await state.page.refresh();
}

// The machine panel: cheap to answer (/proc, a cached nvidia-smi), so on every poll.
async function refreshMachine() {
  renderMachine(byId("machine"), await getJson("/v1/machine"));
}

async function refresh() {
  const id = route();
  await Promise.all([id === null ? refreshList() : refreshJob(id), refreshMachine()]);
  if (id === null) closePage();
  byId("jobs-view").hidden = id !== null;
  byId("job-view").hidden = id === null;
}

// One poll of the current view; a newer tick (a click, a new route) supersedes this one.
async function tick() {
  clearTimeout(state.timer);
  const gen = ++state.gen;
  try {
    await refresh();
    if (gen !== state.gen) return;
    if (!state.live) showApp();
    setText(byId("conn"), "live");
    byId("conn").className = "conn ok";
  } catch (e) {
    if (gen !== state.gen) return;
    if (e instanceof Unauthorized) {
      showLogin(getToken() ? "The server refused this token." : "");
      return;
    }
    if (e instanceof ApiError && e.status === 404 && route() !== null) notice(e.message);
    setText(byId("conn"), e instanceof ApiError ? e.message : "cannot reach the server");
    byId("conn").className = "conn bad";
  }
  state.timer = setTimeout(tick, POLL_MS);
}

async function cancel(id) {
  try {
    const job = await postJson(`/v1/jobs/${id}/cancel`);
    notice(`Job ${job.id}: ${job.status === "cancelled" ? "cancelled" : "cancelling after its current block"}.`);
  } catch (e) {
    if (e instanceof Unauthorized) return showLogin("The server refused this token.");
    notice(`Job ${id}: ${e.message}`);
  }
  return tick();
}

function onTokenSubmit(event) {
  event.preventDefault();
  const input = byId("token");
  const token = input.value.trim();
  input.value = "";
  if (!token) return;
  setToken(token);
  byId("login").hidden = true;
  tick();
}

function boot() {
  takeTokenFromFragment();
  state.table = new JobsTable(byId("jobs").tBodies[0], cancel);
  byId("token-form").addEventListener("submit", onTokenSubmit);
  byId("forget").addEventListener("click", () => {
    forgetToken();
    showLogin("");
    tick();  // a server without a token shows the jobs again
  });
  window.addEventListener("hashchange", () => {
    const newToken = takeTokenFromFragment();
    notice("");
    if (state.live || newToken) tick();
  });
  tick();
}

boot();

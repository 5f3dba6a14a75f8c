// Calls to this server's /v1 API, with the bearer token when there is one.

import { getToken } from "./token.js";

export class Unauthorized extends Error {}

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

function headers() {
  const token = getToken();
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function call(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { ...headers(), ...(options.headers || {}) },
    cache: "no-store",
    credentials: "omit",
    referrerPolicy: "no-referrer",
  });
  if (response.status === 401) throw new Unauthorized("the server refused the token");
  if (!response.ok) throw new ApiError(response.status, await detail(response));
  return response;
}

async function detail(response) {
  try {
    const body = await response.json();
    return typeof body.detail === "string" ? body.detail : `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

export async function getJson(path) {
  return (await call(path)).json();
}

export async function postJson(path) {
  return (await call(path, { method: "POST" })).json();
}

export async function getBlob(path) {
  return (await call(path)).blob();
}

// The bearer token: from the URL fragment (/#token=T, never sent to the server) or the
// form, kept in this tab's sessionStorage, sent only as `Authorization: Bearer` to /v1.

const KEY = "znni-token";

// Move a token in the fragment into sessionStorage and out of the address bar and history;
// whether there was one.
export function takeTokenFromFragment() {
  const params = new URLSearchParams(location.hash.replace(/^#/, ""));
  const token = params.get("token");
  if (token === null) return false;
  if (token) sessionStorage.setItem(KEY, token);
  params.delete("token");
  const rest = params.toString();
  history.replaceState(null, "", `${location.pathname}${location.search}${rest ? `#${rest}` : ""}`);
  return true;
}

export function getToken() {
  return sessionStorage.getItem(KEY);
}

export function setToken(token) {
  sessionStorage.setItem(KEY, token);
}

export function forgetToken() {
  sessionStorage.removeItem(KEY);
}

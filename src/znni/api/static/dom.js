// DOM helpers: every piece of data goes in as text (textContent, attributes), never as HTML.

const SVG_NS = "http://www.w3.org/2000/svg";

// An element with attributes (class, data-*, ...) and children (nodes or plain text).
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  node.append(...children.filter((c) => c !== null && c !== undefined).map(asNode));
  return node;
}

// An SVG element: attributes only (presentation attributes, no style attribute: the CSP).
export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  node.append(...children.map(asNode));
  return node;
}

function setAttrs(node, attrs) {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === false || value === null || value === undefined) continue;
    node.setAttribute(name, value === true ? "" : String(value));
  }
}

function asNode(child) {
  return child instanceof Node ? child : document.createTextNode(String(child));
}

// Replace a node's children.
export function fill(node, ...children) {
  node.replaceChildren(...children.filter((c) => c !== null && c !== undefined).map(asNode));
  return node;
}

// Set text only when it changed (keeps selections and avoids layout work on every poll).
export function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) node.textContent = value;
}

export function byId(id) {
  return document.getElementById(id);
}

// A progress bar: a track and a bar whose width is set through the CSSOM (allowed by the CSP).
export function progressBar() {
  const bar = el("span", { class: "bar" });
  const label = el("span", { class: "bar-label" });
  const node = el("span", { class: "progress", role: "progressbar", "aria-valuemin": 0,
    "aria-valuemax": 100 }, bar, label);
  return { node, bar, label };
}

export function setProgress(progress, fraction, text) {
  const pct = Math.max(0, Math.min(1, fraction)) * 100;
  progress.bar.style.width = `${pct.toFixed(1)}%`;
  progress.node.setAttribute("aria-valuenow", pct.toFixed(0));
  setText(progress.label, text);
}

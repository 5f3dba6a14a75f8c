// Numbers, sizes, durations and times as the dashboard shows them.

const PREFIXES = ["", "k", "M", "G", "T", "P"];

// (digits of value, SI prefix): 12345 -> ["12.3", "k"].
function siParts(value, digits) {
  let v = value;
  let i = 0;
  while (Math.abs(v) >= 1000 && i < PREFIXES.length - 1) {
    v /= 1000;
    i += 1;
  }
  return [String(Number(v.toPrecision(digits))), PREFIXES[i]];
}

function finite(value) {
  return value !== null && value !== undefined && Number.isFinite(value);
}

export function si(value, digits = 3) {
  if (!finite(value)) return "–";
  const [num, prefix] = siParts(value, digits);
  return prefix ? `${num} ${prefix}` : num;
}

export function rate(voxelsPerSecond) {
  if (!finite(voxelsPerSecond)) return "–";
  const [num, prefix] = siParts(voxelsPerSecond, 3);
  return `${num} ${prefix}vox/s`;
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`;
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  if (seconds < 10) return `${Number(Math.max(0, seconds).toFixed(1))} s`;
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${String(s % 60).padStart(2, "0")} s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h} h ${String(m % 60).padStart(2, "0")} min`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

// A unix time: the clock time today, else the date and time.
export function when(unix) {
  if (unix === null || unix === undefined) return "–";
  const d = new Date(unix * 1000);
  const sameDay = d.toDateString() === new Date().toDateString();
  const time = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  return sameDay ? time : `${d.toLocaleDateString()} ${time}`;
}

export function percent(fraction) {
  return `${Math.floor(Math.max(0, Math.min(1, fraction)) * 100)}%`;
}

export function triple(t) {
  return Array.isArray(t) ? t.join(" × ") : "–";
}

// Display formatting only (numbers the server computed, shown with units); no product logic here.
import { t } from "./i18n.mjs";

export function gib(value, digits = 1) {
  if (value === null || value === undefined || Number.isNaN(Number(value))) return "—";
  return `${Number(value).toFixed(digits)} GiB`;
}

/** A memory figure that may be tiny (a simulated card's tensor bytes): below 0.01 GiB it is shown in
 * KiB/MiB, so a real non-zero peak never reads "0.00 GiB". */
export function memGib(value, digits = 2) {
  const v = Number(value);
  if (value === null || value === undefined || Number.isNaN(v)) return "—";
  return v > 0 && v < 0.01 ? bytes(v * 1024 ** 3) : gib(v, digits);
}

/** ``value`` to ``digits`` significant digits, trailing zeros of its fraction dropped (8340.03 -> "8340",
 * 0.5000 -> "0.5", 1.200e+5 -> "1.2e+5"); the zeros of a whole part are digits and stay. */
export function num(value, digits = 3) {
  if (value === null || value === undefined) return "—";
  const v = Number(value);
  if (!Number.isFinite(v)) return String(value);
  if (Number.isInteger(v)) return String(v);
  const text = v.toPrecision(digits);
  return text.includes(".") ? text.replace(/\.?0+(?=e|$)/, "") : text;
}

export function ago(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const s = Math.max(0, Number(seconds));
  if (s < 60) return t("time.seconds_ago", { n: Math.round(s) });
  if (s < 3600) return t("time.minutes_ago", { n: Math.round(s / 60) });
  return t("time.hours_ago", { n: (s / 3600).toFixed(1) });
}

export function when(epochSeconds) {
  if (!epochSeconds) return "—";
  const d = new Date(epochSeconds * 1000);
  return d.toLocaleString();
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 10) return `${Math.max(0, seconds).toFixed(1)} s`;
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

export function shortId(id) {
  return String(id || "").slice(0, 8);
}

export function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n);
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`;
}

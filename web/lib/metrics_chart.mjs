// A run's metrics as small multiples (docs/runs-panel.md): one uPlot panel per kind of figure, so a loss,
// an accuracy (0..1) and a throughput (hundreds of samples/s) never share an axis; the panels share the
// step axis and one cursor, so hovering any of them shows every series' value at that step in the
// legends. The live chart and a finished run's are built the same way (points in the order the run
// reported them), so they look the same; a series keeps its colour whatever appears after it.
import { loadUPlot } from "./chart.mjs";
import { h, replace } from "./dom.mjs";
import { num } from "./format.mjs";
import { t } from "./i18n.mjs";

/** The panels, top to bottom; what goes where is `groupFor`. */
export const GROUPS = ["loss", "accuracy", "throughput", "other"];
const HEIGHTS = { loss: 200, accuracy: 140, throughput: 150, other: 150 }; // room for 3+ ticks and the label
const compact = new Intl.NumberFormat(undefined, { notation: "compact", maximumSignificantDigits: 3 });

/** A panel's y range: accuracies 0..1; a throughput from 0 (one point at a run's end still reads);
 * losses and the rest around their values. */
function yScale(group) {
  if (group === "accuracy") return { range: [0, 1] };
  if (group === "throughput") return { range: (u, lo, hi) => [0, hi > 0 ? niceCeil(hi * 1.1) : 1] };
  return { auto: true };
}
const MANY_POINTS = 60; // above this a series is drawn as a line only

/** Which panel a metric goes to, by its name: accuracies (0..1), throughputs, losses, the rest. */
export function groupFor(name) {
  const n = String(name).toLowerCase();
  if (/acc/.test(n)) return "accuracy";
  if (/per_s$|_per_sec|throughput|samples_s$/.test(n)) return "throughput";
  if (/loss/.test(n)) return "loss";
  return "other";
}

// The metrics the nodes report (nodes/trainer.py, nodes/training.py, nodes/evaluation.py) keep these
// colours; any other name hashes into the palette, so its colour never depends on the other series.
const KNOWN = {
  train_loss: "#1677ff", train_loss_batch: "#91caff", val_loss: "#fa8c16", val_loss_step: "#ffc069",
  eval_loss: "#eb2f96", val_accuracy: "#52c41a", eval_accuracy: "#13c2c2", predict_accuracy: "#722ed1",
  samples_per_s: "#8c8c8c",
};
const PALETTE = ["#1677ff", "#fa8c16", "#52c41a", "#eb2f96", "#13c2c2", "#722ed1", "#a0d911", "#f5222d",
  "#2f54eb", "#faad14"];

/** A series' colour: fixed for the nodes' metrics, a hash of the name otherwise. */
export function colorFor(name) {
  if (KNOWN[name]) return KNOWN[name];
  let hash = 0;
  for (const ch of String(name)) hash = (hash * 31 + ch.codePointAt(0)) >>> 0;
  return PALETTE[hash % PALETTE.length];
}

/** The next 1, 2 or 5 times a power of ten at or above ``v`` (> 0): an axis top its ticks reach. */
function niceCeil(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 5, 10].map((m) => m * p).find((c) => c >= v);
}

let chartIds = 0;

export class MetricsChart {
  constructor(container) {
    this.series = new Map(); // name -> Map(step -> value), in the order names first appeared
    this.maxStep = null;
    this.plots = [];
    this.layout = "";
    this.syncKey = `xf-metrics-${++chartIds}`;
    this.el = h("div", { class: "xf-chart xf-chart-multi", role: "group", "aria-label": t("runs.chart_group_label"),
      dataset: { xpufleet: "chart" } });
    this.empty = h("div", { class: "xf-hint" }, t("runs.chart_empty"));
    container.append(this.el, this.empty);
    this.resizeObserver = new ResizeObserver(() => this.resize());
    this.resizeObserver.observe(this.el);
  }

  /** Replace everything with GET /api/runs/{id}/metrics's ``metrics`` (name -> [{value, step, cursor}]),
   * replayed in the order the run reported them, as the live chart received them. */
  setAll(metrics) {
    this.series.clear();
    this.maxStep = null;
    const points = [];
    for (const [name, list] of Object.entries(metrics || {})) for (const p of list) points.push([name, p]);
    points.sort((a, b) => (a[1].cursor ?? 0) - (b[1].cursor ?? 0));
    for (const [name, p] of points) this.add(name, p.step, p.value, false);
    this.redraw();
  }

  /** One point; a metric reported without a step (Evaluate's) sits at the last step seen. */
  add(name, step, value, redraw = true) {
    if (value === null || value === undefined || !Number.isFinite(Number(value))) return;
    if (!this.series.has(name)) this.series.set(name, new Map());
    const x = Number.isFinite(Number(step)) && step !== null ? Number(step) : (this.maxStep ?? 0);
    this.maxStep = Math.max(this.maxStep ?? x, x);
    this.series.get(name).set(x, Number(value));
    if (redraw) this.scheduleRedraw();
  }

  scheduleRedraw() {
    if (this.pendingFrame) return;
    this.pendingFrame = requestAnimationFrame(() => { this.pendingFrame = null; this.redraw(); });
  }

  /** The shared steps and, per panel, its series names and columns (null where a series has no point). */
  data() {
    const steps = new Set();
    for (const s of this.series.values()) for (const k of s.keys()) steps.add(k);
    const xs = [...steps].sort((a, b) => a - b);
    const groups = GROUPS.map((group) => {
      const names = [...this.series.keys()].filter((n) => groupFor(n) === group);
      const cols = names.map((n) => { const s = this.series.get(n); return xs.map((x) => (s.has(x) ? s.get(x) : null)); });
      return { group, names, data: [xs, ...cols] };
    }).filter((g) => g.names.length);
    return { xs, groups };
  }

  async redraw() {
    const { xs, groups } = this.data();
    this.empty.hidden = xs.length > 0;
    this.el.dataset.points = String([...this.series.values()].reduce((n, s) => n + s.size, 0));
    this.el.dataset.series = [...this.series.keys()].join(",");
    if (!xs.length) return;
    const uPlot = await loadUPlot();
    if (this.destroyed) return;
    const layout = JSON.stringify(groups.map((g) => [g.group, g.names]));
    if (layout !== this.layout) {
      this.build(uPlot, groups);
      this.layout = layout;
    } else {
      groups.forEach((g, i) => this.plots[i].setData(g.data));
    }
  }

  build(uPlot, groups) {
    for (const p of this.plots) p.destroy();
    this.plots = [];
    const width = Math.max(240, this.el.clientWidth || 480);
    const grid = { stroke: "rgba(128,128,128,0.2)" };
    const boxes = groups.map(({ group, names }) => h("div", { class: "xf-chart-panel",
      dataset: { group, series: names.join(",") } }));
    replace(this.el, boxes);
    groups.forEach(({ group, names, data }, i) => {
      const box = boxes[i];
      const plot = new uPlot({
        width, height: HEIGHTS[group],
        cursor: { sync: { key: this.syncKey, setSeries: true }, points: { size: 7 } },
        legend: { live: true },
        scales: { x: { time: false }, y: yScale(group) },
        axes: [
          { label: i === groups.length - 1 ? t("runs.step") : undefined, stroke: "currentColor", grid },
          { label: t(`runs.axis.${group}`), stroke: "currentColor", grid, size: 60, space: 20,
            values: (u, splits) => splits.map((v) => (Math.abs(v) >= 1000 ? compact.format(v) : num(v, 3))) },
        ],
        series: [
          // away from the plots the legends show each series' latest value (at the last step)
          { label: t("runs.step"), value: (u, v, si, idx) => shown(idx === null ? lastOf(u.data[0]) : v, String) },
          ...names.map((name) => ({
            label: name, stroke: colorFor(name), width: name.endsWith("_batch") ? 1 : 2, spanGaps: true,
            value: (u, v, si, idx) => shown(idx === null ? lastOf(u.data[si]) : v, (x) => num(x, 4)),
            points: { show: (u, si) => pointCount(u.data[si]) < MANY_POINTS, size: 5 },
          })),
        ],
        hooks: {
          // the ranges each panel shows, for the tests (a step's place on the plot) and a screen reader's summary
          setScale: [(u, key) => {
            if (key !== "x" && key !== "y") return;
            box.dataset[`${key}Min`] = String(u.scales[key].min);
            box.dataset[`${key}Max`] = String(u.scales[key].max);
          }],
        },
      }, data, box);
      box.setAttribute("aria-label", `${t(`runs.axis.${group}`)}: ${names.join(", ")}`);
      this.plots.push(plot);
    });
    this.el.dataset.drawn = "true";
    this.el.dataset.groups = groups.map((g) => g.group).join(",");
  }

  resize() {
    const width = this.el.clientWidth;
    if (!width) return;
    for (const p of this.plots) p.setSize({ width, height: p.height });
  }

  destroy() {
    this.destroyed = true;
    this.resizeObserver.disconnect();
    for (const p of this.plots) p.destroy();
    this.plots = [];
    if (this.pendingFrame) cancelAnimationFrame(this.pendingFrame);
  }
}

function shown(v, fmt) {
  return v === null || v === undefined ? "—" : fmt(v);
}

function lastOf(col) {
  for (let i = (col?.length ?? 0) - 1; i >= 0; i--) if (col[i] !== null && col[i] !== undefined) return col[i];
  return null;
}

function pointCount(col) {
  let n = 0;
  for (const v of col || []) if (v !== null && v !== undefined && ++n >= MANY_POINTS) break;
  return n;
}

// The charts, drawn by uPlot (web/vendor/uplot, MIT), loaded on first use only: a run's live loss and
// accuracy chart (losses on the left axis, accuracies 0..1 on the right, by optimizer step) and a
// sweep's scatter of one parameter against the objective.
import { h } from "./dom.mjs";
import { t } from "./i18n.mjs";

let uPlotModule = null;
let cssAdded = false;

export async function loadUPlot() {
  if (!uPlotModule) uPlotModule = (await import("../vendor/uplot/uPlot.esm.mjs")).default;
  if (!cssAdded) {
    cssAdded = true;
    document.head.append(h("link", { rel: "stylesheet", href: new URL("../vendor/uplot/uPlot.min.css", import.meta.url).href }));
  }
  return uPlotModule;
}

const COLORS = ["#1677ff", "#fa8c16", "#52c41a", "#eb2f96", "#13c2c2", "#722ed1", "#a0d911", "#f5222d"];

/** Which axis a metric goes on: accuracies (0..1) right, everything else left. */
export function axisFor(name) {
  return /acc/i.test(name) ? "acc" : "loss";
}

export class MetricsChart {
  constructor(container) {
    this.container = container;
    this.series = new Map(); // name -> Map(step -> value)
    this.plot = null;
    this.names = [];
    this.el = h("div", { class: "xf-chart", role: "img", "aria-label": t("runs.chart_label"), dataset: { xpufleet: "chart" } });
    this.empty = h("div", { class: "xf-hint" }, t("runs.chart_empty"));
    container.append(this.el, this.empty);
    this.resizeObserver = new ResizeObserver(() => this.resize());
    this.resizeObserver.observe(this.el);
  }

  /** Replace everything with GET /api/runs/{id}/metrics's ``metrics`` (name -> [{value, step}]). */
  setAll(metrics) {
    this.series.clear();
    for (const [name, points] of Object.entries(metrics || {})) {
      for (const p of points) this.add(name, p.step, p.value, false);
    }
    this.redraw();
  }

  add(name, step, value, redraw = true) {
    if (value === null || value === undefined || !Number.isFinite(Number(value))) return;
    if (!this.series.has(name)) this.series.set(name, new Map());
    const s = this.series.get(name);
    s.set(step ?? s.size, Number(value));
    if (redraw) this.scheduleRedraw();
  }

  scheduleRedraw() {
    if (this.pendingFrame) return;
    this.pendingFrame = requestAnimationFrame(() => { this.pendingFrame = null; this.redraw(); });
  }

  data() {
    const names = [...this.series.keys()].sort();
    const steps = new Set();
    for (const s of this.series.values()) for (const k of s.keys()) steps.add(k);
    const xs = [...steps].sort((a, b) => a - b);
    const cols = names.map((n) => xs.map((x) => (this.series.get(n).has(x) ? this.series.get(n).get(x) : null)));
    return { names, data: [xs, ...cols] };
  }

  async redraw() {
    const { names, data } = this.data();
    const points = data[0].length;
    this.empty.hidden = points > 0;
    this.el.dataset.points = String(names.reduce((n, name) => n + this.series.get(name).size, 0));
    this.el.dataset.series = names.join(",");
    if (!points) return;
    const uPlot = await loadUPlot();
    if (this.destroyed) return;
    if (!this.plot || names.join() !== this.names.join()) {
      this.plot?.destroy();
      this.names = names;
      const width = Math.max(240, this.el.clientWidth || 480);
      this.plot = new uPlot({
        width, height: 220,
        scales: { x: { time: false }, loss: { auto: true }, acc: { range: [0, 1] } },
        axes: [
          { label: t("runs.step"), stroke: "currentColor", grid: { stroke: "rgba(128,128,128,0.2)" } },
          { scale: "loss", label: t("runs.loss"), stroke: "currentColor", grid: { stroke: "rgba(128,128,128,0.2)" } },
          { scale: "acc", side: 1, label: t("runs.accuracy"), stroke: "currentColor", grid: { show: false } },
        ],
        series: [{ label: t("runs.step") }, ...names.map((name, i) => ({
          label: name, scale: axisFor(name), stroke: COLORS[i % COLORS.length], width: name.endsWith("_batch") ? 1 : 2,
          spanGaps: true, points: { show: data[0].length < 60 },
        }))],
      }, data, this.el);
      this.el.dataset.drawn = "true";
    } else {
      this.plot.setData(data);
    }
  }

  resize() {
    if (this.plot && this.el.clientWidth) this.plot.setSize({ width: this.el.clientWidth, height: 220 });
  }

  destroy() {
    this.destroyed = true;
    this.resizeObserver.disconnect();
    this.plot?.destroy();
    if (this.pendingFrame) cancelAnimationFrame(this.pendingFrame);
  }
}

/**
 * A sweep's variants as points: one parameter (x) against the objective (y). Numbers on a linear axis,
 * or a log axis when every value is positive and they span two decades or more (learning rates);
 * strings and booleans as categories in the order they first appear.
 */
export function scatterData(rows, path) {
  const pts = rows.filter((r) => r.metric !== null && r.metric !== undefined && Number.isFinite(Number(r.metric)))
    .map((r) => ({ x: r.parameters?.[path], y: Number(r.metric) }))
    .filter((p) => p.x !== undefined && p.x !== null);
  const numeric = pts.every((p) => typeof p.x === "number");
  let categories = null;
  if (!numeric) {
    categories = [...new Set(pts.map((p) => String(p.x)))];
    for (const p of pts) p.x = categories.indexOf(String(p.x));
  }
  pts.sort((a, b) => a.x - b.x); // uPlot wants x ascending (equal x, e.g. seeds, may repeat)
  const xs = pts.map((p) => p.x);
  const log = numeric && xs.length > 1 && xs[0] > 0 && xs[xs.length - 1] / xs[0] >= 100;
  return { xs, ys: pts.map((p) => p.y), categories, log };
}

/** [lo, hi] widened by a tenth on each side (a factor on a log axis; around the value when lo = hi). */
function padded(lo, hi, log) {
  if (log) return [lo / 1.5, hi * 1.5];
  const span = hi - lo || Math.abs(lo) || 1;
  return [lo - span * 0.1, hi + span * 0.1];
}

export class ScatterChart {
  constructor(container) {
    this.el = h("div", { class: "xf-chart", role: "img", "aria-label": t("sweep.plot_label"), dataset: { xpufleet: "sweep-plot" } });
    this.empty = h("div", { class: "xf-hint" }, t("sweep.plot_empty"));
    container.append(this.el, this.empty);
    this.plot = null;
    this.resizeObserver = new ResizeObserver(() => this.resize());
    this.resizeObserver.observe(this.el);
  }

  /** Draw ``rows`` (a sweep's table) with the parameter ``path`` on x and ``metric`` on y. */
  async set(rows, path, metric) {
    const { xs, ys, categories, log } = scatterData(rows, path);
    this.el.dataset.points = String(xs.length);
    this.el.dataset.x = path;
    this.empty.hidden = xs.length > 0;
    const key = JSON.stringify([path, metric, categories, log]);
    if (!xs.length) { this.plot?.destroy(); this.plot = null; this.key = null; return; }
    const uPlot = await loadUPlot();
    if (this.destroyed) return;
    if (this.plot && this.key === key) { this.plot.setData([xs, ys]); return; }
    this.plot?.destroy();
    this.key = key;
    const grid = { stroke: "rgba(128,128,128,0.2)" };
    // room around the points, so none sits on the frame
    const xRange = categories ? () => [-0.5, categories.length - 0.5] : (u, lo, hi) => padded(lo, hi, log);
    this.plot = new uPlot({
      width: Math.max(240, this.el.clientWidth || 480), height: 220,
      scales: { x: { time: false, distr: log ? 3 : 1, range: xRange }, y: { range: (u, lo, hi) => padded(lo, hi, false) } },
      legend: { show: false },
      axes: [
        { label: path, stroke: "currentColor", grid: log ? { show: false } : grid,
          ...(categories ? { splits: () => categories.map((_, i) => i), values: (_, splits) => splits.map((i) => categories[i] ?? "") } : {}) },
        { label: metric, stroke: "currentColor", grid },
      ],
      series: [{ label: path }, { label: metric, stroke: COLORS[0], fill: COLORS[0], paths: () => null,
        points: { show: true, size: 9, space: 0, fill: COLORS[0] } }],
    }, [xs, ys], this.el);
    this.el.dataset.drawn = "true";
  }

  resize() {
    if (this.plot && this.el.clientWidth) this.plot.setSize({ width: this.el.clientWidth, height: 220 });
  }

  destroy() {
    this.destroyed = true;
    this.resizeObserver.disconnect();
    this.plot?.destroy();
  }
}

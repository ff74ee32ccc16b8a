// The charts, drawn by uPlot (web/vendor/uplot, MIT), loaded on first use only: a sweep's scatter of one
// parameter against the objective; a run's metrics are metrics_chart.mjs's.
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

// The charts of the Sweeps and Studies panels, drawn by uPlot (web/vendor/uplot, MIT): a parameter
// against the objective (a log x axis by default when the values span more than 10x, with a
// linear/log toggle and ticks written as the numbers they are), and a study's optimization history
// (each trial's value, and the best so far). The tick labels drawn last are kept in the chart's
// data-ticks attribute (the axes are drawn on a canvas).
import { loadUPlot } from "./chart.mjs";
import { h } from "./dom.mjs";
import { t } from "./i18n.mjs";

const POINT = "#1677ff";
const BEST = "#fa8c16";
const GRID = { stroke: "rgba(128,128,128,0.2)" };
const HEIGHT = 220;

/** A tick's label: the number as written, never rounded to fewer digits than it has (0.0005, 0.03). */
export function tickLabel(v) {
  return String(Number(Number(v).toPrecision(6))); // 0.0005, 0.03, 1e-7: JavaScript's own shortest form
}

/** Ticks of a log axis over [lo, hi]: 1, 2, 5 x 10^k (only the powers of ten past six decades). */
export function logTicks(lo, hi) {
  if (!(lo > 0) || !(hi > lo)) return [];
  const out = [];
  const decades = Math.log10(hi / lo);
  const mantissas = decades > 6 ? [1] : decades > 3 ? [1, 3] : [1, 2, 5];
  for (let k = Math.floor(Math.log10(lo)); k <= Math.ceil(Math.log10(hi)); k++) {
    for (const m of mantissas) {
      const v = Number((m * 10 ** k).toPrecision(6));
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push(v);
    }
  }
  return out;
}

/** Whether numbers deserve a log axis by default: all positive and spanning more than 10x. */
export function wantsLog(xs) {
  if (!xs.length || !xs.every((x) => typeof x === "number" && x > 0)) return false;
  return Math.max(...xs) / Math.min(...xs) > 10;
}

/**
 * Rows (a sweep's table, or a study's trials as {parameters, metric}) as points of one parameter (x)
 * against the objective (y); strings and booleans become categories in the order they first appear.
 */
export function pointsOf(rows, path) {
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
  return { xs: pts.map((p) => p.x), ys: pts.map((p) => p.y), categories };
}

function padded(lo, hi, log) {
  if (log) return [lo / 1.5, hi * 1.5];
  const span = hi - lo || Math.abs(lo) || 1;
  return [lo - span * 0.1, hi + span * 0.1];
}

class Base {
  constructor(container, label, empty, name) {
    this.el = h("div", { class: "xf-chart", role: "img", "aria-label": label, dataset: { xpufleet: name } });
    this.empty = h("div", { class: "xf-hint" }, empty);
    container.append(this.el, this.empty);
    this.plot = null;
    this.resizeObserver = new ResizeObserver(() => {
      if (this.plot && this.el.clientWidth) this.plot.setSize({ width: this.el.clientWidth, height: HEIGHT });
    });
    this.resizeObserver.observe(this.el);
  }

  width() { return Math.max(240, this.el.clientWidth || 480); }

  /** An axis's tick labels, recorded in data-ticks as drawn. */
  labels(attr) {
    return (u, splits) => {
      const out = splits.map((v) => (v === null || v === undefined ? "" : tickLabel(v)));
      this.el.dataset[attr] = out.join(" ");
      return out;
    };
  }

  destroy() {
    this.destroyed = true;
    this.resizeObserver.disconnect();
    this.plot?.destroy();
  }
}

/** A parameter (x) against the objective (y), with the x axis's scale chosen by the caller or by default. */
export class ParamScatter extends Base {
  constructor(container, label = t("sweep.plot_label"), empty = t("sweep.plot_empty"), name = "sweep-plot") {
    super(container, label, empty, name);
  }

  /** The scale ``set`` would draw by default for these rows: "log", "linear" or null (categories). */
  static defaultScale(rows, path) {
    const { xs, categories } = pointsOf(rows, path);
    if (categories) return null;
    return wantsLog(xs) ? "log" : "linear";
  }

  /** Draw ``rows`` with ``path`` on x (named ``xLabel``) and ``metric`` on y; ``scale`` "log" or "linear" (log needs x > 0). */
  async set(rows, path, metric, scale, xLabel = path) {
    const { xs, ys, categories } = pointsOf(rows, path);
    const log = !categories && scale === "log" && xs.length > 0 && xs[0] > 0;
    Object.assign(this.el.dataset, { points: String(xs.length), x: path, scale: categories ? "category" : (log ? "log" : "linear") });
    this.empty.hidden = xs.length > 0;
    if (!xs.length) { this.plot?.destroy(); this.plot = null; this.key = null; return; }
    const uPlot = await loadUPlot();
    if (this.destroyed) return;
    const key = JSON.stringify([path, xLabel, metric, categories, log]);
    if (this.plot && this.key === key) { this.plot.setData([xs, ys]); return; }
    this.plot?.destroy();
    this.key = key;
    const xRange = categories ? () => [-0.5, categories.length - 0.5] : (u, lo, hi) => padded(lo, hi, log);
    let xAxis;
    if (categories) {
      xAxis = { splits: () => categories.map((_, i) => i), values: (_, splits) => splits.map((i) => categories[i] ?? "") };
    } else if (log) {
      // every split labelled (uPlot's log axes label only the powers of ten by default)
      xAxis = { splits: (u, i, lo, hi) => logTicks(lo, hi), filter: (u, splits) => splits, values: this.labels("ticks") };
    } else {
      xAxis = { values: this.labels("ticks") };
    }
    this.plot = new uPlot({
      width: this.width(), height: HEIGHT,
      scales: { x: { time: false, distr: log ? 3 : 1, log: 10, range: xRange }, y: { range: (u, lo, hi) => padded(lo, hi, false) } },
      legend: { show: false },
      axes: [
        { label: xLabel, stroke: "currentColor", grid: GRID, ...xAxis },
        { label: metric, stroke: "currentColor", grid: GRID, values: (u, splits) => splits.map(tickLabel) },
      ],
      series: [{ label: path }, { label: metric, stroke: POINT, fill: POINT, paths: () => null,
        points: { show: true, size: 9, space: 0, fill: POINT } }],
    }, [xs, ys], this.el);
    this.el.dataset.drawn = "true";
  }
}

/** A study's trials in order: each finished trial's value (points) and the best value so far (a step line). */
export function historyData(trials, direction) {
  const xs = [];
  const values = [];
  const best = [];
  let top = null;
  for (const tr of [...trials].sort((a, b) => a.number - b.number)) {
    const v = tr.state === "complete" && Number.isFinite(Number(tr.value)) && tr.value !== null ? Number(tr.value) : null;
    if (v === null) continue;
    if (top === null || (direction === "minimize" ? v < top : v > top)) top = v;
    xs.push(tr.number);
    values.push(v);
    best.push(top);
  }
  return [xs, values, best];
}

export class HistoryChart extends Base {
  constructor(container) {
    super(container, t("study.history_label"), t("study.empty_chart"), "study-history");
  }

  async set(trials, metric, direction) {
    const data = historyData(trials, direction);
    this.el.dataset.points = String(data[0].length);
    this.el.dataset.best = data[2].length ? String(data[2][data[2].length - 1]) : "";
    this.empty.hidden = data[0].length > 0;
    if (!data[0].length) { this.plot?.destroy(); this.plot = null; return; }
    const uPlot = await loadUPlot();
    if (this.destroyed) return;
    if (this.plot && this.metric === metric) { this.plot.setData(data); return; }
    this.plot?.destroy();
    this.metric = metric;
    this.plot = new uPlot({
      width: this.width(), height: HEIGHT,
      scales: { x: { time: false, range: (u, lo, hi) => [lo - 0.5, hi + 0.5] }, y: { range: (u, lo, hi) => padded(lo, hi, false) } },
      axes: [
        { label: t("study.col_number"), stroke: "currentColor", grid: GRID, incrs: [1, 2, 5, 10, 20, 50, 100] },
        { label: metric, stroke: "currentColor", grid: GRID, values: this.labels("yTicks") },
      ],
      series: [{ label: t("study.col_number") },
        { label: metric, stroke: POINT, fill: POINT, paths: () => null, points: { show: true, size: 8, space: 0, fill: POINT } },
        { label: t("study.best_so_far"), stroke: BEST, width: 2, paths: uPlot.paths.stepped({ align: 1 }), points: { show: false } }],
    }, data, this.el);
    this.el.dataset.drawn = "true";
  }
}

/**
 * The controls over a parameter plot (a ParamScatter): which parameter is on x, when there are several,
 * and the x axis's scale, the default one until the user toggles it. ``kind`` ("sweep" or "study") names
 * them: data-xpufleet="<kind>-plot-x" and "<kind>-plot-scale".
 */
export class ScatterControls {
  /**
   * @param {string} kind
   * @param {ParamScatter} chart
   */
  constructor(kind, chart) {
    this.kind = kind;
    this.chart = chart;
    this.xParam = null;
    this.scale = null; // null until the user toggles it (then theirs)
    this.scaleSelect = null;
    this.el = h("div", { class: "xf-sweep-plot-head" });
  }

  /**
   * Offer ``params`` (named by ``name(path)``) and draw ``rows`` ({parameters, metric}) against ``metric``.
   * @param {string[]} params
   * @param {object[]} rows
   * @param {string} metric
   * @param {(path: string) => string} name
   */
  set(params, rows, metric, name) {
    if (!params.includes(this.xParam)) { this.xParam = params[0] || null; this.scale = null; }
    const draw = () => {
      const scale = this.scale || ParamScatter.defaultScale(rows, this.xParam);
      this.chart.set(rows, this.xParam, metric, scale, name(this.xParam));
      this.scaleSelect.value = scale || "linear";
      // categories have no scale, and a log axis needs every x above 0
      this.scaleSelect.disabled = scale === null || !rows.every((r) => !(Number(r.parameters?.[this.xParam]) <= 0));
    };
    const parts = [];
    if (params.length > 1) {
      const select = h("select", { dataset: { xpufleet: `${this.kind}-plot-x` }, "aria-label": t("sweep.plot_x"),
        onchange: () => { this.xParam = select.value; this.scale = null; draw(); } },
      params.map((p) => h("option", { value: p, selected: p === this.xParam }, name(p))));
      parts.push(h("label", {}, t("sweep.plot_x"), " ", select));
    }
    this.scaleSelect = h("select", { dataset: { xpufleet: `${this.kind}-plot-scale` }, "aria-label": t("sweep.axis_scale"),
      onchange: () => { this.scale = this.scaleSelect.value; draw(); } },
    h("option", { value: "linear" }, t("sweep.axis_linear")), h("option", { value: "log" }, t("sweep.axis_log")));
    parts.push(h("label", {}, t("sweep.axis_scale"), " ", this.scaleSelect));
    this.el.replaceChildren(...parts);
    if (this.xParam) draw();
  }
}

// The plugin's own nodes on ComfyUI's canvas (docs/canvas.md): their seeds stay as set by default.
//
// ComfyUI's front end (1.27) follows every INT input named `seed` with a "control after generate"
// widget that starts at "randomize", and its INPUT_TYPES option `control_after_generate` can only add
// or remove that widget, not change its default. A training graph's seeds must stay between Runs (the
// same seed, the same run), so a new node of ours starts at "fixed"; the user may still pick randomize,
// and a saved workflow keeps what it saved (ComfyUI sets saved widget values after nodeCreated).

export const PLUGIN_CATEGORY = "XPU Fleet";
export const SEED_CONTROL_DEFAULT = "fixed";

/** Whether a node definition (ComfyUI's nodeData) is one of the plugin's nodes. */
export function isPluginNodeDef(nodeData) {
  const category = String(nodeData?.category || "");
  return category === PLUGIN_CATEGORY || category.startsWith(`${PLUGIN_CATEGORY}/`);
}

/** Set every control-after-generate widget of ``node`` (linked to a seed widget) to "fixed". */
export function fixSeedControls(node) {
  for (const widget of node.widgets || []) {
    for (const control of widget.linkedWidgets || []) {
      if (control.options?.values?.includes(SEED_CONTROL_DEFAULT)) control.value = SEED_CONTROL_DEFAULT;
    }
  }
}

// --- results on the node ---------------------------------------------------------------------------
//
// After ComfyUI's own Run, an output node of ours gets its `ui` output through the front end's
// onExecuted: TrainingLoop and Evaluate their final metrics (`text`), ModelSaver the saved path, Predict
// its summary. TrainingLoop also draws its loss curve: live from the `xpufleet.metric` messages the
// hosted node sends (nodes/runtime.py), then the whole curve from its `ui.curve` when it has finished.

export const CANVAS_METRIC_EVENT = "xpufleet.metric";  // constants.py CANVAS_METRIC_EVENT
const SVG = "http://www.w3.org/2000/svg";
const CHART = { width: 280, height: 90, pad: 4 };
const TEXT = { lineHeight: 15, charWidth: 6.2, margin: 4 };  // margin: the DOM widget's, on each side  // xpufleet.css .xf-node-result: 11px Arial, line-height 1.35
const SERIES = [["train_loss_batch", "xf-curve-train", "train loss"], ["val_loss_step", "xf-curve-val", "val loss"]];
const RESULT_WIDGET = "xpufleet_result";

function svg(tag, attrs = {}) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

/** The SVG polyline points of ``series`` ([[step, value]...]) over the shared ``box`` of every series. */
export function polylinePoints(series, box, size = CHART) {
  const sx = (size.width - 2 * size.pad) / Math.max(box.x1 - box.x0, 1e-12);
  const sy = (size.height - 2 * size.pad) / Math.max(box.y1 - box.y0, 1e-12);
  return series.map(([x, y]) => `${(size.pad + (x - box.x0) * sx).toFixed(1)},${(size.height - size.pad - (y - box.y0) * sy).toFixed(1)}`).join(" ");
}

/** The extent of every point of every series (null when there is none). */
export function extent(curves) {
  const all = Object.values(curves).flat();
  if (!all.length) return null;
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  return { x0: Math.min(...xs), x1: Math.max(...xs), y0: Math.min(0, ...ys), y1: Math.max(...ys) };
}

/** The result view of one node: its text lines and, for a TrainingLoop, the loss chart. */
class NodeResult {
  constructor(node) {
    this.node = node;
    this.curves = { train_loss_batch: [], val_loss_step: [] };
    this.promptId = null;
    this.lines = [];
    this.text = document.createElement("div");
    this.text.className = "xf-node-result-text";
    this.chart = svg("svg", { viewBox: `0 0 ${CHART.width} ${CHART.height}`, class: "xf-node-chart", role: "img" });
    this.chart.dataset.xpufleet = "node-chart";
    this.element = document.createElement("div");
    this.element.className = "xf-node-result xf-root";
    this.element.dataset.xpufleet = "node-result";
    this.element.append(this.text);
    this.widget = node.addDOMWidget(RESULT_WIDGET, "xpufleet-result", this.element, {
      serialize: false, hideOnZoom: false, margin: TEXT.margin, getValue: () => "", setValue: () => {},
      // its own content's height (never the element's, which the node's size stretches)
      getMinHeight: () => this.height(), getMaxHeight: () => this.height(),
    });
    this.widget.serialize = false;  // never in widgets_values nor in the prompt
  }

  height() {
    // from the text itself: the element may not be laid out yet when ComfyUI asks (hidden until placed)
    const perLine = Math.max(20, Math.floor((this.node.size[0] - 28) / TEXT.charWidth));
    const rows = this.lines.reduce((n, line) => n + Math.max(1, Math.ceil(line.length / perLine)), 0);
    return rows * TEXT.lineHeight + (this.chart.isConnected ? CHART.height + 3 : 0) + 6 + 2 * TEXT.margin;
  }

  setText(lines) {
    this.lines = lines;
    this.text.replaceChildren(...lines.map((line) => {
      const el = document.createElement("div");
      el.textContent = line;
      if (line.startsWith("warning")) el.className = "xf-node-warning";
      return el;
    }));
    this.fit();
  }

  point(detail) {
    if (detail.prompt_id !== this.promptId) {  // a new Run: a new curve
      this.promptId = detail.prompt_id;
      this.curves = { train_loss_batch: [], val_loss_step: [] };
      this.setText(["training..."]);
    }
    if (Number.isFinite(detail.step)) {
      this.curves[detail.name].push([detail.step, detail.value]);
      this.draw();
    }
  }

  draw() {
    const box = extent(this.curves);
    if (!box) return;
    if (!this.chart.isConnected) { this.element.append(this.chart); this.fit(); }
    const lines = SERIES.filter(([key]) => this.curves[key].length).map(([key, cls]) =>
      svg("polyline", { points: polylinePoints(this.curves[key], box), class: cls, fill: "none" }));
    const title = svg("title");
    title.textContent = SERIES.filter(([key]) => this.curves[key].length)
      .map(([key, , label]) => `${label}: ${this.curves[key].at(-1)[1].toFixed(4)}`).join(", ") + ` (step ${box.x1})`;
    this.chart.setAttribute("aria-label", title.textContent);
    this.chart.replaceChildren(title, ...lines);
  }

  fit() {
    const size = this.node.computeSize();
    this.node.setSize([Math.max(this.node.size[0], size[0]), Math.max(this.node.size[1], size[1])]);
    this.node.setDirtyCanvas?.(true, true);
  }
}

function resultOf(node) {
  if (!node.xpufleetResult) node.xpufleetResult = new NodeResult(node);
  return node.xpufleetResult;
}

/** onExecuted of one of our output nodes: ``output`` is its `ui` dict (lists, as ComfyUI sends them). */
export function showExecuted(node, output) {
  if (!output || !Array.isArray(output.text)) return;
  const view = resultOf(node);
  // one entry may hold several lines (Predict's summary): each line is a row of the view and of its height
  view.setText(output.text.flatMap((entry) => String(entry).split("\n")));
  const curve = Array.isArray(output.curve) ? output.curve[0] : null;
  if (curve) {
    view.curves = { train_loss_batch: curve.train_loss_batch || [], val_loss_step: curve.val_loss_step || [] };
    view.draw();
  }
}

/** A live metric point (the `xpufleet.metric` message's detail) for the node it names. */
export function showLivePoint(graph, detail) {
  const node = graph?.getNodeById?.(Number(detail?.node)) ?? graph?.getNodeById?.(detail?.node);
  if (!SERIES.some(([key]) => key === detail?.name)) return;  // only the loss curves are drawn live
  if (node && isPluginNodeDef({ category: node.constructor?.nodeData?.category })) resultOf(node).point(detail);
}

// --- the canvas run's name ---------------------------------------------------------------------------
//
// A canvas Run of a graph with our nodes is recorded on the sidecar (docs/canvas-runs.md); ComfyUI's server
// does not know the workflow's name, so the page that queued the prompt says it when the prompt starts.

export const CANVAS_NAME_ROUTE = "/xpufleet/canvas/name";  // server/comfy/routes.py

/** On ``execution_start`` of a prompt this page queued: the workflow's name, when the graph has our nodes. */
export function nameCanvasRun(api, app, detail) {
  const name = app.extensionManager?.workflow?.activeWorkflow?.filename;
  const ours = (app.graph?.nodes || []).some((n) => isPluginNodeDef({ category: n.constructor?.nodeData?.category }));
  if (!name || !ours || !detail?.prompt_id) return;
  api.fetchApi(CANVAS_NAME_ROUTE, { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt_id: detail.prompt_id, name: String(name) }) }).catch(() => {});
}

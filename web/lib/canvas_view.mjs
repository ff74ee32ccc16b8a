// A graph of ours opens readable (docs/comfyui.md, "Templates open readable"): LiteGraph draws nodes as
// empty boxes below its low-quality zoom (min_font_size_for_lod / (NODE_TEXT_SIZE * sqrt(dpr)), about 0.57
// at a device pixel ratio of 1), and front end 1.5x fits a template to 75% of the canvas, which for
// the plugin's templates is about 51%. After such a graph is loaded, the view is framed at a zoom where
// its nodes draw whole: the whole graph when it fits at that zoom, else its top-left part.
import { isPluginNodeDef } from "./canvas_nodes.mjs";

const MARGIN = 40;          // screen pixels around the graph
const ABOVE_LOW = 1.1;      // how far above the low-quality zoom the view lands
const SETTLE_FRAMES = 90;   // the front end frames a loaded graph a few frames later (1.5x schedules it)
const TITLE = 30;           // a node's title bar, above its pos, when the node has no boundingRect

/** The zoom below which this canvas draws nodes as boxes (its own figure where it has one). */
export function lowQualityZoom(canvas) {
  if (Number.isFinite(canvas?._lowQualityZoomThreshold) && canvas._lowQualityZoomThreshold > 0) {
    return canvas._lowQualityZoomThreshold;
  }
  const lod = Number(canvas?.min_font_size_for_lod ?? 8);
  const text = Number(globalThis.LiteGraph?.NODE_TEXT_SIZE ?? 14);
  return lod / (text * Math.sqrt(window.devicePixelRatio || 1));
}

/** [x, y, width, height] around the graph's nodes and groups, in canvas units (null when empty). */
export function graphBounds(graph) {
  const rects = [];
  for (const n of graph?.nodes || []) {
    const r = n.boundingRect;
    rects.push(r && r.length === 4 ? [...r] : [n.pos[0], n.pos[1] - TITLE, n.size[0], n.size[1] + TITLE]);
  }
  for (const g of graph?._groups || graph?.groups || []) {
    const r = g._bounding || g.boundingRect;
    if (r && r.length === 4) rects.push([...r]);
  }
  if (!rects.length) return null;
  const x0 = Math.min(...rects.map((r) => r[0])), y0 = Math.min(...rects.map((r) => r[1]));
  const x1 = Math.max(...rects.map((r) => r[0] + r[2])), y1 = Math.max(...rects.map((r) => r[1] + r[3]));
  return [x0, y0, x1 - x0, y1 - y0];
}

/**
 * The view (scale, offset) that frames ``bounds`` in the canvas area ``[x, y, width, height]`` (CSS pixels
 * from the canvas's corner) at ``minScale`` or more: centred when it fits there, else its top-left corner
 * at the area's top-left (a pure function).
 */
export function readableView(bounds, area, minScale, maxScale = 1) {
  const [x, y, w, h] = bounds;
  const [ax, ay, aw, ah] = area;
  const fit = Math.min((aw - 2 * MARGIN) / Math.max(w, 1), (ah - 2 * MARGIN) / Math.max(h, 1));
  const scale = Math.max(Math.min(fit, maxScale), minScale);
  const left = w * scale <= aw - 2 * MARGIN ? ax + (aw - w * scale) / 2 : ax + MARGIN;
  const top = h * scale <= ah - 2 * MARGIN ? ay + (ah - h * scale) / 2 : ay + MARGIN;
  // LiteGraph draws a canvas point p at (p + offset) * scale
  return { scale, offset: [left / scale - x, top / scale - y] };
}

/** How far the page's own bars (1.5x's side and top bars lie over the canvas) cover the canvas's left and
 * top edges, found by asking the page what lies at points along its middle lines (bounded: 480 px). */
function covered(el) {
  const rect = el.getBoundingClientRect();
  const first = (along) => {
    for (let d = 0; d < 480; d += 8) {
      const at = along(d);
      if (at === el || at?.contains?.(el)) return d;
    }
    return 0;
  };
  return [first((d) => document.elementFromPoint(rect.left + d, rect.top + rect.height / 2)),
          first((d) => document.elementFromPoint(rect.left + rect.width / 2, rect.top + d))];
}

/** The canvas's size on screen in CSS pixels (the front end's own figure where it has one). */
function viewportSize(canvas) {
  if (typeof canvas.ds.getViewportSize === "function") return canvas.ds.getViewportSize();
  const rect = canvas.canvas?.getBoundingClientRect();
  return [rect?.width || 0, rect?.height || 0];
}

function hasPluginNode(graph) {
  return (graph?.nodes || []).some((n) => isPluginNodeDef({ category: n.constructor?.nodeData?.category }));
}

let watching = 0; // the load being watched (a newer load ends the older watch)

/**
 * After a graph is loaded (the afterConfigureGraph hook): for a graph with the plugin's nodes, watch a few
 * frames while the front end frames it, and re-frame it readable whenever it lands in low quality. The
 * user's first wheel or pointer press on the canvas ends the watch.
 */
export function keepReadable(app) {
  const canvas = app?.canvas;
  if (!canvas?.ds || !hasPluginNode(app.graph)) return;
  const id = ++watching;
  let frames = 0;
  let userMoved = false;
  const el = canvas.canvas;
  const stop = () => { userMoved = true; };
  el?.addEventListener("wheel", stop, { once: true, passive: true });
  el?.addEventListener("pointerdown", stop, { once: true });
  const tick = () => {
    if (id !== watching || userMoved || frames++ > SETTLE_FRAMES) {
      el?.removeEventListener("wheel", stop);
      el?.removeEventListener("pointerdown", stop);
      return;
    }
    const low = lowQualityZoom(canvas);
    const [width, height] = viewportSize(canvas);
    const bounds = graphBounds(app.graph);
    if (width > 0 && height > 0 && bounds && canvas.ds.scale < low) {
      const [left, top] = covered(el);
      const area = [left, top, width - left, height - top];
      const view = readableView(bounds, area, low * ABOVE_LOW, canvas.ds.max_scale || 1);
      canvas.ds.scale = view.scale;
      canvas.ds.offset[0] = view.offset[0];
      canvas.ds.offset[1] = view.offset[1];
      canvas.setDirty(true, true);
      el.dataset.xfReadable = String(view.scale); // for the browser tests: this module framed it
    }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}

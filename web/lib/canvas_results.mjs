// A run queued from this canvas (Queue on...) shows its results on the canvas's output nodes, as ComfyUI
// shows its own Run's (docs/comfyui.md "Results come home"): the page follows the run; once it has
// succeeded its files are copied into ComfyUI's output folder (gallery.mjs galleryItems) and each output
// node gets the `ui` output ComfyUI's `executed` message would have given it ({images: [{filename,
// subfolder, type}]}), through the front end's own `executed` path (api.dispatchCustomEvent: the node
// output store, node.onExecuted), or, on a front end without it, app.nodeOutputs and node.onExecuted.
// Only while the workflow that queued the run is the one on the canvas. The runs followed are kept for
// this tab (sessionStorage), so a reload goes on following them.
import { sleep } from "./dom.mjs";
import { galleryItems, nodeOutputs } from "./gallery.mjs";

const STORE = "XPUFleet.CanvasRuns";
const KEEP = 20; // runs followed at once (the newest)
const FOLLOW_MS = 24 * 3600 * 1000; // a run followed longer than this is left to the Runs panel
const RETRY_MS = 3000;

function stored() {
  try {
    const list = JSON.parse(sessionStorage.getItem(STORE) || "[]");
    return Array.isArray(list) ? list : [];
  } catch {
    return [];
  }
}

function store(list) {
  try { sessionStorage.setItem(STORE, JSON.stringify(list.slice(-KEEP))); } catch { /* storage off: this page only */ }
}

export class CanvasResults {
  /**
   * @param {object} o
   * @param {import("./api.mjs").Fleet} o.fleet
   * @param {object} o.app  ComfyUI's app
   * @param {object} o.api  ComfyUI's api (dispatchCustomEvent)
   * @param {() => string} o.activeKey  the workflow on the canvas now (its path, else its name)
   */
  constructor({ fleet, app, api, activeKey }) {
    Object.assign(this, { fleet, app, api, activeKey });
    this.following = new Map(); // run id -> AbortController
    this.shown = new Map(); // run id -> the outputs put on the canvas (tests read it)
  }

  /** Follow the runs this tab queued before a reload. */
  resume() {
    for (const { run, key } of stored()) this.follow(run, key, false);
  }

  /** Follow ``runId``, queued from the workflow ``key``. */
  follow(runId, key, remember = true) {
    if (!runId || this.following.has(runId)) return;
    if (remember) store([...stored().filter((x) => x.run !== runId), { run: runId, key }]);
    const ctl = new AbortController();
    this.following.set(runId, ctl);
    this.wait(runId, key, ctl.signal).finally(() => {
      this.following.delete(runId);
      store(stored().filter((x) => x.run !== runId));
    });
  }

  stop() {
    for (const ctl of this.following.values()) ctl.abort();
  }

  async wait(runId, key, signal) {
    let cursor = 0;
    const until = Date.now() + FOLLOW_MS;
    while (!signal.aborted && Date.now() < until) {
      let page;
      try {
        page = await this.fleet.events(runId, cursor, 10, { signal });
      } catch (err) {
        if (err?.name === "AbortError" || err?.status === 404) return; // gone (deleted)
        await sleep(RETRY_MS, signal);
        continue;
      }
      cursor = page.cursor;
      if (page.done) {
        if (page.status === "succeeded") await this.bringHome(runId, key, signal);
        return;
      }
    }
  }

  async bringHome(runId, key, signal) {
    let items;
    try {
      items = await galleryItems(this.fleet, runId, signal);
    } catch (err) {
      if (err?.name !== "AbortError") console.warn(`XPU Fleet: the results of run ${runId} did not come home:`, err);
      return;
    }
    if (key !== this.activeKey()) return; // another workflow is on the canvas now
    this.show(runId, nodeOutputs(items));
  }

  /** Put ``outputs`` ({node id: ui output}) on the canvas's nodes. */
  show(runId, outputs) {
    const { app, api } = this;
    // kept with the workflow too, as the front end keeps its own results: shown again when its tab is
    const tracker = app.extensionManager?.workflow?.activeWorkflow?.changeTracker;
    for (const [node, output] of Object.entries(outputs)) {
      if (tracker) (tracker.nodeOutputs ??= {})[node] = output;
      if (typeof api?.dispatchCustomEvent === "function") {
        api.dispatchCustomEvent("executed", { node, display_node: node, output, prompt_id: `xpufleet-${runId}` });
      } else { // an older front end: its canvas draws app.nodeOutputs
        app.nodeOutputs = { ...(app.nodeOutputs || {}), [node]: output };
        app.graph?.getNodeById?.(Number(node))?.onExecuted?.(output);
      }
    }
    app.graph?.setDirtyCanvas?.(true, true);
    this.shown.set(runId, outputs);
  }
}

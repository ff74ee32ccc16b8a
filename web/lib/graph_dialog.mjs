// The frame the Queue on... and New sweep dialogs share (docs/workers.md): one of a kind open at a time;
// the graph, this server's devices and the workers loaded while it says "Loading"; a form headed by its
// title and a line when there is no graph to send, ending with the error box, Cancel and the submit
// button; a submit that closes the dialog when the server takes it and shows its refusal otherwise. A
// dialog holds one GraphDialog (composition) and draws its own fields in between.
import { ApiFailure } from "./api.mjs";
import { h, nextId, replace } from "./dom.mjs";
import { t } from "./i18n.mjs";

/**
 * One dialog of a kind open at a time: the returned function focuses the open one, else makes one with
 * ``make(o, closed)`` (``closed``: to call when it closes) and opens it.
 * @param {(o: object, closed: () => void) => {frame: GraphDialog, open: () => Promise<void>}} make
 */
export function singleDialog(make) {
  let current = null;
  return async (o) => {
    if (current) { current.frame.focus(); return current; }
    const dlg = make(o, () => { if (current === dlg) current = null; });
    current = dlg;
    await dlg.open();
    return dlg;
  };
}

export class GraphDialog {
  /**
   * @param {object} o
   * @param {string} o.kind  "queue" or "sweep": data-xpufleet="<kind>-dialog", "<kind>-error", "<kind>-submit"
   * @param {string} o.classes  the <dialog>'s classes besides xf-dialog and xf-root
   * @param {() => string} o.title
   * @param {() => void} o.onClose  the dialog's own clean-up when it closes
   */
  constructor({ kind, classes, title, onClose }) {
    this.kind = kind;
    this.title = title;
    this.onClose = onClose;
    this.titleId = nextId(`xf-${kind}-title`);
    this.el = h("dialog", { class: `xf-dialog ${classes} xf-root`, "aria-labelledby": this.titleId,
      dataset: { xpufleet: `${kind}-dialog` } });
    this.el.addEventListener("close", () => this.destroy());
    this.el.addEventListener("cancel", () => this.destroy());
    this.errorBox = null;
    this.submitBtn = null;
  }

  focus() { this.el.querySelector("input, select, button")?.focus(); }

  heading() { return h("h2", { id: this.titleId }, this.title()); }

  loading() { replace(this.el, this.heading(), h("p", { class: "xf-hint" }, t("common.loading"))); }

  /**
   * Show the dialog, saying "Loading" until what it offers is read.
   * @param {object} o
   * @param {import("./api.mjs").Fleet} o.fleet
   * @param {() => Promise<{prompt: object|null, name: string, problem?: string}>} o.graph  the graph to send
   * @param {() => Promise<string[]>} o.localDevices  this server's devices
   * @returns {Promise<{graph: object, workers: object[], pools: object[], workersError: Error|null, local: string[]}>}
   */
  async load({ fleet, graph, localDevices }) {
    document.body.append(this.el);
    this.loading();
    this.el.showModal();
    const [g, w, local] = await Promise.allSettled([graph(), fleet.workers(), localDevices()]);
    const listed = w.status === "fulfilled" ? w.value : {};
    return {
      graph: g.status === "fulfilled" ? g.value : { prompt: null, name: "", problem: String(g.reason?.message || g.reason) },
      workers: listed.workers || [],
      pools: listed.pools || [],
      workersError: w.status === "rejected" ? w.reason : null,
      local: local.status === "fulfilled" && local.value?.length ? local.value : ["cpu"],
    };
  }

  /**
   * Draw the form: the title, ``graph``'s problem when it has no prompt, ``fields``, the error box,
   * Cancel and the submit button (``submitText``; disabled without a graph), which calls ``onSubmit``.
   */
  form(graph, submitText, onSubmit, ...fields) {
    this.errorBox = h("div", { class: "xf-error", role: "alert", dataset: { xpufleet: `${this.kind}-error` } });
    this.submitBtn = h("button", { type: "submit", class: "xf-primary", disabled: !graph.prompt,
      dataset: { xpufleet: `${this.kind}-submit` } }, submitText);
    replace(this.el, h("form", { method: "dialog", onsubmit: (e) => { e.preventDefault(); onSubmit(); } },
      this.heading(),
      graph.prompt ? null : h("div", { class: "xf-error" }, graph.problem || t("queue.no_graph")),
      fields,
      this.errorBox,
      h("div", { class: "xf-actions" },
        h("button", { type: "button", class: "xf-secondary", onclick: () => this.close() }, t("common.cancel")), this.submitBtn)));
  }

  /**
   * Submit through ``request``: taken, the dialog closes and ``then`` gets the answer; refused, the
   * server's words (and each node's error) show in the error box.
   */
  async send(request, then) {
    replace(this.errorBox);
    this.submitBtn.disabled = true;
    try {
      const answer = await request();
      this.close();
      then(answer);
    } catch (err) {
      const lines = [err instanceof ApiFailure ? err.message : String(err)];
      for (const [nid, entry] of Object.entries(err.body?.node_errors || {})) {
        for (const ne of entry.errors || []) lines.push(`${t("queue.node")} ${nid}: ${ne.message}`);
      }
      replace(this.errorBox, lines.map((l) => h("div", {}, l)));
      this.submitBtn.disabled = false;
    }
  }

  destroy() {
    if (!this.el.isConnected) return; // closed already (close() and the close event both end here)
    this.onClose();
    this.el.remove();
  }

  close() {
    if (this.el.open) this.el.close();
    this.destroy();
  }
}

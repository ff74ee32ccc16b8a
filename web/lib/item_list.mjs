// The list side of the Sweeps and Studies panels (docs/sweeps.md): the items the server lists, refreshed
// every LIST_REFRESH_MS while mounted, the selected one marked, a failed request shown in place. A panel
// owns one and says how to load the items and what a row shows; picking a row calls its onSelect.
import { h, replace, sleep } from "./dom.mjs";
import { shortId } from "./format.mjs";

const LIST_REFRESH_MS = 2000;

export class ItemList {
  /**
   * @param {object} o
   * @param {string} o.kind  "sweep" or "study": data-xpufleet="<kind>-list", data-<kind>-id
   * @param {() => string} o.none  the text of an empty list
   * @param {(name: string) => string} o.open  a row's button label
   * @param {(signal: AbortSignal) => Promise<object[]>} o.load  the items, newest first
   * @param {(item: object) => {status: string, hint: string, counts: string}} o.row  what a row shows besides the name
   * @param {(id: string) => void} o.onSelect
   */
  constructor({ kind, none, open, load, row, onSelect }) {
    this.kind = kind;
    this.none = none;
    this.open = open;
    this.load = load;
    this.row = row;
    this.onSelect = onSelect;
    this.items = [];
    this.error = null;
    this.selected = null;
    this.abort = null;
    this.el = h("div", { class: "xf-run-list", role: "list", dataset: { xpufleet: `${kind}-list` } });
  }

  /** Refresh until ``signal`` aborts (the panel's unmount). */
  async start(signal) {
    this.abort = signal;
    while (!signal.aborted) {
      await this.refresh();
      await sleep(LIST_REFRESH_MS, signal);
    }
  }

  async refresh() {
    try {
      this.items = await this.load(this.abort);
      this.error = null;
    } catch (err) {
      if (err?.name === "AbortError") return;
      this.error = err;
    }
    this.render();
  }

  select(id) {
    this.selected = id;
    this.render();
  }

  render() {
    if (this.error) { replace(this.el, h("div", { class: "xf-error", role: "alert" }, this.error.message)); return; }
    if (!this.items.length) { replace(this.el, h("div", { class: "xf-hint" }, this.none())); return; }
    const idKey = `${this.kind}Id`;
    replace(this.el, this.items.map((s) => {
      const { status, hint, counts } = this.row(s);
      const name = s.name || shortId(s.id);
      return h("div", { role: "listitem", class: `xf-run-row${this.selected === s.id ? " xf-selected" : ""}`,
        dataset: { [idKey]: s.id, status: s.status } },
      h("button", { type: "button", class: "xf-run-pick", "aria-label": this.open(name),
        "aria-current": this.selected === s.id ? "true" : "false", onclick: () => this.onSelect(s.id) },
      h("span", { class: `xf-status xf-sweep-${s.status}` }, status),
      h("span", { class: "xf-run-name" }, name),
      h("span", { class: "xf-hint" }, ` ${shortId(s.id)} · ${hint}`),
      h("span", { class: "xf-budget-col" }, counts)));
    }));
  }
}

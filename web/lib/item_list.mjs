// The skeleton the Runs, Sweeps and Studies panels share (docs/runs-panel.md, docs/sweeps.md): a list of
// the items the server lists, refreshed every LIST_REFRESH_MS while mounted, the selected one marked, a
// failed request shown in place; beside it the detail of the selected item, which its panel fills and
// follows until an AbortSignal says the item is no longer shown (another pick, a delete, the unmount).
// A panel holds one ListPanel (composition): it says what a row shows and how an item is shown.
import { h, replace, sleep } from "./dom.mjs";
import { shortId } from "./format.mjs";
import { t } from "./i18n.mjs";

const LIST_REFRESH_MS = 2000;
const LONG_POLL_S = 20;
const PROGRESS_POLL_S = 1; // while a row runs: its progress does not move the item's version
const RETRY_MS = 2000;

/** An error as the panels show it in place. */
export function errorBox(err) {
  return h("div", { class: "xf-error", role: "alert" }, err.message);
}

export class ItemList {
  /**
   * @param {string} kind  "run", "sweep" or "study": data-xpufleet="<kind>-list", data-<kind>-id
   * @param {object} spec  what the panel says of its items:
   * @param {() => string} spec.none  the text of an empty list
   * @param {(name: string) => string} spec.open  a row's button label
   * @param {(signal: AbortSignal) => Promise<object[]>} spec.load  the items, newest first
   * @param {(item: object) => {statusClass: string, status: string, hint: string, cells?: Node[], below?: Node[]}} spec.row
   *   what a row shows besides the name: its status, a hint after the short id, more cells in the row's
   *   button and lines below it
   * @param {(id: string) => void} spec.onSelect  a row picked
   */
  constructor(kind, spec) {
    this.kind = kind;
    this.spec = spec;
    this.el = h("div", { class: "xf-run-list", role: "list", dataset: { xpufleet: `${kind}-list` } });
    this.items = [];
    this.error = null;
    this.selected = null;
    this.abort = null;
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
      this.items = await this.spec.load(this.abort);
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
    if (this.error) { replace(this.el, errorBox(this.error)); return; }
    if (!this.items.length) { replace(this.el, h("div", { class: "xf-hint" }, this.spec.none())); return; }
    const idKey = `${this.kind}Id`;
    replace(this.el, this.items.map((s) => {
      const { statusClass, status, hint, cells, below } = this.spec.row(s);
      const name = s.name || shortId(s.id);
      return h("div", { role: "listitem", class: `xf-run-row${this.selected === s.id ? " xf-selected" : ""}`,
        dataset: { [idKey]: s.id, status: s.status } },
      h("button", { type: "button", class: "xf-run-pick", "aria-label": this.spec.open(name),
        "aria-current": this.selected === s.id ? "true" : "false", onclick: () => this.spec.onSelect(s.id) },
      h("span", { class: `xf-status ${statusClass}` }, status),
      h("span", { class: "xf-run-name" }, name),
      h("span", { class: "xf-hint" }, ` ${shortId(s.id)} · ${hint}`),
      cells),
      below);
    }));
  }
}

/**
 * @typedef {object} ItemView  what the panel that holds a ListPanel does for it
 * @property {(id: string, signal: AbortSignal) => void} show  fill the ListPanel's ``detail`` (and ``head``)
 *   for item ``id``, and follow it until ``signal`` aborts
 * @property {() => void} [render]  draw ``item`` (what ``poll`` follows) anew
 * @property {() => void} [renderTable]  draw its rows anew (only their progress moved)
 */

export class ListPanel {
  /**
   * @param {ItemView} owner  the panel
   * @param {object} o
   * @param {string} o.kind  "run", "sweep" or "study": the list's (ItemList), data-xpufleet="<kind>-detail"
   * @param {string} o.texts  the i18n prefix of the panel's title, pick (before a pick), none (an empty list)
   *   and open (a row's label): "runs" reads runs.title, runs.pick, ...
   * @param {object} o.frame  the panel's frame
   * @param {string} o.frame.panel  the root's data-xpufleet ("sweeps-panel")
   * @param {string} o.frame.classes  the root's classes besides xf-panel and xf-root
   * @param {() => Node[]} [o.frame.tools]  the header's filters, after the title
   * @param {() => Node[]} [o.frame.buttons]  the header's buttons, after Refresh
   * @param {object} o.list  the ItemList's load and row (and none, to word an empty list otherwise)
   */
  constructor(owner, { kind, texts, frame, list }) {
    this.owner = owner;
    this.frame = { kind, texts, ...frame };
    // while mounted: where, the detail section, the signal that ends the mount
    this.container = null;
    this.detail = null;
    this.abort = null;
    this.list = new ItemList(kind, { none: () => t(`${texts}.none`), open: (name) => t(`${texts}.open`, { name }), ...list,
      onSelect: (id) => this.select(id) });
    // the item shown: its id, the last read of it, its head, the signal that ends it, its charts
    this.selected = null;
    this.item = null;
    this.head = null;
    this.detailAbort = null;
    this.kept = [];
  }

  mount(container) {
    if (this.container === container && container.contains(this.detail)) return;
    this.unmount();
    this.container = container;
    this.abort = new AbortController();
    const { kind, texts, panel, classes, tools, buttons } = this.frame;
    this.detail = h("section", { class: "xf-run-detail", "aria-live": "polite", dataset: { xpufleet: `${kind}-detail` } },
      h("div", { class: "xf-hint" }, t(`${texts}.pick`)));
    const root = h("div", { class: `xf-panel ${classes} xf-root`, dataset: { xpufleet: panel } },
      h("header", { class: "xf-panel-head" }, h("h2", {}, t(`${texts}.title`)), tools?.(), h("span", { class: "xf-grow" }),
        h("button", { type: "button", onclick: () => this.refresh() }, t("common.refresh")), buttons?.()),
      h("div", { class: "xf-panel-body" }, this.list.el, this.detail));
    replace(container, root);
    this.list.start(this.abort.signal);
    if (this.selected) this.select(this.selected);
  }

  unmount() {
    this.abort?.abort();
    this.detailAbort?.abort();
    this.release();
    this.container = null;
  }

  /** Show item ``id`` (now, when mounted; else at the next mount). */
  focus(id) {
    this.selected = id;
    if (this.container) { this.refresh(); this.select(id); }
  }

  refresh() {
    return this.list.refresh();
  }

  select(id) {
    this.selected = id;
    this.list.select(id);
    this.detailAbort?.abort();
    this.detailAbort = new AbortController();
    this.release();
    this.item = null;
    this.head = h("div", { class: "xf-run-head" });
    this.owner.show(id, this.detailAbort.signal);
  }

  /** ``part`` (a chart) lives while the item is shown: destroyed before the next one and on unmount. */
  keep(part) {
    this.kept.push(part);
    return part;
  }

  release() {
    for (const part of this.kept.splice(0)) part.destroy();
  }

  /** Run ``fn`` (an action on the item); a refusal shows in the item's head. */
  async act(fn) {
    try {
      await fn();
      return true;
    } catch (err) {
      this.fail(err);
      return false;
    }
  }

  fail(err) {
    this.head.append(errorBox(err));
  }

  /** Delete the shown item through ``fn``, then say ``deletedText`` in its place. */
  async remove(fn, deletedText) {
    this.detailAbort?.abort(); // nothing more is read of an item being deleted (a late read would 404)
    if (!(await this.act(fn))) return; // refused: the error stays in view; picking it again reloads it
    this.selected = null;
    this.list.select(null);
    this.release();
    replace(this.detail, h("div", { class: "xf-hint" }, deletedText));
    this.refresh();
  }

  /**
   * Follow the shown item through the server's long poll (GET ...?version=&wait=) until it ends or
   * ``signal`` aborts, kept in ``item``: the owner's render draws it when its version or status moved,
   * its renderTable when only a row's progress did. A lost item (404) says so in place of the detail,
   * any other failure in its head.
   * @param {AbortSignal} signal
   * @param {object} o
   * @param {(query: object, signal: AbortSignal) => Promise<object>} o.get  the item ({} first, then {version, wait})
   * @param {(item: object) => object[]} o.rows  its rows (each may have a ``progress``)
   * @param {(row: object) => boolean} o.running
   * @param {(item: object) => boolean} o.ended
   */
  async poll(signal, { get, rows, running, ended }) {
    const progress = (item) => JSON.stringify(rows(item).map((r) => r.progress));
    while (!signal.aborted) {
      const last = this.item;
      let item;
      try {
        const query = last === null ? {} : { version: last.version, wait: rows(last).some(running) ? PROGRESS_POLL_S : LONG_POLL_S };
        item = await get(query, signal);
      } catch (err) {
        if (err?.name === "AbortError") return;
        if (err?.status === 404) { replace(this.detail, errorBox(err)); return; }
        replace(this.head, errorBox(err));
        await sleep(RETRY_MS, signal);
        continue;
      }
      if (signal.aborted) return; // another item came in view while this read was answered
      this.item = item;
      if (last === null || item.version !== last.version || item.status !== last.status) this.owner.render();
      else if (progress(item) !== progress(last)) this.owner.renderTable();
      if (ended(item)) { this.refresh(); return; }
    }
  }
}

// The Sweeps view (docs/workers.md "Sweep 與 study", docs/sweeps.md): the sweeps with their children's counts, and one
// sweep's ranked table (each variant's parameters, status, objective, worker and devices, its run a link
// to the Runs panel), live through the server's long poll (GET /api/sweeps/{id}?version=&wait=), a
// scatter of a parameter against the objective (a log x axis by default past a 10x range, with a toggle),
// a running variant's progress, Cancel, Delete and the CSV. The ranking, the counts, the progress and the
// sweep's status are the server's. A sweep of a ComfyUI workflow (a fan-out of seeds, any widget of any
// node) also shows its variants' images in variant order, each run's files copied home first
// (gallery.mjs); for two parameters an XY grid with the values on its axes.
import { Gallery, galleryItems } from "./gallery.mjs";
import { ParamScatter, ScatterControls } from "./sweep_charts.mjs";
import { h, replace, saveBlob } from "./dom.mjs";
import { shortId, when } from "./format.mjs";
import { t } from "./i18n.mjs";
import { ListPanel } from "./item_list.mjs";

const ENDED = new Set(["finished", "cancelled"]);

/** A child's status text (a variant whose run was deleted says so). */
function rowStatus(status) {
  return status === "deleted" ? t("sweep.row_deleted") : t(`runs.status.${status}`);
}

function countsText(counts) {
  return Object.entries(counts || {}).map(([s, n]) => `${n} ${rowStatus(s)}`).join(" · ");
}

/** A running variant's progress (the server's last progress event): a bar and "epoch 2/5 · 7/20". */
export function progressCell(p, variant) {
  if (!p) return "—";
  const max = Math.max(1, Number(p.max || 1));
  const value = Math.min(max, Number(p.value || 0));
  return h("div", { class: "xf-progress", dataset: { xpufleet: "sweep-progress", value: String(value), max: String(max) } },
    h("progress", { max: String(max), value: String(value), "aria-label": t("sweep.progress_label", { n: variant }) }),
    h("span", { class: "xf-hint" }, ` ${[p.text, `${value}/${max}`].filter(Boolean).join(" · ")}`));
}

/** A parameter's name by node title ("Optimizer lr", the server's ``labels``), else its path. */
export function label(item, path) {
  return item?.labels?.[path] || path;
}

function metricText(v) {
  return v === null || v === undefined ? "—" : (typeof v === "number" ? v.toPrecision(4) : String(v));
}

/** A sweep's or a study's name and status, its head's first line (data-xpufleet="<kind>-status"). */
export function titleLine(kind, item, statusText) {
  return h("h3", {}, item.name || shortId(item.id), " ", h("span", { class: `xf-status xf-sweep-${item.status}`,
    dataset: { xpufleet: `${kind}-status`, status: item.status } }, statusText));
}

export function objectiveLine(obj = {}) {
  return h("div", { class: "xf-kvline" },
    `${t("sweep.objective")}: ${obj.metric} (${obj.direction === "minimize" ? t("sweep.minimize") : t("sweep.maximize")})`);
}

/**
 * A sweep's or a study's buttons (data-xpufleet="<kind>-cancel", "-delete", "-csv"): Cancel while it is
 * ``active``, else Delete; then its CSV.
 * @param {import("./item_list.mjs").ListPanel} view  the panel's skeleton (its act and remove)
 * @param {import("./api.mjs").Collection} items  the requests on such items
 * @param {{cancelText: string, deleted: string}} texts  the Cancel button's, and what a delete leaves
 */
export function itemActions(view, kind, item, active, items, { cancelText, deleted }) {
  return h("div", { class: "xf-actions" },
    active
      ? h("button", { type: "button", class: "xf-danger", dataset: { xpufleet: `${kind}-cancel` }, disabled: item.status === "cancelling",
        onclick: async (e) => { e.currentTarget.disabled = true; await view.act(() => items.cancel(item.id)); } }, cancelText)
      : h("button", { type: "button", dataset: { xpufleet: `${kind}-delete` }, onclick: () => view.remove(() => items.remove(item.id), deleted) }, t("runs.delete")),
    h("button", { type: "button", dataset: { xpufleet: `${kind}-csv` }, onclick: () => view.act(async () => {
      saveBlob(await (await items.csv(item.id)).blob(), `${kind}-${item.id}.csv`);
    }) }, t("sweep.csv")));
}

/** A row's run as a link to the Runs panel ("—" when it has none, or it was deleted). */
export function runLink(r, deleted, openRun) {
  return r.run_id && !deleted
    ? h("button", { type: "button", class: "xf-link", "aria-label": t("runs.open", { name: r.name || shortId(r.run_id) }),
      onclick: () => openRun(r.run_id) }, shortId(r.run_id))
    : "—";
}

/** The table of a sweep's variants or a study's trials (data-xpufleet="<kind>-table"). */
export function itemTable(kind, head, rows) {
  return h("table", { class: "xf-devices-table xf-sweep-table", dataset: { xpufleet: `${kind}-table` } },
    h("thead", {}, h("tr", {}, head.map((c) => h("th", { scope: "col" }, c)))), h("tbody", {}, rows));
}

/**
 * The list of sweeps or studies (``items``: the first 100), each row with its status, ``hint(item)`` and
 * its runs' counts (``counts(item.counts)``).
 */
export function collectionList(kind, items, { hint, counts }) {
  return {
    load: async (signal) => (await items.list({ limit: 100 }, { signal }))[items.key] || [],
    row: (s) => ({ statusClass: `xf-sweep-${s.status}`, status: t(`${kind}.status.${s.status}`), hint: hint(s),
      cells: [h("span", { class: "xf-budget-col" }, counts(s.counts))] }),
  };
}

export class SweepsPanel {
  /**
   * @param {object} o
   * @param {import("./api.mjs").Fleet} o.fleet
   * @param {(runId: string) => void} o.openRun   a variant's run in the Runs panel
   * @param {() => void} o.openRuns               back to the Runs panel
   * @param {() => void} o.newSweep               open the New sweep dialog
   */
  constructor({ fleet, openRun, openRuns, newSweep }) {
    this.fleet = fleet;
    this.openRun = openRun;
    this.plot = null;
    this.tableBox = null;
    this.imagesBox = null;
    this.homes = new Map(); // a variant's run id -> its files (null while they come home; {error})
    this.view = new ListPanel(this, {
      kind: "sweep", texts: "sweep", frame: { panel: "sweeps-panel", classes: "xf-sweeps", buttons: () => [
        h("button", { type: "button", class: "xf-primary", dataset: { xpufleet: "new-sweep" }, onclick: () => newSweep() }, t("sweep.new")),
        h("button", { type: "button", dataset: { xpufleet: "open-runs" }, onclick: () => openRuns() }, t("runs.title"))] },
      list: collectionList("sweep", fleet.sweeps,
        { hint: (s) => `${t("sweep.n_runs", { n: s.n_runs })} · ${s.objective?.metric || ""}`, counts: countsText }),
    });
  }

  mount(container) { this.view.mount(container); }
  unmount() { this.view.unmount(); }
  focus(sweepId) { this.view.focus(sweepId); }

  // --- one sweep ---
  show(sweepId, signal) {
    const chartBox = h("div", { class: "xf-chart-box" });
    this.tableBox = h("div", { class: "xf-sweep-table-box" });
    this.imagesBox = h("div", { class: "xf-sweep-images", dataset: { xpufleet: "sweep-images" } });
    this.homes = new Map();
    this.withImages = undefined; // whether this sweep's runs are ComfyUI runs (decided once)
    this.signal = signal;
    this.gallery = this.view.keep(new Gallery({ fleet: this.fleet, label: t("sweep.images") }));
    this.plot = new ScatterControls("sweep", this.view.keep(new ParamScatter(chartBox)));
    this.plotBox = h("div", {}, h("h3", {}, t("sweep.plot")), this.plot.el, chartBox);
    replace(this.view.detail, this.view.head, this.imagesBox, this.plotBox, h("h3", {}, t("sweep.table")), this.tableBox);
    this.view.poll(signal, {
      get: (query, sig) => this.fleet.sweeps.get(sweepId, query, { signal: sig }),
      rows: (s) => s.table || [],
      running: (r) => r.status === "running",
      ended: (s) => ENDED.has(s.status),
    });
  }

  render() {
    const s = this.view.item;
    const best = s.best;
    replace(this.view.head,
      titleLine("sweep", s, t(`sweep.status.${s.status}`)),
      h("div", { class: "xf-kvline" }, `${t("sweep.id")}: ${s.id}`),
      s.objective?.metric ? objectiveLine(s.objective) : null, // a ComfyUI sweep may compare images only
      h("div", { class: "xf-kvline", dataset: { xpufleet: "sweep-counts" } }, `${t("sweep.n_runs", { n: s.n_runs })}: ${countsText(s.counts)}`),
      best ? h("div", { class: "xf-kvline", dataset: { xpufleet: "sweep-best" } },
        `${t("sweep.best")}: #${best.variant} ${Object.entries(best.parameters || {}).map(([k, v]) => `${label(s, k)}=${v}`).join(", ")} → ${metricText(best.metric)}`) : null,
      h("div", { class: "xf-kvline" }, `${t("runs.created")}: ${when(s.created_at)}`),
      itemActions(this.view, "sweep", s, !ENDED.has(s.status), this.fleet.sweeps,
        { cancelText: t("sweep.cancel"), deleted: t("sweep.deleted") }));
    this.plotBox.hidden = !s.objective?.metric; // no metric to plot
    if (s.objective?.metric) this.plot.set(s.parameters || [], s.table || [], s.objective.metric, (p) => label(s, p));
    this.renderTable();
    this.renderImages();
  }

  /** Whether the sweep's variants are ComfyUI runs: the sweep's kind when the server says it, else its first
   * variant's run's (read once); a training sweep shows its metric table only. */
  imagesWanted(s) {
    if (this.withImages !== undefined) return this.withImages;
    if (s.kind) return (this.withImages = s.kind === "comfyui");
    const first = (s.table || []).find((r) => r.run_id && r.status !== "deleted");
    if (!first) return false;
    this.withImages = null; // being read
    const signal = this.signal;
    this.fleet.run(first.run_id, { signal })
      .then((run) => { this.withImages = run.kind === "comfyui"; })
      .catch(() => { this.withImages = undefined; }) // asked again at the next poll
      .then(() => { if (!signal.aborted && this.withImages) this.renderImages(); });
    return false;
  }

  /** Bring each succeeded variant's files home once, then draw the images. */
  renderImages() {
    const s = this.view.item;
    if (!this.imagesWanted(s)) return;
    const signal = this.signal;
    for (const r of s.table || []) {
      if (r.status !== "succeeded" || !r.run_id || this.homes.has(r.run_id)) continue;
      this.homes.set(r.run_id, null);
      galleryItems(this.fleet, r.run_id, signal)
        .then(async (items) => {
          await Promise.all(items.map(async (i) => { i.src = await this.gallery.src(i); }));
          return items;
        })
        .catch((err) => ({ error: err?.message || String(err) }))
        .then((got) => { if (!signal.aborted) { this.homes.set(r.run_id, got); this.drawImages(); } });
    }
    this.drawImages();
  }

  drawImages() {
    const s = this.view.item;
    const params = s.parameters || [];
    const rows = [...(s.table || [])].sort((a, b) => a.variant - b.variant);
    const all = []; // the images in the order shown: the lightbox steps through them
    this.gallery.items = all;
    const thumbs = (r) => {
      if (r.status !== "succeeded" || !r.run_id) return h("div", { class: "xf-hint" }, rowStatus(r.status));
      const got = this.homes.get(r.run_id);
      if (!got) return h("div", { class: "xf-hint" }, t("gallery.loading"));
      if (got.error) return h("div", { class: "xf-error", title: got.error }, t("gallery.failed"));
      const images = got.filter((i) => i.kind === "image");
      if (!images.length) return h("div", { class: "xf-hint" }, t("gallery.none"));
      return images.map((i) => {
        const at = all.push(i) - 1;
        return h("button", { type: "button", class: "xf-thumb", "aria-label": t("gallery.open", { name: i.file }),
          dataset: { xpufleet: "sweep-thumb" }, onclick: () => this.gallery.open(at) },
        h("img", { src: i.src || i.url, alt: i.file, loading: "lazy" }));
      });
    };
    const caption = (r) => [`#${r.variant}`, ...params.map((p) => `${label(s, p)}=${r.parameters?.[p]}`),
      r.seed !== null && r.seed !== undefined ? `${t("queue.seed")}=${r.seed}` : null].filter(Boolean).join(" · ");
    let body;
    if (params.length === 2) { // an XY grid: the first parameter across, the second down
      const [px, py] = params;
      const xs = [...new Set(rows.map((r) => String(r.parameters?.[px])))];
      const ys = [...new Set(rows.map((r) => String(r.parameters?.[py])))];
      body = h("table", { class: "xf-sweep-xy", dataset: { xpufleet: "sweep-xy" } },
        h("thead", {}, h("tr", {}, h("th", { scope: "col" }, `${label(s, py)} ↓ · ${label(s, px)} →`),
          xs.map((x) => h("th", { scope: "col", dataset: { axis: "x" } }, x)))),
        h("tbody", {}, ys.map((y) => h("tr", {}, h("th", { scope: "row", dataset: { axis: "y" } }, y),
          xs.map((x) => h("td", {}, rows.filter((r) => String(r.parameters?.[px]) === x && String(r.parameters?.[py]) === y)
            .map((r) => h("div", { class: "xf-sweep-cell", dataset: { variant: String(r.variant) }, title: caption(r) }, thumbs(r)))))))));
    } else {
      body = h("div", { class: "xf-gallery", role: "list" }, rows.map((r) => h("figure", { class: "xf-gallery-item", role: "listitem",
        dataset: { variant: String(r.variant) } }, thumbs(r), h("figcaption", { class: "xf-hint" }, caption(r)))));
    }
    replace(this.imagesBox, h("h3", {}, t("sweep.images")), body);
  }

  renderTable() {
    const s = this.view.item;
    const params = s.parameters || [];
    const seeded = (s.table || []).some((r) => r.seed !== null && r.seed !== undefined);
    const running = (s.table || []).some((r) => r.status === "running");
    const head = [t("sweep.rank"), "#", ...params.map((p) => label(s, p)), seeded ? t("queue.seed") : null, t("sweep.col_status"),
      running ? t("sweep.col_progress") : null, s.objective?.metric || null,
      t("runs.where"), t("runs.devices"), t("sweep.col_run")].filter((x) => x !== null);
    const rows = (s.table || []).map((r) => h("tr", { dataset: { variant: String(r.variant), status: r.status, metric: r.metric ?? "" } },
      h("td", {}, r.rank ?? "—"),
      h("td", {}, String(r.variant)),
      params.map((p) => h("td", {}, String(r.parameters?.[p] ?? ""))),
      seeded ? h("td", {}, r.seed ?? "") : null,
      h("td", {}, h("span", { class: `xf-status xf-status-${r.status}` }, rowStatus(r.status)),
        r.error ? h("div", { class: "xf-hint", title: r.error }, r.error.slice(0, 120)) : null),
      running ? h("td", {}, r.status === "running" ? progressCell(r.progress, r.variant) : "—") : null,
      s.objective?.metric ? h("td", { dataset: { xpufleet: "sweep-metric" } }, metricText(r.metric)) : null,
      h("td", {}, r.worker_id || "—"),
      h("td", {}, (r.devices || []).join(", ") || "—"),
      h("td", {}, runLink(r, r.status === "deleted", this.openRun))));
    replace(this.tableBox, itemTable("sweep", head, rows));
  }
}

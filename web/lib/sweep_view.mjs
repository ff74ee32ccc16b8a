// The Sweeps view (docs/workers.md "Sweep 與 study", docs/sweeps.md): the sweeps with their children's counts, and one
// sweep's ranked table (each variant's parameters, status, objective, worker and devices, its run a link
// to the Runs panel), live through the server's long poll (GET /api/sweeps/{id}?version=&wait=), a
// scatter of a parameter against the objective (a log x axis by default past a 10x range, with a toggle),
// a running variant's progress, Cancel, Delete and the CSV. The ranking, the counts, the progress and the
// sweep's status are the server's.
import { ParamScatter } from "./sweep_charts.mjs";
import { h, replace, saveBlob, sleep } from "./dom.mjs";
import { shortId, when } from "./format.mjs";
import { t } from "./i18n.mjs";
import { ItemList } from "./item_list.mjs";

const ENDED = new Set(["finished", "cancelled"]);
const LONG_POLL_S = 20;
const PROGRESS_POLL_S = 1; // while a variant runs: its progress does not move the sweep's version
const RETRY_MS = 2000;

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
    this.openRuns = openRuns;
    this.newSweep = newSweep;
    this.selected = null;
    this.xParam = null;
    this.container = null;
    this.list = new ItemList({
      kind: "sweep",
      none: () => t("sweep.none"),
      open: (name) => t("sweep.open", { name }),
      load: async (signal) => (await this.fleet.sweeps({ limit: 100 }, { signal })).sweeps || [],
      row: (s) => ({ status: t(`sweep.status.${s.status}`), counts: countsText(s.counts),
        hint: `${t("sweep.n_runs", { n: s.n_runs })} · ${s.objective?.metric || ""}` }),
      onSelect: (id) => this.select(id),
    });
  }

  mount(container) {
    if (this.container === container && container.contains(this.root)) return;
    this.unmount();
    this.container = container;
    this.abort = new AbortController();
    this.detail = h("section", { class: "xf-run-detail", "aria-live": "polite", dataset: { xpufleet: "sweep-detail" } },
      h("div", { class: "xf-hint" }, t("sweep.pick")));
    this.root = h("div", { class: "xf-panel xf-sweeps xf-root", dataset: { xpufleet: "sweeps-panel" } },
      h("header", { class: "xf-panel-head" },
        h("h2", {}, t("sweep.title")),
        h("span", { class: "xf-grow" }),
        h("button", { type: "button", class: "xf-primary", dataset: { xpufleet: "new-sweep" }, onclick: () => this.newSweep() }, t("sweep.new")),
        h("button", { type: "button", onclick: () => this.refresh() }, t("common.refresh")),
        h("button", { type: "button", dataset: { xpufleet: "open-runs" }, onclick: () => this.openRuns() }, t("runs.title"))),
      h("div", { class: "xf-panel-body" }, this.list.el, this.detail));
    replace(container, this.root);
    this.list.start(this.abort.signal);
    if (this.selected) this.select(this.selected);
  }

  unmount() {
    this.abort?.abort();
    this.detailAbort?.abort();
    this.chart?.destroy();
    this.chart = null;
    this.container = null;
  }

  focus(sweepId) {
    this.selected = sweepId;
    if (this.container) { this.refresh(); this.select(sweepId); }
  }

  refresh() {
    return this.list.refresh();
  }

  // --- one sweep ---
  async select(sweepId) {
    this.selected = sweepId;
    this.list.select(sweepId);
    this.detailAbort?.abort();
    this.detailAbort = new AbortController();
    const signal = this.detailAbort.signal;
    this.abort.signal.addEventListener("abort", () => this.detailAbort.abort(), { once: true });
    this.chart?.destroy();
    this.chart = null;
    this.head = h("div", { class: "xf-run-head" });
    this.plotHead = h("div", { class: "xf-sweep-plot-head" });
    const chartBox = h("div", { class: "xf-chart-box" });
    this.tableBox = h("div", { class: "xf-sweep-table-box" });
    replace(this.detail, this.head, h("h3", {}, t("sweep.plot")), this.plotHead, chartBox, h("h3", {}, t("sweep.table")), this.tableBox);
    this.chart = new ParamScatter(chartBox);
    this.scale = null; // the x axis's scale: null until the user toggles it (then theirs)
    this.sweep = null;
    this.follow(sweepId, signal);
  }

  async follow(sweepId, signal) {
    let version = null;
    while (!signal.aborted) {
      let sweep;
      try {
        const running = (this.sweep?.table || []).some((r) => r.status === "running");
        sweep = await this.fleet.sweep(sweepId, version === null ? {} : { version, wait: running ? PROGRESS_POLL_S : LONG_POLL_S }, { signal });
      } catch (err) {
        if (err?.name === "AbortError") return;
        if (err?.status === 404) { replace(this.detail, h("div", { class: "xf-error", role: "alert" }, err.message)); return; }
        replace(this.head, h("div", { class: "xf-error", role: "alert" }, err.message));
        await sleep(RETRY_MS, signal);
        continue;
      }
      const changed = sweep.version !== version || sweep.status !== this.sweep?.status;
      const moved = JSON.stringify((sweep.table || []).map((r) => r.progress)) !== JSON.stringify((this.sweep?.table || []).map((r) => r.progress));
      this.sweep = sweep;
      version = sweep.version;
      if (changed) this.render();
      else if (moved) this.renderTable();
      if (ENDED.has(sweep.status)) { this.refresh(); return; }
    }
  }

  render() {
    const s = this.sweep;
    const actions = [];
    if (!ENDED.has(s.status)) {
      actions.push(h("button", { type: "button", class: "xf-danger", dataset: { xpufleet: "sweep-cancel" }, disabled: s.status === "cancelling",
        onclick: async (e) => { e.currentTarget.disabled = true; await this.act(() => this.fleet.cancelSweep(s.id)); } }, t("sweep.cancel")));
    } else {
      actions.push(h("button", { type: "button", dataset: { xpufleet: "sweep-delete" },
        onclick: async () => {
          this.detailAbort?.abort(); // nothing more is read of a sweep being deleted
          if (await this.act(() => this.fleet.deleteSweep(s.id))) {
            this.selected = null;
            this.list.select(null);
            replace(this.detail, h("div", { class: "xf-hint" }, t("sweep.deleted")));
            this.refresh();
          } // refused: the error stays in view; picking it again reloads it
        } }, t("runs.delete")));
    }
    actions.push(h("button", { type: "button", dataset: { xpufleet: "sweep-csv" }, onclick: () => this.downloadCsv(s.id) }, t("sweep.csv")));
    const obj = s.objective || {};
    const best = s.best;
    replace(this.head,
      h("h3", {}, s.name || shortId(s.id), " ", h("span", { class: `xf-status xf-sweep-${s.status}`, dataset: { xpufleet: "sweep-status", status: s.status } },
        t(`sweep.status.${s.status}`))),
      h("div", { class: "xf-kvline" }, `${t("sweep.id")}: ${s.id}`),
      h("div", { class: "xf-kvline" }, `${t("sweep.objective")}: ${obj.metric} (${obj.direction === "minimize" ? t("sweep.minimize") : t("sweep.maximize")})`),
      h("div", { class: "xf-kvline", dataset: { xpufleet: "sweep-counts" } }, `${t("sweep.n_runs", { n: s.n_runs })}: ${countsText(s.counts)}`),
      best ? h("div", { class: "xf-kvline", dataset: { xpufleet: "sweep-best" } },
        `${t("sweep.best")}: #${best.variant} ${Object.entries(best.parameters || {}).map(([k, v]) => `${label(s, k)}=${v}`).join(", ")} → ${metricText(best.metric)}`) : null,
      h("div", { class: "xf-kvline" }, `${t("runs.created")}: ${when(s.created_at)}`),
      h("div", { class: "xf-actions" }, actions));
    this.renderPlot();
    this.renderTable();
  }

  renderPlot() {
    const s = this.sweep;
    const params = s.parameters || [];
    if (!params.includes(this.xParam)) { this.xParam = params[0] || null; this.scale = null; }
    const draw = () => {
      const rows = s.table || [];
      const scale = this.scale || ParamScatter.defaultScale(rows, this.xParam);
      this.chart?.set(rows, this.xParam, s.objective?.metric, scale, label(s, this.xParam));
      if (this.scaleSelect) {
        this.scaleSelect.value = scale || "linear";
        this.scaleSelect.disabled = scale === null || !rows.every((r) => !(Number(r.parameters?.[this.xParam]) <= 0));
      }
    };
    const parts = [];
    if (params.length > 1) {
      const select = h("select", { dataset: { xpufleet: "sweep-plot-x" }, "aria-label": t("sweep.plot_x"),
        onchange: () => { this.xParam = select.value; this.scale = null; draw(); } },
      params.map((p) => h("option", { value: p, selected: p === this.xParam }, label(s, p))));
      parts.push(h("label", {}, t("sweep.plot_x"), " ", select));
    }
    this.scaleSelect = h("select", { dataset: { xpufleet: "sweep-plot-scale" }, "aria-label": t("sweep.axis_scale"),
      onchange: () => { this.scale = this.scaleSelect.value; draw(); } },
    h("option", { value: "linear" }, t("sweep.axis_linear")), h("option", { value: "log" }, t("sweep.axis_log")));
    parts.push(h("label", {}, t("sweep.axis_scale"), " ", this.scaleSelect));
    replace(this.plotHead, parts);
    if (this.xParam) draw();
  }

  renderTable() {
    const s = this.sweep;
    const params = s.parameters || [];
    const seeded = (s.table || []).some((r) => r.seed !== null && r.seed !== undefined);
    const running = (s.table || []).some((r) => r.status === "running");
    const head = [t("sweep.rank"), "#", ...params.map((p) => label(s, p)), seeded ? t("queue.seed") : null, t("sweep.col_status"),
      running ? t("sweep.col_progress") : null, s.objective?.metric,
      t("runs.where"), t("runs.devices"), t("sweep.col_run")].filter((x) => x !== null);
    const rows = (s.table || []).map((r) => h("tr", { dataset: { variant: String(r.variant), status: r.status, metric: r.metric ?? "" } },
      h("td", {}, r.rank ?? "—"),
      h("td", {}, String(r.variant)),
      params.map((p) => h("td", {}, String(r.parameters?.[p] ?? ""))),
      seeded ? h("td", {}, r.seed ?? "") : null,
      h("td", {}, h("span", { class: `xf-status xf-status-${r.status}` }, rowStatus(r.status)),
        r.error ? h("div", { class: "xf-hint", title: r.error }, r.error.slice(0, 120)) : null),
      running ? h("td", {}, r.status === "running" ? progressCell(r.progress, r.variant) : "—") : null,
      h("td", { dataset: { xpufleet: "sweep-metric" } }, metricText(r.metric)),
      h("td", {}, r.worker_id || "—"),
      h("td", {}, (r.devices || []).join(", ") || "—"),
      h("td", {}, r.run_id && r.status !== "deleted"
        ? h("button", { type: "button", class: "xf-link", "aria-label": t("runs.open", { name: r.name || shortId(r.run_id) }),
          onclick: () => this.openRun(r.run_id) }, shortId(r.run_id)) : "—")));
    replace(this.tableBox, h("table", { class: "xf-devices-table xf-sweep-table", dataset: { xpufleet: "sweep-table" } },
      h("thead", {}, h("tr", {}, head.map((c) => h("th", { scope: "col" }, c)))), h("tbody", {}, rows)));
  }

  async act(fn) {
    try {
      await fn();
      return true;
    } catch (err) {
      this.head.append(h("div", { class: "xf-error", role: "alert" }, err.message));
      return false;
    }
  }

  async downloadCsv(sweepId) {
    try {
      const resp = await this.fleet.sweepCsv(sweepId);
      saveBlob(await resp.blob(), `sweep-${sweepId}.csv`);
    } catch (err) {
      this.head.append(h("div", { class: "xf-error", role: "alert" }, err.message));
    }
  }
}

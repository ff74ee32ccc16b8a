// The Studies panel (issue 20, point 6; docs/sweeps.md): the Optuna studies of POST /api/studies with
// their status and trial counts, and one study's best trial, optimization history (each trial's value
// and the best so far), a parameter against the objective, the trials table (number, state, parameters,
// value, a running trial's progress, its run a link to the Runs panel), Cancel, Delete and the CSV. Live
// through the server's long poll (GET /api/studies/{id}?version=&wait=); every figure is the server's.
import { h, replace, saveBlob, sleep } from "./dom.mjs";
import { shortId, when } from "./format.mjs";
import { t } from "./i18n.mjs";
import { ItemList } from "./item_list.mjs";
import { HistoryChart, ParamScatter } from "./sweep_charts.mjs";
import { label, progressCell } from "./sweep_view.mjs";

const ACTIVE = new Set(["running", "cancelling"]);
const LONG_POLL_S = 20;
const PROGRESS_POLL_S = 1;
const RETRY_MS = 2000;
const enc = encodeURIComponent;
const RUN_STATUSES = new Set(["queued", "assigned", "running", "succeeded", "failed", "cancelled", "interrupted"]);

function valueText(v) {
  return v === null || v === undefined ? "—" : (typeof v === "number" ? String(Number(v.toPrecision(6))) : String(v));
}

function paramsText(study, parameters) {
  return Object.entries(parameters || {}).map(([k, v]) => `${label(study, k)}=${valueText(v)}`).join(", ");
}

function countsText(counts) {
  return Object.entries(counts || {}).map(([s, n]) => `${n} ${t(`study.state.${s}`)}`).join(" · ");
}

/** A trial's run status ("deleted" and "not queued" are the study's own words). */
function runStatusText(status) {
  if (status === "deleted") return t("sweep.row_deleted");
  return RUN_STATUSES.has(status) ? t(`runs.status.${status}`) : (status || "—");
}

function finished(counts) {
  return Object.entries(counts || {}).filter(([s]) => s !== "running").reduce((n, [, c]) => n + c, 0);
}

export class StudiesPanel {
  /**
   * @param {object} o
   * @param {import("./api.mjs").Fleet} o.fleet
   * @param {(runId: string) => void} o.openRun  a trial's run in the Runs panel
   */
  constructor({ fleet, openRun }) {
    this.fleet = fleet;
    this.openRun = openRun;
    this.selected = null;
    this.container = null;
    this.list = new ItemList({
      kind: "study",
      none: () => t("study.none"),
      open: (name) => t("study.open", { name }),
      load: async (signal) => (await this.fleet.api("GET", "/studies?limit=100", undefined, { signal })).studies || [],
      row: (s) => ({ status: t(`study.status.${s.status}`), counts: countsText(s.counts),
        hint: `${t("study.n_trials", { done: finished(s.counts), n: s.n_trials })} · ${s.objective?.metric || ""}` }),
      onSelect: (id) => this.select(id),
    });
  }

  mount(container) {
    if (this.container === container && container.contains(this.root)) return;
    this.unmount();
    this.container = container;
    this.abort = new AbortController();
    this.detail = h("section", { class: "xf-run-detail", "aria-live": "polite", dataset: { xpufleet: "study-detail" } },
      h("div", { class: "xf-hint" }, t("study.pick")));
    this.root = h("div", { class: "xf-panel xf-sweeps xf-studies xf-root", dataset: { xpufleet: "studies-panel" } },
      h("header", { class: "xf-panel-head" },
        h("h2", {}, t("study.title")),
        h("span", { class: "xf-grow" }),
        h("button", { type: "button", onclick: () => this.refresh() }, t("common.refresh"))),
      h("div", { class: "xf-panel-body" }, this.list.el, this.detail));
    replace(container, this.root);
    this.list.start(this.abort.signal);
    if (this.selected) this.select(this.selected);
  }

  unmount() {
    this.abort?.abort();
    this.detailAbort?.abort();
    this.destroyCharts();
    this.container = null;
  }

  destroyCharts() {
    this.history?.destroy();
    this.scatter?.destroy();
    this.history = null;
    this.scatter = null;
  }

  focus(studyId) {
    this.selected = studyId;
    if (this.container) { this.refresh(); this.select(studyId); }
  }

  refresh() {
    return this.list.refresh();
  }

  // --- one study ---
  async select(studyId) {
    this.selected = studyId;
    this.list.select(studyId);
    this.detailAbort?.abort();
    this.detailAbort = new AbortController();
    const signal = this.detailAbort.signal;
    this.abort.signal.addEventListener("abort", () => this.detailAbort.abort(), { once: true });
    this.destroyCharts();
    this.head = h("div", { class: "xf-run-head" });
    const historyBox = h("div", { class: "xf-chart-box" });
    const scatterBox = h("div", { class: "xf-chart-box" });
    this.plotHead = h("div", { class: "xf-sweep-plot-head" });
    this.tableBox = h("div", { class: "xf-sweep-table-box" });
    replace(this.detail, this.head, h("h3", {}, t("study.history")), historyBox,
      h("h3", {}, t("study.params_view")), this.plotHead, scatterBox, h("h3", {}, t("study.trials")), this.tableBox);
    this.history = new HistoryChart(historyBox);
    this.scatter = new ParamScatter(scatterBox, t("study.params_label"), t("study.empty_chart"), "study-scatter");
    this.study = null;
    this.xParam = null;
    this.scale = null;
    this.follow(studyId, signal);
  }

  async follow(studyId, signal) {
    let version = null;
    while (!signal.aborted) {
      let study;
      const running = (this.study?.trials || []).some((r) => r.run_status === "running");
      const q = version === null ? "" : `?version=${version}&wait=${running ? PROGRESS_POLL_S : LONG_POLL_S}`;
      try {
        study = await this.fleet.api("GET", `/studies/${enc(studyId)}${q}`, undefined, { signal });
      } catch (err) {
        if (err?.name === "AbortError") return;
        if (err?.status === 404) { replace(this.detail, h("div", { class: "xf-error", role: "alert" }, err.message)); return; }
        replace(this.head, h("div", { class: "xf-error", role: "alert" }, err.message));
        await sleep(RETRY_MS, signal);
        continue;
      }
      const changed = study.version !== version || study.status !== this.study?.status;
      const moved = JSON.stringify((study.trials || []).map((r) => r.progress)) !== JSON.stringify((this.study?.trials || []).map((r) => r.progress));
      this.study = study;
      version = study.version;
      if (changed) this.render();
      else if (moved) this.renderTable();
      if (!ACTIVE.has(study.status)) { this.refresh(); return; }
    }
  }

  render() {
    const s = this.study;
    const actions = [];
    if (ACTIVE.has(s.status)) {
      actions.push(h("button", { type: "button", class: "xf-danger", dataset: { xpufleet: "study-cancel" }, disabled: s.status === "cancelling",
        onclick: async (e) => { e.currentTarget.disabled = true; await this.act(() => this.fleet.api("POST", `/studies/${enc(s.id)}/cancel`, {})); } },
      t("study.cancel")));
    } else {
      actions.push(h("button", { type: "button", dataset: { xpufleet: "study-delete" },
        onclick: async () => {
          this.detailAbort?.abort(); // nothing more is read of a study being deleted
          if (await this.act(() => this.fleet.api("DELETE", `/studies/${enc(s.id)}`))) {
            this.selected = null;
            this.list.select(null);
            this.destroyCharts();
            replace(this.detail, h("div", { class: "xf-hint" }, t("study.deleted")));
            this.refresh();
          } // refused: the error stays in view; picking it again reloads it
        } }, t("runs.delete")));
    }
    actions.push(h("button", { type: "button", dataset: { xpufleet: "study-csv" }, onclick: () => this.downloadCsv(s.id) }, t("sweep.csv")));
    const obj = s.objective || {};
    const best = s.best_trial;
    replace(this.head,
      h("h3", {}, s.name || shortId(s.id), " ", h("span", { class: `xf-status xf-sweep-${s.status}`, dataset: { xpufleet: "study-status", status: s.status } },
        t(`study.status.${s.status}`))),
      h("div", { class: "xf-kvline" }, `${t("study.id")}: ${s.id}`),
      h("div", { class: "xf-kvline" }, `${t("sweep.objective")}: ${obj.metric} (${obj.direction === "minimize" ? t("sweep.minimize") : t("sweep.maximize")})`),
      h("div", { class: "xf-kvline", dataset: { xpufleet: "study-counts" } },
        `${t("study.n_trials", { done: finished(s.counts), n: s.n_trials })}: ${countsText(s.counts)}`),
      h("div", { class: "xf-kvline", dataset: { xpufleet: "study-best" } }, best
        ? `${t("study.best")}: #${best.number} ${paramsText(s, best.parameters)} → ${valueText(best.value)}` : t("study.best_none")),
      s.error ? h("div", { class: "xf-error" }, s.error) : null,
      h("div", { class: "xf-kvline" }, `${t("runs.created")}: ${when(s.created_at)}`),
      h("div", { class: "xf-actions" }, actions));
    this.history?.set(s.trials || [], obj.metric, obj.direction);
    this.renderPlot();
    this.renderTable();
  }

  renderPlot() {
    const s = this.study;
    const params = s.parameters || [];
    if (!params.includes(this.xParam)) { this.xParam = params[0] || null; this.scale = null; }
    const rows = (s.trials || []).filter((r) => r.state === "complete").map((r) => ({ parameters: r.parameters, metric: r.value }));
    const draw = () => {
      const scale = this.scale || ParamScatter.defaultScale(rows, this.xParam);
      this.scatter?.set(rows, this.xParam, s.objective?.metric, scale, label(s, this.xParam));
      this.scaleSelect.value = scale || "linear";
      this.scaleSelect.disabled = scale === null;
    };
    const parts = [];
    if (params.length > 1) {
      const select = h("select", { dataset: { xpufleet: "study-plot-x" }, "aria-label": t("sweep.plot_x"),
        onchange: () => { this.xParam = select.value; this.scale = null; draw(); } },
      params.map((p) => h("option", { value: p, selected: p === this.xParam }, label(s, p))));
      parts.push(h("label", {}, t("sweep.plot_x"), " ", select));
    }
    this.scaleSelect = h("select", { dataset: { xpufleet: "study-plot-scale" }, "aria-label": t("sweep.axis_scale"),
      onchange: () => { this.scale = this.scaleSelect.value; draw(); } },
    h("option", { value: "linear" }, t("sweep.axis_linear")), h("option", { value: "log" }, t("sweep.axis_log")));
    parts.push(h("label", {}, t("sweep.axis_scale"), " ", this.scaleSelect));
    replace(this.plotHead, parts);
    if (this.xParam) draw();
  }

  renderTable() {
    const s = this.study;
    const params = s.parameters || [];
    const bestNumber = s.best_trial?.number;
    const head = [t("study.col_number"), t("study.col_state"), ...params.map((p) => label(s, p)), s.objective?.metric, t("sweep.col_progress"),
      t("runs.where"), t("sweep.col_run")];
    const rows = (s.trials || []).map((r) => h("tr", { class: r.number === bestNumber ? "xf-selected" : "",
      dataset: { trial: String(r.number), state: r.state, value: r.value ?? "" } },
    h("td", {}, String(r.number), r.number === bestNumber ? ` ★ ${t("study.best")}` : ""),
    h("td", {}, h("span", { class: `xf-status xf-status-${r.state === "complete" ? "succeeded" : r.state}` }, t(`study.state.${r.state}`)),
      r.state === "pruned" && r.pruned_step !== null ? h("div", { class: "xf-hint" }, t("study.pruned_at", { step: r.pruned_step })) : null,
      r.reason && r.state !== "pruned" ? h("div", { class: "xf-hint", title: r.reason }, r.reason.slice(0, 120)) : null),
    params.map((p) => h("td", {}, valueText(r.parameters?.[p]))),
    h("td", { dataset: { xpufleet: "study-value" } }, valueText(r.value)),
    h("td", {}, r.run_status === "running" ? progressCell(r.progress, r.number) : runStatusText(r.run_status)),
    h("td", {}, r.worker_id || (r.devices || []).join(", ") || "—"),
    h("td", {}, r.run_id && r.run_status !== "deleted"
      ? h("button", { type: "button", class: "xf-link", "aria-label": t("runs.open", { name: r.name || shortId(r.run_id) }),
        onclick: () => this.openRun(r.run_id) }, shortId(r.run_id)) : "—")));
    replace(this.tableBox, h("table", { class: "xf-devices-table xf-sweep-table", dataset: { xpufleet: "study-table" } },
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

  async downloadCsv(studyId) {
    try {
      const resp = await this.fleet.api("GET", `/studies/${enc(studyId)}/trials.csv`, undefined, { raw: true });
      saveBlob(await resp.blob(), `study-${studyId}.csv`);
    } catch (err) {
      this.head.append(h("div", { class: "xf-error", role: "alert" }, err.message));
    }
  }
}

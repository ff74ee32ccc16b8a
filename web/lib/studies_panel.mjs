// The Studies panel (issue 20, point 6; docs/sweeps.md): the Optuna studies of POST /api/studies with
// their status and trial counts, and one study's best trial, optimization history (each trial's value
// and the best so far), a parameter against the objective, the trials table (number, state, parameters,
// value, a running trial's progress, its run a link to the Runs panel), Cancel, Delete and the CSV. Live
// through the server's long poll (GET /api/studies/{id}?version=&wait=); every figure is the server's.
import { h, replace } from "./dom.mjs";
import { when } from "./format.mjs";
import { t } from "./i18n.mjs";
import { ListPanel } from "./item_list.mjs";
import { HistoryChart, ParamScatter, ScatterControls } from "./sweep_charts.mjs";
import { collectionList, itemActions, itemTable, label, objectiveLine, progressCell, runLink, titleLine } from "./sweep_view.mjs";

const ACTIVE = new Set(["running", "cancelling"]);
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
    this.view = new ListPanel(this, {
      kind: "study", texts: "study", frame: { panel: "studies-panel", classes: "xf-sweeps xf-studies" },
      list: collectionList("study", fleet.studies,
        { hint: (s) => `${t("study.n_trials", { done: finished(s.counts), n: s.n_trials })} · ${s.objective?.metric || ""}`, counts: countsText }),
    });
    // the shown study's parts (show makes them)
    this.history = null;
    this.plot = null;
    this.tableBox = null;
  }

  mount(container) { this.view.mount(container); }
  unmount() { this.view.unmount(); }

  // --- one study ---
  show(studyId, signal) {
    const historyBox = h("div", { class: "xf-chart-box" });
    const scatterBox = h("div", { class: "xf-chart-box" });
    this.tableBox = h("div", { class: "xf-sweep-table-box" });
    this.history = this.view.keep(new HistoryChart(historyBox));
    this.plot = new ScatterControls("study", this.view.keep(new ParamScatter(scatterBox, t("study.params_label"), t("study.empty_chart"), "study-scatter")));
    replace(this.view.detail, this.view.head, h("h3", {}, t("study.history")), historyBox,
      h("h3", {}, t("study.params_view")), this.plot.el, scatterBox, h("h3", {}, t("study.trials")), this.tableBox);
    this.view.poll(signal, {
      get: (query, sig) => this.fleet.studies.get(studyId, query, { signal: sig }),
      rows: (s) => s.trials || [],
      running: (r) => r.run_status === "running",
      ended: (s) => !ACTIVE.has(s.status),
    });
  }

  render() {
    const s = this.view.item;
    const obj = s.objective || {};
    const best = s.best_trial;
    replace(this.view.head,
      titleLine("study", s, t(`study.status.${s.status}`)),
      h("div", { class: "xf-kvline" }, `${t("study.id")}: ${s.id}`),
      objectiveLine(obj),
      h("div", { class: "xf-kvline", dataset: { xpufleet: "study-counts" } },
        `${t("study.n_trials", { done: finished(s.counts), n: s.n_trials })}: ${countsText(s.counts)}`),
      h("div", { class: "xf-kvline", dataset: { xpufleet: "study-best" } }, best
        ? `${t("study.best")}: #${best.number} ${paramsText(s, best.parameters)} → ${valueText(best.value)}` : t("study.best_none")),
      s.error ? h("div", { class: "xf-error" }, s.error) : null,
      h("div", { class: "xf-kvline" }, `${t("runs.created")}: ${when(s.created_at)}`),
      itemActions(this.view, "study", s, ACTIVE.has(s.status), this.fleet.studies,
        { cancelText: t("study.cancel"), deleted: t("study.deleted") }));
    this.history.set(s.trials || [], obj.metric, obj.direction);
    const rows = (s.trials || []).filter((r) => r.state === "complete").map((r) => ({ parameters: r.parameters, metric: r.value }));
    this.plot.set(s.parameters || [], rows, obj.metric, (p) => label(s, p));
    this.renderTable();
  }

  renderTable() {
    const s = this.view.item;
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
    h("td", {}, runLink(r, r.run_status === "deleted", this.openRun))));
    replace(this.tableBox, itemTable("study", head, rows));
  }
}

// The Queue on... dialog (docs/workers.md, "排入佇列..."): sends the current graph as a queued run (the same
// POST /api/runs as `xpufleet run`) to this server, a worker's cards, any free worker or a one-shot
// pool (`pools` of GET /api/workers; options.target.pool), with the memory budget the server suggests
// (POST /api/estimates). The server decides everything (which workers are `selectable`, what it
// refuses); a rejection shows here. A workflow with a seed widget may instead be fanned out: N runs with
// seeds s, s+1, ... as a sweep over that seed (fan_out.mjs), its images gathered in the sweep's view.
import { field, h, nextId, replace } from "./dom.mjs";
import { FAN_MAX, fanOutBody, isComfyWorkflow, seedInputs } from "./fan_out.mjs";
import { gib } from "./format.mjs";
import { GraphDialog, singleDialog } from "./graph_dialog.mjs";
import { onLanguageChange, t } from "./i18n.mjs";
import { TargetPicker } from "./target_picker.mjs";

// Queue on... opens on the target last queued to from the same workflow (its path, else its name), kept
// in this browser's localStorage; a workflow never queued from opens on this server.
const REMEMBER_PREFIX = "XPUFleet.QueueOn.LastTarget:";

/** The remembered picker state of workflow ``key`` (null when none, or no key, or storage is off). */
export function rememberedTarget(key) {
  if (!key) return null;
  try {
    return JSON.parse(localStorage.getItem(REMEMBER_PREFIX + key) || "null");
  } catch {
    return null;
  }
}

export function rememberTarget(key, state) {
  if (!key) return;
  try {
    localStorage.setItem(REMEMBER_PREFIX + key, JSON.stringify(state));
  } catch {
    // storage full or disabled: the dialog just opens on the default next time
  }
}

/**
 * @param {object} o
 * @param {import("./api.mjs").Fleet} o.fleet
 * @param {() => Promise<{prompt: object|null, name: string, problem?: string}>} o.graph  the graph to send
 * @param {() => Promise<string[]>} o.localDevices  this server's devices
 * @param {(runId: string) => void} o.openRuns
 * @param {() => void} o.openWorkers
 * @param {(sweepId: string) => void} [o.openSweep]  a fan-out's sweep (fan-out is offered when given)
 * @param {(runId: string, key: string) => void} [o.queued]  a run queued from workflow ``key``
 */
export const openQueueDialog = singleDialog((o, closed) => new QueueDialog(o, closed));

class QueueDialog {
  constructor(o, closed) {
    this.o = o;
    this.loaded = null; // what GraphDialog.load read: the graph, the workers and pools, this server's devices
    this.picker = null;
    // a language change while open rebuilds the form in the new language, keeping what was entered
    this.stopRelabel = onLanguageChange(() => this.relabel());
    this.frame = new GraphDialog({ kind: "queue", classes: "", title: () => t("queue.title"),
      onClose: () => { this.stopRelabel(); closed(); } });
    this.estimate = null;
    this.estimateError = null;
    this.budgetTouched = false;
  }

  async open() {
    this.loaded = await this.frame.load(this.o);
    this.build();
  }

  close() { this.frame.close(); }

  // --- form ---
  relabel() {
    if (!this.picker) { this.frame.loading(); return; } // still loading
    const kept = { target: this.picker.state(), name: this.nameInput.value, seed: this.seedInput.value,
      det: this.detInput.checked, rec: this.recInput.value, budget: this.budgetInput.value,
      touched: this.budgetTouched, wait: this.waitInput.checked,
      fan: this.fan && { on: this.fan.on.checked, n: this.fan.n.value, start: this.fan.start.value, path: this.fan.path.value } };
    this.build(kept.target);
    this.nameInput.value = kept.name;
    this.seedInput.value = kept.seed;
    this.detInput.checked = kept.det;
    if ([...this.recInput.options].some((o) => o.value === kept.rec && !o.disabled)) this.recInput.value = kept.rec;
    this.budgetTouched = kept.touched;
    if (kept.touched) this.budgetInput.value = kept.budget;
    this.waitInput.checked = kept.wait;
    if (kept.fan && this.fan) {
      Object.assign(this.fan.n, { value: kept.fan.n });
      Object.assign(this.fan.start, { value: kept.fan.start });
      this.fan.path.value = kept.fan.path;
      this.fan.on.checked = kept.fan.on;
      this.fanChanged();
    }
  }

  /** Build the form; `state`: the target picker's state to pick (default: the workflow's remembered one). */
  build(state = rememberedTarget(this.loaded.graph.key)) {
    const { workers, pools, workersError, local } = this.loaded;
    this.picker = new TargetPicker({ workers, pools, workersError, local,
      onChange: () => this.targetChanged(), openWorkers: () => { this.close(); this.o.openWorkers(); } });
    this.nameInput = h("input", { type: "text", value: this.loaded.graph.name || "", maxlength: "200", autocomplete: "off" });
    this.seedInput = h("input", { type: "number", min: "0", step: "1", placeholder: t("queue.seed_none") });
    this.detInput = h("input", { type: "checkbox", id: nextId("xf-det") });
    // record_outputs: off, true (kept where the run runs), "upload" (copied to this server at the end)
    this.recOptions = {
      off: h("option", { value: "" }, t("queue.record_off")),
      keep: h("option", { value: "keep", dataset: { record: "keep" } }, t("queue.record_keep")),
      upload: h("option", { value: "upload", dataset: { record: "upload" } }, t("queue.record_upload")),
    };
    this.recInput = h("select", { dataset: { xpufleet: "record-outputs" } }, Object.values(this.recOptions));
    this.recNote = h("div", { class: "xf-hint" });
    this.budgetInput = h("input", { type: "number", min: "0", step: "any", placeholder: t("queue.budget_none"),
      oninput: () => { this.budgetTouched = true; } });
    this.budgetBox = h("div", { class: "xf-budget", dataset: { xpufleet: "budget" } });
    this.waitInput = h("input", { type: "checkbox", id: nextId("xf-wait") });
    this.frame.form(this.loaded.graph, t("queue.submit"), () => this.submit(),
      this.picker.elements,
      h("div", { class: "xf-grid" },
        field(t("queue.name"), this.nameInput),
        field(t("queue.seed"), this.seedInput)),
      h("div", { class: "xf-choice" }, this.detInput, h("label", { for: this.detInput.id }, t("queue.deterministic"))),
      field(t("queue.record_outputs"), this.recInput),
      this.recNote,
      h("fieldset", { class: "xf-budget-box" }, h("legend", {}, t("queue.budget")),
        field(t("queue.budget_field"), this.budgetInput), this.budgetBox,
        h("div", { class: "xf-choice" }, this.waitInput, h("label", { for: this.waitInput.id }, t("queue.wait")))),
      this.fanOutBox());
    this.picker.targetChanged();
    this.picker.restore(state);
    this.nameInput.focus();
  }

  /** "N runs, seeds s, s+1, ..." for a workflow with a seed widget (off: today's one run). */
  fanOutBox() {
    const seeds = this.o.openSweep ? seedInputs(this.loaded.graph.prompt) : [];
    this.fan = null;
    if (!seeds.length) return null;
    const on = h("input", { type: "checkbox", id: nextId("xf-fan"), dataset: { xpufleet: "fan-out" }, onchange: () => this.fanChanged() });
    const n = h("input", { type: "number", min: "2", max: String(FAN_MAX), step: "1", value: "4", dataset: { xpufleet: "fan-count" }, oninput: () => this.fanChanged() });
    const start = h("input", { type: "number", min: "0", step: "1", value: String(seeds[0].value), dataset: { xpufleet: "fan-start" }, oninput: () => this.fanChanged() });
    const path = h("select", { dataset: { xpufleet: "fan-seed" }, onchange: () => {
      start.value = String(seeds.find((s) => s.path === path.value)?.value ?? start.value);
      this.fanChanged();
    } }, seeds.map((s) => h("option", { value: s.path }, `${s.title} #${s.node} · ${s.input}`)));
    const note = h("div", { class: "xf-hint", dataset: { xpufleet: "fan-note" } });
    const fields = h("div", { class: "xf-grid", hidden: true }, field(t("queue.fan_count"), n), field(t("queue.fan_start"), start),
      seeds.length > 1 ? field(t("queue.fan_seed"), path) : null);
    this.fan = { on, n, start, path, note, fields };
    this.fanChanged();
    return h("fieldset", { class: "xf-fan-box", dataset: { xpufleet: "fan-box" } }, h("legend", {}, t("queue.fan_legend")),
      h("div", { class: "xf-choice" }, on, h("label", { for: on.id }, t("queue.fan_out"))), fields, note);
  }

  /** The fan-out's count and first seed, checked; null when off. */
  fanChoice() {
    const f = this.fan;
    if (!f?.on.checked) return null;
    const n = Number(f.n.value), start = Number(f.start.value);
    if (!Number.isInteger(n) || n < 2 || n > FAN_MAX) return { error: t("queue.fan_bad_count", { max: FAN_MAX }) };
    if (!Number.isInteger(start) || start < 0) return { error: t("queue.fan_bad_start") };
    return { n, start, path: f.path.value };
  }

  fanChanged() {
    const f = this.fan;
    if (!f) return;
    f.fields.hidden = !f.on.checked;
    const c = this.fanChoice();
    replace(f.note, !c ? "" : (c.error || t("queue.fan_note", { n: c.n, first: c.start, last: c.start + c.n - 1 })));
    f.note.className = c?.error ? "xf-error" : "xf-hint";
  }

  targetChanged() {
    this.recordChanged(this.picker.selected());
    this.loadEstimate();
  }

  /** Recorded outputs stay on the worker (docs/workers.md). A one-shot agent exits when its run ends, so the
   * server refuses `true` on a one-shot worker (it takes "upload") and any recording on a pool target:
   * the dialog says so beside the choices it would refuse (the server still decides). */
  recordChanged(target) {
    const pool = target.kind === "pool";
    const oneShot = pool || Boolean(target.worker?.one_shot);
    const { keep, upload } = this.recOptions;
    keep.disabled = oneShot;
    keep.textContent = oneShot ? `${t("queue.record_keep")} — ${t("queue.record_refused_one_shot")}` : t("queue.record_keep");
    upload.disabled = pool;
    upload.textContent = pool ? `${t("queue.record_upload")} — ${t("queue.record_refused_pool")}` : t("queue.record_upload");
    if (pool) this.recInput.value = "";
    else if (oneShot && this.recInput.value === "keep") this.recInput.value = "upload";
    let note = "";
    if (pool) note = t("queue.record_note_pool");
    else if (oneShot) note = t("queue.record_note_one_shot");
    else if (target.kind !== "local") note = t("queue.record_note_worker");
    // a ComfyUI run's files always come to this server, then home into ComfyUI's output folder
    if (isComfyWorkflow(this.loaded.graph.prompt)) note = [note, t("queue.record_note_comfy")].filter(Boolean).join(" ");
    this.recNote.dataset.xpufleet = "record-note";
    replace(this.recNote, note);
  }

  targetOptions() { return this.picker.choice(); }

  async loadEstimate() {
    const { target, kind } = this.targetOptions();
    if (!this.loaded.graph.prompt) return;
    if (kind === "local" || kind === "spread") { // a spread run takes exclusive cards: no budget
      replace(this.budgetBox, h("div", { class: "xf-hint" }, t(kind === "local" ? "queue.budget_local" : "queue.budget_spread")));
      return;
    }
    if (this.estimateError?.status === 404) { this.renderEstimate(); return; } // not built on this server: ask once
    const seq = (this.estimateSeq = (this.estimateSeq || 0) + 1);
    replace(this.budgetBox, h("div", { class: "xf-hint" }, t("queue.estimating")));
    try {
      const answer = await this.o.fleet.estimate(this.loaded.graph.prompt, { target });
      if (seq !== this.estimateSeq) return;
      this.estimate = answer;
      this.estimateError = null;
    } catch (err) {
      if (seq !== this.estimateSeq) return;
      this.estimate = null;
      this.estimateError = err;
    }
    this.renderEstimate();
  }

  renderEstimate() {
    const e = this.estimate;
    if (this.estimateError) {
      const err = this.estimateError;
      const text = err.status === 404 ? t("queue.estimate_missing") : `${t("queue.estimate_failed")}: ${err.message}`;
      this.budgetBox.dataset.source = "unavailable";
      replace(this.budgetBox, h("div", { class: "xf-note" }, text));
      return;
    }
    if (!e) return;
    this.budgetBox.dataset.source = e.source;
    if (!this.budgetTouched) this.budgetInput.value = e.budget_gib ?? "";
    const items = (e.items || []).map((i) => h("li", {}, `${i.label || i.name}: ${gib(i.gib, 2)}`));
    let head;
    if (e.source === "measured") head = t("queue.source_measured", { run: String(e.from_run || "").slice(0, 8) });
    else if (e.source === "estimate") head = t("queue.source_estimate");
    else head = t("queue.source_none");
    replace(this.budgetBox,
      h("div", {}, head, e.total_gib != null ? ` — ${gib(e.total_gib, 2)}` : ""),
      items.length ? h("ul", { class: "xf-list" }, items) : null,
      e.rough ? h("div", { class: "xf-warn" }, t("queue.rough"), (e.reasons || []).map((r) => h("div", {}, r))) : null);
  }

  // --- submit ---
  submit() {
    const { options, target, kind } = this.targetOptions();
    if (this.nameInput.value.trim()) options.name = this.nameInput.value.trim();
    if (this.seedInput.value !== "") options.seed = Number(this.seedInput.value);
    if (this.detInput.checked) options.deterministic = true;
    if (this.recInput.value) options.record_outputs = this.recInput.value === "upload" ? "upload" : true;
    const budget = this.budgetInput.value === "" || kind === "spread" ? null : Number(this.budgetInput.value);
    const e = this.estimate;
    if (budget !== null) {
      const unchanged = e && !this.budgetTouched && e.budget_gib === budget;
      // An unchanged measured suggestion is the server's own default: not sent (docs/workers.md). An unchanged
      // estimate is sent and marked as one; anything typed is the user's.
      if (!(unchanged && e.source === "measured")) {
        target.memory_gib = budget;
        if (unchanged && e.source === "estimate") target.memory_source = "estimate";
      }
    }
    if (this.waitInput.checked && kind !== "spread") target.wait = true;
    options.target = target;
    const fan = this.fanChoice();
    if (fan?.error) { this.fanChanged(); this.fan.n.focus(); return undefined; }
    if (fan) { // a sweep over the seed: its children carry the run's options (their name is the sweep's)
      const { name, ...childOptions } = options;
      const body = fanOutBody({ prompt: this.loaded.graph.prompt, path: fan.path, start: fan.start, n: fan.n, name, options: childOptions });
      return this.frame.send(() => this.o.fleet.submitSweep(body), (answer) => {
        rememberTarget(this.loaded.graph.key, this.picker.state());
        this.o.openSweep(answer.sweep_id);
      });
    }
    return this.frame.send(() => this.o.fleet.submit(this.loaded.graph.prompt, options), (answer) => {
      rememberTarget(this.loaded.graph.key, this.picker.state());
      this.o.queued?.(answer.run_id, this.loaded.graph.key);
      this.o.openRuns(answer.run_id);
    });
  }
}

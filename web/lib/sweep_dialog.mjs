// The New sweep dialog (docs/workers.md "Sweep 與 study", docs/sweeps.md): the current graph, node parameters with
// their values (a list or a range), seeds, the objective, and the same target and device picker as
// Queue on... Every change asks the server for a dry run (POST /api/sweeps?dry_run=1): the variant
// count, the first variants and any rejection come from the server, which also expands the grid.
import { ApiFailure } from "./api.mjs";
import { field, h, nextId, replace } from "./dom.mjs";
import { isComfyWorkflow } from "./fan_out.mjs";
import { GraphDialog, singleDialog } from "./graph_dialog.mjs";
import { t } from "./i18n.mjs";
import { TargetPicker } from "./target_picker.mjs";

const PREVIEW_DEBOUNCE_MS = 250;
const PREVIEW_SHOWN = 8;

/**
 * The scalar inputs of an API-format graph (links are arrays), grouped by node for the picker:
 * [{path, node, input, class_type, value, title}]. ``title`` is the node's title on the canvas
 * (ComfyUI's prompt keeps it in ``_meta.title``), else its class without the plugin's XPU prefix; a
 * title two nodes share gets the node id.
 */
export function graphParameters(prompt) {
  const out = [];
  const titles = new Map();
  for (const [node, spec] of Object.entries(prompt || {})) {
    const title = String(spec?._meta?.title || String(spec?.class_type || node).replace(/^XPU/, ""));
    titles.set(title, (titles.get(title) || 0) + 1);
    for (const [input, value] of Object.entries(spec?.inputs || {})) {
      if (["number", "string", "boolean"].includes(typeof value)) {
        out.push({ path: `${node}.${input}`, node, input, class_type: spec.class_type, value, title });
      }
    }
  }
  for (const p of out) if (titles.get(p.title) > 1) p.title = `${p.title} #${p.node}`;
  return out;
}

/** The parameter New sweep opens on: the optimizer's learning rate, else any lr, else the first number. */
export function defaultParameter(params) {
  return params.find((p) => p.input === "lr" && /Optimizer$/.test(String(p.class_type)))
    || params.find((p) => p.input === "lr")
    || params.find((p) => typeof p.value === "number" && p.value > 0)
    || params[0] || null;
}

/**
 * A first choice of values for a parameter that the server accepts as it stands: a positive float
 * spans a decade each side on a log range (an lr of 0.002: 0.0002, 0.002, 0.02), a positive int its
 * value and its double, a boolean both values, anything else its current value.
 */
export function defaultValues(p) {
  const v = p?.value;
  if (typeof v === "number" && v > 0 && !Number.isInteger(v)) {
    return { kind: "log", low: cleanNumber(v / 10), high: cleanNumber(v * 10), steps: 3 };
  }
  if (typeof v === "number" && v > 0) return { kind: "values", values: `${v}, ${v * 2}` };
  if (typeof v === "boolean") return { kind: "values", values: "true, false" };
  return { kind: "values", values: String(v ?? "") };
}

function cleanNumber(x) { return Number(x.toPrecision(12)); }

/**
 * A typed list of values as JSON: separated by commas (by semicolons when any value holds a comma);
 * numbers stay numbers where the graph holds a number, true/false where it holds a boolean.
 */
export function parseValues(text, current) {
  const raw = String(text || "");
  const parts = raw.split(raw.includes(";") ? ";" : ",").map((s) => s.trim()).filter((s) => s !== "");
  return parts.map((s) => {
    if (typeof current === "boolean" && /^(true|false)$/i.test(s)) return s.toLowerCase() === "true";
    if (typeof current !== "string" && s !== "" && Number.isFinite(Number(s))) return Number(s);
    return s;
  });
}

/**
 * @param {object} o
 * @param {import("./api.mjs").Fleet} o.fleet
 * @param {() => Promise<{prompt: object|null, name: string, problem?: string}>} o.graph  the graph to sweep
 * @param {() => Promise<string[]>} o.localDevices  this server's devices
 * @param {(sweepId: string) => void} o.openSweep
 * @param {() => void} o.openWorkers
 */
export const openSweepDialog = singleDialog((o, closed) => new SweepDialog(o, closed));

class SweepDialog {
  constructor(o, closed) {
    this.o = o;
    this.graph = null;
    this.params = [];
    this.picker = null;
    this.frame = new GraphDialog({ kind: "sweep", classes: "xf-sweep-dialog", title: () => t("sweep.new"),
      onClose: () => { clearTimeout(this.previewTimer); closed(); } });
    this.rows = [];
    this.previewSeq = 0;
    this.previewTimer = null;
  }

  async open() {
    const { graph, workers, workersError, local } = await this.frame.load(this.o);
    this.graph = graph;
    this.picker = new TargetPicker({ workers, workersError, local,
      onChange: () => this.changed(), openWorkers: () => { this.close(); this.o.openWorkers(); } });
    this.params = graphParameters(graph.prompt);
    this.build();
  }

  close() { this.frame.close(); }

  // --- form ---
  build() {
    const changed = () => this.changed();
    this.nameInput = h("input", { type: "text", value: this.graph.name ? `${this.graph.name} sweep` : "", maxlength: "200",
      autocomplete: "off", oninput: changed });
    this.modeSelect = h("select", { dataset: { xpufleet: "sweep-mode" }, onchange: changed },
      h("option", { value: "grid" }, t("sweep.mode_grid")), h("option", { value: "random" }, t("sweep.mode_random")));
    this.samplesInput = h("input", { type: "number", min: "1", step: "1", value: "4", dataset: { xpufleet: "sweep-samples" }, oninput: changed });
    this.randomSeedInput = h("input", { type: "number", min: "0", step: "1", placeholder: t("queue.seed_none"), oninput: changed });
    this.randomBox = h("div", { class: "xf-grid" }, field(t("sweep.samples"), this.samplesInput), field(t("sweep.random_seed"), this.randomSeedInput));
    this.seedsInput = h("input", { type: "number", min: "1", step: "1", placeholder: t("sweep.seeds_none"),
      dataset: { xpufleet: "sweep-seeds" }, oninput: changed });
    // a ComfyUI workflow reports no metric: its sweep compares images, no objective unless one is typed
    this.metricInput = h("input", { type: "text", value: isComfyWorkflow(this.graph.prompt) ? "" : "val_accuracy", autocomplete: "off",
      dataset: { xpufleet: "sweep-metric" }, oninput: changed });
    this.directionSelect = h("select", { dataset: { xpufleet: "sweep-direction" }, onchange: changed },
      h("option", { value: "" }, t("sweep.direction_auto")), h("option", { value: "maximize" }, t("sweep.maximize")),
      h("option", { value: "minimize" }, t("sweep.minimize")));
    this.budgetInput = h("input", { type: "number", min: "0", step: "any", placeholder: t("queue.budget_none"),
      dataset: { xpufleet: "sweep-budget" }, oninput: changed });
    this.waitInput = h("input", { type: "checkbox", id: nextId("xf-swait"), onchange: changed });
    this.paramsBox = h("div", { class: "xf-sweep-params", dataset: { xpufleet: "sweep-params" } });
    this.previewBox = h("div", { class: "xf-sweep-preview", "aria-live": "polite", dataset: { xpufleet: "sweep-preview" } });
    this.frame.form(this.graph, t("sweep.submit"), () => this.submit(),
      h("fieldset", {}, h("legend", {}, t("sweep.parameters")), this.paramsBox,
        h("button", { type: "button", dataset: { xpufleet: "sweep-add-param" }, disabled: !this.params.length,
          onclick: () => this.addRow() }, t("sweep.add_parameter"))),
      h("div", { class: "xf-grid" }, field(t("sweep.mode"), this.modeSelect), field(t("sweep.seeds"), this.seedsInput, t("sweep.seeds_hint"))),
      this.randomBox,
      h("div", { class: "xf-grid" }, field(t("sweep.metric"), this.metricInput), field(t("sweep.direction"), this.directionSelect)),
      field(t("queue.name"), this.nameInput),
      this.picker.elements,
      h("fieldset", { class: "xf-budget-box" }, h("legend", {}, t("queue.budget")),
        field(t("queue.budget_field"), this.budgetInput, t("sweep.budget_hint")),
        h("div", { class: "xf-choice" }, this.waitInput, h("label", { for: this.waitInput.id }, t("queue.wait")))),
      this.previewBox);
    if (this.params.length) this.addRow(false);
    this.picker.targetChanged();
    this.frame.focus();
  }

  addRow(focus = true) {
    const changed = () => this.changed();
    const row = {};
    row.path = h("select", { dataset: { xpufleet: "sweep-param" }, "aria-label": t("sweep.parameter"),
      onchange: () => { this.fill(row); changed(); } }, this.pickerGroups());
    row.kind = h("select", { dataset: { xpufleet: "sweep-kind" }, "aria-label": t("sweep.kind"), onchange: () => { this.showKind(row); changed(); } },
      h("option", { value: "values" }, t("sweep.kind_values")), h("option", { value: "range" }, t("sweep.kind_range")),
      h("option", { value: "log" }, t("sweep.kind_log")));
    row.values = h("input", { type: "text", autocomplete: "off", dataset: { xpufleet: "sweep-values" }, oninput: changed });
    row.low = h("input", { type: "number", step: "any", dataset: { xpufleet: "sweep-low" }, oninput: changed });
    row.high = h("input", { type: "number", step: "any", dataset: { xpufleet: "sweep-high" }, oninput: changed });
    row.steps = h("input", { type: "number", min: "2", step: "1", value: "3", dataset: { xpufleet: "sweep-steps" }, oninput: changed });
    row.current = h("span", { class: "xf-hint" });
    row.valuesBox = h("div", { class: "xf-sweep-values" }, field(t("sweep.values"), row.values, t("sweep.values_hint")));
    row.rangeBox = h("div", { class: "xf-grid" }, field(t("sweep.low"), row.low), field(t("sweep.high"), row.high),
      field(t("sweep.steps"), row.steps));
    row.el = h("div", { class: "xf-sweep-param", dataset: { xpufleet: "sweep-param-row" } },
      h("div", { class: "xf-sweep-param-head" }, row.path, row.kind, row.current,
        h("button", { type: "button", class: "xf-link", dataset: { xpufleet: "sweep-remove-param" },
          onclick: () => { this.rows = this.rows.filter((r) => r !== row); row.el.remove(); changed(); } }, t("sweep.remove"))),
      row.valuesBox, row.rangeBox);
    // the optimizer's learning rate first, then the next parameter not yet chosen
    const used = new Set(this.rows.map((r) => r.path.value));
    const first = defaultParameter(this.params);
    row.path.value = (!used.has(first?.path) ? first : this.params.find((p) => !used.has(p.path)) || first).path;
    this.rows.push(row);
    this.paramsBox.append(row.el);
    this.fill(row);
    if (focus) { row.path.focus(); changed(); }
  }

  /** The picker's options: one group per node (its title), each input by name. */
  pickerGroups() {
    const groups = new Map();
    for (const p of this.params) {
      if (!groups.has(p.node)) groups.set(p.node, h("optgroup", { label: p.title, dataset: { node: p.node } }));
      groups.get(p.node).append(h("option", { value: p.path }, p.input));
    }
    return [...groups.values()];
  }

  /** A row's values set to a first choice the server accepts (see defaultValues). */
  fill(row) {
    const d = defaultValues(this.params.find((x) => x.path === row.path.value));
    row.kind.value = d.kind;
    row.values.value = d.values ?? "";
    row.low.value = d.low ?? "";
    row.high.value = d.high ?? "";
    row.steps.value = String(d.steps ?? 3);
    this.showCurrent(row);
    this.showKind(row);
  }

  /** True while a row misses a value the user has still to type (no request goes out until then). */
  incomplete() {
    const random = this.modeSelect.value === "random";
    return this.rows.some((row) => (row.kind.value === "values" ? row.values.value.trim() === ""
      : row.low.value === "" || row.high.value === "" || (!random && row.steps.value === "")));
  }

  showCurrent(row) {
    const p = this.params.find((x) => x.path === row.path.value);
    row.current.textContent = p ? t("sweep.current", { value: JSON.stringify(p.value) }) : "";
  }

  showKind(row) {
    row.valuesBox.hidden = row.kind.value !== "values";
    row.rangeBox.hidden = row.kind.value === "values";
  }

  /** The POST /api/sweeps body of the form as it stands. */
  body() {
    const parameters = {};
    const random = this.modeSelect.value === "random";
    for (const row of this.rows) {
      const p = this.params.find((x) => x.path === row.path.value);
      if (row.kind.value === "values") {
        parameters[row.path.value] = parseValues(row.values.value, p?.value);
      } else {
        const range = { low: numberOrText(row.low.value), high: numberOrText(row.high.value) };
        if (row.kind.value === "log") range.log = true;
        if (!random) range.steps = numberOrText(row.steps.value); // a random draw takes no grid steps
        parameters[row.path.value] = range;
      }
    }
    const { options, target } = this.picker.choice();
    // the budget of each variant (the server checks every one of them, and names a refusal)
    if (this.budgetInput.value !== "") target.memory_gib = numberOrText(this.budgetInput.value);
    if (this.waitInput.checked) target.wait = true;
    const body = { graph: this.graph.prompt, mode: this.modeSelect.value, parameters, options: { ...options, target } };
    if (this.metricInput.value.trim() || !isComfyWorkflow(this.graph.prompt)) body.objective = { metric: this.metricInput.value.trim() };
    if (body.objective && this.directionSelect.value) body.objective.direction = this.directionSelect.value;
    if (this.nameInput.value.trim()) body.name = this.nameInput.value.trim();
    if (this.seedsInput.value !== "") body.seeds = numberOrText(this.seedsInput.value);
    if (random) {
      body.samples = numberOrText(this.samplesInput.value);
      if (this.randomSeedInput.value !== "") body.random_seed = numberOrText(this.randomSeedInput.value);
    }
    return body;
  }

  changed() {
    if (!this.modeSelect) return; // the picker draws its devices before the form is complete
    this.randomBox.hidden = this.modeSelect.value !== "random";
    for (const row of this.rows) row.steps.closest(".xf-field").hidden = this.modeSelect.value === "random";
    clearTimeout(this.previewTimer);
    this.previewTimer = setTimeout(() => this.preview(), PREVIEW_DEBOUNCE_MS);
  }

  async preview() {
    if (!this.graph.prompt) return;
    const seq = (this.previewSeq += 1);
    if (this.incomplete()) { // the server would refuse an empty field: say what is missing instead of asking
      this.previewBox.dataset.state = "incomplete";
      delete this.previewBox.dataset.count;
      replace(this.previewBox, h("div", { class: "xf-hint" }, t("sweep.fill_in")));
      return;
    }
    this.previewBox.dataset.state = "checking";
    replace(this.previewBox, h("div", { class: "xf-hint" }, t("sweep.checking")));
    let answer;
    try {
      answer = await this.o.fleet.sweepDryRun(this.body());
    } catch (err) {
      if (seq !== this.previewSeq) return;
      this.previewBox.dataset.state = "rejected";
      delete this.previewBox.dataset.count;
      replace(this.previewBox, h("div", { class: "xf-error", dataset: { xpufleet: "sweep-rejected" } },
        `${t("sweep.rejected")}: ${err instanceof ApiFailure ? err.message : String(err)}`));
      return;
    }
    if (seq !== this.previewSeq) return;
    this.previewBox.dataset.state = "ok";
    this.previewBox.dataset.count = String(answer.n_runs);
    const shown = (answer.variants || []).slice(0, PREVIEW_SHOWN);
    const moved = answer.own_outputs || [];
    replace(this.previewBox,
      h("div", { class: "xf-sweep-count", dataset: { xpufleet: "sweep-count" } }, t("sweep.count", { n: answer.n_runs })),
      moved.length ? h("div", { class: "xf-hint xf-sweep-outputs", dataset: { xpufleet: "sweep-own-outputs" } },
        t("sweep.own_outputs", { files: moved.map((o) => `${o.title || o.class_type}: ${o.filename ?? "?"}`).join(", ") })) : null,
      h("ul", { class: "xf-list" }, shown.map((v) => h("li", {},
        `#${v.variant} ${Object.entries(v.parameters || {}).map(([k, x]) => `${this.label(k)}=${x}`).join(", ")}`,
        v.seed !== null && v.seed !== undefined ? ` · ${t("queue.seed")} ${v.seed}` : "",
        v.queue_key ? h("span", { class: "xf-hint" }, ` · ${v.queue_key}`) : null))),
      answer.n_runs > shown.length ? h("div", { class: "xf-hint" }, t("sweep.more", { n: answer.n_runs - shown.length })) : null);
  }

  /** "5.lr" -> "Optimizer lr" (the picker's words). */
  label(path) {
    const p = this.params.find((x) => x.path === path);
    return p ? `${p.title} ${p.input}` : path;
  }

  // --- submit ---
  submit() {
    return this.frame.send(() => this.o.fleet.submitSweep(this.body()), (answer) => this.o.openSweep(answer.sweep_id));
  }
}

/** A number field's value as a number (the server names a bad one), or the text when it is not one. */
function numberOrText(value) {
  return value !== "" && Number.isFinite(Number(value)) ? Number(value) : value;
}

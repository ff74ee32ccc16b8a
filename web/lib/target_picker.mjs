// The target and device picker of Queue on... and New sweep (docs/workers.md): this server (one device), each
// worker with its status and devices (cards of one kind, each with its in-run name), any free worker
// by device kind, a one-shot pool (docs/workers.md), or several workers (ddp across workers: target.spread). It turns the choice into POST /api/runs options; the
// server decides the rest (which workers are `selectable`, what it refuses).
import { field, h, nextId, replace } from "./dom.mjs";
import { gib } from "./format.mjs";
import { t } from "./i18n.mjs";

const KINDS = [["", "queue.kind_auto"], ["cuda", "queue.kind_cuda"], ["cpu", "queue.kind_cpu"], ["mps", "queue.kind_mps"]];

export class TargetPicker {
  /**
   * @param {object} o
   * @param {object[]} o.workers        GET /api/workers's workers
   * @param {object[]} [o.pools]        GET /api/workers's pools (one-shot pools as targets)
   * @param {Error|null} o.workersError why they could not be read
   * @param {string[]} o.local          this server's devices
   * @param {() => void} o.onChange     the target or the devices changed
   * @param {() => void} o.openWorkers  the "Open the Workers panel" link
   */
  constructor({ workers, pools, workersError, local, onChange, openWorkers }) {
    this.workers = workers || [];
    this.pools = pools || [];
    this.workersError = workersError;
    this.local = local?.length ? local : ["cpu"];
    this.onChange = onChange || (() => {});
    this.openWorkers = openWorkers;
    this.deviceChecks = [];
    this.devicesBox = h("fieldset", { class: "xf-devices" });
    this.targetsBox = this.buildTargets();
    this.elements = [this.targetsBox, this.devicesBox];
  }

  buildTargets() {
    const name = `xf-target-${nextId()}`;
    const targets = [];
    const addTarget = (value, text, { disabled = false, note = "", status = "", title = null } = {}) => {
      const input = h("input", { type: "radio", name, value, disabled, id: nextId("xf-t"),
        dataset: { target: value }, onchange: () => this.targetChanged() });
      targets.push(h("div", { class: `xf-choice${disabled ? " xf-disabled" : ""}`, dataset: { status } },
        input, h("label", { for: input.id, title }, text, note ? h("span", { class: "xf-hint" }, ` — ${note}`) : null)));
      return input;
    };
    this.targetInputs = [addTarget("local", t("queue.this_server"))];
    this.targetInputs[0].checked = true;
    for (const w of this.workers) {
      const devs = (w.devices || []).map((d) => d.name + (d.simulated ? "*" : "")).join(", ");
      const selectable = w.selectable !== false; // the server's rule (Disabled, Draining: listed, not chosen)
      const why = selectable ? (w.status === "Disconnected" ? t("queue.waits_for_it") : "")
        : t("queue.not_selectable", { status: t(`status.${w.status}`) });
      this.targetInputs.push(addTarget(`worker:${w.name}`,
        `${w.name} — ${t(`status.${w.status}`)} — ${devs || t("queue.no_devices")}`,
        { disabled: !selectable, note: why, status: w.status, title: devs.includes("*") ? t("queue.simulated_mark") : null }));
    }
    if (this.workers.some((w) => w.connected && !w.drained)) {
      this.targetInputs.push(addTarget("any", t("queue.any")));
    }
    if (this.spreadWorkers().length >= 2) { // ddp across workers: one rank per card, on several workers
      this.targetInputs.push(addTarget("spread", t("queue.spread"), { note: t("queue.spread_note") }));
    }
    for (const p of this.pools) {
      const counts = t("queue.pool_counts", { idle: p.idle ?? 0, busy: p.busy ?? 0, queued: p.queued ?? 0 });
      this.targetInputs.push(addTarget(`pool:${p.name}`, `${p.name} — ${t("queue.pool")} — ${counts}`,
        { note: p.revoked ? t("queue.pool_revoked") : (p.idle ? "" : poolWaits(p)), status: "pool" }));
    }
    const noWorkers = this.workers.length || this.pools.length ? null : h("div", { class: "xf-note", dataset: { xpufleet: "no-workers" } },
      this.workersError ? `${t("queue.workers_unavailable")}: ${this.workersError.message}` : t("queue.no_workers"), " ",
      h("button", { type: "button", class: "xf-link", onclick: () => this.openWorkers() }, t("queue.open_workers")));
    // the "*" after a card's name is explained where it appears (and on hover of its line)
    const marked = this.workers.some((w) => (w.devices || []).some((d) => d.simulated));
    return h("fieldset", { class: "xf-targets", dataset: { xpufleet: "targets" } }, h("legend", {}, t("queue.target")), targets, noWorkers,
      marked ? h("div", { class: "xf-hint", dataset: { xpufleet: "simulated-mark" } }, t("queue.simulated_mark")) : null);
  }

  /** Workers a run spread over workers may use: selectable, with CUDA or XPU cards. */
  spreadWorkers() {
    return this.workers.filter((w) => w.selectable !== false && !w.one_shot
      && (w.devices || []).some((d) => d.kind === "cuda" || d.kind === "xpu"));
  }

  selected() {
    const input = this.targetInputs.find((i) => i.checked) || this.targetInputs[0];
    const v = input.value;
    if (v === "local" || v === "any" || v === "spread") return { kind: v };
    if (v.startsWith("pool:")) {
      const name = v.slice("pool:".length);
      return { kind: "pool", name, pool: this.pools.find((p) => p.name === name) };
    }
    const name = v.slice("worker:".length);
    return { kind: "worker", name, worker: this.workers.find((w) => w.name === name) };
  }

  /** Draw the devices of the chosen target (call once after the elements are in the page). */
  targetChanged() {
    const target = this.selected();
    const box = this.devicesBox;
    this.deviceChecks = [];
    this.deviceSelect = null;
    this.kindSelect = null;
    if (target.kind === "local") {
      this.deviceSelect = h("select", { dataset: { xpufleet: "local-device" }, onchange: () => this.onChange() },
        h("option", { value: "" }, t("queue.device_graph")),
        this.local.map((d) => h("option", { value: d }, d)));
      replace(box, h("legend", {}, t("queue.devices")), field(t("queue.one_device"), this.deviceSelect));
    } else if (target.kind === "any" || target.kind === "pool") {
      this.kindSelect = h("select", { dataset: { xpufleet: "any-kind" }, onchange: () => this.onChange() },
        KINDS.map(([v, k]) => h("option", { value: v }, t(k))));
      replace(box, h("legend", {}, t("queue.devices")), field(t("queue.kind"), this.kindSelect,
        target.kind === "pool" ? t("queue.pool_hint") : t("queue.first_free")));
    } else if (target.kind === "spread") {
      const groups = this.spreadWorkers().map((w) => h("div", { class: "xf-choice", dataset: { spreadWorker: w.name } },
        h("strong", {}, w.name), (w.devices || []).filter((d) => d.kind === "cuda" || d.kind === "xpu").map((d) => {
          const input = h("input", { type: "checkbox", value: d.name, id: nextId("xf-d"),
            dataset: { device: `${w.name}:${d.name}`, kind: d.kind }, onchange: () => this.devicesChanged() });
          const alias = h("span", { class: "xf-alias", dataset: { alias: `${w.name}:${d.name}` } });
          this.deviceChecks.push({ input, alias, device: d, worker: w.name });
          return h("span", {}, " ", input, h("label", { for: input.id, title: d.simulated ? t("queue.simulated_mark") : null },
            d.name + (d.simulated ? "*" : "")), " ", alias);
        })));
      replace(box, h("legend", {}, t("queue.devices")), groups, h("div", { class: "xf-hint" }, t("queue.spread_hint")));
    } else {
      const w = target.worker;
      const rows = (w?.devices || []).map((d) => {
        const input = h("input", { type: "checkbox", value: d.name, id: nextId("xf-d"), dataset: { device: d.name, kind: d.kind },
          onchange: () => this.devicesChanged() });
        const alias = h("span", { class: "xf-alias", dataset: { alias: d.name } });
        this.deviceChecks.push({ input, alias, device: d });
        const mem = d.total_gib ? ` · ${t("capsule.free_of", { free: gib(d.free_gib), total: gib(d.total_gib) })}` : "";
        return h("div", { class: "xf-choice" }, input, h("label", { for: input.id },
          `${d.name}${d.label ? ` (${d.label})` : ""}${mem}`,
          d.simulated ? h("span", { class: "xf-tag xf-sim" }, t("common.simulated")) : null,
          d.mode === "shared" ? h("span", { class: "xf-tag" }, t("workers.mode_shared")) : null), " ", alias);
      });
      replace(box, h("legend", {}, t("queue.devices")), rows.length ? rows : h("div", { class: "xf-hint" }, t("queue.no_devices")),
        h("div", { class: "xf-hint" }, t("queue.first_free")));
    }
    this.devicesChanged();
  }

  devicesChanged() {
    const checked = this.deviceChecks.filter((c) => c.input.checked);
    const kind = checked[0]?.device.kind;
    this.deviceChecks.forEach((c) => {
      c.input.disabled = Boolean(kind) && c.device.kind !== kind; // a set is of one kind
      const at = checked.indexOf(c);
      if (c.worker) { // across workers: ranks numbered in the listed order of workers and cards
        c.alias.textContent = at >= 0 ? t("queue.spread_rank", { rank: at }) : "";
        return;
      }
      // the run sees its cards renumbered from 0 in the order the worker lists them
      c.alias.textContent = at >= 0 && c.device.kind !== "cpu"
        ? t("queue.in_run", { machine: c.device.name, run: `${c.device.kind}:${at}` }) : "";
    });
    this.onChange();
  }

  /** What the user picked, to remember: {target: "local" | "any" | "worker:NAME" | "pool:NAME", devices, device}. */
  state() {
    const input = this.targetInputs.find((i) => i.checked) || this.targetInputs[0];
    return { target: input.value, devices: this.deviceChecks.filter((c) => c.input.checked).map((c) => c.device.name),
             device: this.deviceSelect?.value || this.kindSelect?.value || "" };
  }

  /** Pick a remembered {@link state} again, as far as it still applies (a gone or disabled target is skipped). */
  restore(state) {
    const input = this.targetInputs.find((i) => i.value === state?.target && !i.disabled);
    if (!input) return false;
    input.checked = true;
    this.targetChanged();
    const select = this.deviceSelect || this.kindSelect;
    if (select && [...select.options].some((o) => o.value === state.device)) select.value = state.device;
    for (const c of this.deviceChecks) c.input.checked = (state.devices || []).includes(c.device.name);
    this.devicesChanged();
    return true;
  }

  /** The choice as POST /api/runs options: {options: {device?}, target: {worker | pool | spread, devices?}, kind}. */
  choice() {
    const target = this.selected();
    const options = {};
    const tgt = {};
    if (target.kind === "local") {
      tgt.worker = "local";
      if (this.deviceSelect?.value) options.device = this.deviceSelect.value;
    } else if (target.kind === "any") {
      tgt.worker = "any";
      if (this.kindSelect?.value) options.device = this.kindSelect.value;
    } else if (target.kind === "pool") {
      tgt.pool = target.name;
      if (this.kindSelect?.value) options.device = this.kindSelect.value;
    } else if (target.kind === "spread") {
      const parts = new Map(); // worker -> its checked cards, in the listed order (= rank order)
      for (const c of this.deviceChecks.filter((x) => x.input.checked)) {
        parts.set(c.worker, [...(parts.get(c.worker) || []), c.device.name]);
      }
      tgt.spread = [...parts].map(([worker, devices]) => ({ worker, devices }));
    } else {
      tgt.worker = target.name;
      const devices = this.deviceChecks.filter((c) => c.input.checked).map((c) => c.device.name);
      if (devices.length) tgt.devices = devices;
    }
    return { options, target: tgt, kind: target.kind };
  }
}

/** Why a run for an idle-less pool waits: a Slurm pool names its jobs' states (PENDING (Resources), ...). */
function poolWaits(p) {
  if (p.kind !== "slurm") return t("queue.pool_waits");
  const live = (p.jobs || []).filter((j) => !j.ended_at).map((j) => `${j.id}: ${j.status}`);
  return t("queue.pool_slurm", { jobs: live.join(", ") || "—" });
}

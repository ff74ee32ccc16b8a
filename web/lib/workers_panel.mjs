// The Workers panel (docs/workers.md, "Workers 面板"): every worker with its status, version, environment,
// node types, last rejection, heartbeat; each device's memory, slots and mode (memory bars for shared
// cards); its runs; drain/undrain, disable/enable (SSH workers), remove and reissue (a second click
// that says what it will do: the server's `confirm` texts); add worker ("via SSH" or a join command,
// opened on the tab the server's `add_worker.default` names); rejected connections. This server's own
// machine comes first (it runs local runs and sweep variants), pools after the workers (workers_parts.mjs).
// Refreshed every 5 s while open. Simulated cards say so.
import { field, h, replace, sleep } from "./dom.mjs";
import { ago, gib } from "./format.mjs";
import { t } from "./i18n.mjs";
import { admissionCell, poolsSection, runsLine } from "./workers_parts.mjs";

export const REFRESH_MS = 5000;
const CONFIRM_MS = 6000; // a first click on remove/reissue arms it this long
const SHAREABLE = new Set(["cuda", "mps"]);
const LOOPBACK = /^(127\.|localhost$|\[::1\]$|::1$)/;

export class WorkersPanel {
  /**
   * @param {object} o
   * @param {import("./api.mjs").Fleet} o.fleet
   * @param {(runId: string) => void} o.openRun
   */
  constructor({ fleet, openRun }) {
    this.fleet = fleet;
    this.openRun = openRun;
    this.container = null;
    this.armed = new Map(); // "remove:name" -> timer
    this.joinAnswer = null;
    this.addOpen = false;
    this.addWorker = null; // the server's {default: "ssh"|"join", reason}
    this.addTab = null; // the tab the user chose (else the server's default)
    this.sshAdded = null; // the SSH worker added from the form: its connection state shows there
    this.refreshes = 0;
  }

  mount(container) {
    if (this.container === container && container.contains(this.root)) return;
    this.unmount();
    this.container = container;
    this.abort = new AbortController();
    this.body = h("div", { class: "xf-workers-body", dataset: { xpufleet: "workers-body" } }, h("div", { class: "xf-hint" }, t("common.loading")));
    this.addBox = h("div", { class: "xf-add-worker", hidden: !this.addOpen, dataset: { xpufleet: "add-worker" } });
    this.root = h("div", { class: "xf-panel xf-workers xf-root", dataset: { xpufleet: "workers-panel" } },
      h("header", { class: "xf-panel-head" },
        h("h2", {}, t("workers.title")),
        h("span", { class: "xf-hint" }, t("workers.every", { s: REFRESH_MS / 1000 })),
        h("span", { class: "xf-grow" }),
        h("button", { type: "button", "aria-expanded": String(this.addOpen), dataset: { xpufleet: "add-worker-button" },
          onclick: (e) => this.toggleAdd(e.currentTarget) }, t("workers.add"))),
      this.addBox, this.body);
    replace(container, this.root);
    this.renderAdd();
    this.loop();
  }

  unmount() {
    this.abort?.abort();
    for (const timer of this.armed.values()) clearTimeout(timer);
    this.armed.clear();
    this.container = null;
  }

  async loop() {
    const signal = this.abort.signal;
    while (!signal.aborted) {
      await this.refresh();
      await sleep(REFRESH_MS, signal);
    }
  }

  async refresh() {
    const signal = this.abort?.signal;
    try {
      const [w, r] = await Promise.all([this.fleet.workers({ signal }), this.fleet.rejected({ signal })]);
      this.workers = w.workers || [];
      this.pools = w.pools || [];
      this.thisServer = w.this_server || null;
      this.rejectedList = r.rejected || [];
      this.error = null;
      if (w.add_worker && JSON.stringify(w.add_worker) !== JSON.stringify(this.addWorker)) {
        this.addWorker = w.add_worker;
        this.renderAdd(); // the default tab is known now (the form keeps what was typed otherwise)
      }
    } catch (err) {
      if (err?.name === "AbortError") return;
      this.error = err;
    }
    this.refreshes += 1;
    this.render();
    this.renderSshProgress();
  }

  render() {
    if (!this.root) return;
    this.root.dataset.refreshes = String(this.refreshes);
    if (this.error) {
      replace(this.body, h("div", { class: "xf-error", role: "alert" }, this.error.message));
      return;
    }
    const known = new Set(this.workers.map((w) => w.name));
    // a known worker's refused hellos show on its card (last_rejection); unverified claims only here
    const rejected = this.rejectedList.filter((r) => r.unverified || !known.has(r.name));
    const focus = focusKey(this.body);
    replace(this.body,
      this.thisServer ? this.serverCard(this.thisServer) : null,
      this.workers.length ? this.workers.map((w) => this.card(w))
        : h("div", { class: "xf-note", dataset: { xpufleet: "no-workers" } }, t("workers.none")),
      poolsSection(this.pools, this.openRun),
      h("section", { class: "xf-rejected", dataset: { xpufleet: "rejected" } },
        h("h3", {}, t("workers.rejected")),
        rejected.length ? h("ul", { class: "xf-list" }, rejected.map((r) => h("li", {},
          `${r.name || "?"} (${r.address || "?"}${r.version ? `, ${r.version}` : ""}) — ${r.reason} · ${ago(r.age_s)}`)))
          : h("div", { class: "xf-hint" }, t("workers.rejected_none"))));
    restoreFocus(this.body, focus); // a refresh every 5 s must not take the keyboard focus away
  }

  card(w) {
    const env = w.environment || {};
    const envText = [env.hostname, env.os, env.python && `Python ${env.python}`, env.torch && `torch ${env.torch}`,
      env.cpu_count && t("workers.cpus", { n: env.cpu_count })].filter(Boolean).join(" · ");
    const nt = w.node_types;
    let ntText = t("workers.types_unknown");
    if (nt) {
      ntText = nt.match ? t("workers.types_same") : [
        nt.missing_on_worker?.length ? t("workers.types_missing", { list: nt.missing_on_worker.join(", ") }) : "",
        nt.only_on_worker?.length ? t("workers.types_only", { list: nt.only_on_worker.join(", ") }) : ""].filter(Boolean).join("; ");
    }
    const version = w.version
      ? `${w.version} ${w.version_match ? t("workers.version_same") : t("workers.version_differs", { server: w.server_version })}`
      : "—";
    const beat = w.connected ? t("workers.heartbeat", { ago: ago(w.heartbeat_age_s) })
      : t("workers.last_seen", { ago: ago(w.last_seen_age_s) });
    const confirm = w.confirm || {};
    const actions = [
      h("button", { type: "button", dataset: { xpufleet: w.drained ? "undrain" : "drain" },
        onclick: () => this.act(() => (w.drained ? this.fleet.undrain(w.name) : this.fleet.drain(w.name))) },
        w.drained ? t("workers.undrain") : t("workers.drain")),
    ];
    if (w.ssh && w.ssh.disabled) {
      actions.push(h("button", { type: "button", dataset: { xpufleet: "enable" },
        onclick: () => this.act(() => this.fleet.enable(w.name)) }, t("workers.enable")));
    } else if (w.ssh && confirm.disable) {
      actions.push(this.confirmButton(`disable:${w.name}`, t("workers.disable"),
        t("workers.click_again", { what: confirm.disable }), () => this.act(() => this.fleet.disable(w.name))));
    }
    if (w.auth === "credential") {
      actions.push(this.confirmButton(`reissue:${w.name}`, t("workers.reissue"),
        t("workers.reissue_confirm", { name: w.name }), () => this.reissue(w.name)));
    }
    const running = (w.runs || []).length;
    actions.push(this.confirmButton(`remove:${w.name}`, t("workers.remove"),
      confirm.remove ? t("workers.click_again", { what: confirm.remove })
        : t("workers.remove_confirm", { name: w.name, queued: w.queued || 0, running }),
      () => this.act(() => this.fleet.removeWorker(w.name)), "xf-danger"));
    return h("article", { class: `xf-worker${w.drained || w.status === "Disabled" ? " xf-drained" : ""}`, dataset: { worker: w.name, status: w.status },
      "aria-label": `${w.name}: ${t(`status.${w.status}`)}` },
      h("header", { class: "xf-worker-head" },
        h("h3", {}, w.name),
        h("span", { class: `xf-status xf-wstatus-${w.status}`, dataset: { xpufleet: "worker-status" } }, t(`status.${w.status}`)),
        w.status_reason ? h("span", { class: "xf-hint" }, w.status_reason) : null,
        w.simulated ? h("span", { class: "xf-tag xf-sim", dataset: { xpufleet: "simulated" } }, t("workers.simulated_worker")) : null,
        h("span", { class: "xf-grow" }),
        h("span", { class: "xf-actions" }, actions)),
      h("dl", { class: "xf-facts" },
        fact(t("workers.version"), version),
        fact(t("workers.environment"), envText || "—"),
        fact(t("workers.node_types"), ntText),
        fact(t("workers.heartbeat_label"), beat),
        w.last_rejection ? fact(t("workers.last_rejection"), `${w.last_rejection.reason}`) : null,
        w.ssh ? fact(t("workers.ssh"), sshLine(w.ssh)) : null,
        w.ssh ? fact(t("workers.ssh_setup"), h("span", { dataset: { xpufleet: "ssh-setup" } }, sshSetup(w.ssh))) : null,
        w.one_shot ? fact(t("workers.one_shot"), w.one_shot_taken ? t("workers.one_shot_taken") : t("workers.one_shot_idle")) : null,
        (w.mounts || []).length ? fact(t("workers.mounts"), w.mounts.map((m) => `${m.label} (${m.folder})`).join(", ")) : null,
        (w.warnings || []).length ? fact(t("workers.warnings"), w.warnings.join("; ")) : null),
      this.devicesTable(w),
      runsLine(w, this.openRun));
  }

  /** This server's own machine (target "local"): a row like a worker's, without the worker actions. */
  serverCard(w) {
    const env = w.environment || {};
    const envText = [env.hostname, env.os, env.python && `Python ${env.python}`, env.torch && `torch ${env.torch}`,
      env.cpu_count && t("workers.cpus", { n: env.cpu_count })].filter(Boolean).join(" · ");
    return h("article", { class: "xf-worker xf-this-server", dataset: { worker: w.name, thisServer: "true", status: w.status },
      "aria-label": `${t("workers.this_server")}: ${t(`status.${w.status}`)}` },
      h("header", { class: "xf-worker-head" },
        h("h3", {}, t("workers.this_server")),
        h("span", { class: `xf-status xf-wstatus-${w.status}`, dataset: { xpufleet: "worker-status" } }, t(`status.${w.status}`)),
        h("span", { class: "xf-hint" }, t("workers.this_server_hint")),
        w.simulated ? h("span", { class: "xf-tag xf-sim", dataset: { xpufleet: "simulated" } }, t("workers.simulated_worker")) : null),
      h("dl", { class: "xf-facts" },
        fact(t("workers.version"), w.version || "—"),
        fact(t("workers.environment"), envText || "—"),
        (w.warnings || []).length ? fact(t("workers.warnings"), w.warnings.join("; ")) : null),
      this.devicesTable(w),
      runsLine(w, this.openRun));
  }

  devicesTable(w) {
    const rows = (w.devices || []).map((d) => {
      const mem = d.total_gib ? t("capsule.free_of", { free: gib(d.free_gib), total: gib(d.total_gib) })
        : (d.free_gib !== null && d.free_gib !== undefined ? `${gib(d.free_gib)} ${t("workers.free")}` : "—");
      const slots = admissionCell(d, w.name);
      let mode = "—";
      if (w.this_server) { // this server's modes come from its environment (XPUFLEET_LOCAL_SHARED_CARDS), not switched here
        mode = h("span", { title: t("workers.mode_server") }, d.mode === "shared" ? t("workers.mode_shared") : t("workers.mode_exclusive"));
      } else if (SHAREABLE.has(d.kind)) {
        const shared = d.mode === "shared";
        mode = h("button", { type: "button", class: "xf-toggle", "aria-pressed": String(shared), dataset: { xpufleet: "mode", device: d.name },
          "aria-label": t("workers.mode_label", { device: d.name }),
          onclick: () => this.act(() => this.fleet.setMode(w.name, d.name, shared ? "exclusive" : "shared")) },
        shared ? t("workers.mode_shared") : t("workers.mode_exclusive"));
      }
      const same = (d.same_card_as || []).map((o) => `${o.provider}/${o.device}`).join(", ");
      return [h("tr", { dataset: { device: d.name } },
        h("th", { scope: "row" }, d.name, d.label ? h("span", { class: "xf-hint" }, ` ${d.label}`) : null,
          d.simulated ? h("span", { class: "xf-tag xf-sim" }, t("common.simulated")) : null),
        h("td", {}, mem, d.last_reported ? h("span", { class: "xf-hint" }, ` (${t("workers.last_reported")})`) : null),
        h("td", {}, slots),
        h("td", {}, mode)),
      d.mode === "shared" || same ? h("tr", { class: "xf-subrow" }, h("td", { colspan: "4" },
        d.mode === "shared" ? memoryBar(d) : null,
        same ? h("div", { class: "xf-hint" }, t("workers.same_card", { list: same })) : null)) : null];
    });
    if (!rows.length) return h("div", { class: "xf-hint", dataset: { xpufleet: "no-devices" } }, t("workers.no_devices"));
    return h("table", { class: "xf-devices-table" },
      h("thead", {}, h("tr", {}, [t("workers.device"), w.this_server ? t("workers.memory_now") : t("workers.memory"), t("workers.rule_col"), t("workers.mode")].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, rows));
  }

  confirmButton(key, label, confirmText, action, cls = "") {
    const armed = this.armed.has(key);
    return h("button", { type: "button", class: `${cls}${armed ? " xf-armed" : ""}`, dataset: { xpufleet: key.split(":")[0], armed: String(armed) },
      "aria-label": armed ? confirmText : label,
      onclick: async () => {
        if (this.armed.has(key)) {
          clearTimeout(this.armed.get(key));
          this.armed.delete(key);
          await action();
          return;
        }
        this.armed.set(key, setTimeout(() => { this.armed.delete(key); this.render(); }, CONFIRM_MS));
        this.render();
        this.body.querySelector(`[data-armed="true"][data-xpufleet="${key.split(":")[0]}"]`)?.focus();
      } }, armed ? confirmText : label);
  }

  async act(fn) {
    try {
      await fn();
      await this.refresh();
    } catch (err) {
      this.body.prepend(h("div", { class: "xf-error", role: "alert" }, err.message));
    }
  }

  async reissue(name) {
    try {
      const out = await this.fleet.reissue(name);
      this.joinAnswer = out.delivered ? { note: t("workers.reissued", { name }) } : out;
      this.addOpen = true;
      this.renderAdd();
      await this.refresh();
    } catch (err) {
      this.body.prepend(h("div", { class: "xf-error", role: "alert" }, err.message));
    }
  }

  toggleAdd(btn) {
    this.addOpen = !this.addOpen;
    btn.setAttribute("aria-expanded", String(this.addOpen));
    this.renderAdd();
  }

  addTabNow() {
    return this.addTab || this.addWorker?.default || "join";
  }

  renderAdd() {
    this.addBox.hidden = !this.addOpen;
    if (!this.addOpen) return;
    const tab = this.addTabNow();
    const tabs = [["ssh", t("workers.via_ssh")], ["join", t("workers.via_join")]].map(([key, label]) =>
      h("button", { type: "button", role: "tab", "aria-selected": String(tab === key), class: "xf-subtab",
        dataset: { xpufleet: `add-tab-${key}` }, onclick: () => { this.addTab = key; this.renderAdd(); } }, label));
    const reason = this.addWorker?.reason
      ? h("div", { class: "xf-hint", dataset: { xpufleet: "add-reason" } }, this.addWorker.reason) : null;
    replace(this.addBox, h("div", { class: "xf-subtabs", role: "tablist", "aria-label": t("workers.add") }, tabs), reason,
      h("div", { role: "tabpanel", dataset: { xpufleet: `add-${tab}` } }, tab === "ssh" ? this.sshForm() : this.joinPart()));
  }

  joinPart() {
    const j = this.joinAnswer;
    let joinPart;
    if (j?.command) {
      let host = "";
      try { host = new URL(j.command.split(" --server ")[1]?.split(" ")[0] || "").hostname; } catch { host = ""; }
      const cmd = h("input", { type: "text", readonly: true, value: j.command, class: "xf-command", "aria-label": t("workers.join_command"),
        dataset: { xpufleet: "join-command" } });
      joinPart = [cmd,
        h("button", { type: "button", onclick: () => navigator.clipboard?.writeText(j.command).catch(() => cmd.select()) }, t("common.copy")),
        h("div", { class: "xf-hint" }, t("workers.join_expires", { when: new Date(j.expires_at * 1000).toLocaleString() })),
        LOOPBACK.test(host) ? h("div", { class: "xf-warn" }, t("workers.loopback_only")) : null];
    } else if (j?.note) {
      joinPart = h("div", { class: "xf-note" }, j.note);
    } else {
      joinPart = h("button", { type: "button", dataset: { xpufleet: "make-join" }, onclick: () => this.makeJoin() }, t("workers.make_join"));
    }
    return [
      h("h3", {}, t("workers.same_machine")),
      h("code", { class: "xf-command" }, "xpufleet agent start"),
      h("div", { class: "xf-hint" }, t("workers.same_machine_hint")),
      h("h3", {}, t("workers.other_machine")),
      joinPart];
  }

  /** "via SSH": POST /api/workers/ssh with every field of `xpufleet workers add-ssh`; the server checks
   * every field and its 400 text shows here. */
  sshForm() {
    if (!this.ssh) {
      const input = (key, attrs = {}) => h("input", { type: "text", autocomplete: "off", dataset: { xpufleet: `ssh-${key}` }, ...attrs });
      this.ssh = {
        name: input("name", { required: true, maxlength: "64" }),
        host: input("host", { required: true, placeholder: "user@host" }),
        port: input("port", { type: "number", min: "1", max: "65535", step: "1", placeholder: "22" }),
        identity: input("identity", { placeholder: "~/.ssh/id_ed25519" }),
        devices: input("devices", { placeholder: "cuda:0,cuda:1" }),
        python: input("python", { placeholder: "python3" }),
        remoteDir: input("remote-dir", { placeholder: "~/.xpufleet-ssh/NAME" }),
        mounts: h("textarea", { rows: "2", autocomplete: "off", spellcheck: "false", placeholder: "data=/srv/datasets",
          dataset: { xpufleet: "ssh-mounts" } }),
        simulate: input("simulate", { placeholder: "cuda:0=24" }),
        error: h("div", { class: "xf-error", role: "alert", dataset: { xpufleet: "ssh-error" } }),
        progress: h("div", { class: "xf-note", role: "status", "aria-live": "polite", hidden: true, dataset: { xpufleet: "ssh-progress" } }),
      };
    }
    const f = this.ssh;
    return h("form", { class: "xf-ssh-form", dataset: { xpufleet: "ssh-form" }, onsubmit: (e) => { e.preventDefault(); this.addSsh(); } },
      h("div", { class: "xf-hint" }, t("workers.ssh_hint")),
      h("div", { class: "xf-grid" },
        field(t("workers.ssh_name"), f.name),
        field(t("workers.ssh_host"), f.host),
        field(t("workers.ssh_port"), f.port),
        field(t("workers.ssh_identity"), f.identity, t("workers.ssh_identity_hint")),
        field(t("workers.ssh_devices"), f.devices, t("workers.ssh_devices_hint")),
        field(t("workers.ssh_python"), f.python, t("workers.ssh_python_hint")),
        field(t("workers.ssh_remote_dir"), f.remoteDir, t("workers.ssh_remote_dir_hint")),
        field(t("workers.ssh_mounts"), f.mounts, t("workers.ssh_mounts_hint")),
        field(t("workers.ssh_simulate"), f.simulate, t("workers.ssh_simulate_hint"))),
      f.error,
      h("div", { class: "xf-actions" }, h("button", { type: "submit", class: "xf-primary", dataset: { xpufleet: "ssh-add" } }, t("workers.ssh_add"))),
      f.progress);
  }

  async addSsh() {
    const f = this.ssh;
    replace(f.error);
    const body = { name: f.name.value.trim(), host: f.host.value.trim() };
    if (f.port.value !== "") body.port = Number(f.port.value);
    if (f.identity.value.trim()) body.identity = f.identity.value.trim();
    if (f.devices.value.trim()) body.devices = f.devices.value.trim();
    if (f.python.value.trim()) body.python = f.python.value.trim();
    if (f.remoteDir.value.trim()) body.remote_dir = f.remoteDir.value.trim();
    const mounts = f.mounts.value.split("\n").map((m) => m.trim()).filter(Boolean); // one LABEL=FOLDER a line
    if (mounts.length) body.mounts = mounts;
    if (f.simulate.value.trim()) body.simulate = f.simulate.value.trim();
    try {
      const w = await this.fleet.addSsh(body);
      this.sshAdded = w.name;
      this.workers = [...(this.workers || []).filter((x) => x.name !== w.name), w];
      this.renderSshProgress();
      await this.refresh();
    } catch (err) {
      replace(f.error, err.message);
    }
  }

  /** The added SSH worker's connection as the server reports it (every refresh). */
  renderSshProgress() {
    if (!this.ssh || !this.sshAdded) return;
    const w = (this.workers || []).find((x) => x.name === this.sshAdded);
    this.ssh.progress.dataset.for = this.sshAdded;
    this.ssh.progress.hidden = false;
    replace(this.ssh.progress, w?.ssh ? t("workers.ssh_progress", { name: w.name, state: sshText(w.ssh) })
      : t("workers.ssh_gone", { name: this.sshAdded }));
  }

  async makeJoin() {
    try {
      this.joinAnswer = await this.fleet.joinToken();
    } catch (err) {
      this.joinAnswer = { note: err.message };
    }
    this.renderAdd();
  }
}

function focusKey(root) {
  const el = document.activeElement;
  if (!el || !root.contains(el) || !el.dataset.xpufleet) return null;
  return { what: el.dataset.xpufleet, worker: el.closest("[data-worker]")?.dataset.worker, device: el.dataset.device };
}

function restoreFocus(root, key) {
  if (!key) return;
  const scope = key.worker ? root.querySelector(`[data-worker="${CSS.escape(key.worker)}"]`) : root;
  const sel = `[data-xpufleet="${CSS.escape(key.what)}"]${key.device ? `[data-device="${CSS.escape(key.device)}"]` : ""}`;
  scope?.querySelector(sel)?.focus();
}

/** An SSH worker's connection as the server reports it: host, then its state and detail. */
function sshText(ssh) {
  const where = `${ssh.host}${ssh.port ? `:${ssh.port}` : ""}`;
  return `${where} — ${ssh.state || "?"}${ssh.detail ? `: ${ssh.detail}` : ""}`;
}

/** What the server starts there: the host's python, the worker's folder, the agent's options (mounts...). */
function sshSetup(ssh) {
  return [ssh.python, ssh.remote_dir, (ssh.agent_args || []).join(" ")].filter(Boolean).join(" · ");
}

function sshLine(ssh) {
  return h("span", { dataset: { xpufleet: "ssh-state", state: ssh.state || "" } }, sshText(ssh));
}

function fact(label, value) {
  return [h("dt", {}, label), h("dd", {}, value)];
}

/** A shared card's memory, as the server's ledger reports it in `devices[].memory`
 * (server/memory/views.py): in use (heartbeat total - free), reserved and running budgets, free for
 * new budgets after the CUDA context; the runs on it and a hold or note below the bar. */
function memoryBar(d) {
  const total = Number(d.total_gib) || 0;
  if (!total) return h("div", { class: "xf-hint" }, t("workers.bar_no_total"));
  const M = d.memory && d.memory.admits_by_memory ? d.memory : null;
  const parts = [];
  if (M) {
    parts.push(["used", Number(M.in_use_gib ?? Math.max(0, total - Number(d.free_gib || 0))), t("workers.bar_in_use")]);
    parts.push(["reserved", Number(M.reserved_gib || 0) + Number(M.running_gib || 0), t("workers.bar_reserved")]);
    parts.push(["free", Number(M.free_for_budgets_gib || 0), t("workers.bar_free")]);
  } else {
    parts.push(["used", Math.max(0, total - Number(d.free_gib || 0)), t("workers.bar_in_use")]);
    parts.push(["free", Number(d.free_gib || 0), t("workers.bar_free_heartbeat")]);
  }
  const segs = parts.map(([cls, v, label]) => h("span", { class: `xf-seg xf-seg-${cls}`, style: { width: `${Math.min(100, (100 * v) / total)}%` },
    title: `${label}: ${gib(v)}` }));
  const legend = parts.map(([cls, v, label]) => h("span", { class: "xf-legend" }, h("span", { class: `xf-swatch xf-seg-${cls}` }), `${label} ${gib(v)}`));
  const notes = [];
  if (!M) notes.push(d.memory && d.memory.note ? d.memory.note : t("workers.bar_no_ledger"));
  else {
    if (M.note) notes.push(M.note);
    if (M.held_for) notes.push(M.held_for.text);
    for (const r of M.runs || []) notes.push(`${r.id.slice(0, 8)} ${r.state}: ${r.budget_label || (r.budget_gib == null ? "-" : gib(r.budget_gib))}`
      + (r.in_use_gib != null ? ` (${gib(r.in_use_gib)} in use)` : ""));
  }
  return h("div", { class: "xf-membar-box", dataset: { xpufleet: "membar" } },
    h("div", { class: "xf-membar", role: "img", "aria-label": parts.map(([, v, label]) => `${label} ${gib(v)}`).join(", ") }, segs),
    h("div", { class: "xf-legends" }, legend),
    ...notes.map((n) => h("div", { class: "xf-hint" }, n)));
}

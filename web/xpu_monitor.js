// XPU Fleet's ComfyUI front-end extension (docs/comfyui.md): the success-rate, VRAM and RAM capsules in the
// top bar, Queue on... beside ComfyUI's Run button, the Runs, Sweeps and Workers bottom-panel tabs and
// the New sweep dialog (the canvas graph swept over node parameters). Every
// call goes to this ComfyUI's own /xpufleet/ routes (the predictor here, the sidecar through the proxy,
// the token kept on the server side). The only .js file of web/: ComfyUI loads each .js file of a
// plugin's web folder as an extension, so the rest are .mjs modules loaded from here, the panels and
// the chart library only when first opened.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { Fleet } from "./lib/api.mjs";
import { CapsuleBar, SETTINGS } from "./lib/capsule.mjs";
import { CANVAS_METRIC_EVENT, fixSeedControls, isPluginNodeDef, nameCanvasRun, showExecuted, showLivePoint } from "./lib/canvas_nodes.mjs";
import { h } from "./lib/dom.mjs";
import { keepReadable } from "./lib/canvas_view.mjs";
import { CanvasResults } from "./lib/canvas_results.mjs";
import { english, loadStrings, onLanguageChange, resolveLanguage, setLanguage, t } from "./lib/i18n.mjs";
import { installPairing } from "./lib/pairing.mjs"; // the guard's headers and the pairing prompt (docs/security.md)

installPairing(api); // before the first /xpufleet/ request

const LANGUAGE = "XPUFleet.Language";
const AUTOSTART = "XPUFleet.Sidecar.AutoStart";
const SIDECAR = "XPUFleet.Sidecar.URL";
const RUNS_TAB = "xpufleet-runs";
const WORKERS_TAB = "xpufleet-workers";
const SWEEPS_TAB = "xpufleet-sweeps";
const STUDIES_TAB = "xpufleet-studies";

const fleet = new Fleet({
  fetch: (url, init) => api.fetchApi(url, init),
  apiBase: "/xpufleet/api",
  predictPath: "/xpufleet/predict",
  snapshotPath: "/xpufleet/snapshot",
  kind: "comfy",
});

function settingValue(id) {
  const store = app.extensionManager?.setting;
  return store ? store.get(id) : app.ui?.settings?.getSettingValue(id);
}

const settings = {
  get: settingValue,
  set: (id, value) => app.extensionManager?.setting?.set(id, value),
};

function applyLanguage(value = settingValue(LANGUAGE), locale = settingValue("Comfy.Locale")) {
  setLanguage(resolveLanguage(value, locale || navigator.language));
}
// the texts: the plugin's locales/<lang>/main.json, which ComfyUI's own i18n reads too (docs/i18n.md)
await loadStrings("/xpufleet/locales", (url) => api.fetchApi(url));
applyLanguage();

document.head.append(h("link", { rel: "stylesheet", href: new URL("./xpufleet.css", import.meta.url).href }));

// --- the canvas graph ------------------------------------------------------------------------------

/** The workflow the capsule predicts: the canvas in ComfyUI's UI format (bypassed nodes say so). */
function canvasWorkflow() {
  try {
    return app.graph ? app.graph.serialize() : null;
  } catch {
    return null;
  }
}

/** The workflow on the canvas now: its path, else its name (Queue on... remembers its target by it). */
function activeWorkflowKey() {
  const workflow = app.extensionManager?.workflow?.activeWorkflow;
  return workflow?.path || workflow?.filename || "";
}

// a run queued from this canvas shows its images on the canvas's output nodes once it has succeeded
const canvasResults = new CanvasResults({ fleet, app, api, activeKey: activeWorkflowKey });

/** The graph Queue on... sends: ComfyUI's own graph-to-prompt (API format). */
async function canvasPrompt() {
  const workflow = app.extensionManager?.workflow?.activeWorkflow;
  const name = workflow?.filename || "";
  const key = workflow?.path || name;  // Queue on... remembers its last target per workflow
  try {
    const { output } = await app.graphToPrompt();
    return { prompt: Object.keys(output || {}).length ? output : null, name, key };
  } catch (err) {
    return { prompt: null, name, key, problem: `${t("app.prompt_failed")}: ${err?.message || err}` };
  }
}

async function localDevices() {
  // the sidecar runs on this machine (the proxy finds it through this machine's XPUFLEET_HOME)
  const snap = await fleet.snapshot();
  const names = (snap.snapshots || []).map((s) => s.device);
  return ["cpu", ...names.filter((d) => d !== "cpu")];
}

// --- the panels (bottom panel tabs) ----------------------------------------------------------------

const mounted = new Set();
const mountedEl = new Map(); // tab id -> the element ComfyUI gave it (a language change re-mounts it)
let runsPanel = null;
let workersPanel = null;
let sweepsPanel = null;

async function getRunsPanel() {
  if (!runsPanel) {
    const { RunsPanel } = await import("./lib/runs_panel.mjs");
    runsPanel = new RunsPanel({ fleet, openWorkers: () => showTab(WORKERS_TAB), openSweeps: () => showTab(SWEEPS_TAB) });
  }
  return runsPanel;
}

async function getWorkersPanel() {
  if (!workersPanel) {
    const { WorkersPanel } = await import("./lib/workers_panel.mjs");
    workersPanel = new WorkersPanel({ fleet, openRun: (id) => openRun(id) });
  }
  return workersPanel;
}

async function getSweepsPanel() {
  if (!sweepsPanel) {
    const { SweepsPanel } = await import("./lib/sweep_view.mjs");
    sweepsPanel = new SweepsPanel({ fleet, openRun: (id) => openRun(id), openRuns: () => showTab(RUNS_TAB), newSweep: () => newSweep() });
  }
  return sweepsPanel;
}

let studiesPanel = null;
async function getStudiesPanel() { // Optuna studies (lib/studies_panel.mjs)
  if (!studiesPanel) {
    const { StudiesPanel } = await import("./lib/studies_panel.mjs");
    studiesPanel = new StudiesPanel({ fleet, openRun: (id) => openRun(id) });
  }
  return studiesPanel;
}

function showTab(id) {
  if (mounted.has(id)) return;
  app.extensionManager?.command?.execute(`Workspace.ToggleBottomPanelTab.${id}`);
}

/** Show item ``id`` in the panel of tab ``tabId`` (a run in Runs, a sweep in Sweeps). */
async function focusIn(tabId, getPanel, id) {
  (await getPanel()).focus(id);
  showTab(tabId);
}

function openRun(runId) { return focusIn(RUNS_TAB, getRunsPanel, runId); }

function openSweep(sweepId) { return focusIn(SWEEPS_TAB, getSweepsPanel, sweepId); }

const panelGetters = {};

function tab(id, titleKey, getPanel) {
  panelGetters[id] = getPanel;
  return {
    id,
    // ComfyUI's bottom panel translates titleKey with its own i18n (our locales/ main.json), live
    titleKey: `xpufleet.${titleKey}`,
    get title() { return t(titleKey); },
    type: "custom",
    render: (el) => {
      // ComfyUI reuses one element when the user switches tabs (no destroy in between): end the other
      const before = el.dataset.xfTab;
      if (before && before !== id) {
        mounted.delete(before);
        panelGetters[before]().then((p) => p.unmount());
      }
      el.dataset.xfTab = id;
      mounted.add(id);
      mountedEl.set(id, el);
      el.style.height = "100%";
      getPanel().then((p) => { if (mounted.has(id) && el.dataset.xfTab === id) p.mount(el); });
    },
    destroy: () => {
      mounted.delete(id);
      getPanel().then((p) => p.unmount());
    },
  };
}

// --- Queue on... and New sweep... ------------------------------------------------------------------

/** Open a dialog on the canvas's graph: ``load`` gives its module's opener, ``links`` where it leads. */
async function graphDialog(load, links) {
  const open = await load();
  await open({ fleet, graph: canvasPrompt, localDevices, openWorkers: () => showTab(WORKERS_TAB), ...links });
}

function queueOn() {
  return graphDialog(async () => (await import("./lib/queue_dialog.mjs")).openQueueDialog,
    { openRuns: openRun, openSweep, queued: (runId, key) => canvasResults.follow(runId, key) });
}

function newSweep() {
  return graphDialog(async () => (await import("./lib/sweep_dialog.mjs")).openSweepDialog, { openSweep });
}

// Queue on... beside Run. A front end with `actionBarButtons` (1.3x and later) draws it from the extension's
// entry below, in its own look; an older one (1.27) gets our own button after its queue button group.
// Feature-detected on the page: the front end's action-bar button row is there or not.
const QUEUE_ON = "xf-queue-on";
const ACTION_BAR_BUTTONS = "[data-testid=action-bar-buttons]";
const queueAction = { icon: "pi pi-send", class: QUEUE_ON, onClick: () => queueOn() };

const queueButton = h("button", {
  type: "button", class: `${QUEUE_ON} xf-queue-legacy`, dataset: { xpufleet: "queue-on" }, onclick: () => queueOn(),
}, h("i", { class: "pi pi-send", "aria-hidden": "true" }), h("span"));

/** The button the front end drew from ``queueAction`` (none on a front end without actionBarButtons). */
function nativeQueueButton() {
  return document.querySelector(`${ACTION_BAR_BUTTONS} .${QUEUE_ON}`);
}

function labelQueueButton() {
  queueAction.label = t("app.queue_on");
  queueAction.tooltip = t("app.queue_tooltip");
  for (const b of [queueButton, nativeQueueButton()].filter(Boolean)) {
    b.title = queueAction.tooltip;
    b.setAttribute("aria-label", queueAction.label);
    // the front end re-reads label on its next render; until then the drawn text is ours to change
    const text = b.querySelector("span");
    if (text) text.textContent = queueAction.label;
  }
}
labelQueueButton();

/** Keep Queue on... beside ComfyUI's Run button (the action bar is Vue's and may be rebuilt). */
function placeQueueButton() {
  const native = nativeQueueButton();
  if (native) {
    // the same hook on both front ends for users' CSS and the tests; Vue leaves attributes it does not own
    if (native.dataset.xpufleet !== "queue-on") native.dataset.xpufleet = "queue-on";
    if (!native.title) native.title = queueAction.tooltip;
    queueButton.remove();
    return;
  }
  if (queueButton.isConnected || document.querySelector(ACTION_BAR_BUTTONS)) return;
  const group = document.querySelector(".actionbar-content .queue-button-group") || document.querySelector(".queue-button-group");
  if (group) group.after(queueButton);
}

// --- the capsules ----------------------------------------------------------------------------------

const capsules = new CapsuleBar({ fleet, settings, workflow: canvasWorkflow, prompt: canvasApiGraph });

/** The canvas in API format for the capsule: the server estimates a training graph from it. */
async function canvasApiGraph() {
  const { output } = await app.graphToPrompt();
  return output && Object.keys(output).length ? output : null;
}

// A language change relabels every plugin string at once (docs/i18n.md): the capsules, Queue on...
// (an open dialog rebuilds itself: lib/queue_dialog.mjs), and the open panels, mounted again.
onLanguageChange(() => {
  labelQueueButton();
  capsules.closeMenu();
  capsules.render();
  for (const id of [...mounted]) {
    const el = mountedEl.get(id);
    panelGetters[id]().then((p) => { if (mounted.has(id) && el?.dataset.xfTab === id) { p.unmount(); p.mount(el); } });
  }
});

function placeCapsules() {
  if (capsules.element.isConnected) return;
  const menu = app.menu?.element || document.querySelector(".comfyui-menu-right");
  if (menu) menu.prepend(capsules.element);
}

/** A short note in the front end's toast (app.extensionManager.toast, front ends 1.3+), else the console. */
function notify(severity, summary, detail) {
  const toast = app.extensionManager?.toast;
  if (toast?.add) toast.add({ severity, summary, detail, life: 6000 });
  else console.warn(`XPU Fleet: ${summary}:`, detail);
}

// --- the sidecar -----------------------------------------------------------------------------------

// Starts a sidecar on this machine when none runs (the server decides: POST /xpufleet/sidecar/start
// answers started=false when one already runs).
async function ensureSidecar() {
  try {
    const state = await (await api.fetchApi("/xpufleet/sidecar")).json();
    if (state.running) return;
    const resp = await api.fetchApi("/xpufleet/sidecar/start", { method: "POST", body: "{}" });
    if (!resp.ok) notify("error", t("app.sidecar_start_failed"), (await resp.json()).error);
  } catch (err) {
    notify("error", t("app.sidecar_start_failed"), String(err?.message || err));
  }
}

/** The "sidecar URL" setting: shows where this ComfyUI reaches its sidecar (read from the server). */
function sidecarStatus() {
  const out = h("span", { class: "xf-hint", dataset: { xpufleet: "sidecar-status" } }, t("common.loading"));
  api.fetchApi("/xpufleet/sidecar").then((r) => r.json()).then((s) => {
    out.textContent = s.running ? t("settings.sidecar_running", { url: s.url, pid: s.pid }) : `${t("settings.sidecar_stopped")} (${s.home})`;
  }).catch((err) => { out.textContent = String(err?.message || err); });
  return out;
}

// ComfyUI calls a setting's onChange before it stores the new value: read it a moment later
const rescan = () => setTimeout(() => capsules.settingsChanged(), 0);

app.registerExtension({
  name: "XPUFleet.Monitor",
  settings: [
    { id: LANGUAGE, category: ["XPU Fleet", "General", "Language"], name: english("settings.language"), type: "combo",
      options: [{ text: english("settings.language_auto"), value: "auto" }, { text: "中文", value: "zh" }, { text: "English", value: "en" }],
      defaultValue: "auto", onChange: (value) => applyLanguage(value) },
    { id: SETTINGS.refresh, category: ["XPU Fleet", "Capsule", "Refresh"], name: english("settings.refresh"), type: "number",
      defaultValue: 5, attrs: { min: 1, max: 600, step: 1 }, onChange: rescan },
    { id: SETTINGS.showSuccess, category: ["XPU Fleet", "Capsule", "Success"], name: english("settings.show_success"), type: "boolean",
      defaultValue: true, onChange: rescan },
    { id: SETTINGS.showVram, category: ["XPU Fleet", "Capsule", "VRAM"], name: english("settings.show_vram"), type: "boolean",
      defaultValue: true, onChange: rescan },
    { id: SETTINGS.showRam, category: ["XPU Fleet", "Capsule", "RAM"], name: english("settings.show_ram"), type: "boolean",
      defaultValue: true, onChange: rescan },
    { id: SETTINGS.device, category: ["XPU Fleet", "Capsule", "Device"], name: english("settings.device"), type: "combo",
      tooltip: english("settings.device_tip"), defaultValue: "auto",
      // ComfyUI calls this without the current value: read it, and list the cards the capsule's menu found.
      // Every option has a value (front end 1.5x's select refuses an empty one); the empty value stored by
      // earlier versions still reads as "auto" (parseDeviceChoice) and is shown as "auto" here.
      options: () => [...new Set(["auto", settingValue(SETTINGS.device) || "auto", ...capsules.knownDevices])]
        .map((v) => ({ text: v, value: v })),
      onChange: rescan },
    { id: AUTOSTART, category: ["XPU Fleet", "Sidecar", "AutoStart"], name: english("settings.autostart"), tooltip: english("settings.autostart_tip"),
      type: "boolean", defaultValue: false, onChange: (value) => { if (value) ensureSidecar(); } },
    { id: SIDECAR, category: ["XPU Fleet", "Sidecar", "URL"], name: english("settings.sidecar"), tooltip: english("settings.sidecar_tip"),
      type: () => sidecarStatus(), defaultValue: "" },
  ],
  commands: [
    { id: "XPUFleet.QueueOn", label: () => english("app.queue_on"), icon: "pi pi-send", function: () => queueOn() },
    { id: "XPUFleet.ShowRuns", label: () => english("app.show_runs"), icon: "pi pi-list", function: () => showTab(RUNS_TAB) },
    { id: "XPUFleet.ShowWorkers", label: () => english("app.show_workers"), icon: "pi pi-server", function: () => showTab(WORKERS_TAB) },
    { id: "XPUFleet.NewSweep", label: () => english("app.new_sweep"), icon: "pi pi-sliders-h", function: () => newSweep() },
    { id: "XPUFleet.ShowSweeps", label: () => english("app.show_sweeps"), icon: "pi pi-chart-scatter", function: () => showTab(SWEEPS_TAB) },
  ],
  menuCommands: [{ path: ["XPU Fleet"], commands: ["XPUFleet.QueueOn", "XPUFleet.ShowRuns", "XPUFleet.ShowWorkers",
    "XPUFleet.NewSweep", "XPUFleet.ShowSweeps"] }],
  actionBarButtons: [queueAction], // read by front ends that have it; 1.27 ignores it (placeQueueButton)
  bottomPanelTabs: [tab(RUNS_TAB, "runs.title", getRunsPanel), tab(WORKERS_TAB, "workers.title", getWorkersPanel),
    tab(SWEEPS_TAB, "sweep.title", getSweepsPanel), tab(STUDIES_TAB, "study.title", getStudiesPanel)],

  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (isPluginNodeDef(nodeData)) {
      // our seeds start "fixed" (lib/canvas_nodes.mjs); ComfyUI calls onNodeCreated once the widgets exist
      const created = nodeType.prototype.onNodeCreated;
      nodeType.prototype.onNodeCreated = function (...args) {
        const out = created?.apply(this, args);
        fixSeedControls(this);
        return out;
      };
      // the node's `ui` output after ComfyUI's Run: metrics, the saved path, the loss curve
      const executed = nodeType.prototype.onExecuted;
      nodeType.prototype.onExecuted = function (output) {
        const out = executed?.apply(this, [output]);
        showExecuted(this, output);
        return out;
      };
    }
    // a widget edited on the canvas (LiteGraph calls onWidgetChanged from setValue) rescans the graph
    const previous = nodeType.prototype.onWidgetChanged;
    nodeType.prototype.onWidgetChanged = function (...args) {
      capsules.requestScan();
      return previous?.apply(this, args);
    };
  },

  async afterConfigureGraph() {
    capsules.requestScan();
    keepReadable(app);
  },

  nodeCreated() {
    // a node added (by hand, a paste, or a loaded API-format file): its widget values are set right
    // after, in the same task, so the debounced scan sees them
    capsules.requestScan();
  },

  async setup() {
    // "auto" follows ComfyUI's own language (its Comfy.Locale setting's change event)
    app.ui?.settings?.addEventListener?.("Comfy.Locale.change", (e) => applyLanguage(settingValue(LANGUAGE), e.detail?.value));
    applyLanguage();
    // a value stored by an earlier version ("" for auto) is shown as the option it means
    if (settingValue(SETTINGS.device) === "") settings.set(SETTINGS.device, "auto");
    placeCapsules();
    placeQueueButton();
    api.addEventListener("graphChanged", () => capsules.requestScan());
    api.addEventListener(CANVAS_METRIC_EVENT, (e) => showLivePoint(app.graph, e.detail));
    api.addEventListener("execution_start", (e) => nameCanvasRun(api, app, e.detail));
    for (const type of ["execution_success", "execution_error", "execution_interrupted", "reconnected"]) {
      api.addEventListener(type, () => capsules.requestScan());
    }
    // ComfyUI's Vue top bar may be rebuilt (menu position setting): put our elements back
    new MutationObserver(() => { placeCapsules(); placeQueueButton(); })
      .observe(document.body, { childList: true, subtree: false });
    const bar = document.querySelector(".comfyui-body-top") || document.querySelector(".comfyui-menu")?.parentElement;
    if (bar) new MutationObserver(() => { placeCapsules(); placeQueueButton(); }).observe(bar, { childList: true, subtree: true });
    capsules.start();
    canvasResults.resume();
    if (settingValue(AUTOSTART)) await ensureSidecar();
  },
});

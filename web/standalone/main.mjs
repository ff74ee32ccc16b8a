// The standalone page at / of the sidecar (docs/comfyui.md), for users without ComfyUI: the capsules, Queue
// on..., the Runs, Sweeps, Studies and Workers panels, and a graph-file drop zone in place of the canvas.
//
// Login: `xpufleet ui` prints http://HOST:PORT/#login=KEY. The key (one use, five minutes) is traded
// here for a browser session token kept in this tab's sessionStorage and sent as a bearer token
// (server/sidecar/routes/ui.py says why not a cookie). The fragment never reaches the server's logs.
import { Fleet } from "../lib/api.mjs";
import { CapsuleBar, SETTINGS } from "../lib/capsule.mjs";
import { field, h, replace } from "../lib/dom.mjs";
import { language, loadStrings, resolveLanguage, setLanguage, t } from "../lib/i18n.mjs";
import { RunsPanel } from "../lib/runs_panel.mjs";
import { StudiesPanel } from "../lib/studies_panel.mjs";
import { SweepsPanel } from "../lib/sweep_view.mjs";
import { WorkersPanel } from "../lib/workers_panel.mjs";

const SESSION_KEY = "xpufleet.session";
const LANGUAGE = "XPUFleet.Language";
const THEME = "XPUFleet.Theme";
const DEFAULTS = {
  [LANGUAGE]: "auto", [THEME]: "auto", [SETTINGS.refresh]: 5, [SETTINGS.showSuccess]: true,
  [SETTINGS.showVram]: true, [SETTINGS.showRam]: true, [SETTINGS.device]: "",
};

// --- settings in this browser (localStorage), the same ids as inside ComfyUI ---
const settings = {
  get(id) {
    const raw = localStorage.getItem(id);
    if (raw === null) return DEFAULTS[id];
    try { return JSON.parse(raw); } catch { return DEFAULTS[id]; }
  },
  set(id, value) { localStorage.setItem(id, JSON.stringify(value)); },
};

function applyLanguage() {
  setLanguage(resolveLanguage(settings.get(LANGUAGE), navigator.language));
  document.documentElement.lang = language();
}

function applyTheme() {
  const theme = settings.get(THEME);
  if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
  else delete document.documentElement.dataset.theme;
}

// --- the session ---
class LoginNeeded extends Error {}

function session() { return sessionStorage.getItem(SESSION_KEY); }

async function fetchWithSession(url, init = {}) {
  const token = session();
  if (!token) throw new LoginNeeded(t("standalone.login_needed"));
  const resp = await fetch(url, { ...init, headers: { ...(init.headers || {}), Authorization: `Bearer ${token}` } });
  if (resp.status === 401 || resp.status === 403) {
    sessionStorage.removeItem(SESSION_KEY);
    showLogin();
  }
  return resp;
}

async function loginFromFragment() {
  const m = /^#login=([A-Za-z0-9_-]+)$/.exec(location.hash);
  if (!m) return null;
  history.replaceState(null, "", location.pathname + location.search); // the key leaves the address bar
  const resp = await fetch("/api/ui/session", { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ login: m[1] }) });
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) return body.error || `HTTP ${resp.status}`;
  sessionStorage.setItem(SESSION_KEY, body.session);
  return null;
}

const fleet = new Fleet({ fetch: fetchWithSession, apiBase: "/api", predictPath: "/api/predict",
  snapshotPath: "/api/snapshot", kind: "standalone" });

// --- the graph from a dropped file ---
let graph = null; // {json, name, format, blob}

/** "api" ({id: {class_type, inputs}}), "ui" ({nodes: [...], links}) or an error text. */
export function graphFormat(json) {
  if (!json || typeof json !== "object" || Array.isArray(json)) return { error: "not a JSON object" };
  if (Array.isArray(json.nodes)) return { format: "ui", nodes: json.nodes.length };
  const nodes = Object.values(json);
  if (nodes.length && nodes.every((n) => n && typeof n === "object" && typeof n.class_type === "string")) {
    return { format: "api", nodes: nodes.length };
  }
  return { error: "neither ComfyUI's API format ({id: {class_type, inputs}}) nor its workflow format ({nodes, links})" };
}

async function loadFile(file, status) {
  let json;
  try {
    json = JSON.parse(await file.text());
  } catch (err) {
    replace(status, h("span", { class: "xf-error" }, t("standalone.bad_file", { name: file.name, why: err.message })));
    return;
  }
  const f = graphFormat(json);
  if (f.error) {
    replace(status, h("span", { class: "xf-error" }, t("standalone.bad_file", { name: file.name, why: f.error })));
    return;
  }
  graph = { json, name: file.name.replace(/\.json$/i, ""), format: f.format, file: file.name, nodes: f.nodes, blob: file };
  showGraph(status);
  capsules?.requestScan(0);
}

/** Show the loaded file's name in the file picker too (a dropped file, or one kept across a rebuild). */
function pickFile(input) {
  if (!graph?.blob || input.files?.[0] === graph.blob) return;
  try {
    const dt = new DataTransfer();
    dt.items.add(graph.blob);
    input.files = dt.files;
  } catch { /* a browser without a settable FileList: the status line still names the file */ }
}

function showGraph(status) {
  if (!graph) return;
  replace(status, h("span", { dataset: { xpufleet: "graph-loaded", format: graph.format } },
    t("standalone.loaded", { name: graph.file, n: graph.nodes, format: graph.format.toUpperCase() })),
  graph.format === "ui" ? h("div", { class: "xf-warn" }, t("standalone.ui_format", { name: graph.file })) : null);
}

async function localDevices() {
  const st = await fleet.api("GET", "/status");
  const local = (st.providers || []).find((p) => p.local);
  return local?.devices?.length ? local.devices : ["cpu"];
}

async function queueGraph() {
  if (!graph) return { prompt: null, name: "", problem: t("queue.no_graph") };
  if (graph.format !== "api") return { prompt: null, name: graph.name, problem: t("standalone.ui_format", { name: graph.name }) };
  return { prompt: graph.json, name: graph.name };
}

// --- the page ---
let capsules = null;
let runs = null;
let workers = null;
let sweeps = null;
let studies = null;
let tabs = null;

function showLogin(problem) {
  capsules?.stop();
  runs?.unmount();
  workers?.unmount();
  sweeps?.unmount();
  studies?.unmount();
  replace(document.body, h("main", { class: "xf-login", dataset: { xpufleet: "login" } },
    h("h1", {}, t("standalone.title")),
    problem ? h("p", { class: "xf-error", role: "alert" }, t("standalone.login_failed", { why: problem })) : null,
    h("p", {}, t("standalone.login_needed"))));
}

function selectTab(which) {
  for (const [name, { button, panel, view }] of Object.entries(tabs)) {
    const on = name === which;
    button.setAttribute("aria-selected", String(on));
    button.tabIndex = on ? 0 : -1;
    panel.hidden = !on;
    if (on) view.mount(panel); else view.unmount();
  }
}

function settingsDialog() {
  const dlg = h("dialog", { class: "xf-dialog xf-root", "aria-label": t("settings.title"), dataset: { xpufleet: "settings" } });
  const select = (id, options) => {
    const el = h("select", {}, options.map(([v, k]) => h("option", { value: v, selected: String(settings.get(id)) === v }, k)));
    el.addEventListener("change", () => { settings.set(id, el.value); changed(id); });
    return el;
  };
  const check = (id) => {
    const el = h("input", { type: "checkbox", checked: settings.get(id) !== false });
    el.addEventListener("change", () => { settings.set(id, el.checked); changed(id); });
    return el;
  };
  const refresh = h("input", { type: "number", min: "1", max: "600", value: String(settings.get(SETTINGS.refresh)) });
  refresh.addEventListener("change", () => { settings.set(SETTINGS.refresh, Number(refresh.value) || 5); changed(SETTINGS.refresh); });
  const device = h("input", { type: "text", value: settings.get(SETTINGS.device) || "", placeholder: "auto" });
  device.addEventListener("change", () => { settings.set(SETTINGS.device, device.value.trim()); changed(SETTINGS.device); });
  replace(dlg, h("h2", {}, t("settings.title")), h("div", { class: "xf-settings-grid" },
    // no ComfyUI here: "auto" follows the browser's language
    field(t("settings.language"), select(LANGUAGE, [["auto", t("standalone.language_auto")], ["zh", "中文"], ["en", "English"]])),
    field(t("settings.theme"), select(THEME, [["auto", t("settings.theme_auto")], ["light", t("settings.theme_light")], ["dark", t("settings.theme_dark")]])),
    field(t("settings.refresh"), refresh),
    field(t("settings.show_success"), check(SETTINGS.showSuccess)),
    field(t("settings.show_vram"), check(SETTINGS.showVram)),
    field(t("settings.show_ram"), check(SETTINGS.showRam)),
    field(t("settings.device"), device, t("settings.device_tip"))),
  h("div", { class: "xf-actions" }, h("button", { type: "button", onclick: () => dlg.close() }, t("common.close"))));
  dlg.addEventListener("close", () => dlg.remove());
  document.body.append(dlg);
  dlg.showModal();
}

function changed(id) {
  if (id === LANGUAGE) {
    // the page is rebuilt in the new language; the settings dialog the choice came from opens again
    applyLanguage();
    build();
    settingsDialog();
    document.querySelector("[data-xpufleet=settings] select")?.focus();
    return;
  }
  if (id === THEME) { applyTheme(); return; }
  capsules?.settingsChanged();
}

function build() {
  capsules?.stop();
  capsules = new CapsuleBar({ fleet, settings, workflow: () => graph?.json || null });
  runs?.unmount();
  workers?.unmount();
  sweeps?.unmount();
  studies?.unmount();
  const openRun = (id) => { selectTab("runs"); runs.focus(id); };
  const openSweep = (id) => { selectTab("sweeps"); sweeps.focus(id); };
  runs = new RunsPanel({ fleet, openWorkers: () => selectTab("workers"), openSweeps: () => selectTab("sweeps") });
  workers = new WorkersPanel({ fleet, openRun });
  studies = new StudiesPanel({ fleet, openRun });
  sweeps = new SweepsPanel({ fleet, openRun, openRuns: () => selectTab("runs"),
    newSweep: async () => {
      const { openSweepDialog } = await import("../lib/sweep_dialog.mjs");
      openSweepDialog({ fleet, graph: queueGraph, localDevices, openSweep, openWorkers: () => selectTab("workers") });
    } });
  const status = h("div", { class: "xf-drop-status", "aria-live": "polite", dataset: { xpufleet: "drop-status" } });
  showGraph(status); // a language change rebuilds the page: the loaded graph stays
  const input = h("input", { type: "file", accept: ".json,application/json", id: "xf-graph-file", dataset: { xpufleet: "file-input" },
    onchange: () => input.files[0] && loadFile(input.files[0], status) });
  pickFile(input);
  const drop = h("section", { class: "xf-drop", "aria-label": t("standalone.drop"), dataset: { xpufleet: "drop-zone" } },
    h("span", {}, t("standalone.drop")), h("label", { for: input.id, class: "xf-hint" }, t("standalone.choose")), input, status);
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("xf-over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("xf-over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("xf-over");
    const file = e.dataTransfer?.files?.[0];
    if (file) loadFile(file, status).then(() => pickFile(input));
  });
  const mkTab = (name, label) => {
    const button = h("button", { type: "button", role: "tab", id: `xf-tab-${name}`, "aria-controls": `xf-panel-${name}`,
      dataset: { xpufleet: `tab-${name}` }, onclick: () => selectTab(name) }, label);
    const panel = h("section", { class: "xf-tabpanel", role: "tabpanel", id: `xf-panel-${name}`, "aria-labelledby": button.id });
    return { button, panel };
  };
  const r = mkTab("runs", t("standalone.runs"));
  const w = mkTab("workers", t("standalone.workers"));
  const s = mkTab("sweeps", t("standalone.sweeps"));
  const st = mkTab("studies", t("study.title"));
  tabs = { runs: { ...r, view: runs }, workers: { ...w, view: workers }, sweeps: { ...s, view: sweeps }, studies: { ...st, view: studies } };
  const tablist = h("div", { class: "xf-tabs", role: "tablist", "aria-label": t("standalone.tabs") }, r.button, w.button, s.button, st.button);
  tablist.addEventListener("keydown", (e) => {
    if (e.key !== "ArrowLeft" && e.key !== "ArrowRight") return;
    const names = Object.keys(tabs);
    const at = names.findIndex((n) => tabs[n].button === document.activeElement);
    const next = names[(at + (e.key === "ArrowRight" ? 1 : names.length - 1)) % names.length];
    selectTab(next);
    tabs[next].button.focus();
  });
  const queueBtn = h("button", { type: "button", class: "xf-primary", dataset: { xpufleet: "queue-on" }, title: t("app.queue_tooltip"),
    onclick: async () => {
      const { openQueueDialog } = await import("../lib/queue_dialog.mjs");
      openQueueDialog({ fleet, graph: queueGraph, localDevices, openRuns: (id) => { selectTab("runs"); runs.focus(id); },
        openWorkers: () => selectTab("workers") });
    } }, t("app.queue_on"));
  replace(document.body,
    h("header", { class: "xf-topbar" }, h("h1", {}, t("standalone.title")), capsules.element, h("span", { class: "xf-grow" }), queueBtn,
      h("button", { type: "button", dataset: { xpufleet: "settings-button" }, onclick: settingsDialog }, t("settings.title")),
      h("button", { type: "button", onclick: logout }, t("standalone.logout"))),
    drop, tablist, r.panel, w.panel, s.panel, st.panel);
  capsules.start();
  selectTab("runs");
}

async function logout() {
  try { await fleet.request("DELETE", "/api/ui/session"); } catch { /* ended either way */ }
  sessionStorage.removeItem(SESSION_KEY);
  showLogin();
}

async function main() {
  await loadStrings("/ui/locales"); // the plugin's ComfyUI locale files (docs/i18n.md)
  applyLanguage();
  applyTheme();
  const problem = await loginFromFragment();
  if (problem || !session()) { showLogin(problem); return; }
  build();
}

main();

// Pairing this browser with the fleet (docs/security.md). Inside ComfyUI every /xpufleet/ request goes
// through ComfyUI's server, whose guard (server/comfy/guard.py) wants two headers: X-XPUFleet-Request
// (a custom header, so another site's page cannot send the request without a CORS preflight) and, for
// what acts on the fleet, X-XPUFleet-Pairing: the secret the sidecar gave this browser when it paired.
// The secret is kept in localStorage: per origin (scheme, host, port), so no other page or port sees
// it, and never sent by the browser on its own (no CSRF). When the server answers that pairing is
// missing or refused, the "Pair this browser" dialog asks for a code (`xpufleet pair`) or the token,
// redeems it, stores the secret and the request is sent again.
import { fleetHeaders } from "./api.mjs";
import { h, nextId, replace } from "./dom.mjs";
import { t } from "./i18n.mjs";

export const PAIRING_STORAGE_KEY = "xpufleet.pairing";
const REDEEM_PATH = "/xpufleet/api/pairing/redeem";
const QUIET_AFTER_LATER_MS = 60_000; // "Later" keeps the dialog away this long; the panels still say how

function stored() {
  try { return localStorage.getItem(PAIRING_STORAGE_KEY) || null; } catch { return null; }
}

function store(secret) {
  try { localStorage.setItem(PAIRING_STORAGE_KEY, secret); } catch { /* private mode: this page only */ }
  memory = secret;
}

let memory = null;
export function pairingSecret() { return stored() || memory; }

/** Whether an answer says this browser must pair (401 with {"pairing": "missing" | "refused"}). */
async function needsPairing(resp) {
  if (resp.status !== 401) return false;
  try {
    const body = await resp.clone().json();
    return body?.pairing === "missing" || body?.pairing === "refused";
  } catch { return false; }
}

let asking = null; // one dialog for every request waiting on it
let quietUntil = 0;

/**
 * Wrap ComfyUI's api.fetchApi so every /xpufleet/ call carries the plugin's headers and, when pairing is
 * missing, waits for the user to pair and is sent once more. Call once, before the first request.
 * @param {{fetchApi: (route: string, init?: object) => Promise<Response>}} api  ComfyUI's api object
 */
export function installPairing(api) {
  const original = api.fetchApi.bind(api);
  const send = (route, init) => {
    const headers = fleetHeaders(init?.headers, pairingSecret());
    // every body the plugin sends is JSON; a bare string body would go as text/plain, which the guard refuses
    if (typeof init?.body === "string" && !Object.keys(headers).some((k) => k.toLowerCase() === "content-type")) {
      headers["Content-Type"] = "application/json";
    }
    return original(route, { ...(init || {}), headers });
  };
  api.fetchApi = async (route, init) => {
    if (typeof route !== "string" || !route.startsWith("/xpufleet/")) return original(route, init);
    const resp = await send(route, init);
    if (route === REDEEM_PATH || !(await needsPairing(resp))) return resp;
    const paired = await askToPair((body) => send(REDEEM_PATH, { method: "POST", body: JSON.stringify(body),
      headers: { "Content-Type": "application/json" } }));
    return paired ? send(route, init) : resp;
  };
}

/** The dialog, once for all waiting requests; true when the browser paired. */
function askToPair(redeem) {
  if (!asking) {
    if (Date.now() < quietUntil) return Promise.resolve(false);
    asking = pairDialog(redeem).finally(() => { asking = null; });
  }
  return asking;
}

function redeemBody(text) {
  const value = text.trim();
  const body = value.startsWith("xfs_") ? { token: value } : { code: value };
  return { ...body, name: `ComfyUI at ${location.host}`.slice(0, 100) };
}

function pairDialog(redeem) {
  return new Promise((resolve) => {
    const titleId = nextId("xf-pair-title");
    const input = h("input", { type: "text", style: { width: "100%" }, autocomplete: "off", spellcheck: "false",
      placeholder: t("pair.placeholder"), "aria-labelledby": titleId, dataset: { xpufleet: "pair-input" } });
    const error = h("div", { class: "xf-error", role: "alert", dataset: { xpufleet: "pair-error" } });
    const dialog = h("dialog", { class: "xf-dialog xf-root", "aria-labelledby": titleId, dataset: { xpufleet: "pair-dialog" } });
    let done = false;
    const finish = (ok) => {
      if (done) return;
      done = true;
      if (!ok) quietUntil = Date.now() + QUIET_AFTER_LATER_MS;
      dialog.close();
      dialog.remove();
      resolve(ok);
    };
    const submit = h("button", { type: "submit", class: "xf-primary", dataset: { xpufleet: "pair-submit" } }, t("pair.submit"));
    const later = h("button", { type: "button", class: "xf-secondary", dataset: { xpufleet: "pair-later" }, onclick: () => finish(false) }, t("pair.later"));
    const form = h("form", { method: "dialog", onsubmit: async (e) => {
      e.preventDefault();
      if (!input.value.trim()) { replace(error, t("pair.empty")); return; }
      submit.disabled = true;
      try {
        const resp = await redeem(redeemBody(input.value));
        const body = await resp.json().catch(() => ({}));
        if (resp.status === 201 && body.pairing) { store(body.pairing); finish(true); return; }
        replace(error, body.error || `HTTP ${resp.status}`);
      } catch (err) {
        replace(error, String(err?.message || err));
      } finally {
        submit.disabled = false;
      }
    } },
    h("h2", { id: titleId }, t("pair.title")),
    h("p", {}, t("pair.why")),
    h("p", { class: "xf-hint" }, t("pair.where")),
    input, error,
    h("div", { class: "xf-actions" }, later, submit));
    dialog.append(form);
    dialog.addEventListener("cancel", () => finish(false));
    document.body.append(dialog);
    dialog.showModal();
    input.focus();
  });
}

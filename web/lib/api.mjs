// The one client of the server for both hosts: inside ComfyUI every call goes through ComfyUI's own
// server (/xpufleet/..., the token stays there); on the standalone page straight to the sidecar's
// /api/... with the browser session as a bearer token. Errors are the server's {"error": message}.

export class ApiFailure extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

const enc = encodeURIComponent;

// What ComfyUI's guard wants of the plugin's page (server/comfy/guard.py, docs/security.md): a custom
// header (another site's page cannot send it without a CORS preflight) and this browser's pairing.
export const REQUEST_HEADER = "X-XPUFleet-Request";
export const PAIRING_HEADER = "X-XPUFleet-Pairing";

/** ``headers`` (an object, array or Headers) as a plain object with the plugin's request header and, when
 * paired, the pairing (a plain object: every ComfyUI front end's fetchApi adds its own header to one). */
export function fleetHeaders(headers, pairing) {
  const out = Object.fromEntries(new Headers(headers || {}).entries());
  out[REQUEST_HEADER] = "1";
  if (pairing) out[PAIRING_HEADER] = pairing;
  return out;
}

function query(params) {
  const parts = Object.entries(params || {})
    .filter(([, v]) => v !== undefined && v !== null && v !== "")
    .map(([k, v]) => `${enc(k)}=${enc(v)}`);
  return parts.length ? `?${parts.join("&")}` : "";
}

/** The requests on a kind of item the server follows over many runs (sweeps, studies): each one's verbs. */
export class Collection {
  /**
   * @param {Fleet} fleet
   * @param {string} path  "/sweeps" or "/studies"
   * @param {string} csv   the name of one item's CSV ("table.csv", "trials.csv")
   */
  constructor(fleet, path, csv) {
    this.fleet = fleet;
    this.path = path;
    this.key = path.slice(1); // the list's field in the answer: {"sweeps": [...]}
    this.csvName = csv;
  }

  list(params, opts) { return this.fleet.api("GET", `${this.path}${query(params)}`, undefined, opts); }
  /** One item; with version and wait, a long poll that answers when one of its runs has news. */
  get(id, { version, wait } = {}, opts) { return this.fleet.api("GET", `${this.path}/${enc(id)}${query({ version, wait })}`, undefined, opts); }
  cancel(id) { return this.fleet.api("POST", `${this.path}/${enc(id)}/cancel`, {}); }
  remove(id) { return this.fleet.api("DELETE", `${this.path}/${enc(id)}`); }
  csv(id) { return this.fleet.api("GET", `${this.path}/${enc(id)}/${this.csvName}`, undefined, { raw: true }); }
}

export class Fleet {
  /**
   * @param {object} o
   * @param {(url: string, init: object) => Promise<Response>} o.fetch  the host's fetch
   * @param {string} o.apiBase       "/xpufleet/api" (ComfyUI) or "/api" (sidecar)
   * @param {string} o.predictPath   "/xpufleet/predict" or "/api/predict"
   * @param {string} o.snapshotPath  "/xpufleet/snapshot" or "/api/snapshot"
   * @param {string} o.kind          "comfy" | "standalone"
   */
  constructor({ fetch, apiBase, predictPath, snapshotPath, kind }) {
    this.fetchFn = fetch;
    this.apiBase = apiBase;
    this.predictPath = predictPath;
    this.snapshotPath = snapshotPath;
    this.kind = kind;
    this.sweeps = new Collection(this, "/sweeps", "table.csv");
    this.studies = new Collection(this, "/studies", "trials.csv");
  }

  async request(method, url, body, { signal, raw } = {}) {
    const init = { method, signal, headers: { Accept: "application/json" } };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
    let resp;
    try {
      resp = await this.fetchFn(url, init);
    } catch (err) {
      if (err?.name === "AbortError") throw err;
      throw new ApiFailure(0, `the server does not answer (${err?.message || err})`);
    }
    if (raw && resp.ok) return resp;
    const text = await resp.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { data = null; }
    if (!resp.ok) {
      const message = (data && typeof data.error === "string") ? data.error : (text || resp.statusText || `HTTP ${resp.status}`);
      throw new ApiFailure(resp.status, message, data);
    }
    return data;
  }

  api(method, path, body, opts) {
    return this.request(method, this.apiBase + path, body, opts);
  }

  // --- runs ---
  runs(params, opts) { return this.api("GET", `/runs${query(params)}`, undefined, opts); }
  run(id, opts) { return this.api("GET", `/runs/${enc(id)}`, undefined, opts); }
  submit(graph, options) { return this.api("POST", "/runs", { graph, options }); }
  cancel(id) { return this.api("POST", `/runs/${enc(id)}/cancel`, {}); }
  deleteRun(id) { return this.api("DELETE", `/runs/${enc(id)}`); }
  events(id, cursor, wait, opts) {
    return this.api("GET", `/runs/${enc(id)}/events${query({ cursor, wait, limit: 1000 })}`, undefined, opts);
  }
  metrics(id, opts) { return this.api("GET", `/runs/${enc(id)}/metrics`, undefined, opts); }
  logs(id, tail, opts) { return this.api("GET", `/runs/${enc(id)}/logs${query({ tail })}`, undefined, opts); }
  logsFrom(id, offset, opts) { return this.api("GET", `/runs/${enc(id)}/logs${query({ offset, limit: 65536 })}`, undefined, opts); }
  artifacts(id, opts) { return this.api("GET", `/runs/${enc(id)}/artifacts`, undefined, opts); }
  /** A run file's address (a link inside ComfyUI; the standalone page fetches it with its token). */
  artifactUrl(id, path) {
    return `${this.apiBase}/runs/${enc(id)}/artifacts/${String(path).split("/").map(enc).join("/")}`;
  }
  artifactFile(id, path) { return this.request("GET", this.artifactUrl(id, path), undefined, { raw: true }); }
  estimate(graph, options) { return this.api("POST", "/estimates", { graph, options }); }
  // a run's recorded outputs (server/sidecar/routes/outputs.py); a file's address under them
  outputs(id, opts) { return this.api("GET", `/runs/${enc(id)}/outputs`, undefined, opts); }
  nodeOutputs(id, node, opts) { return this.api("GET", `/runs/${enc(id)}/outputs/${enc(node)}`, undefined, opts); }
  outputUrl(id, node, file) { return `${this.apiBase}/runs/${enc(id)}/outputs/${enc(node)}/${enc(file)}`; }
  /** ComfyUI only: copy a succeeded run's files into ComfyUI's output folder (server/comfy/home.py);
   * answers {files: [{node, file, kind, subfolder, type, url}]} with ComfyUI's /view addresses. */
  home(id, opts) { return this.request("POST", `/xpufleet/runs/${enc(id)}/home`, {}, opts); }

  // --- sweeps (the rest: this.sweeps) ---
  sweepDryRun(body, opts) { return this.api("POST", "/sweeps?dry_run=1", body, opts); }
  submitSweep(body) { return this.api("POST", "/sweeps", body); }

  // --- workers ---
  workers(opts) { return this.api("GET", "/workers", undefined, opts); }
  rejected(opts) { return this.api("GET", "/workers/rejected", undefined, opts); }
  drain(name) { return this.api("POST", `/workers/${enc(name)}/drain`, {}); }
  undrain(name) { return this.api("POST", `/workers/${enc(name)}/undrain`, {}); }
  removeWorker(name) { return this.api("DELETE", `/workers/${enc(name)}`); }
  reissue(name) { return this.api("POST", `/workers/${enc(name)}/reissue`, {}); }
  addSsh(body) { return this.api("POST", "/workers/ssh", body); }
  disable(name) { return this.api("POST", `/workers/${enc(name)}/disable`, {}); }
  enable(name) { return this.api("POST", `/workers/${enc(name)}/enable`, {}); }
  joinToken(name) { return this.api("POST", "/workers/join-tokens", name ? { name } : {}); }
  setMode(name, device, mode) {
    return this.api("PUT", `/workers/${enc(name)}/devices/${enc(device)}/mode`, { mode });
  }

  // --- predictor ---
  predict(body, opts) { return this.request("POST", this.predictPath, body, opts); }
  snapshot(opts) { return this.request("GET", this.snapshotPath, undefined, opts); }
}

/** "gpu-box/cuda:0" -> {worker, device}; "cuda:0" -> {device}; "" or "auto" -> {} (this machine). */
export function parseDeviceChoice(text) {
  const value = String(text || "").trim();
  if (!value || value === "auto") return {};
  const slash = value.indexOf("/");
  if (slash > 0) return { worker: value.slice(0, slash), device: value.slice(slash + 1) };
  return { device: value };
}

export function deviceChoice({ worker, device } = {}) {
  if (!device) return "auto";
  return worker ? `${worker}/${device}` : device;
}

// The Runs panel (docs/workers.md, docs/runs-panel.md): queued runs with status filters, each row with its
// source, start time, duration and final objective, live progress, warnings, waiting reasons, worker and
// devices, the budget and where it came from, peak memory per card on hover, stop and delete, the
// metrics chart (metrics_chart.mjs), the output log (live) and the files as download links; a worker's
// run's log and files are read through its agent while it is connected. A ComfyUI run that succeeded shows
// its images, videos and sounds in a gallery (gallery.mjs), copied into ComfyUI's output folder first.
import { Gallery, galleryItems, hasMedia, mayHaveGallery } from "./gallery.mjs";
import { MetricsChart } from "./metrics_chart.mjs";
import { h, replace, saveBlob, sleep } from "./dom.mjs";
import { bytes, duration, gib, memGib, num, shortId, when } from "./format.mjs";
import { t } from "./i18n.mjs";
import { errorBox, ListPanel } from "./item_list.mjs";

const STATUSES = ["queued", "assigned", "running", "succeeded", "failed", "cancelled", "interrupted"];
const ACTIVE = new Set(["queued", "assigned", "running"]);
const LOG_TAIL = 64 * 1024;
const LOG_KEEP = 256 * 1024; // characters a live log keeps on the page (the oldest are dropped)
const LOG_POLL_MS = 2000;

/** Where a run came from (``source``: api, canvas, ...), as the row shows it. */
export function sourceText(run) {
  const source = run.source || "api";
  const key = `runs.origin.${source}`;
  return ORIGINS.has(source) ? t(key) : source;
}
const ORIGINS = new Set(["api", "canvas"]);

/** Start time: the time alone today, the date and time otherwise. */
export function startText(epochSeconds, now = Date.now()) {
  if (!epochSeconds) return null;
  const d = new Date(epochSeconds * 1000);
  return d.toDateString() === new Date(now).toDateString() ? d.toLocaleTimeString() : d.toLocaleString();
}

/** The row's figures: when it started (queued: when it was queued), how long it ran (so far), the final
 * objective the server picked (server/sidecar/objective.py). */
export function rowFacts(run, nowSeconds = Date.now() / 1000) {
  const started = run.started_at || null;
  const at = startText(started || run.created_at);
  const end = run.finished_at || (run.status === "running" ? nowSeconds : null);
  const took = started && end ? duration(end - started) : null;
  const o = run.objective;
  return {
    start: at ? t(started ? "runs.row_started" : "runs.row_queued", { when: at }) : null,
    took: took ? t(run.finished_at ? "runs.row_took" : "runs.row_running_for", { d: took }) : null,
    objective: o ? `${o.metric} ${num(o.value, 4)}` : null,
  };
}

/** The budget column: figure, where it came from, "(est.)" for an estimate (docs/workers.md). */
export function budgetText(run) {
  if (run.budget_gib === null || run.budget_gib === undefined) return t("runs.no_budget");
  const est = run.budget_source === "estimate" ? ` ${t("runs.est")}` : "";
  const src = run.budget_source ? ` · ${t(`runs.source.${run.budget_source}`)}` : "";
  return `${gib(run.budget_gib)}${est}${src}`;
}

/** The peak-memory headline and the per-card text shown on hover. */
export function peakText(run) {
  const p = run.peak_memory;
  if (!p) return { head: t("runs.peak_pending"), detail: "" };
  const aliases = run.execution_facts?.device_aliases || {};
  const cards = Object.entries(p.devices || {});
  const perCard = cards.map(([d, v]) => `${d}${aliases[d] && aliases[d] !== d ? ` (= ${aliases[d]})` : ""}: ${memGib(v)}`);
  // A simulated card's figure is the run's tensor bytes on the CPU: shown with its label, never as a
  // measured CUDA figure (the server says which it is).
  if (!p.measured) {
    const why = [p.reason, p.label, ...perCard].filter(Boolean).join("\n");
    return { head: t("runs.peak_not_measured"), detail: why || t("runs.peak_no_reason") };
  }
  const max = cards.reduce((m, [, v]) => Math.max(m, Number(v) || 0), 0);
  const detail = [p.label, ...perCard].filter(Boolean).join("\n");
  return { head: t("runs.peak", { v: gib(max, 2), n: cards.length }), detail };
}

export class RunsPanel {
  /**
   * @param {object} o
   * @param {import("./api.mjs").Fleet} o.fleet
   * @param {() => void} o.openWorkers
   * @param {() => void} [o.openSweeps]  the Sweeps view (its button shows when given)
   */
  constructor({ fleet, openWorkers, openSweeps }) {
    this.fleet = fleet;
    this.filter = new Set();
    this.progress = {}; // the latest progress of each running run
    // the shown run's log: where the next read starts, the tail read's generation, the follow-up read
    // under way, when it was last polled
    this.log = { offset: undefined, gen: 0, loading: null, polled: 0 };
    this.view = new ListPanel(this, {
      kind: "run", texts: "runs", frame: { panel: "runs-panel", classes: "xf-runs",
        tools: () => h("div", { class: "xf-chips", role: "group", "aria-label": t("runs.filter") }, STATUSES.map((s) => h("button", {
          type: "button", class: "xf-chip", "aria-pressed": String(this.filter.has(s)), dataset: { status: s },
          onclick: (e) => this.toggleFilter(s, e.currentTarget) }, t(`runs.status.${s}`)))),
        buttons: () => [
          openSweeps ? h("button", { type: "button", dataset: { xpufleet: "open-sweeps" }, onclick: () => openSweeps() }, t("runs.sweeps")) : null,
          h("button", { type: "button", dataset: { xpufleet: "open-workers" }, onclick: () => openWorkers() }, t("workers.title"))] },
      list: {
        none: () => (this.filter.size ? t("runs.none_filtered") : t("runs.none")),
        load: (signal) => this.load(signal),
        row: (r) => this.row(r),
      },
    });
    // the shown run, its chart and its boxes (show makes them)
    this.run = null;
    this.chart = null;
    this.progressBox = null;
    this.galleryBox = null;
    this.gallery = null;
    this.filesBox = null;
    this.logBox = null;
  }

  mount(container) { this.view.mount(container); }
  unmount() { this.view.unmount(); }
  focus(runId) { this.view.focus(runId); }

  toggleFilter(status, btn) {
    if (this.filter.has(status)) this.filter.delete(status); else this.filter.add(status);
    btn.setAttribute("aria-pressed", this.filter.has(status) ? "true" : "false");
    this.view.refresh();
  }

  async load(signal) {
    const page = await this.fleet.runs({ status: [...this.filter].join(","), limit: 100 }, { signal });
    const runs = page.runs || [];
    // the latest progress event of each running run (its record holds the last event cursor)
    await Promise.all(runs.filter((r) => r.status === "running").map(async (r) => {
      try {
        const events = await this.fleet.api("GET", `/runs/${encodeURIComponent(r.id)}/events?cursor=${Math.max(0, (r.cursor || 0) - 200)}&type=progress&limit=1000`, undefined, { signal });
        const last = events.events?.[events.events.length - 1];
        if (last) this.progress[r.id] = last.payload;
      } catch { /* progress is a nicety */ }
    }));
    return runs;
  }

  row(r) {
    const prog = this.progress[r.id];
    const where = r.worker_id ? `${r.worker_id}${r.devices?.length ? ` · ${r.devices.join(", ")}` : ""}`
      : (r.placement === "local" ? `${t("queue.this_server")}${r.devices?.length ? ` · ${r.devices.join(", ")}` : ""}` : (r.target || ""));
    return {
      statusClass: `xf-status-${r.status}`, status: t(`runs.status.${r.status}`), hint: where,
      cells: [h("span", { class: "xf-budget-col", dataset: { xpufleet: "budget-col" } }, budgetText(r)), rowMeta(r)],
      below: [r.status === "running" && prog ? progressBar(prog) : null,
        r.waiting_reason ? h("div", { class: "xf-waiting", dataset: { xpufleet: "waiting" } }, r.waiting_reason) : null,
        (r.warnings || []).map((w) => h("div", { class: "xf-warn", dataset: { kind: w.kind } }, `${w.kind}: ${w.message}`))],
    };
  }

  // --- one run ---
  async show(runId, signal) {
    let run;
    try {
      run = await this.fleet.run(runId, { signal });
    } catch (err) {
      if (err?.name === "AbortError") return;
      replace(this.view.detail, errorBox(err));
      return;
    }
    // the panel's run, boxes and log state are the shown run's: a read of a run no longer shown (its
    // signal aborted while the answer was on its way) changes none of them
    if (signal.aborted) return;
    this.run = run;
    this.log.offset = undefined; // this run's log is read from its own tail
    this.progressBox = h("div", { class: "xf-progress-box", dataset: { xpufleet: "progress" } });
    this.gallery?.destroy();
    this.gallery = null;
    this.galleryBox = h("div", { class: "xf-gallery-box", dataset: { xpufleet: "gallery-box" } });
    const chartBox = h("div", { class: "xf-chart-box" });
    this.filesBox = h("div", { class: "xf-files", dataset: { xpufleet: "artifacts" } });
    this.logBox = h("pre", { class: "xf-log", tabindex: "0", "aria-label": t("runs.log"), dataset: { xpufleet: "log" } });
    replace(this.view.detail, this.view.head, this.progressBox, this.galleryBox,
      // a ComfyUI run reports no metric: no empty chart
      h("div", { hidden: run.kind === "comfyui" }, h("h3", {}, t("runs.metrics_heading")), chartBox),
      h("details", { class: "xf-details", open: true }, h("summary", {}, t("runs.artifacts")), this.filesBox),
      h("details", { class: "xf-details" }, h("summary", {}, t("runs.log")), this.logBox));
    this.chart = this.view.keep(new MetricsChart(chartBox));
    this.renderHead();
    try {
      const m = await this.fleet.metrics(runId, { signal });
      if (signal.aborted) return;
      this.chart.setAll(m.metrics);
    } catch (err) {
      if (err?.name === "AbortError") return;
    }
    if (signal.aborted) return;
    this.loadFiles(signal);
    this.follow(runId, signal);
  }

  renderHead() {
    const r = this.run;
    const peak = peakText(r);
    const facts = r.execution_facts || {};
    const actions = ACTIVE.has(r.status)
      ? h("button", { type: "button", class: "xf-danger", dataset: { xpufleet: "stop" },
        onclick: async (e) => { e.currentTarget.disabled = true; await this.view.act(() => this.fleet.cancel(r.id)); } }, t("runs.stop"))
      : h("button", { type: "button", dataset: { xpufleet: "delete" },
        onclick: () => this.view.remove(() => this.fleet.deleteRun(r.id), t("runs.deleted")) }, t("runs.delete"));
    const aliases = Object.entries(facts.device_aliases || {}).filter(([a, m]) => a !== m).map(([a, m]) => `${m} → ${a}`);
    replace(this.view.head,
      h("h3", {}, r.name || shortId(r.id), " ", h("span", { class: `xf-status xf-status-${r.status}`, dataset: { xpufleet: "detail-status" } }, t(`runs.status.${r.status}`))),
      h("div", { class: "xf-kvline" }, `${t("runs.id")}: ${r.id}`),
      h("div", { class: "xf-kvline" }, `${t("runs.where")}: ${r.worker_id || (r.placement === "local" ? t("queue.this_server") : r.target || "—")}`,
        r.devices?.length ? ` · ${t("runs.devices")}: ${r.devices.join(", ")}` : "",
        aliases.length ? ` (${t("runs.in_run")}: ${aliases.join(", ")})` : ""),
      h("div", { class: "xf-kvline" }, `${t("runs.budget")}: ${budgetText(r)}`),
      h("div", { class: "xf-kvline xf-peak", tabindex: "0", title: peak.detail, "aria-label": `${peak.head}. ${peak.detail}`,
        dataset: { xpufleet: "peak", detail: peak.detail } }, `${t("runs.peak_label")}: ${peak.head}`,
        // the per-card figures, shown on hover and on keyboard focus (a title alone never shows on focus)
        peak.detail ? h("span", { class: "xf-peak-detail", role: "tooltip", dataset: { xpufleet: "peak-detail" } }, peak.detail) : null),
      h("div", { class: "xf-kvline" }, `${t("runs.created")}: ${when(r.created_at)}`,
        r.started_at && r.finished_at ? ` · ${t("runs.took")}: ${duration(r.finished_at - r.started_at)}` : ""),
      r.waiting_reason ? h("div", { class: "xf-waiting" }, r.waiting_reason) : null,
      r.error ? h("div", { class: "xf-error", dataset: { xpufleet: "run-error" } }, r.error) : null,
      (r.warnings || []).map((w) => h("div", { class: "xf-warn", dataset: { kind: w.kind } }, `${w.kind}: ${w.message}`)),
      r.final_metrics ? h("div", { class: "xf-kvline" }, `${t("runs.final")}: ${Object.entries(r.final_metrics).map(([k, v]) => `${k} ${typeof v === "number" ? v.toPrecision(4) : v}`).join(", ")}`) : null,
      h("div", { class: "xf-actions" }, actions));
  }

  async follow(runId, signal) {
    let cursor = 0;
    // the chart already holds every metric up to now; new events extend it
    try {
      const first = await this.fleet.events(runId, 0, 0, { signal });
      for (const ev of first.events) this.apply(ev, false);
      cursor = first.cursor;
      if (first.done) { await this.finished(runId, signal); return; }
    } catch (err) {
      if (err?.name === "AbortError") return;
    }
    while (!signal.aborted) {
      let page;
      try {
        page = await this.fleet.events(runId, cursor, 10, { signal });
      } catch (err) {
        if (err?.name === "AbortError") return;
        await sleep(2000, signal);
        continue;
      }
      for (const ev of page.events) this.apply(ev, true);
      cursor = page.cursor;
      if (page.status === "running" && Date.now() - this.log.polled >= LOG_POLL_MS) {
        this.log.polled = Date.now();
        await this.loadLog(signal); // the log as it grows (a worker's through its agent)
      }
      if (page.events.some((e) => ["run_started", "run_warning"].includes(e.type)) || this.run.status !== page.status) {
        try {
          const run = await this.fleet.run(runId, { signal });
          if (signal.aborted) return;
          this.run = run;
          this.renderHead();
        } catch { /* next round */ }
      }
      if (page.done) { await this.finished(runId, signal); return; }
    }
  }

  apply(ev, live) {
    const p = ev.payload || {};
    if (ev.type === "progress") replace(this.progressBox, progressBar(p));
    else if (ev.type === "metric" && live) this.chart?.add(String(p.name), p.step, p.value);
    else if (ev.type === "node_started") replace(this.progressBox, h("div", { class: "xf-hint" }, `${p.node} ${p.class_type || ""}`));
    else if (ev.type === "comfy_output" && this.run?.status !== "succeeded") { // a ComfyUI output node's files, as they are written
      const files = (p.files || []).map((f) => f.file).filter(Boolean);
      this.galleryBox?.append(h("div", { class: "xf-hint", dataset: { xpufleet: "comfy-output", node: String(p.node) } },
        t("gallery.node_wrote", { node: p.node, class_type: p.class_type || "", n: files.length, files: files.join(", ") })));
    }
  }

  async finished(runId, signal) {
    try {
      const run = await this.fleet.run(runId, { signal });
      if (signal.aborted) return;
      this.run = run;
      this.renderHead();
      replace(this.progressBox);
      const m = await this.fleet.metrics(runId, { signal });
      if (signal.aborted) return;
      this.chart?.setAll(m.metrics);
      await this.loadGallery(signal);
      await this.loadFiles(signal);
      this.view.refresh();
    } catch { /* the panel may have closed */ }
  }

  /** A succeeded ComfyUI run's gallery (its files copied home first, in ComfyUI); nothing for a run
   * whose outputs hold no image, video or sound. */
  async loadGallery(signal) {
    const r = this.run;
    const box = this.galleryBox;
    if (r.status !== "succeeded" || !mayHaveGallery(r)) return;
    replace(box, h("div", { class: "xf-hint" }, t("gallery.loading")));
    try {
      const items = await galleryItems(this.fleet, r.id, signal);
      if (signal.aborted || box !== this.galleryBox) return;
      const models = (items.models || []).map((m) => h("div", { class: "xf-hint", dataset: { xpufleet: "model-home", file: m.file } },
        t("gallery.model_home", { node: m.node, path: `${m.folder}/${m.file}`, file: m.file })));
      if (!hasMedia(items) && r.kind !== "comfyui") { replace(box, models); return; }
      const gallery = this.view.keep(new Gallery({ fleet: this.fleet, label: t("gallery.of_run", { name: r.name || shortId(r.id) }) }));
      this.gallery = gallery;
      replace(box, h("h3", {}, t("gallery.title")), gallery.el,
        items[0]?.subfolder ? h("div", { class: "xf-hint", dataset: { xpufleet: "gallery-folder" } }, t("gallery.folder", { folder: `output/${items[0].subfolder}` })) : null, models);
      await gallery.show(items);
    } catch (err) {
      if (err?.name === "AbortError" || box !== this.galleryBox) return;
      // a training run whose recorded outputs cannot be read here (kept on a worker offline): no gallery
      if (r.kind !== "comfyui" && [404, 409].includes(err?.status)) { replace(box); return; }
      replace(box, h("div", { class: "xf-error", dataset: { xpufleet: "gallery-error" } }, `${t("gallery.failed")}: ${err.message}`));
    }
  }

  async loadFiles(signal) {
    const r = this.run;
    const box = this.filesBox;
    try {
      const a = await this.fleet.artifacts(r.id, { signal });
      if (signal.aborted || box !== this.filesBox) return;
      const files = (a.artifacts || []).map((f) => h("li", {},
        f.downloadable ? this.fileLink(r.id, f.path) : h("span", { class: "xf-path" }, f.path),
        ` · ${f.kind}${f.size !== undefined && f.size !== null ? ` · ${bytes(f.size)}` : ""}`));
      const where = a.where === "worker"
        ? h("div", { class: a.connected ? "xf-hint" : "xf-warn", dataset: { xpufleet: "files-where", connected: String(!!a.connected) } },
          t(a.connected ? "runs.files_through_worker" : "runs.files_worker_offline", { worker: a.worker }))
        : null;
      replace(this.filesBox, where,
        files.length ? h("ul", { class: "xf-list" }, files)
          : (a.connected === false ? null : h("div", { class: "xf-hint" }, t("runs.no_files"))));
    } catch (err) {
      if (err?.name !== "AbortError") replace(this.filesBox, h("div", { class: "xf-error" }, err.message));
    }
    await this.loadLog(signal, true);
  }

  /** The output log: its tail first, then (``fromStart`` false) what was written since. A read that a
   * newer tail read (or another run's selection) overtook is dropped, so nothing shows twice. */
  async loadLog(signal, fromStart = false) {
    const r = this.run;
    const box = this.logBox;
    if (fromStart) this.log.gen = this.log.gen + 1;
    else if (this.log.loading === box) return; // one follow-up read at a time: the next round catches up
    const gen = this.log.gen;
    if (!fromStart) this.log.loading = box;
    try {
      const tailRead = fromStart || this.log.offset === undefined; // decided before the wait, as asked
      const log = tailRead
        ? await this.fleet.logs(r.id, LOG_TAIL, { signal })
        : await this.fleet.logsFrom(r.id, this.log.offset, { signal });
      if (box !== this.logBox || gen !== this.log.gen) return;
      box.dataset.where = log.where || "sidecar";
      box.dataset.connected = String(log.connected !== false);
      if (log.connected === false) {
        this.log.offset = undefined;
        box.textContent = t("runs.log_worker_offline", { worker: log.worker });
        return;
      }
      // a tail starts mid-line: shown from its first whole line
      const fresh = tailRead && log.offset > 0 ? log.text.slice(log.text.indexOf("\n") + 1) : log.text;
      const text = tailRead ? fresh : (box.dataset.text === "true" ? box.textContent : "") + fresh;
      this.log.offset = log.next_offset;
      const follow = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
      box.dataset.text = text ? "true" : "false";
      box.textContent = text ? text.slice(-LOG_KEEP) : t(ACTIVE.has(r.status) ? "runs.log_waiting" : "runs.log_empty");
      if (text && follow) box.scrollTop = box.scrollHeight; // follow the end unless the user scrolled up
    } catch (err) {
      if (err?.name !== "AbortError" && box === this.logBox) box.textContent = err.message;
    } finally {
      if (this.log.loading === box) this.log.loading = null;
    }
  }

  /** A file as a link; the request needs this browser's pairing (ComfyUI's proxy) or session (the
   * standalone page) as a header, which a plain link cannot send: the click fetches it and saves the bytes. */
  fileLink(runId, path) {
    const name = path.split("/").pop();
    const attrs = { href: this.fleet.artifactUrl(runId, path), download: name, class: "xf-link",
      "aria-label": t("runs.download", { name: path }), dataset: { xpufleet: "artifact-link", path } };
    attrs.onclick = (e) => { e.preventDefault(); this.download(runId, path); };
    return h("a", attrs, path);
  }

  async download(runId, path) {
    try {
      const resp = await this.fleet.artifactFile(runId, path);
      saveBlob(await resp.blob(), path.split("/").pop());
    } catch (err) {
      this.filesBox.append(h("div", { class: "xf-error", role: "alert" }, err.message));
    }
  }
}

function rowMeta(r) {
  const f = rowFacts(r);
  return h("span", { class: "xf-run-meta xf-hint", dataset: { xpufleet: "run-meta" } },
    h("span", { class: "xf-source-chip", dataset: { xpufleet: "run-source", source: r.source || "api" },
      title: t("runs.origin_title") }, sourceText(r)),
    f.start ? h("span", { dataset: { xpufleet: "run-start" } }, f.start) : null,
    f.took ? h("span", { dataset: { xpufleet: "run-took" } }, f.took) : null,
    f.objective ? h("span", { class: "xf-run-objective", dataset: { xpufleet: "run-objective" } }, f.objective) : null);
}

function progressBar(p) {
  const value = Number(p.value || 0);
  const max = Math.max(1, Number(p.max || 1));
  const text = [p.text, p.loss !== undefined && p.loss !== null ? `loss ${Number(p.loss).toFixed(4)}` : ""].filter(Boolean).join(" · ");
  return h("div", { class: "xf-progress" },
    h("progress", { max: String(max), value: String(value), "aria-label": t("runs.progress") }),
    h("span", { class: "xf-hint" }, ` ${value}/${max} ${text}`));
}

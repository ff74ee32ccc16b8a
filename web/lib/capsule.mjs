// The status-bar capsules (docs/predictor.md section 7): the success rate with its level's colour and label,
// VRAM and RAM beside it, and a tooltip with every input and intermediate of the prediction. The
// figures all come from the server's answer (POST .../predict): no formula here.
import { deviceChoice, parseDeviceChoice } from "./api.mjs";
import { h, nextId, replace } from "./dom.mjs";
import { gib, memGib, num } from "./format.mjs";
import { language, t } from "./i18n.mjs";

export const SETTINGS = {
  refresh: "XPUFleet.Capsule.RefreshSeconds",
  showSuccess: "XPUFleet.Capsule.ShowSuccess",
  showVram: "XPUFleet.Capsule.ShowVRAM",
  showRam: "XPUFleet.Capsule.ShowRAM",
  device: "XPUFleet.Predict.Device",
};
export const DEBOUNCE_MS = 120; // a burst of widget edits is one request
const MIN_REFRESH_S = 1;

/**
 * @param {object} o
 * @param {import("./api.mjs").Fleet} o.fleet
 * @param {{get(id): any, set(id, v): any}} o.settings
 * @param {() => (object|null)} o.workflow  the graph to predict (UI or API format), null for none
 * @param {() => Promise<object|null>} [o.prompt]  the same graph in API format: the server takes a
 *   training graph's peak from its static estimate, the figure Queue on... suggests (docs/canvas.md)
 */
export class CapsuleBar {
  constructor({ fleet, settings, workflow, prompt }) {
    this.fleet = fleet;
    this.settings = settings;
    this.workflow = workflow;
    this.prompt = prompt || null;
    this.answer = null;
    this.error = null;
    this.ticks = 0; // periodic refreshes started
    this.scans = 0; // answers rendered
    this.seq = 0;
    this.inflight = false;
    this.pending = false;
    this.debounceTimer = null;
    this.timer = null;
    this.knownDevices = ["auto"];
    const tipId = nextId("xf-tip");
    this.success = h("button", { class: "xf-capsule xf-success", type: "button", "aria-haspopup": "menu",
      "aria-describedby": tipId, dataset: { xpufleet: "capsule" }, onclick: () => this.toggleMenu() });
    this.vram = h("span", { class: "xf-capsule xf-vram", tabindex: "0", "aria-describedby": tipId,
      dataset: { xpufleet: "vram" } });
    this.ram = h("span", { class: "xf-capsule xf-ram", tabindex: "0", "aria-describedby": tipId,
      dataset: { xpufleet: "ram" } });
    this.tip = h("div", { class: "xf-tooltip", role: "tooltip", id: tipId, hidden: true,
      dataset: { xpufleet: "capsule-tooltip" } });
    this.menuId = nextId("xf-menu");
    this.success.setAttribute("aria-controls", this.menuId);
    // the device it predicts for, in words (the capsule's figures are that device's)
    this.device = h("span", { class: "xf-capsule xf-device", dataset: { xpufleet: "capsule-device" } });
    this.menu = h("div", { class: "xf-menu", role: "menu", id: this.menuId, hidden: true,
      dataset: { xpufleet: "device-menu" } });
    this.element = h("div", { class: "xf-capsules xf-root", role: "group",
      dataset: { xpufleet: "capsules" } }, this.success, this.device, this.vram, this.ram);
    // the tooltip and the menu float over the page: ComfyUI's top bar clips its overflow
    this.floating = h("div", { class: "xf-root xf-floating" }, this.tip, this.menu);
    for (const el of [this.success, this.vram, this.ram]) {
      el.addEventListener("mouseenter", () => this.showTip(true));
      el.addEventListener("mouseleave", () => this.showTip(false));
      el.addEventListener("focus", () => this.showTip(true));
      el.addEventListener("blur", () => this.showTip(false));
    }
    this.element.addEventListener("keydown", (e) => {
      if (e.key === "Escape") { this.showTip(false); this.closeMenu(); }
      // the WAI-ARIA menu button: ArrowDown/ArrowUp open the menu on its first/last item
      if (e.target === this.success && (e.key === "ArrowDown" || e.key === "ArrowUp")) {
        e.preventDefault();
        this.openMenu(e.key === "ArrowUp" ? "last" : "first");
      }
    });
    this.menu.addEventListener("keydown", (e) => this.menuKey(e));
    this.onDocClick = (e) => { if (!this.element.contains(e.target) && !this.floating.contains(e.target)) this.closeMenu(); };
    this.render();
  }

  // --- life cycle ---
  start() {
    this.stop();
    document.body.append(this.floating);
    document.addEventListener("mousedown", this.onDocClick);
    this.requestScan(0);
    this.schedule();
  }

  stop() {
    clearTimeout(this.timer);
    clearTimeout(this.debounceTimer);
    document.removeEventListener("mousedown", this.onDocClick);
    this.floating.remove();
  }

  /** Put a floating box under the capsules, inside the window. */
  place(box) {
    const r = this.element.getBoundingClientRect();
    const width = Math.min(460, window.innerWidth - 16);
    box.style.left = `${Math.max(8, Math.min(r.left, window.innerWidth - width - 8))}px`;
    box.style.top = `${r.bottom + 6}px`;
    box.style.maxHeight = `${Math.max(120, window.innerHeight - r.bottom - 20)}px`;
  }

  intervalMs() {
    const s = Number(this.settings.get(SETTINGS.refresh));
    return 1000 * Math.max(MIN_REFRESH_S, Number.isFinite(s) && s > 0 ? s : 5);
  }

  schedule() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      if (!document.hidden) {
        this.ticks += 1;
        this.element.dataset.ticks = String(this.ticks); // refreshes started (the tests count them)
        this.run();
      }
      this.schedule();
    }, this.intervalMs());
  }

  /** Rescan soon (the graph or a widget changed); `delay` 0 for at once. */
  requestScan(delay = DEBOUNCE_MS) {
    clearTimeout(this.debounceTimer);
    this.debounceTimer = setTimeout(() => this.run(), delay);
  }

  settingsChanged() {
    this.render();
    this.schedule();
    this.requestScan(0);
  }

  target() {
    return parseDeviceChoice(this.settings.get(SETTINGS.device));
  }

  async run() {
    if (this.inflight) { this.pending = true; return; }
    this.inflight = true;
    const seq = ++this.seq;
    const tick = this.ticks;
    try {
      const workflow = this.workflow();
      if (!workflow) {
        this.answer = null;
        this.error = null;
      } else {
        let prompt = null;
        try { prompt = this.prompt ? await this.prompt() : null; } catch { /* the UI workflow alone still predicts */ }
        const answer = await this.fleet.predict({ workflow, ...(prompt ? { prompt } : {}), ...this.target() });
        if (seq === this.seq) { this.answer = answer; this.error = null; }
      }
    } catch (err) {
      if (seq === this.seq) { this.error = err; this.answer = null; }
    } finally {
      this.inflight = false;
      this.scans += 1;
      this.element.dataset.answerTick = String(tick);
      this.render();
      if (this.pending) { this.pending = false; this.run(); }
    }
  }

  // --- rendering ---
  render() {
    this.element.setAttribute("aria-label", t("capsule.group"));
    this.menu.setAttribute("aria-label", t("capsule.pick_device"));
    const show = (id) => this.settings.get(id) !== false;
    this.success.hidden = !show(SETTINGS.showSuccess);
    this.vram.hidden = !show(SETTINGS.showVram);
    this.ram.hidden = !show(SETTINGS.showRam);
    this.element.dataset.scans = String(this.scans);
    this.element.dataset.ticks = String(this.ticks);
    this.element.dataset.device = deviceChoice(this.target());
    const a = this.answer;
    this.device.hidden = this.success.hidden;
    const where = a?.summary ? deviceWords(a.summary) : "";
    replace(this.device, where ? t("capsule.on_device", { device: where }) : "");
    this.device.title = a?.summary?.name || "";
    if (!where) this.device.hidden = true;
    const ds = this.success.dataset;
    if (this.error || !a) { // nothing to rate: the server did not answer, or there is no graph
      const why = this.error ? t("capsule.unavailable") : t("capsule.no_graph");
      ds.level = this.error ? "error" : "none";
      delete ds.p;
      delete ds.missing;
      this.success.style.removeProperty("--xf-level");
      replace(this.success, h("span", { class: "xf-dot" }), why);
      this.success.setAttribute("aria-label", `${t("capsule.success")}: ${why}`);
      replace(this.vram, "VRAM —");
      replace(this.ram, "RAM —");
    } else {
      ds.mPeak = String(a.explanation?.inputs?.m_peak_gb ?? "");
      ds.mTotal = String(a.explanation?.inputs?.m_total_gb ?? "");
      ds.basis = a.summary?.peak_source || "";
      this.success.style.setProperty("--xf-level", a.color);
      if (a.p_success === null || a.p_success === undefined) {
        // a model file is missing: no level and no percentage, the file instead (docs/predictor.md)
        const miss = a.missing || [];
        const text = missingText(miss);
        ds.level = a.level || "missing";
        ds.missing = String(miss.length);
        delete ds.p;
        replace(this.success, h("span", { class: "xf-dot" }), text,
          h("span", { class: "xf-badge", "aria-hidden": "true", title: t("capsule.badge") }, "!"));
        this.success.setAttribute("aria-label", `${t("capsule.success")}: ${text}; ${t("capsule.missing.no_rate")}`);
      } else {
        const label = a.label?.[language()] || a.label?.en || a.level;
        ds.level = a.level;
        ds.p = String(a.p_success);
        delete ds.missing;
        // the mark says what it means on hover; the label below says it to a screen reader
        const badge = (!a.complete || a.snapshot?.reason) ? h("span", { class: "xf-badge", "aria-hidden": "true",
          title: t("capsule.badge") }, "!") : null;
        replace(this.success, h("span", { class: "xf-dot" }), `${a.p_success}% ${label}`, badge);
        const extra = !a.complete ? `; ${t("capsule.incomplete")}` : a.summary?.peak_source === "none" ? `; ${t("capsule.no_models")}` : "";
        this.success.setAttribute("aria-label", `${t("capsule.success")}: ${a.p_success}% ${label}${extra}`);
      }
      const snap = a.snapshot || {};
      this.vram.dataset.free = String(snap.vram_free_gb);
      this.vram.dataset.total = String(snap.vram_total_gb);
      const sim = snap.simulated ? ` ${t("capsule.simulated_short")}` : "";
      if (snap.kind === "cpu" || !snap.vram_total_gb) {
        replace(this.vram, `VRAM: ${t("capsule.no_gpu")}`);
      } else {
        replace(this.vram, `VRAM ${t("capsule.free_of", { free: gib(snap.vram_free_gb), total: gib(snap.vram_total_gb) })}${sim}`);
      }
      const inter = a.explanation?.intermediates || {};
      replace(this.ram, `RAM ${t("capsule.ram_free", { free: gib(snap.ram_free_gb) })} · ${t("capsule.virtual", { v: gib(inter.s_virt_gb) })}`);
    }
    this.renderTip();
  }

  renderTip() {
    const a = this.answer;
    if (this.error) {
      replace(this.tip, h("div", { class: "xf-tip-title" }, t("capsule.unavailable")),
        h("div", { class: "xf-error" }, String(this.error.message || this.error)));
      return;
    }
    if (!a) {
      replace(this.tip, h("div", {}, t("capsule.no_graph_hint")));
      return;
    }
    const ex = a.explanation || {};
    const inp = ex.inputs || {};
    const it = ex.intermediates || {};
    const snap = a.snapshot || {};
    const label = a.label?.[language()] || a.label?.en;
    const rows = (pairs) => h("table", { class: "xf-kv" }, h("tbody", {}, pairs.map(([k, v]) =>
      h("tr", {}, h("th", { scope: "row" }, k), h("td", {}, v)))));
    const where = snap.worker ? `${snap.worker} / ${snap.device}` : `${t("capsule.this_machine")}: ${snap.device}`;
    const name = snap.name ? ` (${snap.name})` : "";
    const deviceLine = [where + name];
    if (snap.simulated) deviceLine.push(t("capsule.simulated_long"));
    const models = (a.models || []).map((m) => h("li", { class: m.status === "found" ? "" : "xf-warn" },
      `${m.name} — ${m.status === "found" ? gib(m.counted_gb ?? m.size_gb, 2) : t("capsule.model_status." + m.status, { reason: m.reason || "" })}`));
    const warnings = (a.warnings || []).map((w) => h("li", { class: "xf-warn" }, w));
    if (a.p_success === null || a.p_success === undefined) {
      replace(this.tip, ...this.missingTip(a, deviceLine, warnings));
      return;
    }
    replace(this.tip,
      a.summary ? h("div", { class: "xf-tip-sentence", dataset: { xpufleet: "capsule-sentence" } }, sentence(a.summary)) : null,
      h("div", { class: "xf-tip-title" }, `P_success = ${a.p_success}% — ${label}`),
      h("div", { class: "xf-tip-device" }, deviceLine.join(" · ")),
      snap.reason ? h("div", { class: "xf-warn" }, snap.reason) : null,
      h("div", { class: "xf-tip-section" }, t("capsule.inputs")),
      rows([
        ["M_peak", gib(inp.m_peak_gb, 2)], ["M_total", gib(inp.m_total_gb, 2)],
        ["V_free", gib(inp.vram_free_gb, 2)], ["V_alloc", gib(inp.vram_allocated_gb, 2)],
        ["V_rsv", gib(inp.vram_reserved_gb, 2)], ["R_free", gib(inp.ram_free_gb, 2)],
        ["C_used", gib(inp.commit_used_gb, 2)], ["C_limit", gib(inp.commit_limit_gb, 2)],
      ]),
      h("div", { class: "xf-tip-section" }, t("capsule.intermediates")),
      rows([
        ["V_reclaim", gib(it.v_reclaim_gb, 2)],
        ["V_eff", gib(it.v_eff_gb, 2) + (it.v_eff_floored ? ` (${t("capsule.floored")})` : "")],
        ["gamma (γ)", `${num(ex.gamma)} (${ex.platform}, ${ex.gamma_source})`],
        ["V_eff × γ", gib(it.v_eff_platform_gb, 2)],
        ["C_ram", gib(it.c_ram_gb, 2)], ["S_virt", gib(it.s_virt_gb, 2)],
        ["D_peak", gib(it.d_peak_gb, 2)], ["D_load", gib(it.d_load_gb, 2)],
        ["P_peak", num(it.p_peak, 4)], ["P_load", `${num(it.p_load, 4)} (${it.p_load_branch})`],
      ]),
      h("div", { class: "xf-tip-section" }, t("capsule.models", { n: (a.models || []).length })),
      models.length ? h("ul", { class: "xf-list" }, models) : h("div", { class: "xf-hint" }, t("capsule.no_models")),
      warnings.length ? h("ul", { class: "xf-list" }, warnings) : null,
      h("div", { class: "xf-hint" }, t("capsule.click_to_pick")),
    );
  }

  /** The tooltip of a workflow whose model file is missing: each file, its node and where it is looked
   * for; what the files found need, as a lower bound; no success rate. */
  missingTip(a, deviceLine, warnings) {
    const miss = a.missing || [];
    const found = (a.models || []).filter((x) => x.status === "found").map((x) => h("li", {},
      `${x.name} — ${gib(x.counted_gb ?? x.size_gb, 2)}`));
    const m = a.explanation?.models || {};
    const comfy = a.scan?.resolver?.source === "comfyui";
    const items = miss.map((x) => {
      const what = { file: x.name, node: x.node, class: x.class_type, input: x.input, folder: x.folder || "—" };
      const head = !x.name ? t("capsule.missing.item_none", what)
        : x.status === "refused" ? `${t("capsule.missing.item", what)}: ${t("capsule.model_status.refused", { reason: x.reason || "" })}`
          : t("capsule.missing.item", what);
      const places = (x.places || []).join(", ") + (x.places_more ? ` ${t("capsule.missing.looked_in_more", { n: x.places_more })}` : "");
      // no folder at all: a node the scan does not know, whose reason says it ("X is not a known loader ...")
      const where = places
        ? t(comfy ? "capsule.missing.looked_in_comfyui" : "capsule.missing.looked_in_config", { places })
        : (x.folders || []).length ? t("capsule.missing.nowhere", { folders: x.folders.join(", ") }) : x.reason || "";
      return h("li", { class: "xf-warn", dataset: { node: x.node, file: x.name } }, head,
        h("div", { class: "xf-hint", dataset: { xpufleet: "missing-places" } }, where));
    });
    return [
      h("div", { class: "xf-tip-sentence", dataset: { xpufleet: "capsule-sentence" } },
        t("capsule.missing.sentence", { device: a.summary ? deviceWords(a.summary) : "" })),
      h("div", { class: "xf-tip-title" }, t("capsule.missing.title", { n: miss.length })),
      h("ul", { class: "xf-list", dataset: { xpufleet: "capsule-missing" } }, items),
      h("div", { class: "xf-hint" }, t("capsule.missing.fix")),
      h("div", { class: "xf-tip-device" }, deviceLine.join(" · ")),
      h("div", { class: "xf-tip-section" }, t("capsule.missing.found_heading")),
      h("div", { dataset: { xpufleet: "capsule-lower-bound" } }, found.length
        ? t("capsule.missing.lower_bound", { peak: gib(m.m_peak_gb, 2), total: gib(m.m_total_gb, 2) })
        : t("capsule.missing.nothing_found")),
      found.length ? h("ul", { class: "xf-list" }, found) : null,
      warnings.length ? h("ul", { class: "xf-list" }, warnings) : null,
      h("div", { class: "xf-hint" }, t("capsule.click_to_pick")),
    ];
  }

  showTip(on) {
    this.tip.hidden = !on || !this.menu.hidden;
    if (!this.tip.hidden) this.place(this.tip);
  }

  // --- the device menu (the WAI-ARIA menu button pattern: docs/canvas.md, "The capsule for a training graph") ---
  toggleMenu() {
    if (!this.menu.hidden) { this.closeMenu(); return; }
    this.openMenu("checked");
  }

  /** Open the menu and focus its checked ("checked"), first or last item. */
  async openMenu(focus = "checked") {
    if (!this.menu.hidden) { this.focusItem(focus); return; }
    this.tip.hidden = true;
    replace(this.menu, h("div", { class: "xf-hint", role: "none" }, t("common.loading")));
    this.menu.hidden = false;
    this.place(this.menu);
    this.success.setAttribute("aria-expanded", "true");
    const current = deviceChoice(this.target());
    // this machine is one entry: its default device ("auto"); its other devices (a second GPU) follow
    const items = [{ value: "auto", text: t("capsule.auto_device") }];
    try {
      const snap = await this.fleet.snapshot();
      const main = snap.snapshot?.device;
      if (main) items[0].text = t("capsule.menu_this_machine", { device: main + (snap.snapshot.name ? ` (${snap.snapshot.name})` : "") });
      for (const s of snap.snapshots || []) {
        if (s.device === main) continue;
        items.push({ value: s.device, text: t("capsule.menu_this_machine", { device: s.device + (s.name ? ` (${s.name})` : "") }) });
      }
    } catch { /* this machine's list is optional */ }
    let workerNote = null;
    try {
      const { workers } = await this.fleet.workers();
      for (const w of workers || []) {
        for (const d of w.devices || []) {
          if (d.kind === "cpu") continue;
          items.push({ value: `${w.name}/${d.name}`, text: `${w.name} / ${d.name}${d.simulated ? ` (${t("common.simulated")})` : ""}` });
        }
      }
    } catch (err) {
      workerNote = `${t("capsule.no_worker_cards")}: ${err.message}`;
    }
    if (this.menu.hidden) return; // closed while loading
    this.knownDevices = items.map((i) => i.value);
    const buttons = items.map((item) => h("button", {
      type: "button", role: "menuitemradio", tabindex: "-1", "aria-checked": item.value === current ? "true" : "false",
      class: "xf-menu-item", dataset: { value: item.value },
      onclick: () => this.choose(item.value),
    }, item.text));
    replace(this.menu, h("div", { class: "xf-tip-section", role: "presentation" }, t("capsule.pick_device")), buttons,
      workerNote ? h("div", { class: "xf-hint", role: "presentation" }, workerNote) : null);
    this.focusItem(focus);
  }

  items() {
    return [...this.menu.querySelectorAll('[role="menuitemradio"]')];
  }

  focusItem(which) {
    const items = this.items();
    if (!items.length) return;
    const at = { first: 0, last: items.length - 1 }[which] ??
      Math.max(0, items.findIndex((b) => b.getAttribute("aria-checked") === "true"));
    items[at].focus();
  }

  choose(value) {
    this.settings.set(SETTINGS.device, value); // "auto" itself: a setting's option never has an empty value
    this.closeMenu(true);
    this.settingsChanged();
  }

  menuKey(e) {
    const items = this.items();
    const i = items.indexOf(document.activeElement);
    const go = (n) => { e.preventDefault(); items[(n + items.length) % items.length]?.focus(); };
    if (e.key === "ArrowDown") go(i + 1);
    else if (e.key === "ArrowUp") go(i < 0 ? items.length - 1 : i - 1);
    else if (e.key === "Home") go(0);
    else if (e.key === "End") go(items.length - 1);
    else if (e.key === "Escape") { e.preventDefault(); this.closeMenu(true); }
    else if (e.key === "Tab") this.closeMenu();
  }

  /** Close the menu; `refocus`: give the focus back to the capsule (Escape, a choice). */
  closeMenu(refocus = false) {
    if (this.menu.hidden) return;
    this.menu.hidden = true;
    this.success.setAttribute("aria-expanded", "false");
    if (refocus) this.success.focus();
  }
}

/** The capsule's words for the missing files: "Missing model: x.safetensors (node 4) +1 more". */
function missingText(miss) {
  const first = miss[0] || {};
  const what = { file: first.name, node: first.node };
  const text = !first.name ? t("capsule.missing.none_chosen", what)
    : first.status === "refused" ? t("capsule.missing.refused", what) : t("capsule.missing.file", what);
  return miss.length > 1 ? `${text} ${t("capsule.missing.more", { n: miss.length - 1 })}` : text;
}

/** "gpu-box cuda:0" / "this machine cuda:0" from the answer's summary (the card's model name is in
 * the tooltip's device line). */
function deviceWords(s) {
  return s.worker ? `${s.worker} ${s.device}` : t("capsule.this_machine_device", { device: s.device });
}

/** 24 -> "24 GiB", 23.6 -> "23.6 GiB" */
function total(v) {
  return gib(v, Number.isInteger(Number(v)) ? 0 : 1);
}

/** The tooltip's first sentence: "Fits: needs about 0.13 GiB of 24 GiB on gpu-box cuda:0 (simulated)". */
function sentence(s) {
  // a workflow that loads no model file: its 0 GiB is no size of anything, so no "needs about 0.00 GiB"
  const text = s.peak_source === "none" ? t("capsule.sentence_no_models", { device: deviceWords(s) })
    : t(s.memory === "ram" ? "capsule.sentence_ram" : "capsule.sentence", {
      verdict: t(`capsule.verdict.${s.verdict}`), need: memGib(s.need_gb), of: total(s.of_gb), device: deviceWords(s) });
  return s.simulated ? `${text} (${t("common.simulated")})` : text;
}

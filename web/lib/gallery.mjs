// The images, videos and sounds a ComfyUI run made (docs/runs-panel.md "Gallery"): thumbnails, full size on
// click (a dialog: previous/next, download, Esc closes), a download link under each; video and audio play
// in place. In ComfyUI the run's files are first copied into ComfyUI's output folder (POST
// /xpufleet/runs/{id}/home, server/comfy/home.py) and shown from ComfyUI's own /view; the sidecar's
// standalone page reads them from the run's recorded outputs with its session.
import { h, replace, saveBlob } from "./dom.mjs";
import { bytes } from "./format.mjs";
import { t } from "./i18n.mjs";

export const MEDIA_KINDS = new Set(["image", "video", "audio"]);
const HOME_KINDS = new Set([...MEDIA_KINDS, "file"]);

/** Whether the page should look for a run's gallery: a ComfyUI run (its ``kind``), or a run that recorded
 * its outputs (the gallery shows only when they hold an image, a video or a sound). */
export function mayHaveGallery(run) {
  return run?.kind === "comfyui" || Boolean(run?.options?.record_outputs);
}

/** A succeeded run's files, in node and output order: [{node, class_type, file, kind, url, fetch?}];
 * ``fetch``: the address needs the page's credentials (read as a blob), not a plain link. */
export async function galleryItems(fleet, runId, signal) {
  if (fleet.kind === "comfy") {
    const answer = await fleet.home(runId, { signal });
    const items = (answer.files || []).filter((f) => HOME_KINDS.has(f.kind));
    items.models = answer.models || []; // a training run's saved models, copied into models/xpufleet
    return items;
  }
  const listing = await fleet.outputs(runId, { signal });
  const items = [];
  for (const n of listing.nodes || []) {
    const m = await fleet.nodeOutputs(runId, String(n.node), { signal });
    for (const o of m.outputs || []) {
      if (!o.file || !HOME_KINDS.has(o.kind)) continue;
      items.push({ node: String(n.node), class_type: m.class_type || n.class_type, file: o.file, kind: o.kind,
        name: o.name, media_type: o.media_type, bytes: o.bytes, url: fleet.outputUrl(runId, String(n.node), o.file), fetch: true });
    }
  }
  return items;
}

/** Whether any item is an image, a video or a sound (a training run's recorded files are not). */
export function hasMedia(items) {
  return (items || []).some((i) => MEDIA_KINDS.has(i.kind));
}

/** The ComfyUI ``ui`` output a node would have had for ``items`` (its own keys: images, audio, ...), by node:
 * what the canvas shows on an output node. */
export function nodeOutputs(items) {
  const out = {};
  for (const i of items || []) {
    if (!MEDIA_KINDS.has(i.kind) || !i.subfolder) continue;
    const key = i.name || (i.kind === "audio" ? "audio" : "images");
    const node = (out[i.node] ||= {});
    (node[key] ||= []).push({ filename: i.file, subfolder: i.subfolder, type: i.type || "output" });
    if (i.kind === "video") node.animated = [true];
  }
  return out;
}

export class Gallery {
  /**
   * @param {object} o
   * @param {import("./api.mjs").Fleet} o.fleet
   * @param {string} [o.label]  what the gallery is of (its aria-label)
   */
  constructor({ fleet, label }) {
    this.fleet = fleet;
    this.objectUrls = [];
    this.items = [];
    this.el = h("div", { class: "xf-gallery", role: "list", "aria-label": label || t("gallery.title"), dataset: { xpufleet: "gallery" } });
  }

  destroy() {
    for (const u of this.objectUrls) URL.revokeObjectURL(u);
    this.objectUrls = [];
  }

  /** Show ``items`` (galleryItems' answer). */
  async show(items) {
    this.destroy();
    this.items = items;
    const cells = await Promise.all(items.map((item, i) => this.cell(item, i)));
    replace(this.el, cells.length ? cells : h("div", { class: "xf-hint" }, t("gallery.none")));
  }

  async src(item) {
    if (!item.fetch) return item.url;
    try {
      const resp = await this.fleet.request("GET", item.url, undefined, { raw: true });
      const url = URL.createObjectURL(await resp.blob());
      this.objectUrls.push(url);
      return url;
    } catch {
      return "";
    }
  }

  async cell(item, index) {
    const src = MEDIA_KINDS.has(item.kind) ? await this.src(item) : item.url;
    let media;
    if (item.kind === "image") {
      media = h("button", { type: "button", class: "xf-thumb", "aria-label": t("gallery.open", { name: item.file }),
        dataset: { xpufleet: "gallery-open" }, onclick: () => this.open(index) },
      h("img", { src, alt: item.file, loading: "lazy", dataset: { xpufleet: "gallery-thumb" } }));
    } else if (item.kind === "video") {
      media = h("video", { src, controls: true, preload: "metadata", class: "xf-thumb-media", "aria-label": item.file });
    } else if (item.kind === "audio") {
      media = h("audio", { src, controls: true, preload: "metadata", "aria-label": item.file });
    } else {
      media = h("span", { class: "xf-path" }, item.file);
    }
    item.src = src;
    return h("figure", { class: "xf-gallery-item", role: "listitem", dataset: { kind: item.kind, node: item.node, file: item.file } },
      media,
      h("figcaption", { class: "xf-hint" }, `${item.class_type || ""} ${item.node}`.trim(), " · ", this.downloadLink(item),
        item.bytes ? ` · ${bytes(item.bytes)}` : ""));
  }

  downloadLink(item) {
    const attrs = { href: item.src || item.url, download: item.file, class: "xf-link",
      "aria-label": t("gallery.download", { name: item.file }), dataset: { xpufleet: "gallery-download" } };
    if (item.fetch && !item.src) {
      attrs.onclick = async (e) => {
        e.preventDefault();
        try { saveBlob(await (await this.fleet.request("GET", item.url, undefined, { raw: true })).blob(), item.file); } catch { /* shown as missing */ }
      };
    }
    return h("a", attrs, t("gallery.download_short"));
  }

  /** The image ``index`` full size in a dialog; the arrow keys step through the gallery's images. */
  open(index) {
    const images = this.items.map((item, i) => ({ item, i })).filter((x) => x.item.kind === "image");
    let at = Math.max(0, images.findIndex((x) => x.i === index));
    const img = h("img", { class: "xf-lightbox-img", dataset: { xpufleet: "lightbox-img" } });
    const caption = h("div", { class: "xf-hint" });
    const dialog = h("dialog", { class: "xf-dialog xf-lightbox xf-root", "aria-label": t("gallery.full_size"), dataset: { xpufleet: "lightbox" } });
    const show = () => {
      const { item } = images[at];
      img.src = item.src || item.url;
      img.alt = item.file;
      replace(caption, `${at + 1}/${images.length} · ${item.class_type || ""} ${item.node} · ${item.file} · `, this.downloadLink(item));
    };
    const step = (d) => { at = (at + d + images.length) % images.length; show(); };
    const many = images.length > 1;
    replace(dialog,
      h("div", { class: "xf-lightbox-bar" },
        many ? h("button", { type: "button", "aria-label": t("gallery.previous"), onclick: () => step(-1) }, "‹") : null,
        many ? h("button", { type: "button", "aria-label": t("gallery.next"), onclick: () => step(1) }, "›") : null,
        h("button", { type: "button", class: "xf-lightbox-close", dataset: { xpufleet: "lightbox-close" }, onclick: () => dialog.close() }, t("gallery.close"))),
      img, caption);
    dialog.addEventListener("keydown", (e) => {
      if (e.key === "Escape") { e.stopPropagation(); dialog.close(); } // a host's own key handling may swallow the dialog's cancel
      else if (many && e.key === "ArrowLeft") step(-1);
      else if (many && e.key === "ArrowRight") step(1);
    });
    dialog.addEventListener("close", () => dialog.remove());
    dialog.addEventListener("click", (e) => { if (e.target === dialog) dialog.close(); }); // the backdrop
    show();
    document.body.append(dialog);
    dialog.showModal();
    return dialog;
  }
}

// Small DOM helpers: every text goes in through textContent (never innerHTML), so names, errors and
// log lines from the server can never become markup.

/**
 * h("button", {class: "x", onclick: fn, "aria-label": "Stop"}, "text", child, [more])
 * Attributes: `class`, `dataset` (object), `style` (object), `on<event>` (listeners), boolean
 * properties (`disabled`, `checked`, `hidden`), everything else through setAttribute.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style") Object.assign(el.style, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "disabled" || key === "checked" || key === "hidden" || key === "selected" ||
             key === "value" || key === "open") el[key] = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replace the children of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

let uid = 0;
/** A page-unique id for label/aria wiring. */
export function nextId(prefix = "xf") {
  uid += 1;
  return `${prefix}-${uid}`;
}

/** A labelled form row: <label for=id>text</label> control [hint]. */
export function field(labelText, control, hint) {
  if (!control.id) control.id = nextId("xf-field");
  const hintEl = hint ? h("div", { class: "xf-hint", id: `${control.id}-hint` }, hint) : null;
  if (hintEl) control.setAttribute("aria-describedby", hintEl.id);
  return h("div", { class: "xf-field" }, h("label", { for: control.id }, labelText), control, hintEl);
}

/** setTimeout as a promise that an AbortSignal ends early (never rejects). */
export function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

/** Save `blob` as a file named `name` (a temporary object URL; no navigation). */
export function saveBlob(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = h("a", { href: url, download: name, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

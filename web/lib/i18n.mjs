// Every text of the front end, in English and Chinese, lives in ComfyUI's own locales files:
// locales/<lang>/main.json under "xpufleet" (nested by the dotted key: "capsule.group" is
// xpufleet.capsule.group). ComfyUI merges them into its i18n; this module reads the same files (ComfyUI's
// /xpufleet/locales/<lang>/main.json, the sidecar's /ui/locales/<lang>/main.json) so `t(key, vars)` stays
// synchronous once `loadStrings` has run. The level labels (Smooth / 轻松 ...) come from the server's
// answer. See docs/i18n.md.

// Keys not (yet) in locales/<lang>/main.json: a branch may add keys here, in a block per branch at the
// end of EN and of ZH; they are used when the JSON lacks them. Move them to the JSON files.
const EN = {
};

const ZH = {
};

export const LANGUAGES = ["en", "zh"];
export const STRINGS = { en: { ...EN }, zh: { ...ZH } };
let current = "en";
const listeners = new Set();

/** {"a": {"b": "x"}} -> {"a.b": "x"} */
export function flatten(tree, prefix = "", out = {}) {
  for (const [key, value] of Object.entries(tree || {})) {
    if (value && typeof value === "object") flatten(value, `${prefix}${key}.`, out);
    else out[prefix + key] = String(value);
  }
  return out;
}

/**
 * Read every language's strings from `${base}/<lang>/main.json` (its "xpufleet" section). A language
 * that fails to load keeps the keys of this file and falls back to English.
 * @param {string} base  "/xpufleet/locales" (ComfyUI) or "/ui/locales" (the sidecar)
 * @param {(url: string) => Promise<Response>} [fetchFn]
 */
export async function loadStrings(base, fetchFn = (url) => fetch(url)) {
  await Promise.all(LANGUAGES.map(async (lang) => {
    try {
      const resp = await fetchFn(`${base}/${lang}/main.json`);
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      const json = await resp.json();
      STRINGS[lang] = { ...(lang === "en" ? EN : ZH), ...flatten(json.xpufleet) };
    } catch (err) {
      console.warn(`XPU Fleet: could not load the ${lang} texts:`, err);
    }
  }));
}

/** "auto" follows the host's locale (ComfyUI's Comfy.Locale, or the browser's). */
export function resolveLanguage(setting, hostLocale) {
  if (setting === "zh" || setting === "en") return setting;
  return String(hostLocale || "").toLowerCase().startsWith("zh") ? "zh" : "en";
}

/** Switch the language; every `onLanguageChange` listener relabels what it shows (no reload). */
export function setLanguage(lang) {
  const next = STRINGS[lang] ? lang : "en";
  const changed = next !== current;
  current = next;
  document.documentElement?.setAttribute("data-xf-lang", current);
  if (changed) {
    for (const fn of [...listeners]) {
      try { fn(current); } catch (err) { console.error("XPU Fleet: relabel failed:", err); }
    }
  }
}

/** Call `fn(lang)` after each language change; returns a function that stops it. */
export function onLanguageChange(fn) {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

export function language() {
  return current;
}

/** The English text of `key`: what ComfyUI's own i18n is given to translate (setting names, commands). */
export function english(key) {
  return STRINGS.en[key] ?? key;
}

export function t(key, vars) {
  let text = STRINGS[current][key] ?? STRINGS.en[key];
  if (text === undefined) {
    console.warn(`XPU Fleet: no text for ${key}`);
    return key;
  }
  if (vars) text = text.replace(/\{(\w+)\}/g, (m, name) => (vars[name] !== undefined ? String(vars[name]) : m));
  return text;
}

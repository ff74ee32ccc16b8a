"""Write the plugin's ComfyUI locale files that are derived from ``locales/<lang>/main.json``.

ComfyUI 0.3.64 (``app/custom_node_manager.py``) merges, for each ``locales/<lang>/`` of a custom node,
``main.json`` with ``settings.json`` (under ``settings``), ``commands.json`` (``commands``) and
``nodeDefs.json`` (``nodeDefs``) into its front end's i18n. The front end then names a setting
``settings.<id with . as _>.name`` (its options ``...options.<text>``, its tooltip ``...tooltip``), a
command ``commands.<id>.label``, a settings group ``settingsCategories.<name>`` and a menu
``menuLabels.<name>``. Those texts are the plugin's own (``xpufleet.settings.*``, ``xpufleet.app.*`` in
main.json): this module copies them, so main.json stays the one place to edit (docs/i18n.md).

``locales/en/nodeDefs.json`` (the canvas's node names, inputs, outputs and tooltips) is made from the
nodes' own INPUT_TYPES, DESCRIPTION and display names; ``locales/zh/nodeDefs.json`` is its hand-made
translation, which a test holds to the same nodes, inputs and outputs.

    python -m xpufleet.server.comfy.make_locales           # rewrite the derived files
    python -m xpufleet.server.comfy.make_locales --check   # exit 1 when one is stale (a test does this)
    python -m xpufleet.server.comfy.make_locales --absorb  # move keys left in web/lib/i18n.mjs into main.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

LOCALES = Path(__file__).resolve().parents[2] / "locales"
I18N_MJS = LOCALES.parent / "web" / "lib" / "i18n.mjs"
_ENTRY = re.compile(r'^\s*"([a-z_.A-Z0-9]+)":\s*("(?:[^"\\]|\\.)*"),?\s*$')
LANGUAGES = ("en", "zh")

# setting id -> (name key, tooltip key or None, {option text (English): key})
SETTINGS: dict[str, tuple[str, str | None, dict[str, str]]] = {
    "XPUFleet.Language": ("settings.language", None, {"Follow ComfyUI": "settings.language_auto"}),
    "XPUFleet.Capsule.RefreshSeconds": ("settings.refresh", None, {}),
    "XPUFleet.Capsule.ShowSuccess": ("settings.show_success", None, {}),
    "XPUFleet.Capsule.ShowVRAM": ("settings.show_vram", None, {}),
    "XPUFleet.Capsule.ShowRAM": ("settings.show_ram", None, {}),
    "XPUFleet.Predict.Device": ("settings.device", "settings.device_tip", {}),
    "XPUFleet.Sidecar.AutoStart": ("settings.autostart", "settings.autostart_tip", {}),
    "XPUFleet.Sidecar.URL": ("settings.sidecar", "settings.sidecar_tip", {}),
}
COMMANDS = {
    "XPUFleet.QueueOn": "app.queue_on", "XPUFleet.ShowRuns": "app.show_runs",
    "XPUFleet.ShowWorkers": "app.show_workers", "XPUFleet.NewSweep": "app.new_sweep",
    "XPUFleet.ShowSweeps": "app.show_sweeps",
}
# the settings dialog's groups (category[1] of each setting) and the menu's name
CATEGORIES = {"XPU Fleet": "app.menu", "General": "settings.category_general",
              "Capsule": "settings.category_capsule", "Sidecar": "settings.category_sidecar"}


def _norm(key: str) -> str:
    """The front end's normalizeI18nKey: dots would split the key path."""
    return key.replace(".", "_")


def strings(lang: str) -> dict[str, str]:
    """``xpufleet`` of ``locales/<lang>/main.json``, flattened to dotted keys."""
    out: dict[str, str] = {}

    def walk(tree: dict[str, Any], prefix: str) -> None:
        for k, v in tree.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out[prefix + k] = str(v)

    walk(json.loads((LOCALES / lang / "main.json").read_text(encoding="utf-8")).get("xpufleet", {}), "")
    return out


def derived(lang: str) -> dict[str, Any]:
    """File name -> content of the derived files of ``lang`` (``main.json`` with its derived sections)."""
    s = strings(lang)
    settings = {}
    for sid, (name, tip, options) in SETTINGS.items():
        entry: dict[str, Any] = {"name": s[name]}
        if tip:
            entry["tooltip"] = s[tip]
        if options:
            entry["options"] = {_norm(text): s[key] for text, key in options.items()}
        settings[_norm(sid)] = entry
    commands = {_norm(cid): {"label": s[key]} for cid, key in COMMANDS.items()}
    main = json.loads((LOCALES / lang / "main.json").read_text(encoding="utf-8"))
    main["settingsCategories"] = {name: s[key] for name, key in CATEGORIES.items()}
    main["menuLabels"] = {"XPU Fleet": s["app.menu"]}
    return {"settings.json": settings, "commands.json": commands, "main.json": main}


def node_defs() -> dict[str, Any]:
    """English nodeDefs.json: per node its display name, description, inputs (name, tooltip), outputs."""
    from ...nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

    out: dict[str, Any] = {}
    for cls_name, cls in NODE_CLASS_MAPPINGS.items():
        inputs: dict[str, Any] = {}
        for section in ("required", "optional"):
            for name, spec in (cls.INPUT_TYPES().get(section) or {}).items():
                entry = {"name": name}
                opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
                if opts.get("tooltip"):
                    entry["tooltip"] = opts["tooltip"]
                inputs[name] = entry
        names = getattr(cls, "RETURN_NAMES", None) or cls.RETURN_TYPES
        tips = getattr(cls, "OUTPUT_TOOLTIPS", None) or ()
        outputs = {str(i): {"name": n, **({"tooltip": tips[i]} if i < len(tips) and tips[i] else {})}
                   for i, n in enumerate(names)}
        node = {"display_name": NODE_DISPLAY_NAME_MAPPINGS.get(cls_name, cls_name)}
        if getattr(cls, "DESCRIPTION", ""):
            node["description"] = cls.DESCRIPTION
        node.update(inputs=inputs, outputs=outputs)
        out[cls_name] = node
    return out


def absorb() -> dict[str, int]:
    """Move the keys of i18n.mjs's EN and ZH objects (a merged branch's block) into main.json's
    ``xpufleet`` (nested by their dots) and empty those objects; the number moved per language."""
    src = I18N_MJS.read_text(encoding="utf-8")
    moved = {}
    for lang, name in (("en", "EN"), ("zh", "ZH")):
        head = f"const {name} = {{"
        start = src.index(head) + len(head)
        end = src.index("\n};", start)
        entries = [m for line in src[start:end].splitlines() if (m := _ENTRY.match(line))]
        path = LOCALES / lang / "main.json"
        main = json.loads(path.read_text(encoding="utf-8"))
        for m in entries:
            node = main.setdefault("xpufleet", {})
            *parents, leaf = m.group(1).split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = json.loads(m.group(2))
        path.write_text(_text(main), encoding="utf-8")
        src = src[:start] + src[end:]
        moved[lang] = len(entries)
    I18N_MJS.write_text(src, encoding="utf-8")
    return moved


def _text(content: Any) -> str:
    return json.dumps(content, ensure_ascii=False, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check compare) the derived locale files; the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 when a file is not what would be written")
    p.add_argument("--absorb", action="store_true", help="first move the keys left in web/lib/i18n.mjs into main.json")
    args = p.parse_args(argv)
    if args.absorb:
        print("moved from i18n.mjs:", absorb())
    stale = []
    files = [(lang, name, content) for lang in LANGUAGES for name, content in derived(lang).items()]
    files.append(("en", "nodeDefs.json", node_defs()))
    for lang, name, content in files:
        path = LOCALES / lang / name
        text = _text(content)
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        if args.check:
            stale.append(str(path))
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print("stale (run python -m xpufleet.server.comfy.make_locales):", *stale, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

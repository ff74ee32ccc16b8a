"""Every text of the front end exists in English and in Chinese (locales/<lang>/main.json, "xpufleet",
plus any keys still in web/lib/i18n.mjs's EN/ZH blocks), and every key the modules ask for is there;
placeholders match between the two languages; the locale files ComfyUI reads beside main.json are in
step with it. Read as text, no browser."""

from __future__ import annotations

import json
import re
from pathlib import Path

from xpufleet.server.comfy import make_locales

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "web"
ENTRY = re.compile(r'^\s*"([a-z_.A-Z]+)":\s*"((?:[^"\\]|\\.)*)",?\s*$')
# keys built at run time from a server value: their prefixes and every value the server can send
DYNAMIC = {
    "runs.status.": ["queued", "assigned", "running", "succeeded", "failed", "cancelled", "interrupted"],
    "status.": ["Online", "Degraded", "Draining", "Disconnected", "Disabled"],
    "runs.source.": ["user", "estimate", "measured"],
    "capsule.model_status.": ["missing", "refused", "unresolved"],
    "capsule.verdict.": ["fits", "spills", "fails"],
    "sweep.status.": ["queued", "running", "cancelling", "finished", "cancelled"],
    # a list panel's texts (web/lib/item_list.mjs ListPanel: t(`${texts}.title`), ...)
    **{f"{panel}.": ["title", "pick", "none", "open"] for panel in ("runs", "sweep", "study")},
}


def dictionaries() -> dict[str, dict[str, str]]:
    text = (WEB / "lib" / "i18n.mjs").read_text(encoding="utf-8")
    out: dict[str, dict[str, str]] = {}
    for lang, name in (("en", "EN"), ("zh", "ZH")):
        block = text.split(f"const {name} = {{", 1)[1].split("\n};", 1)[0]
        out[lang] = {m.group(1): m.group(2) for line in block.splitlines() if (m := ENTRY.match(line))}
        out[lang].update(make_locales.strings(lang))  # the JSON wins, as in lib/i18n.mjs
    return out


def used_keys() -> set[str]:
    keys: set[str] = set()
    for path in [*WEB.rglob("*.mjs"), *WEB.rglob("*.js")]:
        if "vendor" in path.parts:
            continue
        src = path.read_text(encoding="utf-8")
        keys |= {k for k in re.findall(r'\b(?:t|english)\("([a-z_.A-Z]+)"', src) if not k.endswith(".")}
        keys |= set(re.findall(r'(?:titleKey|getPanel\)|tab\([A-Z_]+, )"([a-z_.]+)"', src))
    for prefix, values in DYNAMIC.items():
        keys |= {prefix + v for v in values}
    return keys


def test_both_languages_have_the_same_keys_and_placeholders():
    d = dictionaries()
    assert len(d["en"]) > 200
    assert set(d["en"]) == set(d["zh"]), set(d["en"]) ^ set(d["zh"])
    for key, en in d["en"].items():
        assert set(re.findall(r"\{(\w+)\}", en)) == set(re.findall(r"\{(\w+)\}", d["zh"][key])), key
        assert d["zh"][key].strip(), key


def test_every_key_the_front_end_asks_for_exists():
    d = dictionaries()
    missing = sorted(k for k in used_keys() if k not in d["en"])
    assert not missing, missing


# Names that stay as they are in Chinese texts too (product and panel names, device kinds).
SAME_IN_BOTH = {"XPU Fleet", "Runs", "Workers", "Run", "CUDA GPU", "CPU", "Apple MPS"}


def test_chinese_texts_are_translated():
    d = dictionaries()
    same = [k for k, v in d["zh"].items() if v == d["en"][k] and v not in SAME_IN_BOTH]
    assert not same, same


def test_comfy_locale_files_are_in_step_with_main_json():
    assert make_locales.main(["--check"]) == 0
    for lang in ("en", "zh"):
        settings = json.loads((ROOT / "locales" / lang / "settings.json").read_text(encoding="utf-8"))
        assert settings["XPUFleet_Language"]["name"] == make_locales.strings(lang)["settings.language"]


def test_setting_and_command_ids_are_the_front_ends():
    src = (WEB / "xpu_monitor.js").read_text(encoding="utf-8") + (WEB / "lib" / "capsule.mjs").read_text(encoding="utf-8")
    for sid in [*make_locales.SETTINGS, *make_locales.COMMANDS]:
        assert f'"{sid}"' in src, sid


def test_node_definitions_are_translated_for_the_canvas():
    """locales/<lang>/nodeDefs.json: ComfyUI names nodes, inputs, outputs and tooltips on the canvas with
    them. The English file is made from the nodes (in step: the test above); the Chinese one has the
    same nodes, inputs and outputs, each text translated."""
    en = json.loads((ROOT / "locales" / "en" / "nodeDefs.json").read_text(encoding="utf-8"))
    zh = json.loads((ROOT / "locales" / "zh" / "nodeDefs.json").read_text(encoding="utf-8"))
    assert en == make_locales.node_defs()
    assert set(zh) == set(en)
    for cls, node in en.items():
        z = zh[cls]
        assert z["display_name"] != node["display_name"], cls
        assert ("description" in z) == ("description" in node), cls
        if "description" in node:
            assert z["description"] != node["description"], cls
        assert set(z["inputs"]) == set(node["inputs"]), cls
        for name, entry in node["inputs"].items():
            assert z["inputs"][name]["name"].strip(), (cls, name)
            assert ("tooltip" in z["inputs"][name]) == ("tooltip" in entry), (cls, name)
            if "tooltip" in entry:
                assert z["inputs"][name]["tooltip"] != entry["tooltip"], (cls, name)
        assert set(z["outputs"]) == set(node["outputs"]), cls
        assert all(o["name"] != node["outputs"][k]["name"] for k, o in z["outputs"].items()), cls


def test_absorb_moves_a_branchs_keys_from_i18n_mjs_into_main_json(tmp_path, monkeypatch):
    """What the lead runs after merging a branch that added keys in i18n.mjs's EN/ZH blocks."""
    import shutil

    shutil.copytree(ROOT / "locales", tmp_path / "locales")
    (tmp_path / "web" / "lib").mkdir(parents=True)
    src = (WEB / "lib" / "i18n.mjs").read_text(encoding="utf-8")
    src = src.replace("const EN = {\n", 'const EN = {\n  // h9 keys\n  "runs.h9_note": "{n} runs \\"kept\\"",\n', 1)
    src = src.replace("const ZH = {\n", 'const ZH = {\n  // h9 keys\n  "runs.h9_note": "保留 {n} 个 run",\n', 1)
    (tmp_path / "web" / "lib" / "i18n.mjs").write_text(src, encoding="utf-8")
    monkeypatch.setattr(make_locales, "LOCALES", tmp_path / "locales")
    monkeypatch.setattr(make_locales, "I18N_MJS", tmp_path / "web" / "lib" / "i18n.mjs")
    assert make_locales.absorb() == {"en": 1, "zh": 1}
    assert make_locales.strings("en")["runs.h9_note"] == '{n} runs "kept"'
    assert make_locales.strings("zh")["runs.h9_note"] == "保留 {n} 个 run"
    assert "h9_note" not in (tmp_path / "web" / "lib" / "i18n.mjs").read_text(encoding="utf-8")

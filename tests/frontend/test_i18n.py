"""Every text of the front end exists in English and in Chinese (web/lib/i18n.mjs), and every key the
modules ask for is there; placeholders match between the two languages. Read as text, no browser."""

from __future__ import annotations

import re
from pathlib import Path

WEB = Path(__file__).resolve().parents[2] / "web"
ENTRY = re.compile(r'^\s*"([a-z_.A-Z]+)":\s*"((?:[^"\\]|\\.)*)",?\s*$')
# keys built at run time from a server value: their prefixes and every value the server can send
DYNAMIC = {
    "runs.status.": ["queued", "assigned", "running", "succeeded", "failed", "cancelled", "interrupted"],
    "status.": ["Online", "Degraded", "Draining", "Disconnected", "Disabled"],
    "runs.source.": ["user", "estimate", "measured"],
    "capsule.model_status.": ["missing", "refused", "unresolved"],
    "sweep.status.": ["queued", "running", "cancelling", "finished", "cancelled"],
}


def dictionaries() -> dict[str, dict[str, str]]:
    text = (WEB / "lib" / "i18n.mjs").read_text(encoding="utf-8")
    out: dict[str, dict[str, str]] = {}
    for lang, name in (("en", "EN"), ("zh", "ZH")):
        block = text.split(f"const {name} = {{", 1)[1].split("\n};", 1)[0]
        out[lang] = {m.group(1): m.group(2) for line in block.splitlines() if (m := ENTRY.match(line))}
    return out


def used_keys() -> set[str]:
    keys: set[str] = set()
    for path in [*WEB.rglob("*.mjs"), *WEB.rglob("*.js")]:
        if "vendor" in path.parts:
            continue
        src = path.read_text(encoding="utf-8")
        keys |= {k for k in re.findall(r'\bt\("([a-z_.A-Z]+)"', src) if not k.endswith(".")}
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

"""Write the field tables of the API's request bodies into docs/sidecar.md, from the contract models the
routes declare and validate with (``openapi.bodies`` of the app), so the docs cannot drift from what a
route accepts.

    python -m xpufleet.server.sidecar.make_api_docs           # rewrite the section between the markers
    python -m xpufleet.server.sidecar.make_api_docs --check   # exit 1 when it is stale (a test does this)
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import openapi
from .app import SidecarConfig, create_app

DOC = Path(__file__).resolve().parents[2] / "docs" / "sidecar.md"
BEGIN = "<!-- api-fields:begin (python -m xpufleet.server.sidecar.make_api_docs) -->"
END = "<!-- api-fields:end -->"
REF = "#/components/schemas/"


@functools.cache
def _api() -> tuple[dict[tuple[str, str], openapi.BodySpec], dict[str, Any]]:
    """The body each route declares and the document's schemas, read from an app (not started) whose
    state lives in a temporary folder."""
    with tempfile.TemporaryDirectory() as home:
        app = create_app(SidecarConfig(home=Path(home) / "home", port=0))
        declared = {key: spec for key, spec in openapi.bodies(app).items() if spec.model is not None}
        return declared, openapi.document(app)["components"]["schemas"]


def type_text(schema: dict[str, Any]) -> str:
    """A schema as a short type: ``integer >= 1``, ``string | Target``, ``"grid" | "random"``."""
    if "$ref" in schema:
        return schema["$ref"].removeprefix(REF)
    if "anyOf" in schema or "oneOf" in schema:
        parts = [type_text(s) for s in schema.get("anyOf") or schema["oneOf"]]
        return " | ".join(p for p in parts if p != "null") + (" | null" if "null" in parts else "")
    if "const" in schema:
        return f'"{schema["const"]}"' if isinstance(schema["const"], str) else str(schema["const"]).lower()
    if "enum" in schema:
        return " | ".join(f'"{v}"' if isinstance(v, str) else str(v).lower() for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        text = f"list of {type_text(schema.get('items', {}))}"
    elif kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        text = f"object of {type_text(schema['additionalProperties'])}"
    else:
        text = str(kind)
    bounds = [(k, op) for k, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                                    ("exclusiveMaximum", "<"), ("minLength", "chars >="), ("maxLength", "chars <="),
                                    ("minItems", "items >="), ("maxItems", "items <="),
                                    ("minProperties", "keys >="), ("maxProperties", "keys <=")) if k in schema]
    return text + "".join(f" {op} {schema[k]}" for k, op in bounds)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(name: str) -> list[str]:
    """The rows of one model's fields: name, type, required or its default, description."""
    schema = _api()[1][name]
    required = set(schema.get("required", []))
    rows = ["| field | type | required / default | description |", "| --- | --- | --- | --- |"]
    for field, prop in schema.get("properties", {}).items():
        need = "required" if field in required else f"`{prop['default']!r}`" if prop.get("default") is not None else ""
        rows.append(f"| `{field}` | {_cell(type_text(prop))} | {need} | {_cell(prop.get('description', ''))} |")
    if len(rows) == 2:
        rows.append("| (none) | | | |")
    return rows


def _models_used(name: str, seen: list[str]) -> None:
    if name in seen:
        return
    seen.append(name)
    stack: list[Any] = [_api()[1][name].get("properties", {})]
    found: list[str] = []
    while stack:  # the models this one refers to, in the order its fields name them
        item = stack.pop(0)
        if isinstance(item, dict):
            if isinstance(item.get("$ref"), str):
                found.append(item["$ref"].removeprefix(REF))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    for sub in found:
        _models_used(sub, seen)


def section() -> str:
    """The generated section: each body route, then a table per model it uses (each model once)."""
    declared, schemas = _api()
    lines = [BEGIN, "", "| route | body | required |", "| --- | --- | --- |"]
    for (method, path), spec in declared.items():
        assert spec.model is not None
        lines.append(f"| `{method.upper()} {path}` | {spec.model.__name__} | {'yes' if spec.required else 'no'} |")
    order: list[str] = []
    for spec in declared.values():
        assert spec.model is not None
        _models_used(spec.model.__name__, order)
    for name in order:
        lines += ["", f"#### {name}", ""]
        description = schemas[name].get("description")
        if description:
            lines += [" ".join(description.split()), ""]
        lines += table(name)
    return "\n".join(lines + ["", END])


def render(text: str) -> str:
    """``text`` (docs/sidecar.md) with its generated section replaced."""
    head, sep, rest = text.partition(BEGIN)
    if not sep or END not in rest:
        raise SystemExit(f"{DOC}: the markers {BEGIN!r} ... {END!r} are missing")
    return head + section() + rest.split(END, 1)[1]


def main(argv: list[str] | None = None) -> int:
    """Rewrite docs/sidecar.md's field tables, or with ``--check`` exit 1 when they are stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/sidecar.md is stale")
    args = parser.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    new = render(text)
    if args.check:
        if new != text:
            print(f"{DOC} is stale: run python -m xpufleet.server.sidecar.make_api_docs", file=sys.stderr)
            return 1
        return 0
    if new != text:
        DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

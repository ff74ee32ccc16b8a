"""Write the agent protocol's field tables into docs/workers.md from the models that validate each message
(``server/contracts/agent_protocol.py``), so the docs cannot drift from what either side accepts.

    python -m xpufleet.server.sidecar.make_protocol_docs           # rewrite the section between the markers
    python -m xpufleet.server.sidecar.make_protocol_docs --check   # exit 1 when it is stale (a test does this)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..contracts import agent_protocol as ap
from ..contracts.base import component_schemas
from .make_api_docs import type_text

DOC = Path(__file__).resolve().parents[2] / "docs" / "workers.md"
BEGIN = "<!-- protocol-fields:begin (python -m xpufleet.server.sidecar.make_protocol_docs) -->"
END = "<!-- protocol-fields:end -->"


def _names(model: ap.Model) -> list[str]:
    return [m.__name__ for m in (model if isinstance(model, tuple) else (model,))]


def section() -> str:
    """The generated section: each message type with its direction and model, then each model's fields
    (required ones marked), the objects they hold after them."""
    schemas = component_schemas(ap.models())
    lines = [BEGIN, "", "| message | direction | model |", "| --- | --- | --- |"]
    for direction, table in (("agent -> sidecar", ap.AGENT_MESSAGES), ("sidecar -> agent", ap.SIDECAR_MESSAGES)):
        lines += [f"| `{mtype}` | {direction} | {' or '.join(_names(model))} |" for mtype, model in table.items()]
    for name, schema in schemas.items():
        need = set(schema.get("required", []))
        lines += ["", f"#### {name}", "", " ".join(schema.get("description", "").split()), "",
                  "| field | type | description |", "| --- | --- | --- |"]
        lines += [f"| `{field}`{' (required)' if field in need else ''} | {type_text(prop).replace('|', chr(92) + '|')} "
                  f"| {prop.get('description', '')} |" for field, prop in schema.get("properties", {}).items()]
    return "\n".join(lines + ["", END])


def main(argv: list[str] | None = None) -> int:
    """Rewrite docs/workers.md's protocol tables, or with ``--check`` exit 1 when they are stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/workers.md is stale")
    args = parser.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    head, sep, rest = text.partition(BEGIN)
    if not sep or END not in rest:
        raise SystemExit(f"{DOC}: the markers {BEGIN!r} ... {END!r} are missing")
    new = head + section() + rest.split(END, 1)[1]
    if args.check:
        if new != text:
            print(f"{DOC} is stale: run python -m xpufleet.server.sidecar.make_protocol_docs", file=sys.stderr)
        return int(new != text)
    if new != text:
        DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

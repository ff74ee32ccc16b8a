"""One atomic writer: ``os.replace`` (and ``os.rename``) appear in ``common/atomic.py`` only. Excepted:
the exported training script and the scripts run on an SSH host, which must stand alone."""

from __future__ import annotations

import ast

import arch_imports as arch

STANDALONE = {"xpufleet.server.ssh.commands", "xpufleet.server.run.export_data"}
WRITER = "xpufleet.common.atomic"


def renames(source: str) -> list[int]:
    """Lines that call ``os.replace``/``os.rename`` or a path's ``.replace(x)``/``.rename(x)`` with one
    argument (``str.replace`` takes two)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name, owner = node.func.attr, node.func.value
            if name in ("replace", "rename") and (
                (isinstance(owner, ast.Name) and owner.id == "os") or (len(node.args) == 1 and not node.keywords)
            ):
                out.append(node.lineno)
    return out


def test_the_detector_sees_each_form():
    assert renames("import os\nos.replace(a, b)\n") == [2]
    assert renames("p.rename(q)\n") == [1]
    assert renames("tmp.replace(target)\n") == [1]
    assert renames("s.replace('a', 'b')\n") == []


def test_files_are_replaced_in_one_place_only():
    found = {name: lines for name, path in arch.modules().items()
             if name not in STANDALONE | {WRITER} and (lines := renames(path.read_text(encoding="utf-8")))}
    assert found == {}, f"replace files through xpufleet.common.atomic instead: {found}"
    assert renames((arch.REPO / "common" / "atomic.py").read_text(encoding="utf-8"))

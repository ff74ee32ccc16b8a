"""The package's import graph has no cycle (docs/architecture.md): neither at import time nor through the lazy
imports inside functions; and the layout's size rule (no source file much over 600 lines)."""

from __future__ import annotations

import arch_imports as arch
import pytest

MAX_LINES = 620  # "no file much over 600 lines"


@pytest.mark.parametrize("top_level_only", [True, False], ids=["at-import-time", "including-lazy-imports"])
def test_no_import_cycle(top_level_only):
    found = arch.cycles(arch.imports(top_level_only))
    assert found == [], "import cycles between modules:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checker_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert arch.cycles(graph) == [["a", "b", "c"]]


def test_every_subpackage_is_seen():
    mods = arch.modules()
    for name in ("xpufleet.server.run.launcher", "xpufleet.server.scheduling.queue", "xpufleet.nodes.trainer",
                 "xpufleet.predictor.predict", "xpufleet.server.sidecar.routes.runs"):
        assert name in mods


# Being split by the work that changes them next (none now: the ddp work split the trainer).
PENDING_SPLIT: set[str] = set()


def test_no_source_file_much_over_600_lines():
    long = {name: n for name, path in arch.modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert set(long) - PENDING_SPLIT == set(), f"split these along their jobs: {long}"
    assert PENDING_SPLIT <= set(long), f"{PENDING_SPLIT - set(long)} got short: take it off PENDING_SPLIT"

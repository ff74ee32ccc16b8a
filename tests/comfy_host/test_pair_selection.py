"""Which tests the second ComfyUI pair runs (docs/testing.md, "Two ComfyUI pairs"): those that run in a
ComfyUI (they use one of its fixtures), less those marked ``one_pair``; the first pair runs everything."""

from __future__ import annotations

from types import SimpleNamespace

import comfy_harness  # registered by tests/comfy_host/conftest.py
import pytest


class _Item:
    def __init__(self, name: str, fixtures: tuple[str, ...], one_pair: bool = False) -> None:
        self.name, self.fixturenames, self.one_pair = name, list(fixtures), one_pair

    def get_closest_marker(self, name: str):
        return SimpleNamespace(name=name) if name == "one_pair" and self.one_pair else None


def _select(monkeypatch, pair: str | None) -> tuple[list[str], list[str]]:
    if pair is None:
        monkeypatch.delenv(comfy_harness.PAIR_ENV, raising=False)
    else:
        monkeypatch.setenv(comfy_harness.PAIR_ENV, pair)
    items = [_Item("in_comfyui", ("comfyui", "tmp_path")), _Item("page_in_comfyui", ("comfy_fleet", "comfy_host")),
             _Item("console_baseline", ("bare_comfy",)), _Item("standalone_page", ("standalone_fleet",)),
             _Item("first_only", ("comfyui",), one_pair=True)]
    dropped: list[str] = []
    config = SimpleNamespace(hook=SimpleNamespace(pytest_deselected=lambda items: dropped.extend(i.name for i in items)))
    comfy_harness.select_for_pair(config, items)
    return [i.name for i in items], dropped


def test_the_first_pair_runs_every_test(monkeypatch):
    for pair in (None, "first"):
        kept, dropped = _select(monkeypatch, pair)
        assert len(kept) == 5 and dropped == []


def test_the_second_pair_runs_the_tests_in_a_comfyui_not_marked_one_pair(monkeypatch):
    kept, dropped = _select(monkeypatch, "second")
    assert kept == ["in_comfyui", "page_in_comfyui", "console_baseline"]
    assert dropped == ["standalone_page", "first_only"]


def test_an_unknown_pair_is_an_error_not_a_silent_first_pair(monkeypatch):
    monkeypatch.setenv(comfy_harness.PAIR_ENV, "0.33")
    with pytest.raises(RuntimeError, match="must be 'first' or 'second'"):
        comfy_harness.second_pair()


def test_the_version_of_a_checkout(tmp_path):
    (tmp_path / "comfyui_version.py").write_text('# generated\n__version__ = "0.33.0"\n')
    assert comfy_harness.comfy_version(tmp_path) == "0.33.0"
    assert comfy_harness.comfy_version(tmp_path / "nowhere") == "unknown"

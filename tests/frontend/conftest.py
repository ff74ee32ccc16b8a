"""Fixtures of the browser tests (marker ``browser``): Debian's Chromium through Playwright, the real
ComfyUI of tests/comfy_host with the plugin (and a bare one for the console baseline), a real sidecar
with an agent simulating CUDA cards, and the folder the screenshots go to.

Browser tests run only when selected (``-m browser``; ``make test`` runs them after the comfy tests), so
the unit and e2e selections never start a browser. Screenshots: ``$XPUFLEET_ARTIFACTS/frontend`` when
that variable is set (CI keeps it), else ``<basetemp>/frontend-screenshots``; the path is printed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

if "browser_harness" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("browser_harness", Path(__file__).with_name("browser_harness.py"))
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["browser_harness"] = _module
    _spec.loader.exec_module(_module)

import browser_harness as bh  # noqa: E402

SIMULATE = "cuda:0=24,cuda:1=24"
MODELS = {"small.safetensors": 2 * 1024**3, "big.safetensors": 60 * 1024**3}  # sparse files: sizes only


def pytest_collection_modifyitems(config, items):
    bh.comfy_harness.select_for_pair(config, items)  # the second ComfyUI pair runs a subset (docs/testing.md)
    if "browser" in (config.getoption("markexpr") or "") and "not browser" not in config.getoption("markexpr"):
        return
    skip = pytest.mark.skip(reason="browser test: run with -m browser (make test runs them after the comfy tests)")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def screenshots(request, tmp_path_factory) -> Path:
    root = os.environ.get("XPUFLEET_ARTIFACTS")
    # the second ComfyUI pair's screenshots beside the first's, not over them
    found = bh.comfy_harness.configured() if bh.comfy_harness.second_pair() else None
    pair = f"-comfyui-{bh.comfy_harness.comfy_version(found[0])}" if found else ""
    folder = Path(root) / f"frontend{pair}" if root else tmp_path_factory.getbasetemp() / f"frontend-screenshots{pair}"
    folder.mkdir(parents=True, exist_ok=True)
    request.config._xpufleet_screenshots = folder  # noqa: SLF001 - read by pytest_terminal_summary
    return folder


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    folder = getattr(config, "_xpufleet_screenshots", None)
    if folder is not None:
        shots = sorted(p.name for p in Path(folder).glob("*.png"))
        terminalreporter.write_line(f"[browser] {len(shots)} screenshot(s) in {folder}: {', '.join(shots)}")


@pytest.fixture(scope="session")
def playwright_browser():
    problem = bh.browser_problem()
    if problem:
        pytest.skip(problem)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = bh.launch(p)
        try:
            yield browser
        finally:
            browser.close()


def configured_comfyui() -> tuple[Path, Path]:
    """COMFYUI_DIR and COMFYUI_PYTHON (comfy_harness.configured); the browser test skips, saying so, without."""
    found = bh.comfy_harness.configured()
    if found is None:
        pytest.skip(bh.comfy_harness.SKIP_REASON)
    return found


@pytest.fixture(scope="session")
def comfy_host(tmp_path_factory):
    """The real ComfyUI with the plugin, two model files in its checkpoints folder."""
    comfy_dir, python = configured_comfyui()
    work = tmp_path_factory.mktemp("comfyui-frontend")
    bh.comfy_harness.install_plugin_deps(python, work)
    host = bh.comfy_harness.ComfyUI(comfy_dir, python, work / "base", work / "xpufleet-home")
    make_models(work / "base" / "models")
    host.start()
    try:
        yield host
    finally:
        host.stop()


class BareComfyUI(bh.comfy_harness.ComfyUI):
    """The same ComfyUI without the plugin in custom_nodes/: ComfyUI's own console baseline."""

    def prepare(self) -> None:
        (self.base / "custom_nodes").mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)


@pytest.fixture(scope="session")
def bare_comfy(tmp_path_factory):
    comfy_dir, python = configured_comfyui()
    work = tmp_path_factory.mktemp("comfyui-bare")
    host = BareComfyUI(comfy_dir, python, work / "base", work / "home").start()
    try:
        yield host
    finally:
        host.stop()


@pytest.fixture(scope="module")
def comfy_fleet(comfy_host):
    """A sidecar for the ComfyUI's XPUFLEET_HOME (the proxy finds it there) and the agent gpu-box."""
    fleet = bh.Fleet(comfy_host.home).start()
    try:
        fleet.add_agent("gpu-box", SIMULATE)
        yield fleet
    finally:
        fleet.stop()


def make_models(folder: Path) -> Path:
    checkpoints = folder / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    for name, size in MODELS.items():
        with open(checkpoints / name, "wb") as f:
            f.truncate(size)
    return folder


@pytest.fixture(scope="module")
def standalone_fleet(tmp_path_factory):
    """A sidecar of its own (the sidecar's model folders: XPUFLEET_MODEL_DIRS) and the agent gpu-box."""
    work = tmp_path_factory.mktemp("standalone")
    fleet = bh.Fleet(work / "home", XPUFLEET_MODEL_DIRS=str(make_models(work / "models"))).start()
    try:
        fleet.add_agent("gpu-box", SIMULATE)
        yield fleet
    finally:
        fleet.stop()

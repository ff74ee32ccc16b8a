"""One real ComfyUI per test session for the `comfy`-marked tests (see comfy_harness.py), skipped with
the reason when COMFYUI_DIR / COMFYUI_PYTHON are not set."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

for _name in ("comfy_harness", "sidecar_harness"):
    if _name not in sys.modules:
        _here = Path(__file__).parent if _name == "comfy_harness" else Path(__file__).parents[1] / "server"
        _spec = importlib.util.spec_from_file_location(_name, _here / f"{_name}.py")
        _module = importlib.util.module_from_spec(_spec)
        sys.modules[_name] = _module
        _spec.loader.exec_module(_module)

import comfy_harness  # noqa: E402


def pytest_collection_modifyitems(config, items):
    comfy_harness.select_for_pair(config, items)  # the second ComfyUI pair runs a subset (docs/testing.md)


@pytest.fixture(scope="session")
def comfyui(tmp_path_factory):
    """The running ComfyUI (base dir and XPUFLEET_HOME fresh for the session)."""
    found = comfy_harness.configured()
    if found is None:
        pytest.skip(comfy_harness.SKIP_REASON)
    comfy_dir, python = found
    work = tmp_path_factory.mktemp("comfyui")
    installed = comfy_harness.install_plugin_deps(python, work)
    host = comfy_harness.ComfyUI(comfy_dir, python, work / "base", work / "xpufleet-home")
    host.installed = installed
    host.start()
    sys.stderr.write(f"\n[comfy] ComfyUI {comfy_harness.comfy_version(comfy_dir)} up in {host.startup_s:.1f} s "
                     f"on {host.url}"
                     + (f" (installed {', '.join(installed)})" if installed else "") + "\n")
    try:
        yield host
    finally:
        host.stop()

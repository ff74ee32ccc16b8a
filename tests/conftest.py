"""Shared fixtures: an isolated XPUFLEET_HOME and the ComfyUI stand-in host."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STANDIN = Path(__file__).resolve().parent / "comfy_standin"

# tests/graph_parts.py (the nodes of the tests' small graphs) and tests/processes.py (children stopped by
# PID), importable by name from every test folder
for _name in ("graph_parts", "processes"):
    if _name not in sys.modules:
        _spec = importlib.util.spec_from_file_location(_name, Path(__file__).with_name(f"{_name}.py"))
        sys.modules[_name] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules[_name])


# The static estimate gives up after MEMORY_ESTIMATE_TIMEOUT_S (5 s) of building, a figure the machine's
# load decides: on a loaded 2-core box an example graph's build passed it and a test asserting an estimate
# failed (issue 19). In this test process the limit is one only a hang crosses; the test of the limit itself
# passes its own timeout_s.
ESTIMATE_TIMEOUT_IN_TESTS_S = 300.0


@pytest.fixture(autouse=True)
def _estimate_time_limit_only_a_hang_crosses(monkeypatch):
    from xpufleet.predictor import estimate

    monkeypatch.setitem(estimate.estimate_graph.__kwdefaults__, "timeout_s", ESTIMATE_TIMEOUT_IN_TESTS_S)


@pytest.fixture
def xpufleet_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "xpufleet-home"
    home.mkdir()
    monkeypatch.setenv("XPUFLEET_HOME", str(home))
    return home


_HOST_MODULES = ("server", "folder_paths", "comfy", "comfy_execution", "execution")


@pytest.fixture
def comfy_host(monkeypatch, tmp_path):
    """Put the ComfyUI stand-in on sys.path, create PromptServer.instance, give ``folder_paths`` an
    output folder (``tmp_path/comfy/output``, models in ``tmp_path/comfy/models``), and return a loader
    that imports the repository as ComfyUI does (by folder, under a custom_nodes-style module name)."""
    monkeypatch.syspath_prepend(str(STANDIN))
    for name in list(sys.modules):
        if name.split(".")[0] in _HOST_MODULES:
            monkeypatch.delitem(sys.modules, name, raising=False)
    import folder_paths  # noqa: I001  (the stand-ins, first on sys.path)
    import server

    folder_paths.output_directory = str(tmp_path / "comfy" / "output")
    folder_paths.models_dir = str(tmp_path / "comfy" / "models")
    instance = server.PromptServer()

    def load(module_name: str = "xpufleet_custom_node"):
        spec = importlib.util.spec_from_file_location(
            module_name, REPO / "__init__.py", submodule_search_locations=[str(REPO)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        return module

    yield instance, load
    for name in list(sys.modules):
        if name.split(".")[0] in _HOST_MODULES or name.split(".")[0] == "xpufleet_custom_node":
            del sys.modules[name]

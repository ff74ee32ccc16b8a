"""The end-to-end tests of whole features across processes: tests/server/fleet_harness.py (a real sidecar and
real agents on loopback) and tests/comfy_host/comfy_harness.py (where the real ComfyUI is), importable by name
(test folders are not packages)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
for _name, _folder in (("fleet_harness", "server"), ("comfy_harness", "comfy_host")):
    if _name not in sys.modules:
        _spec = importlib.util.spec_from_file_location(_name, _TESTS / _folder / f"{_name}.py")
        assert _spec is not None and _spec.loader is not None
        _module = importlib.util.module_from_spec(_spec)
        sys.modules[_name] = _module
        _spec.loader.exec_module(_module)

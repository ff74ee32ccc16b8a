"""Makes tests/server/sidecar_harness.py and scripted_agent.py importable by name (test dirs are not packages)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

for _name in ("sidecar_harness", "scripted_agent"):
    if _name not in sys.modules:
        _spec = importlib.util.spec_from_file_location(_name, Path(__file__).with_name(f"{_name}.py"))
        _module = importlib.util.module_from_spec(_spec)
        sys.modules[_name] = _module
        _spec.loader.exec_module(_module)

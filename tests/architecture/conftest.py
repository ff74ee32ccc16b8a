"""Makes tests/architecture/imports.py importable as ``arch_imports`` (test dirs are not packages)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if "arch_imports" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("arch_imports", Path(__file__).with_name("imports.py"))
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["arch_imports"] = _module
    _spec.loader.exec_module(_module)

"""Makes tests/server/slurm/slurm_harness.py importable by name (test dirs are not packages)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if "slurm_harness" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("slurm_harness", Path(__file__).with_name("slurm_harness.py"))
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["slurm_harness"] = _module
    _spec.loader.exec_module(_module)

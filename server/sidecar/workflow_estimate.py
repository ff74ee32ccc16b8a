"""The static memory estimate of a ComfyUI workflow (docs/memory.md; seed 001's formula): M_peak, the largest
model file it loads, from the sizes of the files this machine's model folders hold (predictor/scan.py). A
budget on a card shared by memory uses it, marked ``estimate``, when the same workflow has no measured peak
on that card kind; the Queue on... dialog's suggestion shows the same figure. No figure when a file is
missing here or the workflow loads none (a core-node workflow): the run then needs a typed budget there."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ...predictor.estimate import Estimate, EstimateItem
from ...predictor.scan import scan_workflow


def estimate_workflow(graph: Mapping[str, Any]) -> Estimate:
    """M_peak of ``graph`` (API prompt format) as an estimate with one item, or no total with the reason."""
    started = time.perf_counter()
    try:
        scan = scan_workflow(dict(graph))
    except ValueError as exc:  # an unsafe model name, a graph the scan cannot read
        return Estimate(total_bytes=None, rough=True, reasons=(f"the workflow could not be scanned: {exc}",))
    missing = [m for m in scan.models if m.status != "found"]
    if missing:
        m = missing[0]
        where = f"models/{m.folder}" if m.folder else "the model folders"
        return Estimate(total_bytes=None, rough=True, reasons=(
            f"model file '{m.name}' (node {m.node}, {m.class_type}) is not in {where} on this server: no estimate "
            f"from file sizes; set the budget",), elapsed_s=time.perf_counter() - started)
    files = scan.files()
    if not files:
        return Estimate(total_bytes=None, rough=True, reasons=(
            "the workflow loads no model file: no estimate from file sizes; set the budget",),
            elapsed_s=time.perf_counter() - started)
    path, size = max(files.items(), key=lambda kv: kv[1])
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    item = EstimateItem("weights", size, f"M_peak: the largest model file the workflow loads ({name})")
    return Estimate((item,), size, elapsed_s=time.perf_counter() - started)


def workflow_peak_gib(graph: Mapping[str, Any]) -> float | None:
    """The estimate's figure in GiB (None: no estimate)."""
    return estimate_workflow(graph).total_gib

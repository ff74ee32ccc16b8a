"""P3 option ``calibration``: scale model sizes by what runs really peaked at.

Seed 001's alpha and model-size figures are rules of thumb (its limitations 3 and 4). A run's
measured peak (the run record's ``peak_memory``) against the M_peak the scan gave for the same
workflow yields a ratio; the median ratio over recent runs, clamped to PREDICTOR_CALIBRATION_RANGE,
scales M_peak and M_total. Samples are appended to ``$XPUFLEET_HOME/predictor_calibration.jsonl`` by
``record_run_peak`` (a caller that knows both figures calls it; the sidecar does not record any on its
own yet) or passed in a predict request (``{"calibration": {"samples": [...]}}``).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..common import atomic
from ..constants import (
    PREDICTOR_CALIBRATION_FILENAME,
    PREDICTOR_CALIBRATION_KEEP,
    PREDICTOR_CALIBRATION_RANGE,
)
from .config import home_dir


def _sample_ratio(s: Mapping[str, Any]) -> float | None:
    m, measured = s.get("m_peak_gb"), s.get("measured_peak_gb")
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (m, measured))
    if not ok or m <= 0 or measured <= 0:
        return None
    return float(measured) / float(m)


def calibration_factor(samples: Iterable[Mapping[str, Any]], platform: str | None = None) -> dict[str, Any]:
    """Median of measured/M_peak over the samples (of ``platform`` when given), clamped.

    Returns ``{"factor", "samples", "raw_median", "clamped"}``; factor 1.0 with samples 0 when none fit.
    """
    ratios = []
    for s in samples:
        if platform and s.get("platform") and str(s["platform"]).lower() != platform.lower():
            continue
        r = _sample_ratio(s)
        if r is not None:
            ratios.append(r)
    if not ratios:
        return {"factor": 1.0, "samples": 0, "raw_median": None, "clamped": False}
    raw = statistics.median(ratios)
    lo, hi = PREDICTOR_CALIBRATION_RANGE
    factor = min(hi, max(lo, raw))
    return {"factor": factor, "samples": len(ratios), "raw_median": raw, "clamped": factor != raw}


def calibration_path() -> Path:
    """Where measured-peak samples are kept."""
    return home_dir() / PREDICTOR_CALIBRATION_FILENAME


def load_samples(path: Path | None = None) -> list[dict[str, Any]]:
    """Stored samples, newest last; lines that do not parse are skipped."""
    path = path or calibration_path()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines[-PREDICTOR_CALIBRATION_KEEP:]:
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def record_run_peak(m_peak_gb: float, measured_peak_gb: float, platform: str, device: str | None = None,
                    path: Path | None = None) -> None:
    """Append one measured sample (a finished run's peak vs the scan's M_peak); keeps the newest
    PREDICTOR_CALIBRATION_KEEP. ValueError when a figure is not a positive number."""
    sample = {"m_peak_gb": m_peak_gb, "measured_peak_gb": measured_peak_gb, "platform": platform,
              "device": device, "ts": time.time()}
    if _sample_ratio(sample) is None:
        raise ValueError("m_peak_gb and measured_peak_gb must be positive numbers of GiB")
    path = path or calibration_path()
    kept = load_samples(path)[-(PREDICTOR_CALIBRATION_KEEP - 1):] + [sample]
    atomic.write_text(path, "".join(json.dumps(s) + "\n" for s in kept))  # whole file or nothing

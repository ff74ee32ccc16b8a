"""Seed 001's success-rate model, exactly: P_success = P_peak x P_load (docs/predictor.md).

Pure functions of plain numbers (GiB); no I/O. ``predict`` ties them together and returns a
``Prediction`` whose ``explanation`` lists every input and every intermediate, so the status-bar
tooltip, the CLI and the tests can all show how a figure came about.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..constants import (
    PREDICTOR_ALPHA,
    PREDICTOR_DEFAULT_GAMMA,
    PREDICTOR_GAMMA,
    PREDICTOR_LEVELS,
    PREDICTOR_P_PEAK_FLOOR,
    PREDICTOR_V_EFF_FLOOR_GB,
)

PLATFORMS_KNOWN = ("nvidia", "intel", "amd", "apple", "cpu")


def v_reclaim(v_free: float, v_alloc: float, v_rsv: float) -> float:
    """Reclaimable VRAM: free + PyTorch allocated + PyTorch cache pool (docs/predictor.md §4.1)."""
    return v_free + v_alloc + v_rsv


def v_eff(reclaim: float, alpha: float = PREDICTOR_ALPHA) -> float:
    """Effective VRAM ceiling: ``max(0.1, alpha x V_reclaim)`` (docs/predictor.md §4.2)."""
    return max(PREDICTOR_V_EFF_FLOOR_GB, reclaim * alpha)


def s_virt(commit_limit: float, commit_used: float) -> float:
    """Available virtual memory (commit headroom): ``max(0, C_limit - C_used)`` (docs/predictor.md §4.4)."""
    return max(0.0, commit_limit - commit_used)


def gamma_for(platform: str, overrides: Mapping[str, float] | None = None) -> tuple[float, str]:
    """Platform factor gamma and where it came from (``"override"``, ``"table"`` or ``"default"``).

    NVIDIA 4.0 and Intel 1.0 come from docs/predictor.md; other platforms use ``overrides`` (config file,
    environment) or the strict default 1.0.
    """
    key = (platform or "").strip().lower()
    if overrides and key in overrides:
        return float(overrides[key]), "override"
    if key in PREDICTOR_GAMMA:
        return float(PREDICTOR_GAMMA[key]), "table"
    return float(PREDICTOR_DEFAULT_GAMMA), "default"


def p_peak(m_peak: float, veff: float, gamma: float) -> float:
    """Hard constraint (docs/predictor.md §5): 1 when the largest model fits V_eff, else
    ``max(0.02, exp(-3 x D_peak / (V_eff x gamma)))``."""
    d = max(0.0, m_peak - veff)
    if d == 0.0:
        return 1.0
    return max(PREDICTOR_P_PEAK_FLOOR, math.exp(-3.0 * d / (veff * gamma)))


def p_load_branch(d_load: float, c_ram: float, svirt: float) -> str:
    """Which piece of P_load applies: ``fits``, ``ram``, ``virtual`` or ``beyond``."""
    if d_load <= 0.0:
        return "fits"
    if d_load <= c_ram:
        return "ram"
    if d_load <= c_ram + svirt:
        return "virtual"
    return "beyond"


def p_load(d_load: float, c_ram: float, svirt: float) -> float:
    """Soft constraint (docs/predictor.md §6.2), piecewise and continuous at D = C_ram and D = C_ram + S_virt."""
    branch = p_load_branch(d_load, c_ram, svirt)
    if branch == "fits":
        return 1.0
    if branch == "ram":
        return 1.0 - 0.3 * (d_load / c_ram) ** 0.6
    if branch == "virtual":
        return 0.05 + 0.65 * (1.0 - (d_load - c_ram) / svirt) ** 2
    return max(0.0, 0.05 - 0.1 * (d_load - c_ram - svirt))


def round_percent(p_success_raw: float) -> int:
    """Seed 001 §7's ``round(P_peak x P_load x 100)`` as its implementation (JavaScript's
    ``Math.round``) does it: halves go up (Python's ``round`` would send 94.5 to 94, a level lower)."""
    return int(math.floor(p_success_raw * 100.0 + 0.5))


@dataclass(frozen=True)
class Level:
    """A pressure level: key, colour and the zh/en labels of docs/predictor.md's table."""

    key: str
    color: str
    zh: str
    en: str
    min_percent: int


def level_for(percent: int | float) -> Level:
    """The level for a (rounded) success percentage: Smooth >= 95, Safe >= 80, Warning >= 40, else Critical."""
    for min_pct, key, color, zh, en in PREDICTOR_LEVELS:
        if percent >= min_pct:
            return Level(key, color, zh, en, min_pct)
    min_pct, key, color, zh, en = PREDICTOR_LEVELS[-1]
    return Level(key, color, zh, en, min_pct)


@dataclass
class Prediction:
    """The answer: ``p_success`` in whole percent, its level, and the full explanation."""

    p_success: int
    level: str
    color: str
    label: dict[str, str]
    explanation: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the ``/predict`` answer's core)."""
        return asdict(self)


def _num(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of GiB, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0 GiB, got {value!r}")
    return float(value)


def predict(
    *,
    m_total: float,
    m_peak: float,
    vram_free_gb: float,
    vram_allocated_gb: float,
    vram_reserved_gb: float,
    ram_free_gb: float,
    commit_used_gb: float,
    commit_limit_gb: float,
    platform: str = "nvidia",
    gamma: float | None = None,
    gamma_overrides: Mapping[str, float] | None = None,
    alpha: float = PREDICTOR_ALPHA,
) -> Prediction:
    """Seed 001's P_success for the model sizes M_total / M_peak and one device snapshot (all GiB).

    ``gamma`` overrides the platform table; ``gamma_overrides`` adds platforms (configured values).
    Raises ValueError naming the input to fix when a figure is negative or not a number.
    """
    m_total = _num("m_total", m_total)
    m_peak = _num("m_peak", m_peak)
    v_free = _num("vram_free_gb", vram_free_gb)
    v_alloc = _num("vram_allocated_gb", vram_allocated_gb)
    v_rsv = _num("vram_reserved_gb", vram_reserved_gb)
    r_free = _num("ram_free_gb", ram_free_gb)
    c_used = _num("commit_used_gb", commit_used_gb)
    c_limit = _num("commit_limit_gb", commit_limit_gb)
    if m_peak > m_total + 1e-9:
        raise ValueError(f"m_peak ({m_peak}) cannot exceed m_total ({m_total})")
    if gamma is not None:
        g, g_source = _num("gamma", gamma), "request"
        if g <= 0:
            raise ValueError("gamma must be > 0")
    else:
        g, g_source = gamma_for(platform, gamma_overrides)

    reclaim = v_reclaim(v_free, v_alloc, v_rsv)
    veff = v_eff(reclaim, alpha)
    veff_platform = veff * g
    c_ram = r_free
    svirt = s_virt(c_limit, c_used)
    d_peak = max(0.0, m_peak - veff)
    d_load = max(0.0, m_total - veff)
    pp = p_peak(m_peak, veff, g)
    pl = p_load(d_load, c_ram, svirt)
    percent = round_percent(pp * pl)
    lv = level_for(percent)
    explanation = {
        "inputs": {
            "m_total_gb": m_total,
            "m_peak_gb": m_peak,
            "vram_free_gb": v_free,
            "vram_allocated_gb": v_alloc,
            "vram_reserved_gb": v_rsv,
            "ram_free_gb": r_free,
            "commit_used_gb": c_used,
            "commit_limit_gb": c_limit,
        },
        "constants": {"alpha": alpha, "v_eff_floor_gb": PREDICTOR_V_EFF_FLOOR_GB, "p_peak_floor": PREDICTOR_P_PEAK_FLOOR},
        "platform": platform,
        "gamma": g,
        "gamma_source": g_source,
        "intermediates": {
            "v_reclaim_gb": reclaim,
            "v_eff_gb": veff,
            "v_eff_floored": reclaim * alpha < PREDICTOR_V_EFF_FLOOR_GB,
            "v_eff_platform_gb": veff_platform,
            "c_ram_gb": c_ram,
            "s_virt_gb": svirt,
            "d_peak_gb": d_peak,
            "d_load_gb": d_load,
            "p_peak": pp,
            "p_load": pl,
            "p_load_branch": p_load_branch(d_load, c_ram, svirt),
            "p_success_raw": pp * pl,
        },
        "formula": "P_success = round(100 x P_peak x P_load)",
    }
    return Prediction(
        p_success=percent,
        level=lv.key,
        color=lv.color,
        label={"zh": lv.zh, "en": lv.en},
        explanation=explanation,
    )

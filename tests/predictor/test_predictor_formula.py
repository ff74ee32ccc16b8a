"""Seed 001's formulas: the two curve tables, the joins of P_load, the level edges, the V_eff floor."""

from __future__ import annotations

import math

import pytest

from xpufleet.predictor import predict as P

# Seed 001 §5.2, Intel Arc (gamma 1.0): D_peak as a share of V_eff -> P_peak in whole percent
INTEL_TABLE = [(0.0, 100), (0.1, 74), (0.3, 41), (0.5, 22), (1.0, 5)]
# NVIDIA (gamma 4.0): D_peak as multiples of V_eff -> P_peak
NVIDIA_TABLE = [(0.0, 100), (1.0, 47), (2.0, 22), (3.0, 11), (4.0, 5)]


@pytest.mark.parametrize("veff", [8.54, 2.0, 23.7])
@pytest.mark.parametrize("share,percent", INTEL_TABLE)
def test_intel_curve_table(veff, share, percent):
    gamma, source = P.gamma_for("intel")
    assert (gamma, source) == (1.0, "table")
    assert round(100 * P.p_peak(veff + share * veff, veff, gamma)) == percent


@pytest.mark.parametrize("veff", [8.54, 2.0, 23.7])
@pytest.mark.parametrize("multiple,percent", NVIDIA_TABLE)
def test_nvidia_curve_table(veff, multiple, percent):
    gamma, _ = P.gamma_for("NVIDIA")
    assert gamma == 4.0
    assert round(100 * P.p_peak(veff + multiple * veff, veff, gamma)) == percent


def test_p_peak_floor_and_fit():
    assert P.p_peak(5.0, 5.0, 1.0) == 1.0  # exactly fits
    assert P.p_peak(4.9, 5.0, 1.0) == 1.0
    assert P.p_peak(500.0, 5.0, 1.0) == 0.02  # far over: the 0.02 floor
    assert P.p_peak(5.0 + 1e-6, 5.0, 1.0) < 1.0


@pytest.mark.parametrize("c_ram,s_virt", [(16.0, 24.0), (3.5, 0.7), (64.0, 100.0)])
def test_p_load_continuous_at_both_joins(c_ram, s_virt):
    eps = 1e-9
    # first join: D_load = C_ram, both pieces give 0.70
    assert P.p_load(c_ram, c_ram, s_virt) == pytest.approx(0.70)
    assert P.p_load(c_ram + eps, c_ram, s_virt) == pytest.approx(0.70, abs=1e-6)
    assert P.p_load_branch(c_ram, c_ram, s_virt) == "ram"
    assert P.p_load_branch(c_ram + eps, c_ram, s_virt) == "virtual"
    # second join: D_load = C_ram + S_virt, both pieces give 0.05
    edge = c_ram + s_virt
    assert P.p_load(edge, c_ram, s_virt) == pytest.approx(0.05)
    assert P.p_load(edge + eps, c_ram, s_virt) == pytest.approx(0.05, abs=1e-6)
    assert P.p_load_branch(edge + eps, c_ram, s_virt) == "beyond"
    # fits and the far end
    assert P.p_load(0.0, c_ram, s_virt) == 1.0
    assert P.p_load(edge + 1.0, c_ram, s_virt) == pytest.approx(0.0, abs=1e-12)
    # monotone non-increasing across the whole range
    xs = [i * (edge + 1.0) / 400 for i in range(401)]
    ys = [P.p_load(x, c_ram, s_virt) for x in xs]
    assert all(a >= b - 1e-12 for a, b in zip(ys, ys[1:], strict=False))


def test_p_load_pieces_match_seed_formulas():
    c, s = 10.0, 20.0
    assert P.p_load(5.0, c, s) == pytest.approx(1 - 0.3 * (5.0 / c) ** 0.6)
    assert P.p_load(15.0, c, s) == pytest.approx(0.05 + 0.65 * (1 - 5.0 / s) ** 2)
    assert P.p_load(30.2, c, s) == pytest.approx(0.05 - 0.1 * 0.2)


def test_p_load_without_ram_or_virtual():
    # no RAM reported and no commit headroom: any overflow lands on the last piece
    assert P.p_load_branch(0.5, 0.0, 0.0) == "beyond"
    assert P.p_load(0.5, 0.0, 0.0) == pytest.approx(0.0)
    assert P.p_load(0.1, 0.0, 0.0) == pytest.approx(0.04)


@pytest.mark.parametrize(
    "percent,key,color,zh,en",
    [
        (100, "smooth", "#52c41a", "轻松", "Smooth"),
        (95, "smooth", "#52c41a", "轻松", "Smooth"),
        (94, "safe", "#afff00", "安全", "Safe"),
        (80, "safe", "#afff00", "安全", "Safe"),
        (79, "warning", "#faad14", "预警", "Warning"),
        (40, "warning", "#faad14", "预警", "Warning"),
        (39, "critical", "#ff4d4f", "危险", "Critical"),
        (0, "critical", "#ff4d4f", "危险", "Critical"),
    ],
)
def test_level_edges(percent, key, color, zh, en):
    lv = P.level_for(percent)
    assert (lv.key, lv.color, lv.zh, lv.en) == (key, color, zh, en)


def test_v_eff_floor():
    assert P.v_eff(0.0) == 0.1
    assert P.v_eff(0.1) == 0.1  # 0.09 < 0.1
    assert P.v_eff(1.0) == pytest.approx(0.9)
    assert P.v_eff(9.49) == pytest.approx(8.541)  # docs/predictor.md's worked example (12 GB card, 9.49 free)
    pred = P.predict(m_total=0.05, m_peak=0.05, vram_free_gb=0, vram_allocated_gb=0, vram_reserved_gb=0,
                     ram_free_gb=0, commit_used_gb=0, commit_limit_gb=0, platform="cpu")
    it = pred.explanation["intermediates"]
    assert it["v_eff_gb"] == 0.1 and it["v_eff_floored"] is True
    assert pred.p_success == 100  # a 0.05 GB model fits under the floor


def test_predict_end_to_end_and_explanation():
    pred = P.predict(m_total=20.0, m_peak=12.0, vram_free_gb=6.0, vram_allocated_gb=2.0, vram_reserved_gb=1.0,
                     ram_free_gb=16.0, commit_used_gb=20.0, commit_limit_gb=48.0, platform="intel")
    e, it = pred.explanation, pred.explanation["intermediates"]
    veff = 0.9 * 9.0
    assert it["v_reclaim_gb"] == pytest.approx(9.0)
    assert it["v_eff_gb"] == pytest.approx(veff)
    assert it["v_eff_platform_gb"] == pytest.approx(veff)
    assert it["s_virt_gb"] == pytest.approx(28.0)
    assert it["d_peak_gb"] == pytest.approx(12.0 - veff)
    assert it["d_load_gb"] == pytest.approx(20.0 - veff)
    pp = math.exp(-3 * (12.0 - veff) / veff)
    pl = 1 - 0.3 * ((20.0 - veff) / 16.0) ** 0.6
    assert it["p_peak"] == pytest.approx(pp)
    assert it["p_load"] == pytest.approx(pl)
    assert pred.p_success == round(100 * pp * pl)
    assert pred.level == P.level_for(pred.p_success).key
    assert pred.label == {"zh": P.level_for(pred.p_success).zh, "en": P.level_for(pred.p_success).en}
    assert set(e["inputs"]) == {"m_total_gb", "m_peak_gb", "vram_free_gb", "vram_allocated_gb", "vram_reserved_gb",
                                "ram_free_gb", "commit_used_gb", "commit_limit_gb"}
    assert e["gamma"] == 1.0 and e["platform"] == "intel" and e["constants"]["alpha"] == 0.9
    # the same inputs on NVIDIA: gamma 4 softens P_peak only
    nv = P.predict(m_total=20.0, m_peak=12.0, vram_free_gb=6.0, vram_allocated_gb=2.0, vram_reserved_gb=1.0,
                   ram_free_gb=16.0, commit_used_gb=20.0, commit_limit_gb=48.0, platform="nvidia")
    assert nv.explanation["intermediates"]["p_peak"] == pytest.approx(math.exp(-3 * (12.0 - veff) / (4 * veff)))
    assert nv.explanation["intermediates"]["p_load"] == pytest.approx(pl)
    assert nv.p_success > pred.p_success


def test_gamma_configurable_for_other_platforms():
    assert P.gamma_for("amd") == (1.0, "default")
    assert P.gamma_for("amd", {"amd": 2.5}) == (2.5, "override")
    assert P.gamma_for("nvidia", {"nvidia": 3.0}) == (3.0, "override")
    pred = P.predict(m_total=10, m_peak=10, vram_free_gb=5, vram_allocated_gb=0, vram_reserved_gb=0, ram_free_gb=0,
                     commit_used_gb=0, commit_limit_gb=0, platform="amd", gamma_overrides={"amd": 2.0})
    assert pred.explanation["gamma"] == 2.0 and pred.explanation["gamma_source"] == "override"


@pytest.mark.parametrize("field,value", [("m_total", -1), ("vram_free_gb", float("nan")), ("ram_free_gb", "8"),
                                         ("commit_limit_gb", True)])
def test_bad_inputs_name_the_field(field, value):
    kw = dict(m_total=1.0, m_peak=1.0, vram_free_gb=1.0, vram_allocated_gb=0.0, vram_reserved_gb=0.0,
              ram_free_gb=1.0, commit_used_gb=0.0, commit_limit_gb=1.0)
    kw[field] = value
    with pytest.raises(ValueError, match=field):
        P.predict(**kw)


def test_peak_above_total_is_refused():
    with pytest.raises(ValueError, match="m_peak"):
        P.predict(m_total=1.0, m_peak=2.0, vram_free_gb=1, vram_allocated_gb=0, vram_reserved_gb=0,
                  ram_free_gb=1, commit_used_gb=0, commit_limit_gb=1)


def test_rounding_sends_halves_up_as_the_seed_implementation_does():
    """Seed 001's round() is its JavaScript's Math.round: x.5 goes up (Python's round() goes to even)."""
    assert [P.round_percent(x) for x in (0.025, 0.945 + 1e-12, 0.795 + 1e-12, 0.395 + 1e-12)] == [3, 95, 80, 40]
    assert [P.round_percent(x) for x in (0.0, 0.004999, 0.005, 0.994999, 1.0)] == [0, 0, 1, 99, 100]
    # end to end: V_eff = 0.9 x 10/9 = 1, D_load = 0.25 on the last piece: P_load = 0.025 -> 2.5 %
    pred = P.predict(m_total=1.25, m_peak=0.05, vram_free_gb=10 / 9, vram_allocated_gb=0, vram_reserved_gb=0,
                     ram_free_gb=0, commit_used_gb=0, commit_limit_gb=0, platform="nvidia")
    it = pred.explanation["intermediates"]
    assert it["p_load_branch"] == "beyond" and it["p_success_raw"] * 100 == 2.5
    assert pred.p_success == 3  # round(2.5) would give 2

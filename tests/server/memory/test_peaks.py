"""What a finished run's peak_memory says per card: CUDA peak, MPS driver-held memory, simulated tensor bytes."""

from __future__ import annotations

from xpufleet.server.memory.peaks import card_peak


def test_the_largest_card_is_the_runs_figure_with_what_measured_it():
    p = card_peak({"measured": True, "kind": "cuda_max_memory_allocated", "devices": {"cuda:0": 3.5, "cuda:1": 4.25}})
    assert (p.gib, p.source) == (4.25, "cuda") and "high-water mark" in p.label
    p = card_peak({"measured": True, "kind": "mps_driver_allocated", "devices": {"mps:0": 2.0}})
    assert p.source == "mps" and "no peak counter" in p.label
    p = card_peak({"measured": False, "simulated": True, "kind": "simulated_tensor_bytes", "devices": {"cuda:0": 0.1}})
    assert p.source == "simulated" and "not a CUDA figure" in p.label


def test_nothing_measured_on_a_card_is_no_figure():
    assert card_peak(None) is None
    assert card_peak({"measured": False, "reason": "the run used no CUDA device"}) is None
    assert card_peak({"kind": "cuda_max_memory_allocated", "devices": {}}) is None
    assert card_peak({"kind": "cuda_max_memory_allocated", "devices": {"cuda:0": 0, "cuda:1": True}}) is None
    assert card_peak({"kind": "something_else", "devices": {"cuda:0": 1.0}}) is None

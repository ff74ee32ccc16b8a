"""Device inventory, --devices/--simulate parsing and in-run renumbering (SPEC Q4, W2, W6)."""

from __future__ import annotations

import json

import pytest

from xpufleet.server import devices as devmod


def test_parse_device_list_normalizes_and_keeps_order():
    assert devmod.parse_device_list("CUDA:1, cuda:0,cpu") == ["cuda:1", "cuda:0", "cpu"]
    assert devmod.parse_device_list("") is None
    assert devmod.parse_device_list("mps") == ["mps:0"]
    with pytest.raises(devmod.DeviceSpecError, match="name the card with its index"):
        devmod.parse_device_list("cuda")
    with pytest.raises(devmod.DeviceSpecError, match="invalid device 'gpu0'"):
        devmod.parse_device_list("gpu0")


def test_parse_simulate_gives_deterministic_uuids_and_explicit_ones():
    cards = devmod.parse_simulate("cuda:0=24,cuda:1=12.5@GPU-shared-1", "box-a")
    assert [(c.name, c.total_gib) for c in cards] == [("cuda:0", 24.0), ("cuda:1", 12.5)]
    assert cards[1].uuid == "GPU-shared-1"
    again = devmod.parse_simulate("cuda:0=24", "box-a")[0].uuid
    other = devmod.parse_simulate("cuda:0=24", "box-b")[0].uuid
    assert cards[0].uuid == again != other
    assert cards[0].uuid.startswith("GPU-")
    with pytest.raises(devmod.DeviceSpecError, match="cuda:N=GIB"):
        devmod.parse_simulate("cuda:0", "x")
    with pytest.raises(devmod.DeviceSpecError, match="twice"):
        devmod.parse_simulate("cuda:0=1,cuda:0=2", "x")


def test_renumber_follows_listed_order_and_hides_other_cards():
    r = devmod.renumber(["cuda:2", "cuda:0"], parent_env={})
    assert r.run_devices == ["cuda:0", "cuda:1"]
    assert r.aliases == {"cuda:0": "cuda:2", "cuda:1": "cuda:0"}
    assert r.env["CUDA_VISIBLE_DEVICES"] == "2,0"
    assert r.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    cpu = devmod.renumber(["cpu"], parent_env={})
    assert cpu.run_devices == ["cpu"] and cpu.aliases == {}
    assert cpu.env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU run sees no card
    xpu = devmod.renumber(["xpu:1"], parent_env={})
    assert xpu.run_devices == ["xpu:0"] and xpu.env["ZE_AFFINITY_MASK"] == "1"


def test_renumber_composes_with_the_agents_own_visible_devices():
    # The agent runs under CUDA_VISIBLE_DEVICES=5,7: its cuda:1 is physical card 7.
    r = devmod.renumber(["cuda:1"], parent_env={"CUDA_VISIBLE_DEVICES": "5,7"})
    assert r.env["CUDA_VISIBLE_DEVICES"] == "7"
    with pytest.raises(devmod.DeviceSpecError, match="not among"):
        devmod.renumber(["cuda:3"], parent_env={"CUDA_VISIBLE_DEVICES": "5,7"})


def test_simulated_inventory_reads_the_free_figure_a_test_changes(tmp_path):
    cards = devmod.parse_simulate("cuda:0=24,cuda:1=16", "sim")
    inv = devmod.Inventory("sim", tmp_path, devices=["cuda:1", "cuda:0"], simulate=cards)
    snap = inv.snapshot()
    assert [d["name"] for d in snap] == ["cpu", "cuda:1", "cuda:0"]  # --devices order
    assert snap[0]["simulated"] is False and snap[0]["total_gib"] > 0
    c1 = snap[1]
    assert c1["simulated"] is True and c1["total_gib"] == 16.0 and c1["free_gib"] == 16.0
    assert c1["uuid"] == cards[1].uuid
    devmod.set_simulated_free(tmp_path, "sim", "cuda:1", 3.5)
    assert inv.snapshot()[1]["free_gib"] == 3.5
    # A broken file keeps the last figures instead of crashing the heartbeat.
    devmod.simulated_file(tmp_path, "sim").write_text("{not json")
    assert inv.snapshot()[1]["free_gib"] == 3.5
    with pytest.raises(devmod.DeviceSpecError, match="between 0"):
        devmod.write_simulated_file(devmod.simulated_file(tmp_path, "sim"),
                                    {"cuda:1": {"total_gib": 16, "free_gib": 1, "uuid": "u", "label": "x"}})
        devmod.set_simulated_free(tmp_path, "sim", "cuda:1", 99)
    data = json.loads(devmod.simulated_file(tmp_path, "sim").read_text())
    assert data["simulated"] is True


def test_real_inventory_on_a_machine_without_gpus_offers_the_cpu(tmp_path):
    inv = devmod.Inventory("plain", tmp_path)
    snap = inv.snapshot()
    assert snap[0]["name"] == "cpu"
    assert all(d["simulated"] is False for d in snap)
    assert inv.check_requested() == []
    missing = devmod.Inventory("plain", tmp_path, devices=["cuda:7"]).check_requested()
    assert missing == ["cuda:7"] or any(d["name"] == "cuda:7" for d in snap)

"""Device inventory, --devices/--simulate parsing and in-run renumbering (docs/sidecar.md, docs/workers.md, docs/architecture.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from typing import Any

import pytest

from xpufleet.server import devices as devmod
from xpufleet.server.devices import probe as devprobe


def test_parse_device_list_normalizes_and_keeps_order():
    assert devmod.parse_device_list("CUDA:1, cuda:0,cpu") == ["cuda:1", "cuda:0", "cpu"]
    assert devmod.parse_device_list("") is None
    assert devmod.parse_device_list("mps") == ["mps:0"]
    with pytest.raises(devmod.DeviceSpecError, match="name one card"):
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


# --- real-device probing with stand-ins (no GPU on the test machine) ----------------------------------

class _FakeNvml:
    """A stand-in for nvidia-ml-py: ``cards`` is a list of (uuid, name, total bytes, free bytes)."""

    def __init__(self, cards: list[tuple[str, str, int, int]], fail: set[str] | None = None) -> None:
        self.cards = cards
        self.fail = fail or set()
        self.inits = 0

    def module(self) -> Any:
        mod = types.ModuleType("pynvml")
        fake = self

        def maybe_fail(what: str) -> None:
            if what in fake.fail:
                raise RuntimeError(f"{what} failed (stand-in)")

        def init() -> None:
            maybe_fail("init")
            fake.inits += 1

        def count() -> int:
            maybe_fail("count")
            return len(fake.cards)

        def memory(h: int) -> Any:
            maybe_fail("memory")
            return types.SimpleNamespace(total=fake.cards[h][2], free=fake.cards[h][3], used=0)

        mod.nvmlInit = init
        mod.nvmlDeviceGetCount = count
        mod.nvmlDeviceGetHandleByIndex = lambda i: i
        mod.nvmlDeviceGetUUID = lambda h: fake.cards[h][0].encode()  # older bindings return bytes
        mod.nvmlDeviceGetName = lambda h: fake.cards[h][1]
        mod.nvmlDeviceGetMemoryInfo = memory
        return mod


GIB = 1024**3
TWO_CARDS = [("GPU-aaaa-1111", "NVIDIA A", 24 * GIB, 20 * GIB), ("GPU-bbbb-2222", "NVIDIA B", 16 * GIB, 4 * GIB)]


def test_nvml_is_probed_lazily_once_and_reports_uuids_and_memory(tmp_path, monkeypatch):
    nvml = _FakeNvml(TWO_CARDS)
    monkeypatch.setitem(sys.modules, "pynvml", nvml.module())
    inv = devmod.Inventory("real", tmp_path, env={})
    assert nvml.inits == 0  # nothing probed until the first snapshot
    snap = inv.snapshot()
    cards = [d for d in snap if d["kind"] == "cuda"]
    assert [(d["name"], d["uuid"], d["label"]) for d in cards] == [
        ("cuda:0", "GPU-aaaa-1111", "NVIDIA A"), ("cuda:1", "GPU-bbbb-2222", "NVIDIA B")]
    assert (cards[1]["total_gib"], cards[1]["free_gib"]) == (16.0, 4.0)
    assert all(d["simulated"] is False for d in snap)
    nvml.cards[1] = ("GPU-bbbb-2222", "NVIDIA B", 16 * GIB, 8 * GIB)  # the next heartbeat sees new figures
    assert inv.snapshot()[2]["free_gib"] == 8.0
    assert nvml.inits == 1


def test_nvml_follows_the_agents_own_cuda_visible_devices(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml(TWO_CARDS).module())
    by_index = devmod.Inventory("a", tmp_path, env={"CUDA_VISIBLE_DEVICES": "1"}).snapshot()
    assert [(d["name"], d["uuid"]) for d in by_index[1:]] == [("cuda:0", "GPU-bbbb-2222")]
    by_uuid = devmod.Inventory("b", tmp_path, env={"CUDA_VISIBLE_DEVICES": "GPU-bbbb,0"}).snapshot()
    assert [(d["name"], d["uuid"]) for d in by_uuid[1:]] == [("cuda:0", "GPU-bbbb-2222"), ("cuda:1", "GPU-aaaa-1111")]


@pytest.mark.parametrize(("fail", "cards", "note"), [
    ({"init"}, 0, "NVML unavailable"),  # a machine without the driver
    ({"count"}, 0, None),  # NVML breaks after init: no cards, no crash
    ({"memory"}, 2, None),  # cards listed, figures unknown (None, not a guess)
])
def test_nvml_failures_fail_soft(tmp_path, monkeypatch, fail, cards, note):
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml(TWO_CARDS, fail).module())
    inv = devmod.Inventory("soft", tmp_path, env={})
    snap = inv.snapshot()
    assert snap[0]["name"] == "cpu"
    got = [d for d in snap if d["kind"] == "cuda"]
    assert len(got) == cards
    if "memory" in fail:
        assert all(d["total_gib"] is None and d["free_gib"] is None for d in got)
    if note:
        assert any(note in n for n in inv.notes)
        assert note in " ".join(devmod.environment_summary(inv)["notes"])


def test_missing_nvidia_ml_py_fails_soft(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    inv = devmod.Inventory("none", tmp_path, env={})
    assert [d["name"] for d in inv.snapshot()] == ["cpu"]
    assert any("nvidia-ml-py is not installed" in n for n in inv.notes)


def _fake_torch(xpu: Any) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.xpu = xpu
    torch.backends = types.SimpleNamespace(mps=None)
    return torch


def test_intel_gpus_through_torch_xpu_stand_in(tmp_path, monkeypatch):
    props = types.SimpleNamespace(name="Intel Arc A770", total_memory=16 * GIB, uuid="8086-xpu-0")
    xpu = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1,
                                get_device_properties=lambda i: props,
                                mem_get_info=lambda i: (10 * GIB, 16 * GIB))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(xpu))
    monkeypatch.setattr(devprobe, "_intel_gpu_present", lambda: True)
    snap = devmod.Inventory("arc", tmp_path, env={}).snapshot()
    assert snap[1] == {"name": "xpu:0", "kind": "xpu", "label": "Intel Arc A770", "uuid": "8086-xpu-0",
                       "total_gib": 16.0, "free_gib": 10.0, "simulated": False}


def test_a_broken_torch_xpu_fails_soft_and_is_not_probed_again(tmp_path, monkeypatch):
    calls = []

    def broken() -> bool:
        calls.append(1)
        raise RuntimeError("level zero loader missing (stand-in)")

    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(types.SimpleNamespace(is_available=broken)))
    monkeypatch.setattr(devprobe, "_intel_gpu_present", lambda: True)
    inv = devmod.Inventory("arc", tmp_path, env={})
    assert [d["name"] for d in inv.snapshot()] == ["cpu"]
    assert [d["name"] for d in inv.snapshot()] == ["cpu"]
    assert len(calls) == 1 and any("xpu/mps probe failed" in n for n in inv.notes)


@pytest.mark.skipif(sys.platform == "darwin", reason="MPS is probed through torch on macOS")
def test_importing_the_agent_and_probing_without_an_intel_gpu_never_imports_torch():
    code = (
        "import sys, tempfile\n"
        "from xpufleet.server.agent import agent\nfrom xpufleet.server.cli import agent as agent_cli\nfrom xpufleet.server import devices\n"
        "print(sorted(m for m in ('torch', 'pynvml') if m in sys.modules))\n"
        "devices._intel_gpu_present = lambda: False\n"
        "devices.Inventory('t', tempfile.mkdtemp()).snapshot()\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "False"], out.stdout

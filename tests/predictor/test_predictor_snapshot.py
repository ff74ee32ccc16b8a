"""Snapshots (docs/predictor.md): no-GPU zeros with a reason, commit charge on Linux and Windows, NVML matched
to torch's index by UUID (stand-ins for the GPU libraries: this machine has no GPU)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from xpufleet.predictor import snapshot as S

GiB = 1024**3


@pytest.fixture(autouse=True)
def _fresh_cache():
    S.clear_cache()
    yield
    S.clear_cache()


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    except Exception:
        return False


@pytest.mark.skipif(_has_gpu(), reason="this check is for a machine without a GPU")
def test_no_gpu_gives_zeros_and_a_reason():
    snap = S.take_snapshot(import_torch=True)
    assert snap.device == "cpu" and snap.platform == "cpu" and snap.kind == "cpu"
    assert (snap.vram_free_gb, snap.vram_total_gb, snap.vram_allocated_gb, snap.vram_reserved_gb) == (0, 0, 0, 0)
    assert snap.reason.startswith("no GPU found") and "CUDA not available" in snap.reason
    assert snap.ram_free_gb > 0
    if sys.platform.startswith("linux"):
        assert snap.commit_limit_gb > 0
    all_snaps = S.take_snapshots(import_torch=True)
    assert [s.device for s in all_snaps] == ["cpu"]
    with pytest.raises(ValueError, match="devices: cpu"):
        S.take_snapshot("cuda:3", import_torch=True)


def test_host_figures_are_the_device_layers_in_gib():
    from xpufleet.server.devices.host import host_memory

    raw, snap = host_memory(), S.host_memory()
    assert snap["commit_limit_gb"] == pytest.approx(raw.commit_limit / GiB)
    assert snap["ram_free_gb"] == pytest.approx(raw.ram_free / GiB, rel=0.2)  # it moves


# ---- stand-ins for NVML and torch.cuda -------------------------------------------------------------

NV = [  # NVML's order (PCI bus)
    {"uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001", "name": "NVIDIA A", "total": 24 * GiB, "free": 20 * GiB},
    {"uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000002", "name": "NVIDIA B", "total": 80 * GiB, "free": 70 * GiB},
]


def nvml_stand_in(devs=NV):
    return SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: len(devs),
        nvmlDeviceGetHandleByIndex=lambda i: devs[i],
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=h["total"], free=h["free"], used=h["total"] - h["free"]),
        nvmlDeviceGetUUID=lambda h: h["uuid"].encode(),  # older bindings return bytes
        nvmlDeviceGetName=lambda h: h["name"],
    )


def torch_stand_in(order, alloc, reserved, initialised=True, hip=None, mem_get_info=None):
    """torch.cuda seeing the NVML devices in ``order`` (CUDA's fastest-first order differs)."""
    props = [SimpleNamespace(name=NV[j]["name"], total_memory=NV[j]["total"], uuid=NV[j]["uuid"][4:]) for j in order]
    cuda = SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: initialised,
        device_count=lambda: len(order),
        get_device_properties=lambda i: props[i],
        memory_allocated=lambda i: alloc[i],
        memory_reserved=lambda i: reserved[i],
        mem_get_info=mem_get_info or (lambda i: (1 * GiB, 2 * GiB)),
    )
    return SimpleNamespace(cuda=cuda, version=SimpleNamespace(hip=hip), __version__="2.x")


def nvml_cards(monkeypatch, devs=NV):
    from xpufleet.server.devices.nvml import Nvml

    monkeypatch.setitem(sys.modules, "pynvml", nvml_stand_in(devs))
    nvml = Nvml()
    assert nvml.ok
    return nvml


def test_torch_index_mapped_to_nvml_by_uuid(monkeypatch):
    nvml_list = nvml_cards(monkeypatch).cards()
    torch = torch_stand_in(order=[1, 0], alloc=[3 * GiB, 0], reserved=[5 * GiB, GiB])
    snaps = S.torch_cuda_snapshots(torch, nvml_list, None)
    c0, c1 = snaps
    assert (c0.device, c0.name, c0.uuid) == ("cuda:0", "NVIDIA B", NV[1]["uuid"])
    assert (c0.vram_total_gb, c0.vram_free_gb) == (80.0, 70.0)
    assert c0.vram_allocated_gb == 3.0 and c0.vram_reserved_gb == 2.0 and c0.torch_reserved_gb == 5.0
    assert (c1.name, c1.vram_free_gb, c1.vram_reserved_gb) == ("NVIDIA A", 20.0, 1.0)
    assert c0.platform == "nvidia" and c0.source == "torch+nvml"


def test_without_nvml_free_comes_from_torch_with_a_note():
    torch = torch_stand_in(order=[0], alloc=[0], reserved=[0], mem_get_info=lambda i: (6 * GiB, 24 * GiB))
    (snap,) = S.torch_cuda_snapshots(torch, None, "NVML unavailable (x)")
    assert snap.vram_free_gb == 6.0 and snap.vram_total_gb == 24.0 and snap.source == "torch"
    assert any("NVML unavailable" in n for n in snap.notes)


def test_rocm_build_is_amd():
    torch = torch_stand_in(order=[0], alloc=[GiB], reserved=[GiB], hip="6.2",
                           mem_get_info=lambda i: (10 * GiB, 64 * GiB))
    (snap,) = S.torch_cuda_snapshots(torch, [], None)
    assert snap.platform == "amd" and snap.vram_total_gb == 64.0 and snap.vram_free_gb == 10.0
    assert not snap.notes  # no NVML expected on AMD


def test_intel_xpu_snapshot():
    xpu = SimpleNamespace(
        device_count=lambda: 1,
        get_device_properties=lambda i: SimpleNamespace(name="Intel(R) Arc(TM) A770", total_memory=16 * GiB),
        memory_allocated=lambda i: 2 * GiB,
        memory_reserved=lambda i: 3 * GiB,
        mem_get_info=lambda i: (9 * GiB, 16 * GiB),
    )
    (snap,) = S.torch_xpu_snapshots(SimpleNamespace(xpu=xpu))
    assert (snap.device, snap.platform, snap.kind) == ("xpu:0", "intel", "xpu")
    assert (snap.vram_free_gb, snap.vram_allocated_gb, snap.vram_reserved_gb) == (9.0, 2.0, 1.0)


def test_snapshot_never_initialises_cuda(monkeypatch):
    """torch imported but CUDA not initialised (the sidecar): NVML figures, no torch.cuda calls."""
    torch = torch_stand_in(order=[1, 0], alloc=[0, 0], reserved=[0, 0], initialised=False)

    def boom(i):
        raise AssertionError("would initialise CUDA")

    torch.cuda.get_device_properties = boom
    monkeypatch.setitem(sys.modules, "torch", torch)
    nvml = nvml_cards(monkeypatch)
    monkeypatch.setattr(S, "shared_nvml", lambda: nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    snaps = S.take_snapshots(import_torch=False)
    assert [(s.device, s.name, s.source) for s in snaps] == [("cuda:0", "NVIDIA A", "nvml"), ("cuda:1", "NVIDIA B", "nvml")]
    assert any("CUDA not initialised" in n for n in snaps[0].notes)
    assert any("CUDA_DEVICE_ORDER" in n for n in snaps[0].notes)
    # once CUDA is initialised (ComfyUI), the allocator figures and the UUID mapping are used
    S.clear_cache()
    torch2 = torch_stand_in(order=[1, 0], alloc=[GiB, 0], reserved=[GiB, 0], initialised=True)
    monkeypatch.setitem(sys.modules, "torch", torch2)
    snap = S.take_snapshot("cuda:0")
    assert (snap.name, snap.vram_allocated_gb, snap.source) == ("NVIDIA B", 1.0, "torch+nvml")
    assert snap.ram_free_gb > 0  # host figures are added to every device


def test_snapshot_from_heartbeat_card():
    card = {"worker": "gpu-box", "device": "cuda:1", "total_gib": 24.0, "free_gib": 20.5, "kind": "cuda",
            "uuid": "GPU-x", "simulated": False, "ram_free_gib": 30.0, "commit_used_gib": 8.0,
            "commit_limit_gib": 70.0}
    s = S.snapshot_from_card(card)
    assert (s.worker, s.device, s.vram_free_gb, s.platform, s.source) == ("gpu-box", "cuda:1", 20.5, "nvidia", "heartbeat")
    assert (s.ram_free_gb, s.commit_used_gb, s.commit_limit_gb) == (30.0, 8.0, 70.0)
    assert s.vram_allocated_gb == 0 and not s.simulated
    sim = S.snapshot_from_card({"worker": "w", "device": "xpu:0", "total_gib": 16, "free_gib": 16, "kind": "xpu",
                                "simulated": True})
    assert sim.simulated and sim.platform == "intel"
    assert any("SIMULATED" in n for n in sim.notes)
    assert any("ram_free_gb" in n for n in sim.notes)
    assert s.reason is None and sim.reason is None


def test_card_without_free_figure_or_offline_says_so(template):
    """A 0 that is really 'unknown', or a stale heartbeat, turns into a warning in the answer."""
    from xpufleet.predictor.resolve import DirsResolver
    from xpufleet.predictor.service import predict_workflow

    card = {"worker": "gpu-box", "device": "cuda:0", "total_gib": 24.0, "free_gib": None, "kind": "cuda",
            "online": False}
    s = S.snapshot_from_card(card)
    assert s.vram_free_gb == 0.0
    assert "no free-memory figure for gpu-box/cuda:0" in s.reason and "gpu-box is offline" in s.reason
    a = predict_workflow(template("sd3.5_large_canny_controlnet_example.json"), s, resolver=DirsResolver([]),
                         gamma_overrides={})
    assert any("no free-memory figure" in w for w in a["warnings"])
    assert any("offline" in w for w in a["warnings"])
    assert S.snapshot_from_card({**card, "free_gib": 20.0, "online": True}).reason is None


def test_cached_for_the_ttl(monkeypatch):
    # Count the probes: a cached answer takes none, an expired (ttl 0) or cleared cache takes one.
    probes: list[bool] = []
    real = S._device_snapshots
    monkeypatch.setattr(S, "_device_snapshots", lambda import_torch: probes.append(import_torch) or real(import_torch))
    S.clear_cache()
    a = S.take_snapshots(ttl=60)
    b = S.take_snapshots(ttl=60)
    assert len(probes) == 1 and a[0].taken_at == b[0].taken_at
    a[0].notes.append("caller edits its copy")
    assert "caller edits its copy" not in S.take_snapshots(ttl=60)[0].notes
    assert len(probes) == 1
    S.take_snapshots(ttl=0)
    assert len(probes) == 2
    S.clear_cache()
    S.take_snapshots(ttl=60)
    assert len(probes) == 3


def test_predictor_modules_import_nothing_heavy():
    """ComfyUI start-up: importing the predictor loads no torch, NVML, aiohttp, yaml or psutil."""
    import subprocess

    code = ("import sys, xpufleet.predictor, xpufleet.server.sidecar.routes.predictor, xpufleet.predictor.service, "
            "xpufleet.server.cli.predict, xpufleet.predictor.snapshot, xpufleet.predictor.scan; "
            "print(','.join(m for m in ('torch', 'pynvml', 'aiohttp', 'yaml', 'psutil', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""

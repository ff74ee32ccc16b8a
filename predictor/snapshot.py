"""Per-device memory snapshots (docs/predictor.md): the figures docs/predictor.md feeds into P_success.

- NVIDIA: free/total from NVML (the device layer's one wrapper, ``server/devices/nvml.py``), allocator
  figures from ``torch.cuda`` of this process; the torch index is matched to the NVML device by UUID
  (CUDA_VISIBLE_DEVICES and CUDA's own device order need not match NVML's).
- Intel: stock ``torch.xpu``; AMD: torch's ROCm build (``torch.cuda`` with ``torch.version.hip``);
  Apple: ``torch.mps``.
- RAM free from psutil; commit charge from ``GlobalMemoryStatusEx`` on Windows and
  ``CommitLimit``/``Committed_AS`` in ``/proc/meminfo`` on Linux (``server/devices/host.py``).
- No GPU: one snapshot of zeros with the reason.

torch is never imported here unless the caller allows it (``import_torch=True``: the CLI); inside
ComfyUI it is already imported and its allocator figures are the ComfyUI process's own. CUDA is
never initialised by a snapshot in a long-lived process that has not initialised it (the sidecar,
ComfyUI before its first model); the short-lived CLI (``import_torch=True``) does initialise it to
name devices by torch index, after NVML's free figures have been read. Reads are cached for
SNAPSHOT_TTL_S. All ``*_gb`` figures are GiB.

``vram_reserved_gb`` is docs/predictor.md's "PyTorch cache pool": reserved but not allocated
(``memory_reserved - memory_allocated``), so V_free + V_alloc + V_rsv counts no byte twice; the
raw ``memory_reserved`` is kept in ``torch_reserved_gb``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..constants import BYTES_PER_GB, SNAPSHOT_TTL_S
from ..server.devices.host import host_memory as read_host_memory
from ..server.devices.nvml import NvmlCard, norm_uuid, visible_order
from ..server.devices.nvml import shared as shared_nvml

GB = float(BYTES_PER_GB)


@dataclass
class Snapshot:
    """One device's memory figures (GiB) plus the host's RAM and commit charge."""

    vram_free_gb: float = 0.0
    vram_total_gb: float = 0.0
    vram_allocated_gb: float = 0.0
    vram_reserved_gb: float = 0.0
    ram_free_gb: float = 0.0
    commit_used_gb: float = 0.0
    commit_limit_gb: float = 0.0
    device: str = "cpu"
    name: str = ""
    kind: str = "cpu"
    uuid: str | None = None
    platform: str = "cpu"
    reason: str | None = None
    source: str = "none"
    simulated: bool = False
    worker: str | None = None
    torch_reserved_gb: float = 0.0
    notes: list[str] = field(default_factory=list)
    taken_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


SNAPSHOT_FIELDS = ("vram_free_gb", "vram_total_gb", "vram_allocated_gb", "vram_reserved_gb", "ram_free_gb",
                   "commit_used_gb", "commit_limit_gb")


def host_memory() -> dict[str, Any]:
    """This machine's RAM free and commit charge in the snapshot's units (GiB), with notes
    (the device layer reads them: ``server/devices/host.py``)."""
    h = read_host_memory()
    return {"ram_free_gb": h.ram_free / GB, "commit_used_gb": h.commit_used / GB,
            "commit_limit_gb": h.commit_limit / GB, "notes": list(h.notes)}


# --------------------------------------------------------------------------------------------------
# torch
# --------------------------------------------------------------------------------------------------


def torch_cuda_snapshots(torch: Any, nvml_list: list[NvmlCard] | None, nvml_error: str | None) -> list[Snapshot]:
    """One snapshot per ``torch.cuda`` device (NVIDIA or ROCm), NVML matched by UUID."""
    hip = getattr(getattr(torch, "version", None), "hip", None)
    platform = "amd" if hip else "nvidia"
    by_uuid = {norm_uuid(d.uuid): d for d in (nvml_list or [])}
    initialised = bool(getattr(torch.cuda, "is_initialized", lambda: True)())
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        uuid = getattr(props, "uuid", None)
        snap = Snapshot(device=f"cuda:{i}", kind="cuda", platform=platform, name=str(getattr(props, "name", "")),
                        uuid=(str(uuid) if uuid is not None else None))
        total = int(getattr(props, "total_memory", 0))
        alloc = int(torch.cuda.memory_allocated(i)) if initialised else 0
        reserved = int(torch.cuda.memory_reserved(i)) if initialised else 0
        nv = by_uuid.get(norm_uuid(uuid)) if uuid is not None else None
        if nv is not None and nv.free is not None and nv.total is not None:
            free, total = nv.free, nv.total
            snap.uuid = nv.uuid
            snap.source = "torch+nvml"
        else:
            free, total2 = torch.cuda.mem_get_info(i)
            total = int(total2) or total
            snap.source = "torch"
            if platform == "nvidia":
                snap.notes.append(f"free memory from torch.cuda.mem_get_info: {nvml_error or 'no NVML device with this UUID'}")
        if not initialised:
            snap.notes.append("CUDA not initialised in this process: allocator figures 0")
        snap.vram_total_gb = total / GB
        snap.vram_free_gb = int(free) / GB
        snap.vram_allocated_gb = alloc / GB
        snap.vram_reserved_gb = max(0, reserved - alloc) / GB
        snap.torch_reserved_gb = reserved / GB
        out.append(snap)
    return out


def torch_xpu_snapshots(torch: Any) -> list[Snapshot]:
    """One snapshot per ``torch.xpu`` device (Intel, stock torch)."""
    xpu = torch.xpu
    out = []
    for i in range(xpu.device_count()):
        props = xpu.get_device_properties(i)
        snap = Snapshot(device=f"xpu:{i}", kind="xpu", platform="intel", name=str(getattr(props, "name", "")),
                        source="torch")
        uuid = getattr(props, "uuid", None)
        snap.uuid = str(uuid) if uuid is not None else None
        total = int(getattr(props, "total_memory", 0))
        alloc = int(xpu.memory_allocated(i))
        reserved = int(xpu.memory_reserved(i))
        try:
            free, total = (int(v) for v in xpu.mem_get_info(i))
        except Exception as exc:  # older torch.xpu: no mem_get_info
            free = max(0, total - reserved)
            snap.notes.append(f"free memory estimated as total - this process's reservations ({exc})")
        snap.vram_total_gb, snap.vram_free_gb = total / GB, free / GB
        snap.vram_allocated_gb = alloc / GB
        snap.vram_reserved_gb = max(0, reserved - alloc) / GB
        snap.torch_reserved_gb = reserved / GB
        out.append(snap)
    return out


def torch_mps_snapshot(torch: Any) -> Snapshot:
    """Apple unified memory as torch.mps reports it."""
    mps = torch.mps
    total = int(mps.recommended_max_memory())
    alloc = int(mps.current_allocated_memory())
    driver = int(mps.driver_allocated_memory())
    return Snapshot(device="mps", kind="mps", platform="apple", name="Apple GPU", source="torch",
                    vram_total_gb=total / GB, vram_free_gb=max(0, total - driver) / GB,
                    vram_allocated_gb=alloc / GB, vram_reserved_gb=max(0, driver - alloc) / GB,
                    torch_reserved_gb=driver / GB,
                    notes=["unified memory: free = recommended maximum - driver allocations"])


def _device_snapshots(import_torch: bool) -> list[Snapshot]:
    reasons: list[str] = []
    torch = sys.modules.get("torch")
    if torch is None and import_torch:
        try:
            import torch  # noqa: F811  (lazy: the CLI allows it, ComfyUI has it already)
        except Exception as exc:
            reasons.append(f"torch not importable ({exc})")
            torch = None
    elif torch is None:
        reasons.append("torch not loaded in this process")
    nvml = shared_nvml()
    nvml_error = None if nvml.ok else nvml.reason
    nvml_list: list[NvmlCard] | None = nvml.cards() if nvml.ok else None
    if torch is not None:
        try:
            if torch.cuda.is_available():
                if import_torch or torch.cuda.is_initialized():
                    return torch_cuda_snapshots(torch, nvml_list, nvml_error)
                # never initialise CUDA (a context costs hundreds of MiB) just to take a snapshot
                reasons.append("CUDA not initialised in this process")
            else:
                reasons.append(f"torch {getattr(torch, '__version__', '?')}: CUDA not available")
            xpu = getattr(torch, "xpu", None)
            if xpu is not None and xpu.is_available():
                return torch_xpu_snapshots(torch)
            mps = getattr(getattr(torch, "backends", None), "mps", None)
            if mps is not None and mps.is_available() and hasattr(torch, "mps"):
                return [torch_mps_snapshot(torch)]
        except Exception as exc:
            reasons.append(f"torch device query failed ({exc})")
    if nvml_list:
        order = visible_order(nvml_list, os.environ.get("CUDA_VISIBLE_DEVICES"))
        out = []
        for i, d in enumerate(order):
            snap = Snapshot(device=f"cuda:{i}", kind="cuda", platform="nvidia", name=d.name, uuid=d.uuid,
                            vram_total_gb=(d.total or 0) / GB, vram_free_gb=(d.free or 0) / GB, source="nvml")
            if d.total is None:
                snap.notes.append("NVML could not read this card's memory: figures 0")
            snap.notes.append("; ".join(reasons + ["allocator figures 0 (no torch allocator in this process)"]))
            if len(order) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
                snap.notes.append("index order is NVML's (PCI bus); set CUDA_DEVICE_ORDER=PCI_BUS_ID so torch matches")
            out.append(snap)
        return out
    if nvml_error:
        reasons.append(nvml_error)
    return [Snapshot(reason="no GPU found: " + "; ".join(reasons or ["no accelerator reported"]), source="none")]


_CACHE_LOCK = threading.Lock()
_CACHE: dict[bool, tuple[float, list[Snapshot]]] = {}


def clear_cache() -> None:
    """Forget cached snapshots (tests; after loading or freeing a model)."""
    with _CACHE_LOCK:
        _CACHE.clear()


def take_snapshots(import_torch: bool = False, ttl: float = SNAPSHOT_TTL_S) -> list[Snapshot]:
    """Snapshots of every device this process can see (one zero snapshot with a reason when none),
    each with the host's RAM and commit figures; cached for ``ttl`` seconds."""
    now = time.monotonic()
    with _CACHE_LOCK:
        hit = _CACHE.get(import_torch)
        if hit is not None and now - hit[0] < ttl:
            return [Snapshot(**{**asdict(s), "notes": list(s.notes)}) for s in hit[1]]
    snaps = _device_snapshots(import_torch)
    host = host_memory()
    stamp = time.time()
    for s in snaps:
        s.ram_free_gb = host["ram_free_gb"]
        s.commit_used_gb = host["commit_used_gb"]
        s.commit_limit_gb = host["commit_limit_gb"]
        s.notes.extend(host["notes"])
        s.taken_at = stamp
    with _CACHE_LOCK:
        _CACHE[import_torch] = (now, snaps)
    return [Snapshot(**{**asdict(s), "notes": list(s.notes)}) for s in snaps]


def default_device(snaps: list[Snapshot]) -> str:
    """The device a workflow would run on: ComfyUI's torch device when hosted, else the first one."""
    mm = sys.modules.get("comfy.model_management")
    get = getattr(mm, "get_torch_device", None) if mm is not None else None
    if get is not None:
        try:
            dev = get()
            name = f"{dev.type}:{dev.index}" if getattr(dev, "index", None) is not None else str(getattr(dev, "type", dev))
            if any(s.device == name for s in snaps):
                return name
            if name == "cuda" or name == "xpu":
                return f"{name}:0"
        except Exception:
            pass
    return snaps[0].device


def take_snapshot(device: str | None = None, import_torch: bool = False, ttl: float = SNAPSHOT_TTL_S) -> Snapshot:
    """The snapshot of one device (``cuda:1``, ``xpu:0``, ``mps``, ``cpu``; default: the device a
    workflow would run on). ValueError listing the devices when ``device`` is not one of them."""
    snaps = take_snapshots(import_torch, ttl)
    want = device or default_device(snaps)
    if want in ("cuda", "xpu"):
        want = f"{want}:0"
    for s in snaps:
        if s.device == want:
            return s
    if want == "cpu":
        cpu = snaps[0] if snaps[0].device == "cpu" else Snapshot(
            ram_free_gb=snaps[0].ram_free_gb, commit_used_gb=snaps[0].commit_used_gb,
            commit_limit_gb=snaps[0].commit_limit_gb, taken_at=snaps[0].taken_at,
            reason="cpu: no VRAM", source="none")
        return cpu
    raise ValueError(f"no device {want!r} here; devices: {', '.join(s.device for s in snaps)}")


def platform_for_kind(kind: str, name: str = "") -> str:
    """Predictor platform from a torch device kind (and the card's name for ROCm)."""
    kind = (kind or "").lower()
    if kind == "cuda":
        return "amd" if any(k in name.lower() for k in ("amd", "radeon", "instinct")) else "nvidia"
    return {"xpu": "intel", "mps": "apple"}.get(kind, "cpu")


def snapshot_from_card(card: dict[str, Any]) -> Snapshot:
    """A worker card's figures from its heartbeat (``free_gib``, ``total_gib``, ...) as a Snapshot.

    A heartbeat has no allocator figures (the run's process is not the agent); RAM and commit come
    from ``ram_free_gib`` / ``commit_used_gib`` / ``commit_limit_gib`` when the heartbeat has them.
    """
    kind = str(card.get("kind") or "cuda")
    name = str(card.get("name") or "")
    notes = ["device figures from the worker's heartbeat; allocator figures 0"]
    ram = {}
    for f in ("ram_free", "commit_used", "commit_limit"):
        v = card.get(f + "_gib")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            ram[f + "_gb"] = float(v)
    missing = [f for f in ("ram_free_gb", "commit_used_gb", "commit_limit_gb") if f not in ram]
    if missing:
        notes.append(f"heartbeat has no {', '.join(missing)}: counted as 0")
    simulated = bool(card.get("simulated"))
    if simulated:
        notes.append("SIMULATED card: these are not measured figures")
    # say so (reason -> a warning in the answer) rather than predict silently on a 0 or stale figure
    worker = card.get("worker")
    reasons = []
    if card.get("free_gib") is None:
        reasons.append(f"the heartbeat has no free-memory figure for {worker}/{card.get('device')} "
                       "(the agent could not read it): V_free counted as 0")
    if card.get("online") is False:
        reasons.append(f"worker {worker} is offline: figures from its last heartbeat")
    return Snapshot(
        reason="; ".join(reasons) or None,
        vram_free_gb=float(card.get("free_gib") or 0.0),
        vram_total_gb=float(card.get("total_gib") or 0.0),
        device=str(card.get("device") or ""),
        name=name,
        kind=kind,
        uuid=card.get("uuid"),
        platform=str(card.get("platform") or platform_for_kind(kind, name)),
        source="heartbeat",
        simulated=simulated,
        worker=str(card.get("worker")) if card.get("worker") is not None else None,
        notes=notes,
        taken_at=float(card.get("ts") or time.time()),
        **ram,
    )

"""The worker agent's device inventory (SPEC W2, W6) and in-run renumbering (SPEC Q4).

Real devices: NVIDIA cards through nvidia-ml-py (``pynvml``, with UUIDs), Intel GPUs through stock
``torch.xpu``, Apple ``mps``, and the CPU through psutil. Simulated CUDA cards (``--simulate
"cuda:0=24,cuda:1=24"``) have a name, a total, a deterministic UUID and a free figure a test can
change while the agent runs: they live in ``$XPUFLEET_HOME/agents/<name>-simulated.json``, which
the agent writes at start and re-reads at every heartbeat. Every simulated figure says
``"simulated": true``; the work of a run on a simulated card runs on the CPU.

Heavy modules (pynvml, torch) are imported lazily, only where a device of their kind may exist.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..constants import BYTES_PER_GB, SIMULATED_UUID_PREFIX

log = logging.getLogger("xpufleet.devices")

GIB = BYTES_PER_GB  # one definition of a GiB: constants.py
_DEVICE_RE = re.compile(r"^(cpu|mps|cuda|xpu)(?::(\d+))?$")
_SIM_RE = re.compile(r"^cuda:(\d+)=(\d+(?:\.\d+)?)(?:@([A-Za-z0-9][A-Za-z0-9-]{0,63}))?$")


class DeviceSpecError(ValueError):
    """A ``--devices`` or ``--simulate`` value that cannot be used (the text says what to fix)."""


# --- parsing (pure) -----------------------------------------------------------------------------

def normalize_device(name: str) -> str:
    """``CUDA:1`` -> ``cuda:1``; ``mps`` -> ``mps:0``; ``cpu:0`` -> ``cpu``. Raise DeviceSpecError."""
    text = str(name).strip().lower()
    m = _DEVICE_RE.match(text)
    if not m:
        raise DeviceSpecError(f"invalid device {name!r}: use cpu, cuda:N, xpu:N or mps")
    kind, index = m.group(1), m.group(2)
    if kind == "cpu":
        return "cpu"
    if kind == "mps":
        return "mps:0"
    if index is None:
        raise DeviceSpecError(f"invalid device {name!r}: name the card with its index, e.g. {kind}:0")
    return f"{kind}:{int(index)}"


def device_kind(name: str) -> str:
    """``cuda:1`` -> ``cuda``."""
    return name.split(":", 1)[0]


def device_index(name: str) -> int:
    """``cuda:1`` -> 1 (``cpu`` -> 0)."""
    return int(name.split(":", 1)[1]) if ":" in name else 0


def parse_device_list(text: str | None) -> list[str] | None:
    """``--devices cuda:0,cuda:1`` -> ``["cuda:0", "cuda:1"]``; None/empty -> None (offer all)."""
    if text is None or not str(text).strip():
        return None
    out: list[str] = []
    for part in str(text).split(","):
        if not part.strip():
            continue
        name = normalize_device(part)
        if name not in out:
            out.append(name)
    return out or None


@dataclass(frozen=True)
class SimulatedCard:
    """One simulated CUDA card of ``--simulate``."""

    name: str  # machine name, cuda:N
    total_gib: float
    uuid: str


def simulated_uuid(worker: str, device: str) -> str:
    """A deterministic UUID for a simulated card: same worker + device -> same UUID, across runs."""
    tail = uuid.uuid5(uuid.NAMESPACE_URL, f"xpufleet-simulated/{worker}/{device}").hex
    return f"{SIMULATED_UUID_PREFIX}-{tail[:4]}-{tail[4:8]}-{tail[8:12]}-{tail[12:24]}"


def parse_simulate(text: str | None, worker: str) -> list[SimulatedCard]:
    """``"cuda:0=24,cuda:1=24@GPU-shared-1"`` -> simulated cards (GiB; ``@UUID`` optional).

    Two agents that name the same ``@UUID`` simulate one physical card offered twice (SPEC Q5).
    """
    if text is None or not str(text).strip():
        return []
    cards: list[SimulatedCard] = []
    seen: set[str] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        m = _SIM_RE.match(part)
        if not m:
            raise DeviceSpecError(
                f"invalid --simulate entry {part!r}: write cuda:N=GIB or cuda:N=GIB@UUID, e.g. cuda:0=24"
            )
        name = f"cuda:{int(m.group(1))}"
        total = float(m.group(2))
        if total <= 0:
            raise DeviceSpecError(f"invalid --simulate entry {part!r}: the card needs more than 0 GiB")
        if name in seen:
            raise DeviceSpecError(f"--simulate lists {name} twice")
        seen.add(name)
        cards.append(SimulatedCard(name, total, m.group(3) or simulated_uuid(worker, name)))
    return cards


# --- renumbering (pure) -------------------------------------------------------------------------

@dataclass
class Renumbering:
    """How a worker run sees its cards: run ``cuda:0`` = ``aliases["cuda:0"]`` on the machine."""

    run_devices: list[str]
    aliases: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)


def _parent_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [p.strip() for p in value.split(",") if p.strip()]


def renumber(machine_devices: list[str], parent_env: dict[str, str] | None = None) -> Renumbering:
    """Renumber a run's machine devices from 0, per kind, in the order listed (SPEC Q4).

    ``["cuda:2", "cuda:0"]`` -> run ``cuda:0`` = machine ``cuda:2``, run ``cuda:1`` = ``cuda:0``, and
    ``CUDA_VISIBLE_DEVICES=2,0``. When the agent itself runs under ``CUDA_VISIBLE_DEVICES`` /
    ``ZE_AFFINITY_MASK``, its ``cuda:N`` is the N-th entry of that list, and the child's list
    is built from those entries. A run without CUDA cards sees none (``CUDA_VISIBLE_DEVICES=``).
    """
    parent_env = parent_env if parent_env is not None else dict(os.environ)
    counters: dict[str, int] = {}
    run_devices: list[str] = []
    aliases: dict[str, str] = {}
    by_kind: dict[str, list[int]] = {}
    for dev in machine_devices:
        dev = normalize_device(dev)
        kind = device_kind(dev)
        if kind == "cpu":
            if "cpu" not in run_devices:
                run_devices.append("cpu")
            continue
        n = counters.get(kind, 0)
        counters[kind] = n + 1
        in_run = "mps" if kind == "mps" else f"{kind}:{n}"
        run_devices.append(in_run)
        aliases[in_run] = dev
        by_kind.setdefault(kind, []).append(device_index(dev))
    env: dict[str, str] = {}
    for kind, var in (("cuda", "CUDA_VISIBLE_DEVICES"), ("xpu", "ZE_AFFINITY_MASK")):
        indices = by_kind.get(kind)
        parent = _parent_list(parent_env.get(var))
        if not indices:
            if kind == "cuda":
                env[var] = ""  # the run sees only its cards: none
            continue
        if parent is not None:
            try:
                env[var] = ",".join(parent[i] for i in indices)
            except IndexError:
                raise DeviceSpecError(
                    f"{kind}:{max(indices)} is not among the agent's {var}={parent_env.get(var)}"
                ) from None
        else:
            env[var] = ",".join(str(i) for i in indices)
    if by_kind.get("cuda") and "CUDA_DEVICE_ORDER" not in parent_env:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # so CUDA's numbering matches NVML's (UUIDs)
    return Renumbering(run_devices, aliases, env)


# --- probing real devices ---------------------------------------------------------------------

def _gib(n_bytes: float | int | None) -> float | None:
    return None if n_bytes is None else round(float(n_bytes) / GIB, 3)


def _cpu_device() -> dict[str, Any]:
    import psutil

    vm = psutil.virtual_memory()
    import platform

    label = platform.processor() or platform.machine() or "CPU"
    from ..predictor.snapshot import host_memory

    host = host_memory()  # commit charge too: the predictor's P_load needs it for worker cards
    return {
        "name": "cpu",
        "kind": "cpu",
        "label": f"{label} ({os.cpu_count() or 1} cores)",
        "uuid": None,
        "total_gib": _gib(vm.total),
        "free_gib": _gib(vm.available),
        "commit_used_gib": round(host["commit_used_gb"], 3),
        "commit_limit_gib": round(host["commit_limit_gb"], 3),
        "simulated": False,
    }


class _Nvml:
    """NVIDIA cards through nvidia-ml-py; initialised once, ``None`` figures when NVML fails."""

    def __init__(self) -> None:
        self.ok = False
        self.reason = ""
        self._mod: Any = None
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            self.reason = "nvidia-ml-py is not installed"
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # no driver / no card: a machine without NVIDIA GPUs
            self.reason = f"NVML unavailable: {exc}"
            return
        self._mod = pynvml
        self.ok = True

    @staticmethod
    def _text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def devices(self, parent_env: dict[str, str]) -> list[dict[str, Any]]:
        if not self.ok:
            return []
        nv = self._mod
        try:
            count = nv.nvmlDeviceGetCount()
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            uuids = [self._text(nv.nvmlDeviceGetUUID(h)) for h in handles]
        except Exception as exc:
            log.warning("NVML failed to list cards: %s", exc)
            return []
        order = list(range(count))
        visible = _parent_list(parent_env.get("CUDA_VISIBLE_DEVICES"))
        if visible is not None:  # the agent's cuda:N is the N-th visible card, as in CUDA
            order = []
            for entry in visible:
                if entry.isdigit() and int(entry) < count:
                    order.append(int(entry))
                elif entry.startswith("GPU-") and any(u.startswith(entry) for u in uuids):
                    order.append(next(i for i, u in enumerate(uuids) if u.startswith(entry)))
                else:
                    break  # CUDA stops at the first entry it cannot resolve
        out = []
        for n, i in enumerate(order):
            h = handles[i]
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                total, free = mem.total, mem.free
            except Exception:
                total = free = None
            try:
                label = self._text(nv.nvmlDeviceGetName(h))
            except Exception:
                label = "NVIDIA GPU"
            out.append({
                "name": f"cuda:{n}",
                "kind": "cuda",
                "label": label,
                "uuid": uuids[i],
                "total_gib": _gib(total),
                "free_gib": _gib(free),
                "simulated": False,
            })
        return out


def _intel_gpu_present() -> bool:
    """A cheap look for an Intel GPU before paying for ``import torch`` (Linux: DRM vendor 0x8086)."""
    if sys.platform.startswith("win"):
        return True
    drm = Path("/sys/class/drm")
    if not drm.is_dir():
        return False
    for vendor in drm.glob("renderD*/device/vendor"):
        try:
            if vendor.read_text().strip().lower() == "0x8086":
                return True
        except OSError:
            continue
    return False


def _xpu_devices() -> list[dict[str, Any]]:
    if not _intel_gpu_present():
        return []
    try:
        import torch
    except ImportError:
        return []
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return []
    out = []
    for i in range(xpu.device_count()):
        props = xpu.get_device_properties(i)
        total = getattr(props, "total_memory", None)
        free = None
        try:
            free, total = xpu.mem_get_info(i)
        except Exception:  # older torch: no free figure
            pass
        dev_uuid = getattr(props, "uuid", None)
        out.append({
            "name": f"xpu:{i}",
            "kind": "xpu",
            "label": getattr(props, "name", "Intel GPU"),
            "uuid": str(dev_uuid) if dev_uuid else None,
            "total_gib": _gib(total),
            "free_gib": _gib(free),
            "simulated": False,
        })
    return out


def _mps_devices() -> list[dict[str, Any]]:
    if sys.platform != "darwin":
        return []
    try:
        import torch
    except ImportError:
        return []
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_available():
        return []
    total = None
    try:
        total = torch.mps.recommended_max_memory()
    except Exception:
        pass
    # MPS has no free figure (seed 000: shared MPS cards report no total either for budgets).
    return [{"name": "mps:0", "kind": "mps", "label": "Apple MPS", "uuid": None,
             "total_gib": _gib(total), "free_gib": None, "simulated": False}]


# --- the inventory -------------------------------------------------------------------------------

def simulated_file(home: Path, worker: str) -> Path:
    """Where an agent's simulated cards (and the free figures a test may change) live."""
    return Path(home) / "agents" / f"{worker}-simulated.json"


def write_simulated_file(path: Path, cards: dict[str, dict[str, Any]]) -> None:
    """Atomically write ``{"cards": {name: {...}}}`` (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"simulated": True, "cards": cards}, indent=2))
    os.replace(tmp, path)


def set_simulated_free(home: Path, worker: str, device: str, free_gib: float) -> None:
    """Change a simulated card's free figure while its agent runs (tests, demos)."""
    path = simulated_file(home, worker)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DeviceSpecError(f"no simulated cards for worker {worker!r} ({path}): {exc}") from None
    cards = data.get("cards") or {}
    device = normalize_device(device)
    if device not in cards:
        raise DeviceSpecError(f"worker {worker!r} simulates {', '.join(cards) or 'no cards'}, not {device}")
    total = float(cards[device]["total_gib"])
    if not 0 <= float(free_gib) <= total:
        raise DeviceSpecError(f"free_gib must be between 0 and the card's {total} GiB")
    cards[device]["free_gib"] = float(free_gib)
    write_simulated_file(path, cards)


class Inventory:
    """What one agent offers: CPU always, then real or simulated cards, filtered by ``--devices``."""

    def __init__(
        self,
        worker: str,
        home: Path,
        devices: list[str] | None = None,
        simulate: list[SimulatedCard] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.worker = worker
        self.only = devices
        self.simulate = list(simulate or [])
        self.env = dict(os.environ if env is None else env)
        self.sim_path = simulated_file(home, worker) if self.simulate else None
        self._sim_last: dict[str, dict[str, Any]] = {}
        self._nvml: _Nvml | None = None
        self._other_present: bool | None = None
        self.notes: list[str] = []
        if self.simulate:
            cards = {
                c.name: {"label": f"Simulated GPU ({c.total_gib:g} GiB)", "total_gib": c.total_gib,
                         "free_gib": c.total_gib, "uuid": c.uuid}
                for c in self.simulate
            }
            self._sim_last = cards
            write_simulated_file(self.sim_path, cards)

    @property
    def simulated(self) -> bool:
        """True when this agent's cards are simulated (W6)."""
        return bool(self.simulate)

    def _simulated_devices(self) -> list[dict[str, Any]]:
        try:
            data = json.loads(self.sim_path.read_text())
            cards = data["cards"]
            for c in self.simulate:  # keep name/total/uuid from the command line; take free from file
                free = float(cards[c.name]["free_gib"])
                if not 0 <= free <= c.total_gib:
                    raise ValueError(f"{c.name} free_gib {free} outside 0..{c.total_gib}")
                self._sim_last[c.name]["free_gib"] = free
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("simulated cards file %s unreadable (%s); keeping the last figures", self.sim_path, exc)
        return [
            {"name": c.name, "kind": "cuda", "label": self._sim_last[c.name]["label"], "uuid": c.uuid,
             "total_gib": c.total_gib, "free_gib": round(self._sim_last[c.name]["free_gib"], 3),
             "simulated": True}
            for c in self.simulate
        ]

    def _real_accelerators(self) -> list[dict[str, Any]]:
        if self._nvml is None:
            self._nvml = _Nvml()
            if not self._nvml.ok:
                self.notes.append(f"CUDA: {self._nvml.reason}")
        out = self._nvml.devices(self.env)
        if self._other_present is None or self._other_present:
            try:
                other = _xpu_devices() + _mps_devices()
            except Exception as exc:  # a broken torch build must not stop the agent
                if self._other_present is None:
                    self.notes.append(f"xpu/mps probe failed: {exc}")
                other = []
            if self._other_present is None:
                self._other_present = bool(other)  # probe torch again only where it found cards
            out += other
        return out

    def snapshot(self) -> list[dict[str, Any]]:
        """Devices offered now, with total/free memory (GiB) and UUIDs; CPU first."""
        accel = self._simulated_devices() if self.simulate else self._real_accelerators()
        if self.only is not None:
            accel = [d for d in accel if d["name"] in self.only]
            # --devices order is the order the worker lists its cards in
            accel.sort(key=lambda d: self.only.index(d["name"]))
        return [_cpu_device(), *accel]

    def check_requested(self) -> list[str]:
        """Names in ``--devices`` that this machine does not have (empty when all exist)."""
        if self.only is None:
            return []
        have = {d["name"] for d in self.snapshot()}
        return [d for d in self.only if d != "cpu" and d not in have]


def environment_summary(inventory: Inventory) -> dict[str, Any]:
    """A short description of the agent's environment for the Workers panel."""
    import platform

    summary: dict[str, Any] = {
        "hostname": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "simulated": inventory.simulated,
    }
    try:  # the torch version without importing torch (import costs seconds)
        from importlib.metadata import version

        summary["torch"] = version("torch")
    except Exception:
        summary["torch"] = None
    if inventory.notes:
        summary["notes"] = list(inventory.notes)
    return summary

"""In-run device names (docs/sidecar.md): a worker run's cards renumbered from 0 in the order listed."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .names import DeviceSpecError, device_index, device_kind, normalize_device


@dataclass
class Renumbering:
    """How a worker run sees its cards: run ``cuda:0`` = ``aliases["cuda:0"]`` on the machine."""

    run_devices: list[str]
    aliases: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)


def parent_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [p.strip() for p in value.split(",") if p.strip()]


def renumber(machine_devices: list[str], parent_env: dict[str, str] | None = None) -> Renumbering:
    """Renumber a run's machine devices from 0, per kind, in the order listed (docs/sidecar.md).

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
        parent = parent_list(parent_env.get(var))
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

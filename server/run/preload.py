"""What the warm parent imports once so forked run processes start in milliseconds (see warm.py).

Everything a run needs before its first node: torch, the node modules and what they import lazily
(scikit-learn's bundled datasets, safetensors), the runner and the graph executor, and a ComfyUI run's client. Nothing here
touches a device: CUDA must never be initialised in a process that forks.
"""

from __future__ import annotations

import gc
import importlib
import logging

log = logging.getLogger("xpufleet.launcher")

MODULES = (
    "torch",
    "torch.nn",
    "torch.optim",
    "torch.utils.data",
    "torch._dynamo",  # the optimizers' first step imports it (with sympy): about a second, once
    "torch.distributed",  # ddp ranks (importing it touches no device and opens no socket)
    "torch.nn.parallel",
    "torch.utils.data.distributed",
    "xpufleet.nodes",
    "xpufleet.nodes.trainer",
    "xpufleet.nodes.ddp",
    "xpufleet.nodes.tensordata",
    "xpufleet.server.run.runner",
    "xpufleet.server.run.executor",
    # a ComfyUI run's process: its client (aiohttp alone is ~160 ms to import, most of a warm run's queue cost)
    "aiohttp",
    "xpufleet.server.run.comfy_client",
)
OPTIONAL = ("sklearn.datasets", "sklearn.model_selection", "sklearn.metrics", "safetensors.torch", "numpy")

for _name in MODULES:
    importlib.import_module(_name)
for _name in OPTIONAL:
    try:
        importlib.import_module(_name)
    except ImportError:  # an optional package: a run that needs it imports (and fails) on its own
        pass

_torch = importlib.import_module("torch")
if _torch.cuda.is_initialized():  # a preloaded module touched CUDA: forked children could not use it
    raise RuntimeError("CUDA was initialised while preloading the warm start parent")

# What a forked run freezes (warm.py ``member_main``), counted once here for its facts: counting the frozen
# generation in each child (gc.get_freeze_count) walks every inherited object and faults its page in:
# 40 ms of every warm run's start, measured.
OBJECTS = len(gc.get_objects())

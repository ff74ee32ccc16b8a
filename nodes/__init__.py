"""XPU Fleet graph nodes (ComfyUI V1 node classes), one module per domain; ``_NODES`` is the one list of them."""

from __future__ import annotations

from . import data, io, models, training

# In the order ComfyUI's menu lists them. A node's type is its class name (nodes/types.py names each); its
# display name is in its class line (nodes/contract.py).
_NODES: tuple[type, ...] = (
    data.XPUDataset, data.XPUDataLoader, models.XPUMLP, models.XPUCNN, models.XPUSequential,
    training.XPUOptimizer, training.XPULRScheduler, training.XPULoss, training.XPUTrainingLoop, training.XPUEvaluate,
    io.XPUModelSaver, io.XPUModelLoader, io.XPUPredict,
)
NODE_CLASS_MAPPINGS: dict[str, type] = {cls.__name__: cls for cls in _NODES}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {cls.__name__: cls.DISPLAY_NAME for cls in _NODES}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]

"""The model file ModelSaver writes and ModelLoader reads (docs/nodes.md): weights and the ``xpu_spec``
in safetensors (the spec as JSON metadata) or a plain PyTorch dict read with ``weights_only=True``;
inlined into exported scripts (nodes/lib/__init__.py).
"""

from __future__ import annotations

# --- inlined by xpufleet export from here
import json

MODEL_FORMAT = "xpufleet-model"
MODEL_VERSION = 1
CHECKPOINT_FORMAT = "xpufleet-checkpoint"
CHECKPOINT_VERSION = 1


def checkpoint_state(model, optimizer, scheduler, scaler, spec, epoch, step, reason, epoch_complete, history):
    """What a TrainingLoop checkpoint holds (ModelLoader reads its model; ``resume_from`` all of it);
    ``history`` maps train_loss, val_loss and val_accuracy to their lists so far."""
    return {
        "format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "reason": reason, "epoch": epoch,
        "epoch_complete": epoch_complete, "step": step, "xpu_spec": spec,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        **{name: list(history[name]) for name in ("train_loss", "val_loss", "val_accuracy")},
    }


def write_model_file(model, spec, path, fmt, write_atomic):
    """Write ``model``'s weights and ``spec`` to ``path`` in ``fmt`` through ``write_atomic(path, write)``."""
    import torch

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if fmt == "safetensors":
        from safetensors.torch import save_file

        metadata = {"format": MODEL_FORMAT, "version": str(MODEL_VERSION), "xpu_spec": json.dumps(spec)}
        return write_atomic(path, lambda tmp: save_file(state, str(tmp), metadata=metadata))
    payload = {"format": MODEL_FORMAT, "version": MODEL_VERSION, "xpu_spec": spec, "state_dict": state}
    return write_atomic(path, lambda tmp: torch.save(payload, tmp))


def read_model_file(path):
    """(spec, state_dict) from a saved model (either format) or a TrainingLoop checkpoint."""
    import torch

    if path.suffix.lower() == ".safetensors":
        from safetensors import safe_open
        from safetensors.torch import load_file

        try:
            with safe_open(str(path), framework="pt") as fh:
                meta = fh.metadata() or {}
            state = load_file(str(path))
        except Exception as exc:  # its text may quote the file: name the kind of failure only
            raise ValueError(f"cannot read safetensors file {path}: not a safetensors file "
                             f"({type(exc).__name__})") from None
        raw = meta.get("xpu_spec")
        return (json.loads(raw) if raw and raw != "null" else None), state
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # an unpickling error quotes the file's bytes: name the kind of failure only
        raise ValueError(f"cannot read {path} as a PyTorch model file ({type(exc).__name__}); give a file "
                         f"ModelSaver or a TrainingLoop checkpoint wrote") from None
    if isinstance(payload, dict) and payload.get("format") == MODEL_FORMAT:
        return payload.get("xpu_spec"), payload["state_dict"]
    if isinstance(payload, dict) and payload.get("format") == CHECKPOINT_FORMAT:
        return payload.get("xpu_spec"), payload["model"]
    if isinstance(payload, dict) and all(isinstance(v, torch.Tensor) for v in payload.values()):
        return None, payload  # a bare state_dict: weights without an architecture
    raise ValueError(f"{path} is not a model saved by XPU Fleet (ModelSaver or a TrainingLoop checkpoint)")


def load_weights(module, state, path, error=ValueError):
    """Load ``state`` into ``module`` strictly and put it in eval mode; weights that do not fit the module's
    architecture are an ``error`` naming ``path`` and torch's first line."""
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise error(f"{path}: the weights do not fit the recorded architecture: "
                    f"{str(exc).splitlines()[0]}") from None
    module.eval()
    return module

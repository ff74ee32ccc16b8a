"""The second half of an exported script's library (see export_data.py): loss, precision, the
TrainingLoop and Evaluate nodes, ModelSaver, ModelLoader and Predict. In a script both halves share one
namespace; imported as a module (tests), the names of the first half come from export_data.
"""

from __future__ import annotations

try:  # imported as a module (tests): the first half's names; a script holds both halves in one namespace
    from .export_data import (  # noqa: F401
        DEFAULT_DEVICE,
        OUTPUTS,
        RUN_DIR,
        build_model,
        device_for,
        output_path,
        seed_for,
        warn,
        write_atomic,
    )
except ImportError:  # pragma: no cover - never in the package
    pass

# --- the script library starts here (copied verbatim into exported scripts) ---
import contextlib
import copy
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

# ---------------------------------------------------------------------------------------------------
# Loss and precision
# ---------------------------------------------------------------------------------------------------


class Loss:
    """The Loss node: the mean over the batch, with the target adapted to the outputs."""

    def __init__(self, name, label_smoothing=0.0):
        self.name = name
        self.label_smoothing = float(label_smoothing)
        self.fn = {"cross_entropy": None, "mse": F.mse_loss, "l1": F.l1_loss, "smooth_l1": F.smooth_l1_loss,
                   "bce_with_logits": F.binary_cross_entropy_with_logits}[name]

    def __call__(self, out, y):
        if self.fn is None:
            return F.cross_entropy(out, y, label_smoothing=self.label_smoothing)
        if not y.is_floating_point():
            y = F.one_hot(y, out.shape[1]).to(out.dtype) if out.dim() == 2 and out.shape[1] > 1 and y.dim() == 1 \
                else y.to(out.dtype)
        if y.dim() == 1 and out.dim() == 2 and out.shape[1] == 1:
            y = y.unsqueeze(1)
        return self.fn(out, y.to(out.dtype))


def precision_for(requested, device, label=""):
    """(autocast dtype or None, GradScaler or None, the precision that runs)."""
    if requested == "fp32":
        return None, None, "fp32"
    if requested == "fp16" and device.type == "cpu":
        warn("precision_fallback", f"{label}: fp16 autocast is not supported on the CPU; training in bf16 instead.")
        requested = "bf16"
    if requested == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        warn("precision_fallback", f"{label}: this card does not support bf16; training in fp16 with loss scaling.")
        requested = "fp16"
    if requested == "bf16":
        return torch.bfloat16, None, "bf16"
    return torch.float16, torch.amp.GradScaler(device.type), "fp16"


def autocast(device, dtype):
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------------
# TrainingLoop and Evaluate
# ---------------------------------------------------------------------------------------------------


def accuracy_counts(out, target, loss_name):
    if loss_name == "cross_entropy":
        if target.is_floating_point() and target.shape == out.shape:
            target = target.argmax(dim=1)
        return (out.argmax(dim=1) == target).sum(), int(target.numel())
    if loss_name == "bce_with_logits":
        if not target.is_floating_point() and out.dim() == 2 and out.shape[1] > 1 and target.dim() == 1:
            return (out.argmax(dim=1) == target).sum(), int(target.numel())
        if target.dim() == 1 and out.dim() == 2 and out.shape[1] == 1:
            target = target.unsqueeze(1)
        return ((out > 0) == (target > 0.5)).sum(), int(target.numel())
    return None


def evaluate(model, loader, loss_fn, device, amp_dtype=None):
    """Mean loss per sample and accuracy (float64 sums, as the Evaluate node and the loop's validation)."""
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.float64, device=device)
    n = n_pred = 0
    has_acc = True
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            with autocast(device, amp_dtype):
                out = model(x)
                loss = loss_fn(out, y)
            loss_sum += loss.detach().double() * int(y.shape[0])
            n += int(y.shape[0])
            if has_acc:
                got = accuracy_counts(out.float(), y, loss_fn.name)
                if got is None:
                    has_acc = False
                else:
                    correct += got[0]
                    n_pred += got[1]
    model.train(was_training)
    loss_total, correct_total = float(loss_sum), float(correct)
    return {"loss": loss_total / n if n else float("nan"),
            "accuracy": correct_total / n_pred if has_acc and n_pred else None, "n_samples": n}


def save_checkpoint(model, optimizer, scheduler, scaler, epoch, step, reason, history, epoch_complete, name):
    state = {"format": "xpufleet-checkpoint", "version": 1, "reason": reason, "epoch": epoch,
             "epoch_complete": epoch_complete, "step": step, "xpu_spec": getattr(model, "xpu_spec", None),
             "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict() if scheduler else None,
             "scaler": scaler.state_dict() if scaler is not None else None, **history}
    return write_atomic(RUN_DIR / "checkpoints" / name, lambda tmp: torch.save(state, tmp))


def train(model, loader, make_optimizer, loss_fn, label, epochs=10, max_steps=0, device="auto", precision="fp32",
          val_loader=None, make_scheduler=None, scheduler_per_step=False, accumulate_steps=1, grad_clip_norm=0.0,
          checkpoint_every=0, checkpoint_every_steps=0, val_every_steps=0, seed=0, tensorboard=True):
    """The TrainingLoop node: trains a copy of ``model``; returns it (eval mode) and the metrics."""
    seed = seed_for(seed)
    device = device_for(device, label)
    amp_dtype, scaler, precision = precision_for(precision, device, label)
    model = copy.deepcopy(model).to(device)
    optimizer = make_optimizer(model.parameters())
    n_batches, accum = len(loader), int(accumulate_steps)
    total = math.ceil(n_batches / accum) * int(epochs)
    total_steps = min(total, int(max_steps)) if max_steps else total
    scheduler = make_scheduler(optimizer, int(epochs), total_steps) if make_scheduler else None
    per_step = scheduler is not None and scheduler_per_step
    last_group_start = (n_batches // accum) * accum
    last_group = n_batches - last_group_start
    params = [p for p in model.parameters() if p.requires_grad]
    history = {"train_loss": [], "val_loss": [], "val_accuracy": []}
    val_loss_step, checkpoints = [], []
    board = None
    if tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter

            board = SummaryWriter(log_dir=str(RUN_DIR / "tensorboard"))
        except Exception as exc:  # tensorboard not installed
            print(f"TensorBoard event files off: {exc}")

    def scalar(name, value, step):
        if board is not None and value is not None and math.isfinite(value):
            board.add_scalar(name, value, step)

    def checkpoint(name, reason, epoch_complete=True):
        path = save_checkpoint(model, optimizer, scheduler, scaler, epoch_done, step, reason, history,
                               epoch_complete, name)
        checkpoints.append(str(path))

    def validate():
        if val_loader is None or len(val_loader) == 0:
            return None
        res = evaluate(model, val_loader, loss_fn, device, amp_dtype)
        val_loss_step.append([step, res["loss"]])
        scalar("val_loss_step", res["loss"], step)
        return res

    step = epoch_done = samples = 0
    last_val_step, last_val = -1, None
    started = time.perf_counter()
    rng = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
    with rng:
        if seed is not None:
            torch.manual_seed(seed)
        optimizer.zero_grad(set_to_none=True)
        done = bool(max_steps) and step >= max_steps
        while epoch_done < epochs and not done:
            model.train()
            loss_sum, batches = 0.0, 0
            for i, (x, y) in enumerate(loader):
                x, y = x.to(device), y.to(device)
                with autocast(device, amp_dtype):
                    loss = loss_fn(model(x), y)
                back = loss if accum == 1 else loss / (last_group if i >= last_group_start else accum)
                (scaler.scale(back) if scaler is not None else back).backward()
                loss_sum += loss.item()
                batches += 1
                samples += int(y.shape[0])
                if accum == 1 or (i + 1) % accum == 0 or i + 1 == n_batches:
                    if scaler is not None:
                        if grad_clip_norm:
                            scaler.unscale_(optimizer)
                            torch.nn.utils.clip_grad_norm_(params, grad_clip_norm)
                        scaler.step(optimizer)
                        scaler.update()
                    else:
                        if grad_clip_norm:
                            torch.nn.utils.clip_grad_norm_(params, grad_clip_norm)
                        optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    step += 1
                    if per_step:
                        scheduler.step()
                    if checkpoint_every_steps and step % checkpoint_every_steps == 0:
                        checkpoint(f"step_{step:08d}.pt", "step", epoch_complete=False)
                    if val_every_steps and val_loader is not None and len(val_loader) and step % val_every_steps == 0:
                        last_val_step, last_val = step, validate()
                    if max_steps and step >= max_steps:
                        done = True
                if done:
                    break
            if batches == n_batches or not done:
                epoch_done += 1
            train_loss = loss_sum / max(1, batches)
            history["train_loss"].append(train_loss)
            scalar("train_loss", train_loss, step)
            print(f"{label}: epoch {epoch_done}/{epochs}, step {step}, train_loss {train_loss:.6f}", flush=True)
            val = validate() if last_val_step != step else last_val
            if val is not None:
                last_val_step, last_val = step, val
                history["val_loss"].append(val["loss"])
                scalar("val_loss", val["loss"], step)
                if val["accuracy"] is not None:
                    history["val_accuracy"].append(val["accuracy"])
                    scalar("val_accuracy", val["accuracy"], step)
            if scheduler is not None and not per_step:
                scheduler.step()
            if checkpoint_every and (batches == n_batches or not done) and epoch_done % checkpoint_every == 0:
                checkpoint(f"epoch_{epoch_done:04d}.pt", "epoch")
    duration = time.perf_counter() - started
    if board is not None:
        board.close()
    model.eval()
    h = history
    return model, {
        "strategy": "single", "world_size": 1, "device": str(device), "precision": precision,
        "epochs_completed": epoch_done, "steps": step, "effective_batch_size": int(loader.batch_size) * accum,
        "train_loss": h["train_loss"], "val_loss": h["val_loss"], "val_accuracy": h["val_accuracy"],
        "val_loss_step": val_loss_step, "checkpoints": checkpoints,
        "final_train_loss": h["train_loss"][-1] if h["train_loss"] else None,
        "final_val_loss": h["val_loss"][-1] if h["val_loss"] else None,
        "final_val_accuracy": h["val_accuracy"][-1] if h["val_accuracy"] else None,
        "duration_s": duration, "samples_per_s": samples / duration if duration > 0 else None,
    }


def evaluate_node(model, loader, label, device="auto", precision="fp32", loss_fn=None):
    """The Evaluate node."""
    device = device_for(device, label)
    amp_dtype, _, _ = precision_for(precision, device, label)
    spec = getattr(model, "xpu_spec", None) or {}
    loss_fn = loss_fn or Loss("cross_entropy" if spec.get("task") == "classification" else "mse")
    with torch.inference_mode():
        res = evaluate(model.to(device), loader, loss_fn, device, amp_dtype)
    return {"loss": res["loss"], "accuracy": res["accuracy"], "n_samples": res["n_samples"], "loss_name": loss_fn.name}


# ---------------------------------------------------------------------------------------------------
# ModelSaver, ModelLoader, Predict
# ---------------------------------------------------------------------------------------------------


def save_model(model, filename, fmt="safetensors", location="outputs", overwrite=True):
    """The ModelSaver node: weights and the architecture (loadable by XPU Fleet's ModelLoader too)."""
    path = output_path(filename, location)
    if path.exists() and not overwrite:
        raise SystemExit(f"ModelSaver: {path} exists and overwrite is off")
    spec = getattr(model, "xpu_spec", None)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if fmt == "safetensors":
        from safetensors.torch import save_file

        meta = {"format": "xpufleet-model", "version": "1", "xpu_spec": json.dumps(spec)}
        write_atomic(path, lambda tmp: save_file(state, str(tmp), metadata=meta))
    else:
        payload = {"format": "xpufleet-model", "version": 1, "xpu_spec": spec, "state_dict": state}
        write_atomic(path, lambda tmp: torch.save(payload, tmp))
    print(f"ModelSaver: saved {path}")
    return str(path)


def load_model(filename):
    """The ModelLoader node: a file ModelSaver wrote (either format) or a TrainingLoop checkpoint."""
    p = Path(os.path.expanduser(str(filename).strip()))
    candidates = [p] if p.is_absolute() else [OUTPUTS / p, RUN_DIR / p, Path.cwd() / p]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise SystemExit(f"ModelLoader: model file {filename!r} not found; looked in: "
                         f"{', '.join(map(str, candidates))}")
    if found.suffix.lower() == ".safetensors":
        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(str(found), framework="pt") as fh:
            spec = json.loads((fh.metadata() or {}).get("xpu_spec") or "null")
        state = load_file(str(found))
    else:
        payload = torch.load(found, map_location="cpu", weights_only=True)
        spec = payload.get("xpu_spec")
        state = payload["model"] if payload.get("format") == "xpufleet-checkpoint" else payload["state_dict"]
    model = build_model(spec)
    model.load_state_dict(state, strict=True)
    model.eval()
    print(f"ModelLoader: loaded {found}")
    return model


def predict(model, source, label, output="auto", device="auto", batch_size=256, precision="fp32", show=20):
    """The Predict node: (predictions, summary); ``source`` is a DataLoader or a dataset."""
    device = device_for(device, label)
    amp_dtype, _, _ = precision_for(precision, device, label)
    model = model.to(device)
    if isinstance(source, TensorDataset):
        source = DataLoader(source, batch_size=int(batch_size), shuffle=False)
    outs, ys = [], []
    model.eval()
    with torch.inference_mode():
        for x, y in source:
            with autocast(device, amp_dtype):
                outs.append(model(x.to(device)).float().cpu())
            ys.append(y)
    raw, targets = torch.cat(outs), torch.cat(ys)
    spec = getattr(model, "xpu_spec", None) or {}
    classifier = spec.get("task") == "classification" or (spec.get("task") is None and not targets.is_floating_point())
    mode = output if output != "auto" else ("classes" if classifier else "raw")
    if mode == "classes":
        preds = (raw > 0).long().squeeze(1) if raw.dim() == 2 and raw.shape[1] == 1 else raw.argmax(dim=1)
    elif mode == "probabilities":
        preds = torch.sigmoid(raw) if raw.dim() == 2 and raw.shape[1] == 1 else torch.softmax(raw, dim=1)
    else:
        preds = raw
    lines = [f"{preds.shape[0]} predictions ({mode}), shape {list(preds.shape)}"]
    result = {"n": int(preds.shape[0]), "mode": mode}
    if mode == "classes" and not targets.is_floating_point():
        result["accuracy"] = (preds == targets.view(-1)).double().mean().item()
        lines.append(f"accuracy vs labels {result['accuracy']:.4f}")
    head = preds[: int(show)].tolist()
    if mode == "classes" and spec.get("classes"):
        head = [spec["classes"][i] if 0 <= i < len(spec["classes"]) else i for i in head]
    if show:
        lines.append(f"first {len(head)}: {head}")
    result["summary"] = "\n".join(lines)
    print(f"{label}: " + "; ".join(lines[:2]))
    return preds, result

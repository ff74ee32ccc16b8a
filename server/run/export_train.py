"""The second half of an exported script's own code (see export_data.py): the TrainingLoop, Evaluate,
ModelSaver, ModelLoader and Predict nodes as functions, calling the node library (``nodes/lib/``: the
loss, precision, optimizer step, evaluation, model file and prediction figures). In a script everything
shares one namespace; imported as a module (tests), the names come from export_data and the library.
"""

from __future__ import annotations

# In a script these precede this code in one namespace; imported as a module (tests), from here.
from ...nodes.lib.evaluation import evaluate, summarise_predictions
from ...nodes.lib.losses import LossFn
from ...nodes.lib.modelfile import checkpoint_state, load_weights, read_model_file, write_model_file
from ...nodes.lib.optim import optimizer_step, optimizer_steps
from ...nodes.lib.precision import autocast, autocast_dtype, choose_precision
from .export_data import OUTPUTS, RUN_DIR, build_model, device_for, output_path, seed_for, warn, write_atomic

__all__ = ["evaluate_node", "load_model", "precision_for", "predict", "save_checkpoint", "save_model", "train"]

# --- the script library starts here (copied verbatim into exported scripts) ---
import contextlib
import copy
import math
import os
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

# ---------------------------------------------------------------------------------------------------
# Precision (what runs: nodes/lib/precision.py)
# ---------------------------------------------------------------------------------------------------


def precision_for(requested, device, label=""):
    """(autocast dtype or None, GradScaler or None, the precision that runs)."""
    name, why = choose_precision(requested, device)
    if why is not None:
        warn("precision_fallback", f"{label}: {why}")
    scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None
    return autocast_dtype(name), scaler, name


# ---------------------------------------------------------------------------------------------------
# TrainingLoop and Evaluate (the loss, the step and the evaluation: nodes/lib/)
# ---------------------------------------------------------------------------------------------------


def save_checkpoint(model, optimizer, scheduler, scaler, epoch, step, reason, history, epoch_complete, name):
    state = checkpoint_state(model, optimizer, scheduler, scaler, getattr(model, "xpu_spec", None), epoch, step,
                             reason, epoch_complete, history)
    return write_atomic(RUN_DIR / "checkpoints" / name, lambda tmp: torch.save(state, tmp))


def train(model, loader, optimizer_factory, loss_fn, label, epochs=10, max_steps=0, device="auto", precision="fp32",
          val_loader=None, scheduler_factory=None, scheduler_per_step=False, accumulate_steps=1, grad_clip_norm=0.0,
          checkpoint_every=0, checkpoint_every_steps=0, val_every_steps=0, seed=0, tensorboard=True):
    """The TrainingLoop node: trains a copy of ``model``; returns it (eval mode) and the metrics."""
    seed = seed_for(seed)
    device = device_for(device, label)
    amp_dtype, scaler, precision = precision_for(precision, device, label)
    model = copy.deepcopy(model).to(device)
    optimizer = optimizer_factory(model.parameters())
    n_batches, accum = len(loader), int(accumulate_steps)
    total_steps = optimizer_steps(n_batches, accum, epochs, max_steps)
    scheduler = scheduler_factory(optimizer, int(epochs), total_steps) if scheduler_factory else None
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
                    optimizer_step(optimizer, scaler, params, grad_clip_norm)
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
    loss_fn = loss_fn or LossFn("cross_entropy" if spec.get("task") == "classification" else "mse")
    with torch.inference_mode():
        res = evaluate(model.to(device), loader, loss_fn, device, amp_dtype)
    return {"loss": res["loss"], "accuracy": res["accuracy"], "n_samples": res["n_samples"], "loss_name": loss_fn.name}


# ---------------------------------------------------------------------------------------------------
# ModelSaver, ModelLoader, Predict (the file format and the prediction figures: nodes/lib/)
# ---------------------------------------------------------------------------------------------------


def save_model(model, filename, fmt="safetensors", location="outputs", overwrite=True):
    """The ModelSaver node: weights and the architecture (loadable by XPU Fleet's ModelLoader too)."""
    path = output_path(filename, location)
    if path.exists() and not overwrite:
        raise SystemExit(f"ModelSaver: {path} exists and overwrite is off")
    write_model_file(model, getattr(model, "xpu_spec", None), path, fmt, write_atomic)
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
    spec, state = read_model_file(found)
    model = load_weights(build_model(spec), state, found)  # nodes/lib/modelfile.py, inlined
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
    preds, mode, accuracy, lines = summarise_predictions(torch.cat(outs), torch.cat(ys), output,
                                                         getattr(model, "xpu_spec", None), show)
    result = {"n": int(preds.shape[0]), "mode": mode}
    if accuracy is not None:
        result["accuracy"] = accuracy
    result["summary"] = "\n".join(lines)
    print(f"{label}: " + "; ".join(lines[:2]))
    return preds, result

"""The torch optimizer and learning-rate scheduler the Optimizer and LR Scheduler nodes describe
(docs/nodes.md); inlined into exported scripts (nodes/lib/__init__.py).
"""

from __future__ import annotations

# --- inlined by xpufleet export from here
import math


def make_optimizer(params, name="adam", lr=1e-3, weight_decay=0.0, momentum=0.9, nesterov=False, beta1=0.9,
                   beta2=0.999, eps=1e-8):
    """The torch optimizer ``name`` over ``params``; a chosen momentum of 0.0 stays 0.0."""
    import torch

    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay)
    if name == "sgd_momentum":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    return torch.optim.RMSprop(params, lr=lr, momentum=momentum, eps=eps, weight_decay=weight_decay)


def steps_per_interval(name, interval):
    """Whether a schedule steps per optimizer step (one-cycle always does) rather than per epoch."""
    return name == "onecycle" or interval == "step"


def make_scheduler(optimizer, epochs, total_steps, name="none", interval="epoch", step_size=10, gamma=0.1, t_max=0,
                   eta_min=0.0, max_lr=0.0, pct_start=0.3):
    """The torch scheduler ``name`` (None for "none"); ``total_steps`` = optimizer steps in the whole run."""
    import torch

    sched = torch.optim.lr_scheduler
    if name == "none":
        return None
    if name == "step":
        return sched.StepLR(optimizer, step_size=step_size, gamma=gamma)
    if name == "exponential":
        return sched.ExponentialLR(optimizer, gamma=gamma)
    span = max(1, total_steps if steps_per_interval(name, interval) else epochs)
    if name == "cosine":
        return sched.CosineAnnealingLR(optimizer, T_max=t_max or span, eta_min=eta_min)
    base = optimizer.param_groups[0]["lr"]
    return sched.OneCycleLR(optimizer, max_lr=max_lr or base * 10, total_steps=max(1, total_steps),
                            pct_start=pct_start)


def optimizer_steps(n_batches, accumulate_steps, epochs, max_steps=0):
    """Optimizer steps a loop makes: one per group of ``accumulate_steps`` batches, capped by ``max_steps``."""
    total = math.ceil(int(n_batches) / int(accumulate_steps)) * int(epochs)
    return min(total, int(max_steps)) if max_steps else total


def optimizer_step(optimizer, scaler, params, clip):
    """One optimizer step: unscale (fp16) and clip the gradients to norm ``clip`` when set, then step."""
    import torch

    if scaler is not None:
        if clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, clip)
        scaler.step(optimizer)
        scaler.update()
    else:
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)

"""ComfyUI's Cancel on both sides of its 2026-04 change (commit 9949c19c): its ``InterruptProcessingException``
derived from ``Exception`` before and from ``BaseException`` since. Either way a hosted node that stops
raises ComfyUI's own exception (its executor then reports an interruption, not a node error), after the
training loop wrote its interrupt checkpoint."""

from __future__ import annotations

import pytest

from xpufleet.nodes import runtime


class _OldInterrupt(Exception):
    """ComfyUI up to early 2026."""


class _NewInterrupt(BaseException):
    """ComfyUI since commit 9949c19c (0.3x, e.g. 0.33.0)."""


@pytest.mark.parametrize("interrupt", [_OldInterrupt, _NewInterrupt], ids=["Exception", "BaseException"])
def test_a_hosted_stop_raises_comfyuis_interrupt_whatever_its_base(comfy_host, digits, loaders, build_mlp,
                                                                   train_node, tmp_path, monkeypatch, interrupt):
    import comfy.model_management as mm

    monkeypatch.setattr(mm, "InterruptProcessingException", interrupt)
    monkeypatch.setattr(mm, "interrupt_processing", True)  # Cancel pressed
    assert runtime.hosted_interrupt() is interrupt
    tl, _ = loaders
    with pytest.raises(interrupt, match=r"stopped at epoch 1, batch 1, step 1; interrupt checkpoint written"):
        train_node(build_mlp(digits[2]), tl, epochs=2, checkpoint_dir="ck")
    assert (tmp_path / "comfy" / "output" / "xpufleet" / "ck" / "interrupt.pt").is_file()
    assert mm.interrupt_processing is False  # cleared, as ComfyUI clears it when it raises its own


@pytest.mark.parametrize("interrupt", [_OldInterrupt, _NewInterrupt], ids=["Exception", "BaseException"])
def test_comfyuis_progress_hook_interrupt_is_left_to_the_loops_own_check(comfy_host, monkeypatch, interrupt):
    """ComfyUI's progress hook raises its interrupt on Cancel: caught there whatever its base class, and the
    flag put back so the loop's per-batch check stops after the batch (with its checkpoint)."""
    import comfy.model_management as mm
    import comfy.utils as utils

    monkeypatch.setattr(mm, "InterruptProcessingException", interrupt)

    def hook(value, total, preview=None, node_id=None):
        mm.interrupt_current_processing(False)  # as ComfyUI's hook does before raising
        raise interrupt()

    monkeypatch.setattr(utils, "PROGRESS_BAR_HOOK", hook, raising=False)
    monkeypatch.setattr(utils, "ProgressBar", _bar(hook))
    assert runtime._hosted.update(1, 10) is False
    assert runtime.should_stop() is True


def test_outside_comfyui_there_is_no_hosted_interrupt_and_a_stop_is_runstopped(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "comfy.model_management", raising=False)
    assert runtime.hosted_interrupt() is None
    assert type(runtime.stopped("why")) is runtime.RunStopped


def _bar(hook):
    class Bar:
        def __init__(self, total):
            self.total = total

        def update_absolute(self, value, total=None, preview=None):
            hook(value, total or self.total)

    return Bar

"""reading.py: the typed form of an agent's ``comfyui`` message."""

from __future__ import annotations

from xpufleet.server.comfyflow.reading import STATE_PROBING, reading_of, summary
from xpufleet.server.contracts import agent_protocol as P

from .readings import message


def test_reading_of_a_message_keeps_classes_inputs_options_outputs_and_files() -> None:
    r = reading_of(message(models={"upscale_models": ["sub\\x4.pth", "x2.safetensors"]}))
    assert r.ok and r.version == "0.3.64"
    spec = r.classes["ImageScale"]
    assert spec.outputs == ("IMAGE",)
    assert spec.inputs["crop"].options == ("disabled", "center") and spec.inputs["crop"].required
    assert spec.inputs["width"].options is None
    assert r.has_file("upscale_models", "sub/x4.pth") and r.has_file("upscale_models", "sub\\x4.pth")
    assert not r.has_file("checkpoints", "x2.safetensors")
    assert r.summary() == {"state": "ready", "version": "0.3.64", "classes": 6, "error": None}


def test_a_failed_reading_and_the_probing_summary() -> None:
    r = reading_of({"ok": False, "error": "main.py not found"})
    assert r.state == "failed" and not r.classes
    assert summary("failed", r)["error"] == "main.py not found"
    assert summary(STATE_PROBING, None) == {"state": "probing", "version": None, "classes": 0, "error": None}


def test_the_protocol_model_accepts_the_test_message() -> None:
    P.ComfyuiInfo.model_validate(message())

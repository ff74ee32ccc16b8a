"""Shared test data: ComfyUI readings as an agent's ``comfyui`` message carries them, and workflows."""

from __future__ import annotations

from typing import Any


def inp(type_: str, required: bool = True, options: list[Any] | None = None) -> dict[str, Any]:
    return {"type": type_, "required": required, "options": options}


CLASSES: dict[str, Any] = {
    "EmptyImage": {"inputs": {"width": inp("INT"), "height": inp("INT"), "batch_size": inp("INT"),
                              "color": inp("INT")}, "outputs": ["IMAGE"]},
    "ImageScale": {"inputs": {"image": inp("IMAGE"), "upscale_method": inp("COMBO", options=["nearest-exact",
                                                                                            "bilinear"]),
                              "width": inp("INT"), "height": inp("INT"),
                              "crop": inp("COMBO", options=["disabled", "center"])}, "outputs": ["IMAGE"]},
    "SaveImage": {"inputs": {"images": inp("IMAGE"), "filename_prefix": inp("STRING")}, "outputs": []},
    "UpscaleModelLoader": {"inputs": {"model_name": inp("COMBO", options=["x2.safetensors"])},
                           "outputs": ["UPSCALE_MODEL"]},
    "ImageUpscaleWithModel": {"inputs": {"upscale_model": inp("UPSCALE_MODEL"), "image": inp("IMAGE")},
                              "outputs": ["IMAGE"]},
    "KSampler": {"inputs": {"seed": inp("INT"), "steps": inp("INT")}, "outputs": ["LATENT"]},
}


def message(classes: dict[str, Any] | None = None, models: dict[str, list[str]] | None = None,
            ok: bool = True, error: str | None = None) -> dict[str, Any]:
    """A ``comfyui`` message (without ``type``)."""
    return {"ok": ok, "error": error, "version": "0.3.64", "path": "/opt/ComfyUI",
            "classes": CLASSES if classes is None else classes,
            "models": {"upscale_models": ["x2.safetensors"]} if models is None else models}


def core_workflow(seed_node: bool = False) -> dict[str, Any]:
    """EmptyImage -> ImageScale -> SaveImage (needs no model file)."""
    g: dict[str, Any] = {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "bilinear",
                                                       "width": 32, "height": 32, "crop": "disabled"}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "t"}},
    }
    return g


def upscale_workflow(model: str = "x2.safetensors") -> dict[str, Any]:
    """EmptyImage -> ImageUpscaleWithModel(UpscaleModelLoader) -> SaveImage."""
    return {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
        "2": {"class_type": "UpscaleModelLoader", "inputs": {"model_name": model}},
        "3": {"class_type": "ImageUpscaleWithModel", "inputs": {"upscale_model": ["2", 0], "image": ["1", 0]}},
        "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "u"}},
    }

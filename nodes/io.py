"""Model I/O nodes (docs/nodes.md): ModelSaver, ModelLoader, Predict.

Both file formats carry the model's ``xpu_spec`` (builder + resolved arguments) beside its weights, so
ModelLoader rebuilds the same architecture and a reloaded model predicts exactly what the saved one
did. safetensors keeps the spec as JSON in the header metadata; the PyTorch format is a plain dict
``{"format", "version", "xpu_spec", "state_dict"}`` read back with ``torch.load(weights_only=True)``
(no pickled code is ever executed). ModelLoader also reads TrainingLoop checkpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..common import atomic
from . import device as devmod
from . import hostmode, mounts, paths, runtime
from . import types as T
from .lib.evaluation import summarise_predictions
from .lib.modelfile import MODEL_FORMAT, MODEL_VERSION, read_model_file, write_model_file
from .models import build_model, spec_of

__all__ = ["MODEL_FORMAT", "MODEL_VERSION", "XPUModelLoader", "XPUModelSaver", "XPUPredict", "load_model",
           "read_model_file", "save_model"]
from .training import node_label

_EXTENSIONS = {"safetensors": (".safetensors",), "pytorch": (".pt", ".pth")}


def _target_path(filename: str, fmt: str, location: str) -> Path:
    if fmt not in _EXTENSIONS:
        raise ValueError(f"format must be one of {', '.join(_EXTENSIONS)}, got {fmt!r}")
    path = paths.resolve_output_path(filename, location, "ModelSaver: filename")
    suffix = path.suffix.lower()
    if not suffix:
        return path.with_suffix(_EXTENSIONS[fmt][0])
    if suffix not in _EXTENSIONS[fmt]:
        other = next((f for f, exts in _EXTENSIONS.items() if suffix in exts), None)
        hint = f" (that is the {other} format's extension)" if other else ""
        raise ValueError(f"file {path.name!r} does not match format {fmt!r}{hint}: use a name ending in "
                         f"{' or '.join(_EXTENSIONS[fmt])}, or change the format")
    return path


def save_model(model: Any, path: Path, fmt: str) -> Path:
    """Write ``model``'s weights and spec to ``path`` atomically in ``fmt``."""
    return write_model_file(model, spec_of(model), path, fmt, atomic.write_atomic)


def load_model(path: Path) -> Any:
    """Rebuild the model saved at ``path`` (on the CPU, in eval mode)."""
    spec, state = read_model_file(path)
    if spec is None:
        raise ValueError(f"{path} holds weights but no architecture spec, so the model cannot be rebuilt; save "
                         f"models built by the MLP/CNN/Sequential nodes with ModelSaver")
    model = build_model(spec)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"{path}: the weights do not fit the recorded architecture: "
                         f"{str(exc).splitlines()[0]}") from None
    model.eval()
    return model


class XPUModelSaver:
    """ModelSaver node (output node): weights + architecture, safetensors or PyTorch format."""

    DESCRIPTION = ("Saves a model with its architecture so ModelLoader can rebuild it. The filename is relative "
                   "to the outputs folder (ComfyUI's output/xpufleet, else $XPUFLEET_HOME/outputs) or the run "
                   "directory, and stays inside it (no '..', no absolute path, no symlink leading out). The file "
                   "is written to a temp file and renamed, never half written.")
    CATEGORY = T.CATEGORY_IO
    FUNCTION = "save"
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("path",)
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "model": (T.MODEL, {"tooltip": "the model to save (from a builder, TrainingLoop or ModelLoader)"}),
                "filename": ("STRING", {"default": "models/model.safetensors",
                                        "tooltip": "relative to the location below, and inside it "
                                                   "(no '..', not absolute)"}),
                "format": (T.MODEL_FORMATS, {"default": "safetensors",
                                             "tooltip": "safetensors (.safetensors) or PyTorch (.pt / .pth)"}),
                "location": (T.SAVE_LOCATIONS, {"default": "outputs",
                                                "tooltip": "the outputs folder, or this run's directory"}),
            },
            "optional": {"overwrite": ("BOOLEAN", {"default": True, "tooltip": "replace an existing file"})},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, filename: Any = None) -> bool | str:
        """Refuse a filename that cannot stay inside its folder before anything runs (a linked
        filename, known only at run time, is checked when the node saves)."""
        if filename is None:
            return True
        if not isinstance(filename, str):
            return "filename must be a string"
        problem = paths.relative_path_problem(filename)
        return True if problem is None else (f"filename {problem}; files go inside the outputs folder or the run "
                                             f"directory: give a relative path like 'models/mlp.safetensors'")

    def save(self, model: Any, filename: str, format: str = "safetensors", location: str = "outputs",
             overwrite: bool = True) -> dict[str, Any]:
        path = _target_path(filename, format, location)
        if path.exists() and not overwrite:
            raise ValueError(f"ModelSaver: {path} exists and overwrite is off; choose another filename")
        if spec_of(model) is None:
            runtime.warn("model_spec_missing", "ModelSaver: this model did not come from an XPU Fleet model builder; "
                         "its weights are saved but ModelLoader cannot rebuild it")
        saved = save_model(model, path, format)
        runtime.artifact(saved, "model", format=format)
        runtime.info(f"ModelSaver: saved {saved}")
        return {"ui": {"text": [str(saved)]}, "result": (str(saved),)}


class XPUModelLoader:
    """ModelLoader node: rebuilds a model saved by ModelSaver (either format) or a checkpoint."""

    DESCRIPTION = ("Loads a model saved by ModelSaver (safetensors or PyTorch) or a TrainingLoop checkpoint and "
                   "rebuilds its architecture. A relative path is looked up in the outputs folder, then (in "
                   "ComfyUI) the models/xpufleet folder, then the run directory, then the current directory.")
    CATEGORY = T.CATEGORY_IO
    FUNCTION = "load"
    RETURN_TYPES = (T.MODEL,)
    RETURN_NAMES = ("model",)
    OUTPUT_NODE = False

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {"path": ("STRING", {"default": "models/model.safetensors",
                                                 "tooltip": "a file ModelSaver wrote (relative: outputs folder, "
                                                            "models/xpufleet in ComfyUI, the run directory, then "
                                                            "the current directory)"})}}

    @classmethod
    def IS_CHANGED(cls, path: str = "", **_: Any) -> Any:
        """ComfyUI re-runs the node when the model file changes (a new save under the same name)."""
        try:
            cands = [mounts.resolve(path)] if mounts.split_ref(path) else paths.candidate_paths(path)
        except mounts.MountError:
            return float("nan")
        found = next((p for p in cands if p.is_file()), None) if str(path).strip() else None
        return found.stat().st_mtime_ns if found is not None else float("nan")

    def load(self, path: str) -> tuple[Any]:
        if not str(path).strip():
            raise ValueError("ModelLoader: path is empty; give the file ModelSaver wrote")
        # a worker's "label:file" resolves inside that mount only; other paths as before
        candidates = [mounts.resolve(path)] if mounts.split_ref(path) else paths.candidate_paths(path)
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            raise ValueError(f"ModelLoader: model file {path!r} not found; looked in: "
                             f"{', '.join(str(p) for p in candidates)}. A ModelSaver writes it: run the graph that "
                             f"saves it first (the predict_saved template reads what mlp_digits saves)")
        model = load_model(found)
        runtime.info(f"ModelLoader: loaded {found}")
        return (model,)


class XPUPredict:
    """Predict node (output node): model outputs for a dataset or dataloader."""

    DESCRIPTION = ("Runs the model on a dataset or dataloader. output auto = class indices for classifiers, raw "
                   "outputs otherwise; probabilities = softmax (sigmoid for one output). Shows accuracy when the "
                   "data has labels.")
    CATEGORY = T.CATEGORY_IO
    FUNCTION = "predict"
    RETURN_TYPES = (T.TENSOR, "STRING")
    RETURN_NAMES = ("predictions", "summary")
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "model": (T.MODEL, {"tooltip": "the model to run"}),
                "output": (T.PREDICT_OUTPUTS, {"default": "auto",
                                               "tooltip": "auto = class indices for classifiers, raw outputs otherwise"}),
                "device": (devmod.DEVICE_CHOICES, {"default": "auto", "tooltip": "auto follows the run's first device"}),
                "batch_size": ("INT", {"default": 256, "min": 1, "max": 65536, "tooltip": "samples per forward pass"}),
            },
            "optional": {
                "dataset": (T.DATASET, {"tooltip": "the inputs (connect this or a dataloader)"}),
                "dataloader": (T.DATALOADER, {"tooltip": "the inputs as batches (used when connected)"}),
                "precision": (T.PRECISION_CHOICES, {"default": "fp32", "tooltip": "autocast precision"}),
                "show": ("INT", {"default": 20, "min": 0, "max": 10_000, "tooltip": "predictions shown in the UI"}),
            },
        }

    def predict(self, model: Any, output: str = "auto", device: str = "auto", batch_size: int = 256,
                dataset: Any = None, dataloader: Any = None, precision: str = "fp32",
                show: int = 20) -> dict[str, Any]:
        from .trainer import predict_outputs, resolve_precision, stop_checker

        if output not in T.PREDICT_OUTPUTS:
            raise ValueError(f"Predict: output must be one of {', '.join(T.PREDICT_OUTPUTS)}, got {output!r}")
        source = dataloader if dataloader is not None else dataset
        if source is None:
            raise ValueError("Predict: connect a dataset or a dataloader")
        label = node_label("Predict", T.PREDICT_NODE)
        dev = devmod.torch_device(device, label)
        prec = resolve_precision(precision, dev, label)
        model = model.to(dev)
        with hostmode.inference():
            raw, targets = predict_outputs(model, source, dev, prec, int(batch_size), stop_checker())
        preds, _, acc, lines = summarise_predictions(raw, targets, output, spec_of(model), show)
        if acc is not None:
            runtime.metric("predict_accuracy", acc)
        summary = "\n".join(lines)
        runtime.info(f"{label}: " + lines[0] + (f"; {lines[1]}" if len(lines) > 1 and "accuracy" in lines[1] else ""))
        return {"ui": {"text": [summary]}, "result": (preds, summary)}


NODE_CLASS_MAPPINGS: dict[str, type] = {
    T.MODEL_SAVER_NODE: XPUModelSaver,
    T.MODEL_LOADER_NODE: XPUModelLoader,
    T.PREDICT_NODE: XPUPredict,
}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {
    T.MODEL_SAVER_NODE: "Model Saver",
    T.MODEL_LOADER_NODE: "Model Loader",
    T.PREDICT_NODE: "Predict",
}

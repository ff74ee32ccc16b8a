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
from . import hostmode, paths, runtime
from . import types as T
from .contract import Node, int_widget, socket, widget
from .lib.evaluation import summarise_predictions
from .lib.modelfile import MODEL_FORMAT, MODEL_VERSION, load_weights, read_model_file, write_model_file
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
    return load_weights(build_model(spec), state, path)


class XPUModelSaver(Node, category=T.CATEGORY_IO, function="save", display="Model Saver",
                    returns={"path": "STRING"}, output=True):
    """ModelSaver node (output node): weights + architecture, safetensors or PyTorch format."""

    DESCRIPTION = ("Saves a model with its architecture so ModelLoader can rebuild it. The filename is relative "
                   "to the outputs folder (ComfyUI's output/xpufleet, else $XPUFLEET_HOME/outputs) or the run "
                   "directory, and stays inside it (no '..', no absolute path, no symlink leading out). The file "
                   "is written to a temp file and renamed, never half written.")
    REQUIRED = {
        "model": socket(T.MODEL, "the model to save (from a builder, TrainingLoop or ModelLoader)"),
        "filename": widget("STRING", "models/model.safetensors", "relative to the location below, and inside it "
                                                                 "(no '..', not absolute)"),
        "format": widget(T.MODEL_FORMATS, "safetensors", "safetensors (.safetensors) or PyTorch (.pt / .pth)"),
        "location": widget(T.SAVE_LOCATIONS, "outputs", "the outputs folder, or this run's directory"),
    }
    OPTIONAL = {"overwrite": widget("BOOLEAN", True, "replace an existing file")}

    @classmethod
    def VALIDATE_INPUTS(cls, filename: Any = None) -> bool | str:
        """Refuse a filename that cannot stay inside its folder before anything runs (a linked
        filename, known only at run time, is checked when the node saves)."""
        return paths.path_input_check("filename", filename, "files go inside the outputs folder or the run "
                                      "directory: give a relative path like 'models/mlp.safetensors'")

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


class XPUModelLoader(Node, category=T.CATEGORY_IO, function="load", display="Model Loader", returns={"model": T.MODEL}):
    """ModelLoader node: rebuilds a model saved by ModelSaver (either format) or a checkpoint."""

    DESCRIPTION = ("Loads a model saved by ModelSaver (safetensors or PyTorch) or a TrainingLoop checkpoint and "
                   "rebuilds its architecture. A relative path is looked up in the outputs folder, then (in "
                   "ComfyUI) the models/xpufleet and input folders, then the run directory, then the data roots; "
                   "an absolute path must lie in one of the folders this machine lets graphs read.")
    REQUIRED = {"path": widget("STRING", "models/model.safetensors",
                               "a file ModelSaver wrote (relative: outputs folder, models/xpufleet in ComfyUI, the "
                               "run directory, then the data roots; LABEL:path on a worker's mount)")}

    @classmethod
    def IS_CHANGED(cls, path: str = "", **_: Any) -> Any:
        """ComfyUI re-runs the node when the model file changes (a new save under the same name)."""
        return paths.file_mtime(path)

    @classmethod
    def VALIDATE_INPUTS(cls, path: Any = None) -> bool | str:
        """A path outside the folders graphs may read (nodes/paths.py) is refused by name before the run
        starts: a model file is a weights file, and another run's checkpoint is not this graph's."""
        return paths.read_input_check("path", path)

    def load(self, path: str) -> tuple[Any]:
        if not str(path).strip():
            raise ValueError("ModelLoader: path is empty; give the file ModelSaver wrote")
        # inside the folders graphs may read only (a worker's "label:file" inside that mount)
        candidates = paths.read_candidates(path, "ModelLoader: path")
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            raise ValueError(f"ModelLoader: model file {path!r} not found; looked in: "
                             f"{', '.join(str(p) for p in candidates)}. A ModelSaver writes it: run the graph that "
                             f"saves it first (the predict_saved template reads what mlp_digits saves)")
        model = load_model(found)
        runtime.info(f"ModelLoader: loaded {found}")
        return (model,)


class XPUPredict(Node, category=T.CATEGORY_IO, function="predict", display="Predict",
                 returns={"predictions": T.TENSOR, "summary": "STRING"}, output=True):
    """Predict node (output node): model outputs for a dataset or dataloader."""

    DESCRIPTION = ("Runs the model on a dataset or dataloader. output auto = class indices for classifiers, raw "
                   "outputs otherwise; probabilities = softmax (sigmoid for one output). Shows accuracy when the "
                   "data has labels.")
    REQUIRED = {
        "model": socket(T.MODEL, "the model to run"),
        "output": widget(T.PREDICT_OUTPUTS, "auto",
                         "auto = class indices for classifiers, raw outputs otherwise"),
        "device": widget(devmod.DEVICE_CHOICES, "auto", "auto follows the run's first device"),
        "batch_size": int_widget(256, 1, 65536, "samples per forward pass"),
    }
    OPTIONAL = {
        "dataset": socket(T.DATASET, "the inputs (connect this or a dataloader)"),
        "dataloader": socket(T.DATALOADER, "the inputs as batches (used when connected)"),
        "precision": widget(T.PRECISION_CHOICES, "fp32", "autocast precision"),
        "show": int_widget(20, 0, 10_000, "predictions shown in the UI"),
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

"""Recorded node outputs (docs/workers.md, ``options.record_outputs``): what each node returned, kept in the run's
folder on the machine that ran it, for the Inspector to read back through the sidecar.

Layout under ``RUN_DIR/recorded_outputs/``::

    index.json              {"run_id", "complete", "nodes": [{"node", "class_type", "outputs", "files", "bytes"}]}
    <node>/outputs.json     {"node", "class_type", "outputs": [...], "ui": {...}}
    <node>/<i>_<name>.safetensors   a tensor output (key = the output's name), or a model's weights

Each output is described by kind: ``tensor`` (safetensors file, shape, dtype), ``model`` (its weights as
safetensors, its architecture spec), ``metrics`` (a JSON object inline), ``text`` / ``value`` (inline),
``summary`` (what it is, for objects with no file form: datasets, data loaders, optimizer specs).
Files are written to a temporary name and renamed; ``index.json`` is rewritten after every node, so a
reader during the run sees the nodes finished so far. Recording never fails a run: a node that cannot be
recorded gets a ``run_warning`` and the run goes on.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...common import atomic
from ...constants import RECORDED_OUTPUTS_DIRNAME

INDEX_NAME = "index.json"
NODE_MANIFEST = "outputs.json"
INLINE_TEXT_MAX = 256 * 1024  # longer text goes to a file
SUMMARY_MAX = 2000
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def record_mode(options: dict[str, Any]) -> str | None:
    """``None`` (off), ``"keep"`` (true: kept where the run ran) or ``"upload"`` (also copied to the sidecar)."""
    value = (options or {}).get("record_outputs")
    if value == "upload":
        return "upload"
    return "keep" if value is True else None


def outputs_dir(run_dir: Path) -> Path:
    return Path(run_dir) / RECORDED_OUTPUTS_DIRNAME


def safe_name(text: str) -> str:
    """A file-name-safe form of a node id or output name."""
    return _SAFE.sub("_", str(text)).strip("._") or "x"


def _json_safe(value: Any, depth: int = 0) -> Any:
    """Plain JSON from metrics-like values (tensor scalars -> floats, NaN -> None)."""
    if depth > 8:
        return str(value)[:SUMMARY_MAX]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v, depth + 1) for v in value]
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "numel", lambda: 2)() == 1:
        try:
            return _json_safe(item(), depth + 1)
        except Exception:  # noqa: BLE001
            pass
    return str(value)[:SUMMARY_MAX]


def _write_atomic(path: Path, writer: Callable[[Path], None]) -> None:
    atomic.write_atomic(path, writer)


def _write_json(path: Path, data: Any) -> None:
    _write_atomic(path, lambda tmp: tmp.write_text(json.dumps(data, indent=1, allow_nan=False), encoding="utf-8"))


class OutputRecorder:
    """Records each finished node's outputs under ``RUN_DIR/recorded_outputs`` (see the module doc)."""

    def __init__(self, run_dir: Path, run_id: str | None, mode: str,
                 warn: Callable[[str, str], None] | None = None) -> None:
        self.root = outputs_dir(run_dir)
        self.run_id = run_id
        self.mode = mode
        self.warn = warn
        self.nodes: list[dict[str, Any]] = []
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_index(complete=False)

    def _write_index(self, complete: bool) -> None:
        _write_json(self.root / INDEX_NAME, {"run_id": self.run_id, "mode": self.mode, "complete": complete,
                                             "nodes": self.nodes})

    def record(self, node_id: str, class_type: str, cls: type, outputs: tuple, ui: Any = None) -> None:
        """Keep one node's outputs (called by the executor after the node finished)."""
        try:
            entry = self._record(node_id, class_type, cls, outputs, ui)
        except Exception as exc:  # noqa: BLE001 - recording must never fail the run
            if self.warn is not None:
                self.warn("record_outputs_failed",
                          f"record_outputs: the outputs of node {node_id} ({class_type}) could not be recorded: "
                          f"{type(exc).__name__}: {exc}")
            return
        self.nodes = [n for n in self.nodes if n["node"] != str(node_id)] + [entry]
        self._write_index(complete=False)

    def _record(self, node_id: str, class_type: str, cls: type, outputs: tuple, ui: Any) -> dict[str, Any]:
        folder = self.root / safe_name(node_id)
        folder.mkdir(parents=True, exist_ok=True)
        types = list(getattr(cls, "RETURN_TYPES", ()))
        names = list(getattr(cls, "RETURN_NAMES", ()) or types)
        described = []
        files: list[str] = []
        for i, value in enumerate(outputs):
            name = str(names[i]) if i < len(names) else f"output_{i}"
            item = self._describe(folder, i, name, types[i] if i < len(types) else None, value)
            if item.get("file"):
                files.append(item["file"])
            described.append(item)
        manifest = {"node": str(node_id), "class_type": class_type, "outputs": described,
                    "ui": _json_safe(ui) if ui is not None else None}
        _write_json(folder / NODE_MANIFEST, manifest)
        size = sum((folder / f).stat().st_size for f in files)
        return {"node": str(node_id), "class_type": class_type, "outputs": len(described),
                "files": [NODE_MANIFEST, *files], "bytes": size}

    def _describe(self, folder: Path, index: int, name: str, rtype: Any, value: Any) -> dict[str, Any]:
        base = {"index": index, "name": name, "type": rtype}
        fname = f"{index}_{safe_name(name)}.safetensors"
        try:
            import torch
        except ImportError:  # pragma: no cover - the runner always has torch
            torch = None  # type: ignore[assignment]
        if torch is not None and isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            self._save({name: tensor}, folder / fname)
            return {**base, "kind": "tensor", "file": fname, "shape": list(tensor.shape),
                    "dtype": str(tensor.dtype).replace("torch.", "")}
        if torch is not None and isinstance(value, torch.nn.Module):
            state = {k: v.detach().cpu().contiguous().clone() for k, v in value.state_dict().items()}
            self._save(state, folder / fname)
            spec = getattr(value, "xpu_spec", None)
            return {**base, "kind": "model", "file": fname, "tensors": len(state),
                    "parameters": int(sum(p.numel() for p in value.parameters())),
                    "spec": _json_safe(spec) if spec is not None else None}
        if isinstance(value, dict):
            return {**base, "kind": "metrics", "value": _json_safe(value)}
        if isinstance(value, str):
            if len(value) > INLINE_TEXT_MAX:
                tname = f"{index}_{safe_name(name)}.txt"
                _write_atomic(folder / tname, lambda tmp: tmp.write_text(value, encoding="utf-8"))
                return {**base, "kind": "text", "file": tname, "chars": len(value)}
            return {**base, "kind": "text", "value": value}
        if value is None or isinstance(value, (bool, int, float)):
            return {**base, "kind": "value", "value": _json_safe(value)}
        return {**base, "kind": "summary", "python_type": f"{type(value).__module__}.{type(value).__qualname__}",
                "value": repr(value)[:SUMMARY_MAX]}

    @staticmethod
    def _save(tensors: dict[str, Any], path: Path) -> None:
        from safetensors.torch import save_file

        _write_atomic(path, lambda tmp: save_file(tensors, str(tmp)))

    def finish(self) -> dict[str, Any]:
        """Mark the record complete; what the ``outputs_recorded`` event says."""
        self._write_index(complete=True)
        return {"nodes": len(self.nodes), "bytes": sum(n["bytes"] for n in self.nodes), "mode": self.mode}

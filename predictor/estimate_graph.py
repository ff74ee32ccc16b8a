"""What the static memory estimate reads from a graph (docs/memory.md), pure: no torch, no data loaded.

:func:`read_graph` finds every place a model goes onto the card: each TrainingLoop (a training step at its
DataLoader's batch, and an evaluation at its val_dataloader's batch), each Evaluate (at its DataLoader's
batch) and each Predict (at its batch size). For each it traces the model back to the builder node that
made it (through TrainingLoops), the data that flows in back to the Dataset node, the optimizer, the
loss and the precision.

Shapes come from the Dataset node's own widgets: a bundled dataset has a known shape and size; a synthetic
one takes its n_features / channels / image_size / seq_len; a csv or safetensors file is only read on the
worker, so its shape is unknown here. A size the data node does not give (synthetic images or sequences
with image_size / seq_len 0) is the node's default: the estimate uses it but says it is a guess, since
defaults never decide the size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..nodes import types as T

# The bundled scikit-learn datasets: per-sample shape, classes (0: regression, one target) and samples.
# tests/predictor/test_estimate.py checks these against the data the Dataset node really loads.
BUNDLED = {
    "digits": ([64], 10, 1797),
    "iris": ([4], 3, 150),
    "wine": ([13], 3, 178),
    "breast_cancer": ([30], 2, 569),
    "diabetes": ([10], 0, 442),
}
DIGITS_IMAGE = [1, 8, 8]
BUILDERS = frozenset({T.MLP_NODE, T.CNN_NODE, T.SEQUENTIAL_NODE})


def _is_link(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], (str, int))
            and not isinstance(value[0], bool) and isinstance(value[1], int) and not isinstance(value[1], bool))


def _literal(inputs: Mapping[str, Any], name: str, default: Any) -> Any:
    value = inputs.get(name, default)
    return default if _is_link(value) else value


def split_sizes(n: int, val_split: float) -> tuple[int, int]:
    """Train and val sample counts of the Dataset node's split (``nodes.data.split_indices``)."""
    n_val = int(round(n * float(val_split)))
    if val_split > 0 and n_val == 0:
        n_val = 1
    return n - n_val, n_val


@dataclass(frozen=True)
class DataFacts:
    """What a Dataset node gives a model builder (``info`` in the node's own keys) and how many samples
    each split has. ``guess``: the size is a default (a reason); ``unknown``: why there is no shape."""

    info: Mapping[str, Any] | None
    n_train: int | None = None
    n_val: int | None = None
    guess: str | None = None
    unknown: str | None = None


def dataset_facts(node_id: str, inputs: Mapping[str, Any]) -> DataFacts:
    """The shape and size of a Dataset node's data from its widgets (see the module docstring)."""
    from ..nodes.data import SYNTHETIC_IMAGE_SIZE, SYNTHETIC_SEQ_LEN, DatasetOptions

    d = DatasetOptions()
    name = _literal(inputs, "name", d.name)
    val_split = float(_literal(inputs, "val_split", d.val_split) or 0.0)
    as_image = bool(_literal(inputs, "as_image", d.as_image))
    image_size = int(_literal(inputs, "image_size", d.image_size) or 0)
    guess = None
    if name in BUNDLED:
        shape, classes, n = BUNDLED[name]
        if name == "digits" and (as_image or image_size):
            shape = [1, image_size, image_size] if image_size else DIGITS_IMAGE
        task = "regression" if classes == 0 else "classification"
    elif name in T.SYNTHETIC_DATASETS:
        n = int(_literal(inputs, "n_samples", d.n_samples))
        features = int(_literal(inputs, "n_features", d.n_features))
        classes = int(_literal(inputs, "num_classes", d.num_classes))
        task = "classification"
        if name == "synthetic_classification":
            shape = [features]
        elif name == "synthetic_regression":
            shape, classes, task = [features], 0, "regression"
        elif name == "synthetic_images":
            size = image_size or SYNTHETIC_IMAGE_SIZE
            if not image_size:
                guess = (f"Dataset node {node_id} gives no image_size: the estimate assumes the default "
                         f"{SYNTHETIC_IMAGE_SIZE} px, a guess")
            shape = [int(_literal(inputs, "channels", d.channels)), size, size]
        else:
            seq_len = int(_literal(inputs, "seq_len", d.seq_len) or 0)
            if not seq_len:
                guess = (f"Dataset node {node_id} gives no seq_len: the estimate assumes the default "
                         f"{SYNTHETIC_SEQ_LEN}, a guess")
            shape = [seq_len or SYNTHETIC_SEQ_LEN, features]
    elif name in T.FILE_DATASETS:
        return DataFacts(None, unknown=f"Dataset node {node_id} reads a {name} file, whose shape is only known "
                                      f"where the run loads it")
    else:
        return DataFacts(None, unknown=f"Dataset node {node_id} has an unknown dataset {name!r}")
    n_train, n_val = split_sizes(n, val_split)
    info = {"name": name, "task": task, "input_shape": list(shape), "num_features": math.prod(shape),
            "num_classes": classes, "out_features": classes if classes else 1}
    return DataFacts(info, n_train, n_val, guess)


@dataclass(frozen=True)
class ModelNode:
    """The builder node a model comes from, its literal inputs and the Dataset info wired into it."""

    node_id: str
    class_type: str
    inputs: Mapping[str, Any]
    data: DataFacts | None


@dataclass
class Use:
    """One place a model runs on the card: a training step or an evaluation."""

    kind: str  # "train" | "eval"
    node_id: str  # the TrainingLoop / Evaluate / Predict node
    resident: str  # the node whose output model is on the card (a TrainingLoop's copy, or a builder's)
    model: ModelNode | None
    batch: int | None
    data: DataFacts | None
    split: int = 0  # which Dataset output feeds it (0 train, 1 val)
    optimizer: Mapping[str, Any] = field(default_factory=dict)
    loss: Mapping[str, Any] = field(default_factory=dict)
    precision: str = "fp32"
    grad_clip_norm: float = 0.0

    @property
    def label(self) -> str:
        what = "training step" if self.kind == "train" else "evaluation"
        return f"one {what} at batch {self.batch} (node {self.node_id})"


@dataclass
class GraphFacts:
    uses: list[Use] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # rough: what had to be skipped or guessed
    _noted: set[str] = field(default_factory=set, repr=False)  # the reasons, for an O(1) duplicate check

    def note(self, reason: str | None) -> None:
        if reason and reason not in self._noted:
            self._noted.add(reason)
            self.reasons.append(reason)


class _Reader:
    def __init__(self, graph: Mapping[str, Any]) -> None:
        self.graph = {str(k): v for k, v in graph.items() if isinstance(v, Mapping)}
        self.facts = GraphFacts()
        self.builders: dict[str, ModelNode | None] = {}  # node -> the builder of the model it gives

    def node(self, link: Any) -> tuple[str, Mapping[str, Any]] | None:
        if not _is_link(link) or str(link[0]) not in self.graph:
            return None
        return str(link[0]), self.graph[str(link[0])]

    def inputs(self, nid: str) -> Mapping[str, Any]:
        return self.graph[nid].get("inputs") or {}

    def model(self, link: Any) -> tuple[str | None, ModelNode | None]:
        """The node whose model arrives through ``link`` (resident on the card) and its builder."""
        found = self.node(link)
        if found is None:
            return None, None
        return found[0], self.builder(found[0])

    def builder(self, nid: str) -> ModelNode | None:
        """The model builder behind node ``nid``, following TrainingLoops back (each trains the model it is
        given). Iterative and remembered per node, so a chain of n TrainingLoops is read in O(n), not O(n^2)
        with n levels of recursion (issue 19); a cycle ends at the first node seen twice."""
        path: list[str] = []
        seen: set[str] = set()
        cur: str | None = nid
        result: ModelNode | None = None
        while cur is not None:
            if cur in self.builders:
                result = self.builders[cur]
                break
            ct = self.graph[cur].get("class_type")
            if ct in BUILDERS:
                inputs = self.inputs(cur)
                data = self.dataset(inputs.get("dataset_info"))[0]
                result = ModelNode(cur, ct, {k: v for k, v in inputs.items() if not _is_link(v)}, data)
                path.append(cur)
                break
            if ct != T.TRAINING_LOOP_NODE or cur in seen:
                self.facts.note(f"model node {cur} ({ct}) cannot be built here, so its size is not counted")
                break
            seen.add(cur)
            path.append(cur)
            upstream = self.node(self.inputs(cur).get("model"))
            cur = upstream[0] if upstream is not None else None
        for p in path:
            self.builders[p] = result
        return result

    def dataset(self, link: Any) -> tuple[DataFacts | None, int]:
        found = self.node(link)
        if found is None:
            return None, 0
        nid, node = found
        if node.get("class_type") != T.DATASET_NODE:
            return DataFacts(None, unknown=f"node {nid} ({node.get('class_type')}) provides data this estimator "
                                           f"does not know"), 0
        return dataset_facts(nid, self.inputs(nid)), int(link[1])

    def loader(self, link: Any) -> tuple[int | None, DataFacts | None, int, str | None]:
        """Batch size, data and split of a DataLoader node (with why the batch is unknown)."""
        found = self.node(link)
        if found is None:
            return None, None, 0, "no DataLoader is connected"
        nid, node = found
        if node.get("class_type") != T.DATALOADER_NODE:
            return None, None, 0, f"the batch size of node {nid} ({node.get('class_type')}) is not known here"
        inputs = self.inputs(nid)
        batch = inputs.get("batch_size")
        data, split = self.dataset(inputs.get("dataset"))
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            return None, data, split, f"DataLoader node {nid} has no batch size"
        return batch, data, split, None

    def use(self, kind: str, nid: str, model_link: Any, batch: int | None, data: DataFacts | None, split: int,
            why_no_batch: str | None, **extra: Any) -> None:
        resident, model = self.model(model_link)
        if resident is None:
            self.facts.note(f"node {nid} has no model connected")
            return
        if data is not None:
            n = data.n_train if split == 0 else data.n_val
            if batch is not None and n is not None:
                batch = min(batch, n)
            if batch == 0:
                return  # an empty split: the node runs no batch
        if batch is None:
            self.facts.note(f"node {nid}: {why_no_batch or 'no batch size'}, so its activations are not counted")
        if kind == "train":
            resident = nid  # the TrainingLoop trains a copy on the card; the built model stays where it was
        self.facts.uses.append(Use(kind, nid, resident, model, batch, data, split, **extra))

    def read(self) -> GraphFacts:
        from ..nodes import NODE_CLASS_MAPPINGS

        for nid, node in sorted(self.graph.items(), key=lambda kv: (len(kv[0]), kv[0])):
            ct, inputs = node.get("class_type"), self.inputs(nid)
            if ct not in NODE_CLASS_MAPPINGS:
                self.facts.note(f"node {nid} ({ct}) is not a node this estimator knows: what it puts on the card "
                                f"is not counted")
                continue
            device = _literal(inputs, "device", "auto")
            if ct in (T.TRAINING_LOOP_NODE, T.EVALUATE_NODE, T.PREDICT_NODE) and device == "cpu":
                continue  # runs on the CPU: nothing of it on the card
            precision = str(_literal(inputs, "precision", "fp32"))
            loss = self.loss(inputs.get("loss"))
            if ct == T.TRAINING_LOOP_NODE:
                opt = self.optimizer(nid, inputs.get("optimizer"))
                batch, data, split, why = self.loader(inputs.get("dataloader"))
                clip = float(_literal(inputs, "grad_clip_norm", 0.0) or 0.0)
                self.use("train", nid, inputs.get("model"), batch, data, split, why, optimizer=opt, loss=loss,
                         precision=precision, grad_clip_norm=clip)
                if inputs.get("val_dataloader") is not None:
                    batch, data, split, why = self.loader(inputs.get("val_dataloader"))
                    self.use("eval", nid, [nid, 0], batch, data, split, why, optimizer=opt, loss=loss,
                             precision=precision)
            elif ct == T.EVALUATE_NODE:
                batch, data, split, why = self.loader(inputs.get("dataloader"))
                self.use("eval", nid, inputs.get("model"), batch, data, split, why, loss=loss, precision=precision)
            elif ct == T.PREDICT_NODE:
                if inputs.get("dataloader") is not None:
                    batch, data, split, why = self.loader(inputs.get("dataloader"))
                else:
                    raw = _literal(inputs, "batch_size", 256)
                    batch = raw if isinstance(raw, int) and raw > 0 else None
                    data, split = self.dataset(inputs.get("dataset"))
                    why = None if batch else f"Predict node {nid} has no batch size"
                self.use("eval", nid, inputs.get("model"), batch, data, split, why, loss={"name": "none"},
                         precision=precision)
        return self.facts

    def optimizer(self, nid: str, link: Any) -> Mapping[str, Any]:
        found = self.node(link)
        if found is not None and found[1].get("class_type") == T.OPTIMIZER_NODE:
            inputs = self.inputs(found[0])
            return {"name": _literal(inputs, "name", "adam"), "momentum": float(_literal(inputs, "momentum", 0.9)),
                    "weight_decay": float(_literal(inputs, "weight_decay", 0.0))}
        self.facts.note(f"TrainingLoop node {nid} has no Optimizer node this estimator knows: Adam is assumed")
        return {"name": "adam", "momentum": 0.9, "weight_decay": 0.0}

    def loss(self, link: Any) -> Mapping[str, Any]:
        found = self.node(link)
        if found is not None and found[1].get("class_type") == T.LOSS_NODE:
            inputs = self.inputs(found[0])
            return {"name": _literal(inputs, "name", "cross_entropy"),
                    "label_smoothing": float(_literal(inputs, "label_smoothing", 0.0))}
        return {}  # the node's own default (cross_entropy for classifiers, mse otherwise)


def read_graph(graph: Mapping[str, Any]) -> GraphFacts:
    """Every use of a model on the card in an API-format graph, with what could not be read."""
    if not isinstance(graph, Mapping):
        raise ValueError("the graph must be an API-format object {\"<id>\": {\"class_type\", \"inputs\"}}")
    return _Reader(graph).read()

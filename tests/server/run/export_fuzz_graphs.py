"""Graphs for the export injection tests: one template touching every node type the exporter writes,
with every free-text field (node ids, titles, extra input names, string widgets) given by the caller,
and a hostile-text strategy for Hypothesis."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

SEQ_LAYERS = '[{"type": "Flatten"}, {"type": "Linear", "in": "auto", "out": 10, "bias": false}]'

# template key -> (class_type, inputs); links name template keys and are renamed with the ids.
TEMPLATE: dict[str, tuple[str, dict[str, Any]]] = {
    "data": ("XPUDataset", {"name": "digits", "val_split": 0.2, "seed": 0, "normalize": "standard",
                            "path": "", "target_column": "target", "x_key": "x", "y_key": "y"}),
    "train_loader": ("XPUDataLoader", {"dataset": ["data", 0], "batch_size": 128, "shuffle": True,
                                       "num_workers": 0, "drop_last": False}),
    "val_loader": ("XPUDataLoader", {"dataset": ["data", 1], "batch_size": 256, "shuffle": False,
                                     "num_workers": 0, "drop_last": False}),
    "mlp": ("XPUMLP", {"hidden": "16", "activation": "relu", "dropout": 0.0, "seed": 0, "dataset_info": ["data", 2]}),
    "opt": ("XPUOptimizer", {"name": "adam", "lr": 0.01, "weight_decay": 0.0, "momentum": 0.9}),
    "loss": ("XPULoss", {"name": "cross_entropy"}),
    "sched": ("XPULRScheduler", {"name": "cosine", "interval": "epoch"}),
    "train": ("XPUTrainingLoop", {"model": ["mlp", 0], "dataloader": ["train_loader", 0], "optimizer": ["opt", 0],
                                  "loss": ["loss", 0], "epochs": 1, "max_steps": 0, "device": "auto",
                                  "precision": "fp32", "val_dataloader": ["val_loader", 0],
                                  "lr_scheduler": ["sched", 0], "seed": 0, "tensorboard": False,
                                  "strategy": "single"}),
    "eval": ("XPUEvaluate", {"model": ["train", 0], "dataloader": ["val_loader", 0], "device": "auto",
                             "precision": "fp32"}),
    "save": ("XPUModelSaver", {"model": ["train", 0], "filename": "models/m.safetensors", "format": "safetensors",
                               "location": "outputs"}),
    "seq": ("XPUSequential", {"layers": SEQ_LAYERS, "seed": 1, "dataset_info": ["data", 2]}),
    "save_seq": ("XPUModelSaver", {"model": ["seq", 0], "filename": "models/seq.pt", "format": "pytorch",
                                   "location": "outputs"}),
    "load": ("XPUModelLoader", {"path": "models/m.safetensors"}),
    "predict": ("XPUPredict", {"model": ["load", 0], "dataset": ["data", 1], "output": "classes", "device": "auto",
                               "batch_size": 256}),
}
# The string widgets a caller may fill: (template key, input name).
STRING_FIELDS = [("data", "path"), ("data", "target_column"), ("data", "x_key"), ("data", "y_key"),
                 ("save", "filename"), ("load", "path")]


def build_graph(ids: dict[str, str], titles: dict[str, Any] | None = None,
                strings: dict[tuple[str, str], str] | None = None,
                extra_inputs: dict[str, dict[str, Any]] | None = None, strategy: str = "single",
                keys: list[str] | None = None) -> dict[str, Any]:
    """The template with node ``ids`` (template key -> id), ``titles`` (a non-string title is kept as
    given; a missing one means no ``_meta``), string widget values and undeclared extra inputs."""
    graph: dict[str, Any] = {}
    for key in keys or list(TEMPLATE):
        ct, inputs = TEMPLATE[key]
        given = {name: [ids[v[0]], v[1]] if isinstance(v, list) else v for name, v in inputs.items()}
        for (k, name), value in (strings or {}).items():
            if k == key:
                given[name] = value
        if key == "train":
            given["strategy"] = strategy
        node: dict[str, Any] = {"class_type": ct, "inputs": {**(extra_inputs or {}).get(key, {}), **given}}
        if titles and key in titles:
            node["_meta"] = {"title": titles[key]}
        graph[ids[key]] = node
    return graph


# Text chosen to break out of every quoting and line a generator might use, mixed with arbitrary
# code points (surrogates and unassigned ones included).
DANGER = ["\n", "\r", "\r\n", "\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x00", "\x1b[2J", "\u202e", "\t",
          "'", '"', "'''", '"""', "\\", "\\'", "#", "{", "}", "%(prog)s", "%", ")", "(", ",", "=", ";", "$(", "`",
          "__import__('os').system('touch /tmp/xpufleet-export-pwned')", "n1_model", "nonlocal", "0", "1", "é",
          "\U0001f600", "\ud800", "\ufeff", " ", "--", "*/", "<!--", "{{", "${HOME}", ": ", "- ", "&a", "!!python/"]


def hostile_text(max_parts: int = 6) -> st.SearchStrategy[str]:
    """Strings made of DANGER pieces and arbitrary code points."""
    part = st.one_of(st.sampled_from(DANGER), st.text(alphabet=st.characters(exclude_categories=()), max_size=6))
    return st.lists(part, max_size=max_parts).map("".join)


def printable_text(max_parts: int = 6) -> st.SearchStrategy[str]:
    """hostile_text with its unprintable characters dropped (quotes, '#', backslashes and code stay)."""
    return hostile_text(max_parts).map(lambda s: "".join(c for c in s if c.isprintable()))

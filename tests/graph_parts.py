"""The nodes of the small training graphs the tests run (a dataset, loaders, an MLP, an optimizer, a loss, a
TrainingLoop, an Evaluate), each with every input it takes written once. A test spells its graph as
``{"1": dataset(), "2": loader("1"), ...}`` and names only what it changes.

Test files use it as ``import graph_parts as gp`` (tests/conftest.py registers it: test folders are not
packages)."""

from __future__ import annotations

from typing import Any

Node = dict[str, Any]


def dataset(name: str = "iris", **inputs: Any) -> Node:
    """An ``XPUDataset`` (outputs: 0 train, 1 validation, 2 dataset_info)."""
    return {"class_type": "XPUDataset", "inputs": {"name": name, "val_split": 0.2, "seed": 0, "normalize": "standard",
                                                   **inputs}}


def loader(data: str, output: int = 0, batch_size: int = 16, shuffle: bool = True) -> Node:
    """An ``XPUDataLoader`` over output ``output`` of the dataset node ``data``."""
    return {"class_type": "XPUDataLoader", "inputs": {"dataset": [data, output], "batch_size": batch_size,
                                                      "shuffle": shuffle, "num_workers": 0, "drop_last": False}}


def mlp(data: str, hidden: str = "16", seed: int = 0, dropout: float = 0.0) -> Node:
    """An ``XPUMLP`` shaped by the dataset node ``data``'s dataset_info."""
    return {"class_type": "XPUMLP", "inputs": {"hidden": hidden, "activation": "relu", "dropout": dropout, "seed": seed,
                                               "dataset_info": [data, 2]}}


def optimizer(name: str = "adam", lr: float = 0.01, momentum: float = 0.9) -> Node:
    return {"class_type": "XPUOptimizer", "inputs": {"name": name, "lr": lr, "weight_decay": 0.0,
                                                     "momentum": momentum}}


def loss() -> Node:
    return {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}}


def training_loop(model: str, data: str, opt: str, loss_node: str, **inputs: Any) -> Node:
    """An ``XPUTrainingLoop`` wired to those nodes: one epoch, fp32, no TensorBoard unless ``inputs`` says."""
    return {"class_type": "XPUTrainingLoop", "inputs": {
        "model": [model, 0], "dataloader": [data, 0], "optimizer": [opt, 0], "loss": [loss_node, 0], "epochs": 1,
        "max_steps": 0, "device": "auto", "precision": "fp32", "tensorboard": False, **inputs}}


def evaluate(model: str, data: str) -> Node:
    """An ``XPUEvaluate`` (an output node) of the model node ``model`` on loader ``data``."""
    return {"class_type": "XPUEvaluate", "inputs": {"model": [model, 0], "dataloader": [data, 0], "device": "auto",
                                                    "precision": "fp32"}}


def with_validation(name: str, batch_size: int, val_batch_size: int, hidden: str, lr: float, dropout: float = 0.0,
                    **loop: Any) -> dict[str, Node]:
    """Dataset ``name`` (1), its train (2) and validation (3) loaders, an MLP (4), adam at ``lr`` (5), cross
    entropy (6) and a TrainingLoop (7) that validates on loader 3; ``loop`` sets the loop's other inputs."""
    return {"1": dataset(name), "2": loader("1", batch_size=batch_size),
            "3": loader("1", 1, batch_size=val_batch_size, shuffle=False), "4": mlp("1", hidden, dropout=dropout),
            "5": optimizer(lr=lr), "6": loss(), "7": training_loop("4", "2", "5", "6", val_dataloader=["3", 0], **loop)}


def iris(**loop: Any) -> dict[str, Node]:
    """The sidecar suites' iris graph: :func:`with_validation` on iris, then an Evaluate (8) on loader 3."""
    return {**with_validation("iris", 16, 64, "16", 0.01, **loop), "8": evaluate("7", "3")}


def digits_ddp(epochs: int, dropout: float = 0.0, **loop: Any) -> dict[str, Node]:
    """The ddp suites' graph: :func:`with_validation` on digits, trained with ``strategy="ddp"``, seed 0."""
    return with_validation("digits", 16, 128, "32", 0.002, dropout,
                           **{"epochs": epochs, "strategy": "ddp", "seed": 0, **loop})

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


def mlp(data: str, hidden: str = "16", seed: int = 0) -> Node:
    """An ``XPUMLP`` shaped by the dataset node ``data``'s dataset_info."""
    return {"class_type": "XPUMLP", "inputs": {"hidden": hidden, "activation": "relu", "dropout": 0.0, "seed": seed,
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

"""The static memory estimate against a measured peak (docs/memory.md, issue 12).

    python bench/bench_estimate.py [--only NAME] [--repeat 3]

For each built-in example graph that trains (samples/*.json) and larger graphs built here (a CNN with
millions of parameters, feed-forward transformer blocks from the Sequential layer spec, an MLP with a large
batch, a wide optimizer-bound MLP, an autocast MLP with SGD momentum, an adaptive-pooling CNN with
RMSprop), it compares:

* the estimate: ``predictor.estimate.estimate_graph`` (built on the meta device, nothing allocated);
* a reference peak measured on this CPU with PyTorch's own tracker,
  ``torch.distributed._tools.mem_tracker.MemTracker``, while the graph's real nodes build the real model
  and data and two training steps run as the TrainingLoop runs them (foreach optimizer step, as PyTorch
  does on CUDA; autocast on the CPU for bf16/fp16), followed by one evaluation batch at the val / Evaluate
  loader's batch. The reference counts what a run keeps on the card: the trained copy of the model,
  gradients, optimizer state, batches, activations and temporaries; the dataset itself stays in host RAM
  on a GPU run and is not counted.

The ratio compares like with like: the estimate's tensor items (weights, training, autocast, activations)
over the reference. Its margins (the autocast copies' gradients, +30% for the caching allocator, the convolution workspaces, 72 MiB for the
CUDA libraries) are CUDA's, which a CPU run does not have: the GPU check (`make gpu-check`, docs/gpu-check.md)
judges them against real reserved peaks. Goals: ratio 0.995 to 1.05 (the meta-device simulation matches the
tracker) and <= 200 ms per estimate (warm: the first estimate in a process also imports torch, shown separately).
The bench exits non-zero only when something fails to run; missed goals are printed.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

from xpufleet.nodes import NODE_CLASS_MAPPINGS
from xpufleet.nodes import types as T
from xpufleet.predictor.estimate import estimate_graph

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024**2
TENSOR_ITEMS = ("weights", "training", "autocast", "activations")  # before the CUDA margins
RATIO_MIN, RATIO_MAX = 0.995, 1.05


def graph(dataset: dict[str, Any], model: tuple[str, dict[str, Any]], *, batch: int, val_batch: int = 256,
          optimizer: str = "adam", precision: str = "fp32", loss: str = "cross_entropy", clip: float = 0.0,
          evaluate: bool = True) -> dict[str, Any]:
    """An API-format training graph: Dataset -> loaders -> model -> TrainingLoop (-> Evaluate)."""
    g: dict[str, Any] = {
        "1": {"class_type": T.DATASET_NODE, "inputs": {"val_split": 0.2, "seed": 0, "normalize": "standard",
                                                       **dataset}},
        "2": {"class_type": T.DATALOADER_NODE, "inputs": {"dataset": ["1", 0], "batch_size": batch,
                                                          "shuffle": True, "num_workers": 0, "drop_last": False}},
        "3": {"class_type": T.DATALOADER_NODE, "inputs": {"dataset": ["1", 1], "batch_size": val_batch,
                                                          "shuffle": False, "num_workers": 0, "drop_last": False}},
        "4": {"class_type": model[0], "inputs": {"seed": 0, "dataset_info": ["1", 2], **model[1]}},
        "5": {"class_type": T.OPTIMIZER_NODE, "inputs": {"name": optimizer, "lr": 1e-3, "weight_decay": 0.0,
                                                         "momentum": 0.9}},
        "6": {"class_type": T.LOSS_NODE, "inputs": {"name": loss}},
        "8": {"class_type": T.TRAINING_LOOP_NODE, "inputs": {
            "model": ["4", 0], "dataloader": ["2", 0], "optimizer": ["5", 0], "loss": ["6", 0], "epochs": 1,
            "max_steps": 2, "device": "auto", "precision": precision, "val_dataloader": ["3", 0],
            "grad_clip_norm": clip, "tensorboard": False}},
    }
    if evaluate:
        g["9"] = {"class_type": T.EVALUATE_NODE, "inputs": {"model": ["8", 0], "dataloader": ["3", 0],
                                                            "device": "auto", "precision": precision}}
    return g


def _ffn_blocks(width: int, hidden: int, blocks: int, seq_len: int, classes: int) -> str:
    layers: list[dict[str, Any]] = []
    for _ in range(blocks):
        layers += [{"type": "LayerNorm", "in": "auto"}, {"type": "Linear", "in": "auto", "out": hidden},
                   {"type": "GELU"}, {"type": "Dropout", "p": 0.1}, {"type": "Linear", "in": hidden, "out": width}]
    layers += [{"type": "LayerNorm", "in": "auto"}, {"type": "Flatten"},
               {"type": "Linear", "in": seq_len * width, "out": classes}]
    return json.dumps(layers)


ADAPTIVE_CNN = json.dumps([
    {"type": "Conv2d", "in": "auto", "out": 64, "kernel": 3, "padding": 1}, {"type": "BatchNorm2d", "in": "auto"},
    {"type": "ReLU"}, {"type": "MaxPool2d", "kernel": 2},
    {"type": "Conv2d", "in": 64, "out": 128, "kernel": 3, "padding": 1}, {"type": "BatchNorm2d", "in": "auto"},
    {"type": "ReLU"}, {"type": "MaxPool2d", "kernel": 2},
    {"type": "Conv2d", "in": 128, "out": 256, "kernel": 3, "padding": 1}, {"type": "BatchNorm2d", "in": "auto"},
    {"type": "ReLU"}, {"type": "AdaptiveAvgPool2d", "size": 1}, {"type": "Flatten"},
    {"type": "Linear", "in": 256, "out": 10}])


def larger_graphs() -> dict[str, dict[str, Any]]:
    images = {"name": "synthetic_images", "n_samples": 512, "num_classes": 10, "channels": 3, "image_size": 64}
    return {
        "cnn_8M_images64": graph(images, (T.CNN_NODE, {"channels": "64,128,256", "kernel_size": 3,
                                                       "activation": "relu", "dropout": 0.1, "fc_hidden": 512}),
                                 batch=64, val_batch=128),
        "ffn_transformer_blocks": graph(
            {"name": "synthetic_sequences", "n_samples": 512, "n_features": 256, "seq_len": 128, "num_classes": 8},
            (T.SEQUENTIAL_NODE, {"layers": _ffn_blocks(256, 1024, 4, 128, 8)}), batch=32, val_batch=64,
            optimizer="adamw", clip=1.0),
        "mlp_batch4096": graph(
            {"name": "synthetic_classification", "n_samples": 10240, "n_features": 1024, "num_classes": 10},
            (T.MLP_NODE, {"hidden": "4096,4096,1024", "activation": "gelu", "dropout": 0.1}),
            batch=4096, val_batch=2048),
        "mlp_wide_optimizer_bound": graph({"name": "digits"}, (T.MLP_NODE, {"hidden": "8192,4096",
                                                                            "activation": "relu", "dropout": 0.0}), batch=64),
        "mlp_bf16_sgd_momentum": graph(
            {"name": "synthetic_classification", "n_samples": 4096, "n_features": 512, "num_classes": 10},
            (T.MLP_NODE, {"hidden": "2048,2048", "activation": "silu", "dropout": 0.0,
                                "batch_norm": True}), batch=1024,
            optimizer="sgd_momentum", precision="bf16"),
        "cnn_adaptive_rmsprop": graph(
            {"name": "synthetic_images", "n_samples": 512, "num_classes": 10, "channels": 3, "image_size": 32},
            (T.SEQUENTIAL_NODE, {"layers": ADAPTIVE_CNN}), batch=128, optimizer="rmsprop"),
    }


def example_graphs() -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted((ROOT / "samples").glob("*.json")):
        if path.name.startswith("serve_"):  # service specs, not graphs
            continue
        g = json.loads(path.read_text())
        if any(n.get("class_type") == T.TRAINING_LOOP_NODE for n in g.values()):
            out[f"example:{path.stem}"] = g
    return out


# --- the reference: the graph's real nodes, real steps, PyTorch's MemTracker ------------------------------


class _Nodes:
    """Runs the graph's non-device nodes for real (data, loaders, models, specs), memoised."""

    def __init__(self, g: dict[str, Any]) -> None:
        self.g = g
        self.memo: dict[str, tuple[Any, ...]] = {}

    def out(self, link: list[Any]) -> Any:
        nid = str(link[0])
        if nid not in self.memo:
            node = self.g[nid]
            cls = NODE_CLASS_MAPPINGS[node["class_type"]]
            kwargs = {k: (self.out(v) if isinstance(v, list) and len(v) == 2 and str(v[0]) in self.g else v)
                      for k, v in node["inputs"].items()}
            result = getattr(cls(), cls.FUNCTION)(**kwargs)
            self.memo[nid] = tuple(result["result"] if isinstance(result, dict) else result)
        return self.memo[nid][int(link[1])]


def reference_peak(g: dict[str, Any]) -> int:
    """Peak bytes of two training steps and the evaluations, tracked by MemTracker (see the docstring)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from xpufleet.nodes.trainer import resolve_precision

    nodes = _Nodes(g)
    loops = [nid for nid, n in g.items() if n["class_type"] == T.TRAINING_LOOP_NODE]
    evals = [nid for nid, n in g.items() if n["class_type"] == T.EVALUATE_NODE]
    peak = 0
    for nid in loops:
        inputs = g[nid]["inputs"]
        built = nodes.out(inputs["model"])
        loader = nodes.out(inputs["dataloader"])
        opt_spec, loss_spec = nodes.out(inputs["optimizer"]), nodes.out(inputs["loss"])
        val_loader = nodes.out(inputs["val_dataloader"]) if "val_dataloader" in inputs else None
        device = torch.device("cpu")
        prec = resolve_precision(inputs.get("precision", "fp32"), device)
        clip = float(inputs.get("grad_clip_norm", 0.0))
        model = copy.deepcopy(built)  # the TrainingLoop trains a copy
        params = [p for p in model.parameters() if p.requires_grad]
        opt = opt_spec.build(params)
        for group in opt.param_groups:
            if "foreach" in group:
                group["foreach"] = True  # as on CUDA
        loss_fn = loss_spec.build()
        tracker = MemTracker()
        tracker.track_external(model, opt)

        def autocast(dtype: Any = prec.dtype) -> Any:
            return torch.autocast("cpu", dtype=dtype) if dtype is not None else torch.autocast("cpu", enabled=False)

        with tracker:
            batches = iter(loader)
            for _ in range(2):
                x, y = next(batches)[:2]
                with autocast():
                    value = loss_fn(model(x), y)
                value.backward()
                del x, y, value
                if clip:
                    torch.nn.utils.clip_grad_norm_(params, clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                tracker.reset_mod_stats()
            for ev_loader in [val_loader] + [nodes.out(g[e]["inputs"]["dataloader"]) for e in evals
                                             if g[e]["inputs"]["model"][0] == nid]:
                if ev_loader is None:
                    continue
                model.eval()
                with torch.no_grad(), autocast():
                    x, y = next(iter(ev_loader))[:2]
                    loss_fn(model(x), y)
                    del x, y
                model.train()
                tracker.reset_mod_stats()
        snap = tracker.get_tracker_snapshot("peak")
        peak = max(peak, max(dev["Total"] for dev in snap.values()))
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="run only graphs whose name contains this")
    ap.add_argument("--repeat", type=int, default=3, help="estimates per graph for the time (the best is shown)")
    args = ap.parse_args()
    graphs = {**example_graphs(), **larger_graphs()}
    if args.only:
        graphs = {k: v for k, v in graphs.items() if args.only in k}
    t0 = time.perf_counter()
    estimate_graph(next(iter(graphs.values())))
    cold_ms = (time.perf_counter() - t0) * 1e3
    print(f"first estimate in this process (imports torch): {cold_ms:.0f} ms; the times below are warm")
    rows = []
    errors = 0
    for name, g in graphs.items():
        try:
            times = []
            for _ in range(max(1, args.repeat)):
                est = estimate_graph(g)
                times.append(est.elapsed_s * 1e3)
            ref = reference_peak(g)
        except Exception as exc:  # noqa: BLE001 - reported, and the exit status says so
            print(f"{name}: ERROR {type(exc).__name__}: {exc}")
            errors += 1
            continue
        if est.total_bytes is None:
            print(f"{name}: no estimate: {'; '.join(est.reasons)}")
            errors += 1
            continue
        items = {i.name: i.bytes for i in est.items}
        tensors = sum(items.get(k, 0) for k in TENSOR_ITEMS)
        rows.append((name, items, est.total_bytes, tensors, ref, tensors / ref, min(times), est.rough))
    header = (f"{'graph':28} {'weights':>9} {'training':>9} {'autocast':>9} {'activ.':>9} {'estimate':>9} "
              f"{'tensors':>9} {'measured':>9} {'ratio':>6} {'ms':>6}")
    print("MiB per card; 'estimate' includes the CUDA margins (autocast gradients, allocator, convolution workspaces, libraries), "
          "'tensors' does not;\n'measured' = MemTracker peak on this CPU; ratio = tensors / measured (how closely "
          "the meta-device simulation matches the tracker)")
    print(header)
    missed = []
    for name, items, total, tensors, ref, ratio, ms, rough in rows:
        def m(key: str, items: dict[str, int] = items) -> str:
            return f"{items.get(key, 0) / MIB:9.1f}"
        print(f"{name:28} {m('weights')} {m('training')} {m('autocast')} {m('activations')} {total / MIB:9.1f} "
              f"{tensors / MIB:9.1f} {ref / MIB:9.1f} {ratio:6.3f} {ms:6.1f}" + ("  rough" if rough else ""))
        if not RATIO_MIN <= ratio <= RATIO_MAX:
            missed.append(f"{name}: ratio {ratio:.3f} outside {RATIO_MIN}-{RATIO_MAX}")
        if ms > 200:
            missed.append(f"{name}: {ms:.0f} ms > 200 ms")
    if rows:
        ratios = [r[5] for r in rows]
        print(f"ratio min {min(ratios):.2f}, max {max(ratios):.2f}; slowest estimate {max(r[6] for r in rows):.1f} ms")
    print(f"goals: ratio {RATIO_MIN}-{RATIO_MAX} per graph, <= 200 ms per estimate: " +
          ("met" if not missed else "NOT met: " + "; ".join(missed)))
    if errors:
        sys.exit(f"{errors} graph(s) failed")


if __name__ == "__main__":
    main()

"""``xpufleet export GRAPH.json``: a graph as a standalone PyTorch script (docs/nodes.md, docs/workers.md's "export
as Python").

The script is the node library (``nodes/lib/``: the code the nodes run, inlined), then the script's own
half from export_data.py and export_train.py (one function per node, calling that library), then a
``main()`` that calls them in the graph's execution order, one block per node, with the node's literal
inputs written out and its links as variables (``n8_model``). It needs torch, numpy, scikit-learn and
safetensors, not xpufleet, and with the same seed it reaches the graph's metrics
(``--seed`` plays the run's seed). A TrainingLoop set to ddp exports as single-process training: the
``ddp_not_available`` warning is printed by the exporter, written in the script and printed by it.
Node types the script cannot reproduce, and inputs it would have to ignore, are refused by name.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...constants import VERSION
from ...nodes import lib as node_lib
from ...nodes import types as T
from ...nodes.strategy import EXPORT_REASON
from .executor import check_graph, default_node_classes, is_link, output_nodes, topological_order
from .export_safe import UnsafeNameError, check_node_ids, docstring_literal, py_literal, variable_bases

LIB_MARKER = "# --- the script library starts here"


class ExportError(ValueError):
    """A graph the exporter cannot write as a script; the text names the node and what to change."""


def library_modules() -> list[tuple[str, Path, str]]:
    """(title, file, marker) of every file whose code after the marker line a script holds, in order: the
    node library (what the nodes compute), then the script's own half (export_data.py, export_train.py)."""
    lib_dir = Path(node_lib.__file__).parent
    return ([(f"nodes/lib/{name}.py", lib_dir / f"{name}.py", node_lib.SCRIPT_MARKER) for name in node_lib.SCRIPT_MODULES]
            + [(f"server/run/{name}", Path(__file__).with_name(name), LIB_MARKER)
               for name in ("export_data.py", "export_train.py")])


def code_after_marker(path: Path, marker: str) -> str:
    """The code of ``path`` after its ``marker`` line (what a script copies)."""
    text = path.read_text(encoding="utf-8")
    start = text.index(marker)
    return text[text.index("\n", start) + 1:].strip("\n") + "\n"


@functools.lru_cache(maxsize=1)
def _lib_source() -> str:
    """The library part of a script: the node library's modules, then the script's own half, each the code
    after its marker line (read and compiled once: the part of a script that holds nothing from the graph)."""
    parts = ["from __future__ import annotations\n"]
    for title, path, marker in library_modules():
        parts.append(f"# --- {title} (xpufleet {VERSION})\n\n" + code_after_marker(path, marker) + "\n")
    text = "\n".join(parts)
    compile(text, "<xpufleet export library>", "exec")
    return text


def _upstream(graph: Mapping[str, Any], roots: list[str]) -> set[str]:
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        nid = stack.pop()
        if nid in seen or nid not in graph:
            continue
        seen.add(nid)
        stack += [str(v[0]) for v in (graph[nid].get("inputs") or {}).values() if is_link(v)]
    return seen


class _Node:
    """One node's inputs as the script writes them: literals (node defaults filled in) and links."""

    def __init__(self, nid: str, node: Mapping[str, Any], cls: type, graph: Mapping[str, Any],
                 classes: Mapping[str, type], bases: Mapping[str, str] | None = None) -> None:
        self.id, self.cls, self.class_type = nid, cls, str(node["class_type"])
        bases = bases if bases is not None else variable_bases(dict.fromkeys([*graph, nid]))
        self.id_var = bases[nid]
        self.label = f"{nid} ({self.class_type})"  # a runtime string: only ever written with py_literal
        meta = node.get("_meta")
        title = meta.get("title") if isinstance(meta, Mapping) else None
        self.comment = f"# node {nid!r} ({self.class_type!r})" + (f", title {title!r}" if isinstance(title, str) else "")
        params = inspect.signature(getattr(cls, cls.FUNCTION)).parameters
        declared = {**(cls.INPUT_TYPES().get("required") or {}), **(cls.INPUT_TYPES().get("optional") or {})}
        self.values: dict[str, Any] = {n: p.default for n, p in params.items()
                                       if p.default is not inspect.Parameter.empty}
        self.links: dict[str, str] = {}
        for name, value in (node.get("inputs") or {}).items():
            if name not in declared:
                continue
            if is_link(value):
                src = graph[str(value[0])]
                names = getattr(classes[src["class_type"]], "RETURN_NAMES", None) or ()
                out = names[value[1]] if value[1] < len(names) else f"out{int(value[1])}"
                self.links[name] = f"{bases[str(value[0])]}_{out}"
            else:
                self.values[name] = value

    def v(self, name: str) -> Any:
        return self.values.get(name)

    def link(self, name: str) -> str:
        return self.links.get(name, "None")

    def out(self, index: int = 0) -> str:
        return f"{self.id_var}_{self.cls.RETURN_NAMES[index]}"

    def refuse(self, name: str, why: str) -> ExportError:
        return ExportError(f"node {self.label}: {name} {why}; clear it to export the graph")


def _kw(**kwargs: Any) -> str:
    # The keywords are the script library's parameter names, never the graph's; every value is a literal.
    return ", ".join(f"{k}={py_literal(v)}" for k, v in kwargs.items())


def _optimizer_code(n: _Node) -> list[str]:
    from ...nodes.specs import OptimizerSpec

    spec = OptimizerSpec(name=n.v("name"), lr=float(n.v("lr")), weight_decay=float(n.v("weight_decay")),
                         momentum=float(n.v("momentum")), nesterov=bool(n.v("nesterov")), beta1=float(n.v("beta1")),
                         beta2=float(n.v("beta2")), eps=float(n.v("eps")))
    return [f"def {n.out()}(params):", f"    return make_optimizer(params, {_kw(**spec.as_dict())})"]


def _scheduler_code(n: _Node) -> list[str]:
    from ...nodes.specs import SchedulerSpec

    s = SchedulerSpec(name=n.v("name"), interval=n.v("interval"), step_size=int(n.v("step_size")),
                      gamma=float(n.v("gamma")), t_max=int(n.v("t_max")), eta_min=float(n.v("eta_min")),
                      max_lr=float(n.v("max_lr")), pct_start=float(n.v("pct_start")))
    fn = f"{n.out()}_make"
    return [f"def {fn}(optimizer, epochs, total_steps):",
            f"    return make_scheduler(optimizer, epochs, total_steps, {_kw(**s.as_dict())})",
            f"{n.out()} = ({fn}, {py_literal(s.per_step)})  # (factory, steps per optimizer step)"]


def _sequential_layers(n: _Node) -> list[dict[str, Any]]:
    from ...nodes.layerspec import LayerSpecError, _normalise, parse_layers

    try:
        return [{"type": name, **args} for name, args in
                (_normalise(i, layer) for i, layer in enumerate(parse_layers(n.v("layers")), start=1))]
    except LayerSpecError as exc:
        raise ExportError(f"node {n.label}: {exc}") from None


def _node_code(n: _Node, warnings: list[str]) -> list[str]:
    from ...nodes.models import parse_sizes

    ct, v, link = n.class_type, n.v, n.link
    if ct == T.DATASET_NODE:
        given = {"name": v("name"), **{k: n.values[k] for k in n.values if k not in n.links and k != "name"}}
        return [f"{n.out(0)}, {n.out(1)}, {n.out(2)} = load_dataset({_kw(**given)})"]
    if ct == T.DATALOADER_NODE:
        return [f"{n.out()} = make_loader({link('dataset')}, "
                + _kw(batch_size=v("batch_size"), shuffle=v("shuffle"), num_workers=v("num_workers"),
                      drop_last=v("drop_last"), pin_memory=v("pin_memory")) + ")"]
    if ct == T.MLP_NODE:
        return [f"{n.out()} = mlp({link('dataset_info')}, "
                + _kw(hidden=parse_sizes(v("hidden"), "MLP hidden"), activation=v("activation"), dropout=v("dropout"),
                      seed=v("seed"), in_features=v("in_features"), out_features=v("out_features"),
                      batch_norm=v("batch_norm")) + ")"]
    if ct == T.CNN_NODE:
        return [f"{n.out()} = cnn({link('dataset_info')}, "
                + _kw(channels=parse_sizes(v("channels"), "CNN channels"), kernel_size=v("kernel_size"),
                      activation=v("activation"), dropout=v("dropout"), seed=v("seed"), in_channels=v("in_channels"),
                      image_size=v("image_size"), out_features=v("out_features"), batch_norm=v("batch_norm"),
                      fc_hidden=v("fc_hidden")) + ")"]
    if ct == T.SEQUENTIAL_NODE:
        layers = py_literal(_sequential_layers(n))  # not JSON: true/false/null are no Python literals
        return [f"{n.out()} = sequential({link('dataset_info')}, layers={layers}, seed={py_literal(v('seed'))})"]
    if ct == T.OPTIMIZER_NODE:
        return _optimizer_code(n)
    if ct == T.LR_SCHEDULER_NODE:
        return _scheduler_code(n)
    if ct == T.LOSS_NODE:
        return [f"{n.out()} = LossFn({py_literal(v('name'))}, label_smoothing={py_literal(v('label_smoothing'))})"]
    if ct == T.TRAINING_LOOP_NODE:
        for name in ("resume_from", "checkpoint_dir"):
            if str(v(name) or "").strip():
                raise n.refuse(name, "is not supported by xpufleet export")
        if "strategy" in n.links:
            raise n.refuse("strategy", "comes from a link; set it on the node")
        lines = []
        if v("strategy") == "ddp":
            message = f"Node {n.label}: strategy ddp trains in a single process here: {EXPORT_REASON}."
            warnings.append(message)
            lines += ["# ddp_not_available: this node trains in a single process (the warning below)",
                      f"warn('ddp_not_available', {py_literal(message)})"]
        sched = link("lr_scheduler")
        kw = _kw(label=n.label, epochs=v("epochs"), max_steps=v("max_steps"), device=v("device"),
                 precision=v("precision"), accumulate_steps=v("accumulate_steps"),
                 grad_clip_norm=v("grad_clip_norm"), checkpoint_every=v("checkpoint_every"),
                 checkpoint_every_steps=v("checkpoint_every_steps"), val_every_steps=v("val_every_steps"),
                 seed=v("seed"), tensorboard=v("tensorboard"))
        scheduler = (f", scheduler_factory={sched}[0], scheduler_per_step={sched}[1]" if sched != "None" else "")
        lines.append(f"{n.out(0)}, {n.out(1)} = train({link('model')}, {link('dataloader')}, {link('optimizer')}, "
                     f"{link('loss')}, val_loader={link('val_dataloader')}{scheduler}, {kw})")
        return [*lines, f"results[{py_literal(n.id)}] = {n.out(1)}"]
    if ct == T.EVALUATE_NODE:
        return [f"{n.out()} = evaluate_node({link('model')}, {link('dataloader')}, "
                + _kw(label=n.label, device=v("device"), precision=v("precision")) + f", loss_fn={link('loss')})",
                f"results[{py_literal(n.id)}] = {n.out()}"]
    if ct == T.MODEL_SAVER_NODE:
        return [f"{n.out()} = save_model({link('model')}, "
                + _kw(filename=v("filename"), fmt=v("format"), location=v("location"), overwrite=v("overwrite")) + ")"]
    if ct == T.MODEL_LOADER_NODE:
        return [f"{n.out()} = load_model({py_literal(v('path'))})"]
    if ct == T.PREDICT_NODE:
        source = link("dataloader") if "dataloader" in n.links else link("dataset")
        return [f"{n.out(0)}, {n.id_var}_result = predict({link('model')}, {source}, "
                + _kw(label=n.label, output=v("output"), device=v("device"), batch_size=v("batch_size"),
                      precision=v("precision"), show=v("show")) + ")",
                f"{n.out(1)} = {n.id_var}_result['summary']", f"results[{py_literal(n.id)}] = {n.id_var}_result"]
    raise ExportError(f"node {n.label}: xpufleet export cannot write a {ct} node as PyTorch code")


_MAIN_HEAD = '''

def main(argv=None):
    """Run the graph's nodes in order; print and optionally save the metrics of its output nodes."""
    import argparse

    global DEFAULT_DEVICE, RUN_SEED, OUTPUTS, RUN_DIR
    home = Path(os.path.expanduser(os.environ.get("XPUFLEET_HOME", "").strip() or "~/.xpufleet"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=None, help="the run seed: overrides every node's seed")
    ap.add_argument("--device", default="auto", help="what 'auto' nodes use: auto (first accelerator), cpu, cuda:N")
    ap.add_argument("--outputs", default=str(home / "outputs"),
                    help="relative model paths (ModelSaver, ModelLoader); default $XPUFLEET_HOME/outputs")
    ap.add_argument("--run-dir", default=None, help="checkpoints and TensorBoard files (default ./runs/export-<stamp>)")
    ap.add_argument("--metrics", default=None, help="write the output nodes' metrics to this JSON file")
    args = ap.parse_args(argv)
    RUN_SEED = args.seed
    DEFAULT_DEVICE = pick_default_device(args.device)
    OUTPUTS = Path(os.path.expanduser(args.outputs))
    RUN_DIR = Path(args.run_dir or Path.cwd() / "runs" / time.strftime("export-%Y%m%d-%H%M%S"))
    results = {}
'''

_MAIN_TAIL = '''
    for nid, metrics in results.items():
        shown = {k: v for k, v in metrics.items() if not isinstance(v, list) and k != "summary"}
        print(f"node {nid}: {shown}")
    if args.metrics:
        Path(args.metrics).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
'''


def _docstring(source: str, warnings: list[str]) -> str:
    """The script's docstring; its first line (the script's ``--help``) holds nothing from the graph."""
    lines = [f"A graph as a standalone PyTorch script (exported by xpufleet export, XPU Fleet {VERSION}).", "",
             f"Graph file: {Path(source).name!r}.", "",
             "Needs torch, numpy, scikit-learn and safetensors; not xpufleet. With the same seed it reaches the",
             "graph's metrics (`xpufleet run --local --seed S` = `python THIS.py --seed S`).", "",
             "    python THIS.py [--seed S] [--device auto|cpu|cuda:N] [--outputs DIR] [--run-dir DIR] [--metrics FILE]"]
    for w in warnings:
        lines += ["", f"WARNING (ddp_not_available): {w}"]
    return docstring_literal("\n".join(lines))


def export_script(graph: Any, source: str = "graph.json") -> tuple[str, list[str]]:
    """The script for ``graph`` and the warnings it carries (``ddp_not_available``); raises
    GraphValidationError for an invalid graph and ExportError for one the script cannot reproduce
    or whose node ids it cannot show (control or line-separator characters)."""
    if isinstance(graph, Mapping):
        try:
            check_node_ids(graph)
        except UnsafeNameError as exc:
            raise ExportError(str(exc)) from None
    classes = default_node_classes()
    check_graph(graph, classes)
    graph = {str(k): v for k, v in graph.items()}
    order, _ = topological_order(graph, _upstream(graph, output_nodes(graph, classes)))
    bases = variable_bases(graph)
    body: list[str] = []
    warnings: list[str] = []
    for nid in order:
        node = _Node(nid, graph[nid], classes[graph[nid]["class_type"]], graph, classes, bases)
        try:
            code = _node_code(node, warnings)
        except ExportError:
            raise
        except ValueError as exc:  # a value py_literal cannot write
            raise ExportError(f"node {node.label}: {exc}") from None
        body += [node.comment, *code, ""]
    doc = _docstring(source, warnings)
    main = _MAIN_HEAD + "".join(f"    {line}\n" if line else "\n" for line in body) + _MAIN_TAIL
    try:  # the library parses on its own (_lib_source), so the script parses when these two do
        compile(doc, "<xpufleet export>", "exec")
        compile(main, "<xpufleet export>", "exec")
    except (SyntaxError, ValueError) as exc:  # never the graph's doing: every value went in as a literal
        raise ExportError(f"xpufleet export wrote a script that does not parse ({exc}); this is a bug in "
                          f"xpufleet export, please report it with the graph") from None
    text = doc + "\n\n" + _lib_source() + main
    return text, warnings

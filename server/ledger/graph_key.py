"""The runtime-graph key (docs/memory.md; docs/workers.md, "sharing a card"): which finished runs ran "the same graph".

A measured peak is filed under the key of the graph that ran, and a new run of the same key on the same
number of cards gets that peak + 20% as its default budget. The seed says what counts:

* node types;
* parameters that change how much memory the run uses or which data it reads (the Dataset's ``name``
  included);
* the connections, topology included;
* every parameter of a node type this server does not know (a plugin installed only on a worker):
  the server cannot tell which of them matter, so all of them count.

and what does not: node ids and positions, display labels (``_meta``), ``seed``, how long the run goes
(``epochs``, ``max_steps``, ``lr``) and the DataLoader's worker processes. So a re-run with another seed or
more epochs finds the earlier peak.

Where the seed lists examples, :data:`IGNORED_INPUTS` applies them to our node types: besides the listed
names it leaves out the same kind of parameter, that changes values but not memory (the other optimizer
hyper-parameters, the learning-rate schedule) or only says how long, how often and where the run writes
(checkpoint and TensorBoard settings, the saved file's name, how many predictions the UI shows).

The key is canonical: renumbering node ids, reordering the JSON, omitting an optional input that is at its
default, or writing a layer spec or size list with other spacing or key aliases gives the same key. Only
the nodes that run count (the output nodes and what they depend on, as the executor runs them; a node of
an unknown type is kept, since it may be an output node). Topology is captured by each node's two
dependency trees, hashed bottom-up in topological order (what it reads, transitively, and what reads it),
then a few rounds of colour refinement (Weisfeiler-Leman) over the labelled graph, reading both the
inputs and the consumers of each node, followed by the multiset of labelled edges: invariant under
renumbering by construction, and it tells apart every pair of different graphs but for highly symmetric
ones (two interchangeable identical sub-graphs swapping consumers), which run the same nodes on the same
data. The work is linear in nodes + edges: every node is hashed a fixed number of times (refining colours
to a fixed point instead took n/2 rounds of n nodes on a chain: 26 s for 1,000 TrainingLoops).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ...nodes import types as T

KEY_VERSION = "g2"  # bump when what counts changes: old peaks then stop matching instead of misleading
# g2: the topology by dependency trees (linear) instead of colour refinement to a fixed point (quadratic
# on a chain); the same graphs match, but every key changed.
REFINE_ROUNDS = 2  # colour-refinement rounds after the trees (part of the key: changing it changes keys)

COMMON_IGNORED = frozenset({"seed"})  # on every node type this server knows
IGNORED_INPUTS: Mapping[str, frozenset[str]] = {
    # the seed's "DataLoader worker processes"
    T.DATALOADER_NODE: frozenset({"num_workers"}),
    # the seed's "lr"; betas and eps change values the same way and no memory
    T.OPTIMIZER_NODE: frozenset({"lr", "beta1", "beta2", "eps"}),
    # the learning rate over time: every widget of the schedule (connecting one is topology and counts)
    T.LR_SCHEDULER_NODE: frozenset({"name", "interval", "step_size", "gamma", "t_max", "eta_min", "max_lr",
                                    "pct_start"}),
    # the seed's "epochs, max_steps"; how often and where it checkpoints, validates and logs
    T.TRAINING_LOOP_NODE: frozenset({"epochs", "max_steps", "checkpoint_every", "checkpoint_every_steps",
                                     "val_every_steps", "tensorboard", "resume_from", "checkpoint_dir"}),
    # where the file goes
    T.MODEL_SAVER_NODE: frozenset({"filename", "location", "overwrite"}),
    # how many predictions the node shows in the UI
    T.PREDICT_NODE: frozenset({"show"}),
}


def _is_link(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], (str, int))
            and not isinstance(value[0], bool) and isinstance(value[1], int) and not isinstance(value[1], bool))


def _plain(value: Any) -> Any:
    """A JSON value in one canonical form: integral floats as ints, tuples as lists, keys sorted later."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return int(value)
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, int):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return repr(value)


def _sizes(value: Any) -> Any:
    from ...nodes.models import parse_sizes

    try:
        return parse_sizes(value)
    except (TypeError, ValueError):
        return value


def _layers(value: Any) -> Any:
    """A layer spec as canonical layer dicts (type names and argument names as torch spells them)."""
    from ...nodes.layerspec import LayerSpecError, _normalise, parse_layers

    try:
        out = []
        for i, layer in enumerate(parse_layers(value), start=1):
            name, args = _normalise(i, layer)
            out.append({"type": name, **args})
        return out
    except (LayerSpecError, TypeError, ValueError):
        return value


# Inputs written as free text whose spelling does not change the model.
_CANONICAL_VALUES = {
    (T.MLP_NODE, "hidden"): _sizes,
    (T.CNN_NODE, "channels"): _sizes,
    (T.SEQUENTIAL_NODE, "layers"): _layers,
}


@functools.lru_cache(maxsize=1024)
def _defaults(cls: type) -> dict[str, Any]:
    """The default of every widget input of a node class (missing inputs take them when it runs).
    Kept per class: asking INPUT_TYPES for every node of every graph was a fifth of a key's cost (a
    1,000-variant sweep computes 1,000 keys); callers copy, never change, the answer."""
    try:
        spec = cls.INPUT_TYPES()
    except Exception:  # noqa: BLE001 - a node class that cannot describe itself gives no defaults
        return {}
    out: dict[str, Any] = {}
    for section in ("required", "optional"):
        for name, entry in (spec.get(section) or {}).items():
            if not isinstance(entry, (list, tuple)) or not entry:
                continue
            options = entry[1] if len(entry) > 1 and isinstance(entry[1], Mapping) else {}
            if "default" in options:
                out[name] = options["default"]
            elif isinstance(entry[0], (list, tuple)) and entry[0]:  # a combo's default is its first choice
                out[name] = entry[0][0]
    return out


def default_node_classes() -> dict[str, type]:
    """This server's node classes (importing them loads no torch)."""
    from ...nodes import NODE_CLASS_MAPPINGS

    return dict(NODE_CLASS_MAPPINGS)


def counted_inputs(class_type: str, inputs: Mapping[str, Any], node_classes: Mapping[str, type]) -> dict[str, Any]:
    """The literal (non-link) inputs of one node that count toward the key, canonical.

    A known node type gets its defaults for missing widget inputs and loses its ignored inputs; an
    unknown one keeps every input as written."""
    cls = node_classes.get(class_type)
    values: dict[str, Any] = {}
    if cls is not None:
        values.update(_defaults(cls))
    values.update({k: v for k, v in inputs.items()})
    out: dict[str, Any] = {}
    ignored = (COMMON_IGNORED | IGNORED_INPUTS.get(class_type, frozenset())) if cls is not None else frozenset()
    for name, value in values.items():
        if name in ignored or _is_link(value):
            continue
        canon = _CANONICAL_VALUES.get((class_type, name))
        out[name] = _plain(canon(value) if canon is not None else value)
    return out


def _digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def running_nodes(graph: Mapping[str, Any], node_classes: Mapping[str, type]) -> set[str]:
    """The nodes that run: output nodes (and nodes of unknown types) and everything they depend on."""
    def is_root(node: Any) -> bool:
        cls = node_classes.get(node.get("class_type"))
        return cls is None or bool(getattr(cls, "OUTPUT_NODE", False))

    keep: set[str] = set()
    stack = [nid for nid, node in graph.items() if is_root(node)]
    while stack:
        nid = stack.pop()
        if nid in keep:
            continue
        keep.add(nid)
        for value in (graph[nid].get("inputs") or {}).values():
            if _is_link(value) and str(value[0]) in graph:
                stack.append(str(value[0]))
    return keep


def _check(graph: Any) -> dict[str, Mapping[str, Any]]:
    if not isinstance(graph, Mapping):
        raise ValueError("the graph must be an API-format object {\"<id>\": {\"class_type\", \"inputs\"}}")
    out: dict[str, Mapping[str, Any]] = {}
    for nid, node in graph.items():
        if not isinstance(node, Mapping) or not isinstance(node.get("class_type"), str):
            raise ValueError(f"node {nid!r} has no class_type: the graph key needs an API-format graph")
        inputs = node.get("inputs") or {}
        if not isinstance(inputs, Mapping):
            raise ValueError(f"node {nid!r}: inputs must be an object")
        out[str(nid)] = node
    return out


def _merkle(nodes: Mapping[str, str], deps: Mapping[str, list[tuple[str, int, str]]], tag: str) -> dict[str, str]:
    """Each node's hash over its whole dependency tree in one direction, computed once per node in
    topological order (Kahn): ``deps[n]`` lists (input name, output index, other node) and a node's hash
    is that of its own colour with its deps' hashes. Linear in nodes + edges (a chain of n nodes takes n
    digests, where colour refinement took n/2 rounds of n). A node on a cycle, or after one, has no such
    tree: it is hashed as "cycle" with its own colour (such a graph fails validation and never runs)."""
    pending = {nid: 0 for nid in nodes}
    users: dict[str, list[str]] = {nid: [] for nid in nodes}
    for nid, items in deps.items():
        for _, _, other in items:
            if other in nodes:
                pending[nid] += 1
                users[other].append(nid)
    ready = [nid for nid, count in pending.items() if count == 0]
    out: dict[str, str] = {}
    while ready:
        nid = ready.pop()
        out[nid] = _digest([tag, nodes[nid], sorted((n, i, out.get(o, "missing")) for n, i, o in deps[nid])])
        for user in users[nid]:
            pending[user] -= 1
            if pending[user] == 0:
                ready.append(user)
    for nid in nodes:
        if nid not in out:
            out[nid] = _digest([tag, nodes[nid], "cycle"])
    return out


def graph_key(graph: Any, node_classes: Mapping[str, type] | None = None) -> str:
    """The runtime-graph key of an API-format graph (see the module docstring); raises ValueError for a
    graph that is not one. ``node_classes``: the node types this server knows (default: ours).
    Linear in the graph's size (see the module docstring)."""
    nodes = _check(graph)
    classes = default_node_classes() if node_classes is None else node_classes
    keep = running_nodes(nodes, classes)
    base: dict[str, str] = {}
    edges: list[tuple[str, int, str, str]] = []  # (source, output index, input name, consumer)
    for nid in keep:
        node = nodes[nid]
        inputs = node.get("inputs") or {}
        base[nid] = _digest([node["class_type"], counted_inputs(node["class_type"], inputs, classes)])
        for name, value in inputs.items():
            if _is_link(value):
                edges.append((str(value[0]), int(value[1]), str(name), nid))
    ins: dict[str, list[tuple[str, int, str]]] = {nid: [] for nid in keep}
    outs: dict[str, list[tuple[str, int, str]]] = {nid: [] for nid in keep}
    for src, idx, name, dst in edges:
        ins[dst].append((name, idx, src))
        if src in outs:
            outs[src].append((name, idx, dst))
    up, down = _merkle(base, ins, "up"), _merkle(base, outs, "down")
    colour = {nid: _digest([base[nid], up[nid], down[nid]]) for nid in keep}

    def label(nid: str) -> str:
        return colour.get(nid, "missing")  # a link to a node the graph lacks (it would fail validation)

    classes_seen = len(set(colour.values()))
    for _ in range(REFINE_ROUNDS):  # a few rounds of colour refinement mix in the siblings' trees
        colour = {nid: _digest([colour[nid], sorted((n, i, label(s)) for n, i, s in ins[nid]),
                                sorted((n, i, label(d)) for n, i, d in outs[nid])]) for nid in keep}
        now = len(set(colour.values()))
        if now == classes_seen:
            break
        classes_seen = now
    node_multiset = sorted(Counter(colour.values()).items())
    edge_multiset = sorted(Counter((label(s), i, n, label(d)) for s, i, n, d in edges).items())
    return f"{KEY_VERSION}-{_digest([node_multiset, edge_multiset])}"

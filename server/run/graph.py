"""The structure of an API-format graph: links, dependency order, cycles, what the outputs need.

Pure functions, each linear in the graph (nodes + links) and none recursive, so a graph of the
largest size the server accepts (``MAX_GRAPH_NODES``) is ordered and searched in milliseconds and a
deep chain can never exhaust the stack. A node's dependencies are the nodes its inputs link to.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


def is_link(value: Any) -> bool:
    """A link is ``[node_id, output_index]`` (a list or tuple of a string/int id and an int)."""
    kind = type(value)
    if kind is not list and kind is not tuple:
        if kind is str or kind is int or kind is float or kind is bool or not isinstance(value, (list, tuple)):
            return False  # (the common case, a literal, decided by its type alone)
    if len(value) != 2:
        return False
    src, idx = value
    return (isinstance(src, (str, int)) and not isinstance(src, bool)
            and isinstance(idx, int) and not isinstance(idx, bool))


def node_id_key(node_id: str) -> tuple[int, int, str, str]:
    """Sort key for node ids: numeric ids by value ("2" before "10"), then the others by text.

    Compares digit strings by length and text rather than ``int()``, which refuses strings of more
    than 4,300 digits and accepts non-ASCII digits it then cannot order."""
    if node_id.isascii() and node_id.isdigit():
        digits = node_id.lstrip("0")
        return (0, len(digits), digits, node_id)
    return (1, 0, node_id, node_id)


def inputs_of(node: Any) -> Mapping[str, Any]:
    """A node's inputs, or nothing for a malformed node (validation reports it; the graph skips it)."""
    inputs = node.get("inputs") if isinstance(node, Mapping) else None
    return inputs if isinstance(inputs, Mapping) else {}


def links_of(node: Any) -> set[str]:
    """The ids of the nodes ``node``'s inputs link to."""
    return {str(v[0]) for v in inputs_of(node).values() if is_link(v)}


def dependency_map(graph: Mapping[str, Any], nodes: Iterable[str]) -> dict[str, list[str]]:
    """``node -> the nodes among ``nodes`` it takes input from`` (each once, in id order)."""
    order = list(dict.fromkeys(nodes))  # the caller's order (a set's would change with the hash seed)
    within = set(order)
    out: dict[str, list[str]] = {}
    for n in order:
        node = graph[n]
        inputs = node.get("inputs") if isinstance(node, Mapping) else None
        ds = {str(v[0]) for v in inputs.values() if is_link(v)} if isinstance(inputs, Mapping) else set()
        if len(ds) > 1:
            out[n] = sorted(ds & within, key=node_id_key)
        else:
            out[n] = [d for d in ds if d in within]
    return out


def topological_order(graph: Mapping[str, Any], nodes: set[str]) -> tuple[list[str], list[str]]:
    """Kahn's algorithm over ``nodes``; returns (order, nodes that cannot be ordered: those on a
    dependency cycle and those downstream of one). Ties break by id (:func:`node_id_key`)."""
    deps = dependency_map(graph, nodes)
    users: dict[str, list[str]] = {n: [] for n in deps}
    remaining: dict[str, int] = {}
    for n, ds in deps.items():
        remaining[n] = len(ds)
        for d in ds:
            users[d].append(n)
    ready = [(node_id_key(n), n) for n, count in remaining.items() if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for u in users[n]:
            remaining[u] -= 1
            if remaining[u] == 0:
                heapq.heappush(ready, (node_id_key(u), u))
    stuck = sorted((n for n, count in remaining.items() if count > 0), key=node_id_key)
    return order, stuck


def strongly_connected(deps: Mapping[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of the dependency graph, iteratively (no recursion).

    Components come dependencies first: a component is listed after every component it takes input
    from. Each component lists its nodes in id order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in deps:  # (in the graph's own order: deterministic, and no sort of every id)
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(deps[root]))]
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(deps[w])))
                    break
                if w in on_stack and index[w] < low[v]:
                    low[v] = index[w]
            else:  # every dependency of v is done
                work.pop()
                if work and low[v] < low[work[-1][0]]:
                    low[work[-1][0]] = low[v]
                if low[v] == index[v]:
                    component: list[str] = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    out.append(sorted(component, key=node_id_key))
    return out


@dataclass(frozen=True)
class Cycle:
    """One dependency cycle: ``path`` = ``[first, dep, dep-of-dep, ..., first]`` (the shortest cycle
    through ``first``, the component's lowest id) and every node of its component in ``members``."""

    path: tuple[str, ...]
    members: tuple[str, ...]


def _shortest_cycle(start: str, deps: Mapping[str, list[str]], members: set[str]) -> tuple[str, ...]:
    # Breadth-first over dependencies from `start`, inside its component; via[d] = the node taking input from d.
    via: dict[str, str] = {}
    queue: deque[str] = deque([start])
    while queue and start not in via:
        cur = queue.popleft()
        for d in deps[cur]:
            if d in members and d not in via:
                via[d] = cur
                queue.append(d)
    users = [start]  # walk back: start is used by via[start], which is used by ...
    cur = via[start]
    while cur != start:
        users.append(cur)
        cur = via[cur]
    return (start, *reversed(users[1:]), start)


def cycles_of(components: list[list[str]], deps: Mapping[str, list[str]]) -> list[Cycle]:
    """The components of :func:`strongly_connected` that are cycles, one path each (linear: one
    breadth-first search per component, inside it)."""
    found: list[Cycle] = []
    for comp in components:
        first = comp[0]
        if len(comp) == 1 and first not in deps[first]:
            continue  # a node on no cycle (downstream of one, maybe: its own inputs are fine)
        found.append(Cycle(_shortest_cycle(first, deps, set(comp)), tuple(comp)))
    return found


def dependency_cycles(graph: Mapping[str, Any], nodes: set[str]) -> list[Cycle]:
    """Every dependency cycle among ``nodes``, one :class:`Cycle` per strongly connected component.
    Nodes merely downstream of a cycle are on none."""
    deps = dependency_map(graph, nodes)
    return cycles_of(strongly_connected(deps), deps)


def upstream(graph: Mapping[str, Any], roots: Iterable[str]) -> set[str]:
    """``roots`` and every node they depend on, transitively."""
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        nid = stack.pop()
        if nid in seen or nid not in graph or not isinstance(graph[nid], Mapping):
            continue
        seen.add(nid)
        stack.extend(links_of(graph[nid]))
    return seen


def output_nodes(graph: Mapping[str, Any], node_classes: Mapping[str, type]) -> list[str]:
    """Ids of nodes whose class is an OUTPUT_NODE, in graph order."""
    out = []
    for nid, node in graph.items():
        if isinstance(node, Mapping):
            ct = node.get("class_type")
            if isinstance(ct, str) and getattr(node_classes.get(ct), "OUTPUT_NODE", False):
                out.append(nid)
    return out


def dependent_outputs(graph: Mapping[str, Any], node_classes: Mapping[str, type],
                      only: Iterable[str] | None = None, limit: int | None = None,
                      deps: Mapping[str, list[str]] | None = None,
                      components: list[list[str]] | None = None) -> dict[str, list[str]]:
    """Node id -> the output nodes that need it (itself included), ComfyUI's ``dependent_outputs``,
    for the nodes in ``only`` (default: every node), at most ``limit`` outputs each, in id order.

    One pass in dependency order: each node carries the set (a bit mask) of the asked-for nodes it
    depends on, so the cost is linear in the graph times the bits of one mask. ``deps`` and
    ``components`` (of :func:`dependency_map` and :func:`strongly_connected`) may be passed when
    the caller has them already."""
    nodes = [n for n, node in graph.items() if isinstance(node, Mapping)]
    asked = sorted({n for n in (nodes if only is None else only) if n in graph and isinstance(graph[n], Mapping)},
                   key=node_id_key)
    bit = {n: 1 << i for i, n in enumerate(asked)}
    if deps is None:
        deps = dependency_map(graph, nodes)
    mask: dict[str, int] = {}
    for comp in components if components is not None else strongly_connected(deps):
        # dependencies first; a cycle's nodes share one mask
        m = 0
        for n in comp:
            m |= bit.get(n, 0)
            for d in deps[n]:
                m |= mask.get(d, 0)
        for n in comp:
            mask[n] = m
    out: dict[str, list[str]] = {}
    open_bits = (1 << len(asked)) - 1
    for oid in sorted(output_nodes(graph, node_classes), key=node_id_key):
        m = mask.get(oid, 0) & open_bits
        while m:
            low = m & -m
            m ^= low
            nid = asked[low.bit_length() - 1]
            listed = out.setdefault(nid, [])
            listed.append(oid)
            if limit is not None and len(listed) >= limit:
                open_bits &= ~low
    return out

"""The graph's structure (server/run/graph.py): order, cycles, what the outputs need; each checked
against a brute-force reference on random graphs (Hypothesis), and on graphs large and deep enough
that anything recursive or quadratic would show."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from xpufleet.server.run.graph import (
    dependency_cycles,
    dependency_map,
    dependent_outputs,
    node_id_key,
    strongly_connected,
    topological_order,
    upstream,
)


class Node:
    """A test node: three optional links of any type."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"optional": {"a": ("*",), "b": ("*",), "c": ("*",)}}

    RETURN_TYPES = ("*",)
    FUNCTION = "run"


class Out(Node):
    OUTPUT_NODE = True


CLASSES = {"Node": Node, "Out": Out}


@st.composite
def digraphs(draw, max_nodes: int = 9):
    """A graph of up to ``max_nodes`` nodes, each linking to up to three others (itself allowed)."""
    n = draw(st.integers(1, max_nodes))
    ids = [str(i) for i in range(n)]
    graph = {}
    for nid in ids:
        targets = draw(st.lists(st.sampled_from(ids), max_size=3))
        graph[nid] = {"class_type": draw(st.sampled_from(["Node", "Out"])),
                      "inputs": {name: [t, 0] for name, t in zip("abc", targets, strict=False)}}
    return graph


def reaches(graph, src: str) -> set[str]:
    """Brute force: every node ``src`` depends on through one or more links."""
    seen: set[str] = set()
    todo = [str(v[0]) for v in graph[src]["inputs"].values()]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += [str(v[0]) for v in graph[n]["inputs"].values()]
    return seen


def shortest_cycle_length(graph, start: str) -> int:
    frontier, seen, steps = {start}, set(), 0
    while frontier:
        steps += 1
        nxt = set()
        for n in frontier:
            for v in graph[n]["inputs"].values():
                d = str(v[0])
                if d == start:
                    return steps
                if d not in seen:
                    seen.add(d)
                    nxt.add(d)
        frontier = nxt
    raise AssertionError("no cycle")


@settings(max_examples=300, deadline=None)
@given(digraphs())
def test_cycles_match_brute_force(graph):
    on_cycle = {n for n in graph if n in reaches(graph, n)}
    cycles = dependency_cycles(graph, set(graph))
    assert {m for c in cycles for m in c.members} == on_cycle
    for c in cycles:
        path = c.path
        assert path[0] == path[-1] == c.members[0] == min(c.members, key=node_id_key)
        for user, dep in zip(path, path[1:], strict=False):  # each step is a real link
            assert dep in {str(v[0]) for v in graph[user]["inputs"].values()}
        assert len(path) - 1 == shortest_cycle_length(graph, path[0])
        # one component per cycle: its members all reach each other
        assert all(set(c.members) <= reaches(graph, m) for m in c.members)


@settings(max_examples=300, deadline=None)
@given(digraphs())
def test_topological_order_matches_brute_force(graph):
    order, stuck = topological_order(graph, set(graph))
    on_cycle = {n for n in graph if n in reaches(graph, n)}
    blocked = {n for n in graph if n in on_cycle or reaches(graph, n) & on_cycle}
    assert set(stuck) == blocked and set(order) == set(graph) - blocked
    position = {n: i for i, n in enumerate(order)}
    for n in order:
        assert all(position[d] < position[n] for d in reaches(graph, n))


@settings(max_examples=300, deadline=None)
@given(digraphs())
def test_dependent_outputs_match_brute_force(graph):
    outputs = sorted((n for n in graph if graph[n]["class_type"] == "Out"), key=node_id_key)
    want: dict[str, list[str]] = {}
    for o in outputs:
        for n in sorted(upstream(graph, [o]), key=node_id_key):
            want.setdefault(n, []).append(o)
    assert dependent_outputs(graph, CLASSES) == want
    assert dependent_outputs(graph, CLASSES, only=["0"], limit=1) == ({"0": want["0"][:1]} if "0" in want else {})


def test_strongly_connected_lists_dependencies_first():
    deps = {"1": ["2"], "2": ["3"], "3": ["2"], "4": ["1"]}
    comps = strongly_connected(deps)
    assert comps == [["2", "3"], ["1"], ["4"]]


def test_a_chain_of_50000_nodes_needs_no_recursion():
    n = 50_000  # 50 times Python's recursion limit
    graph = {str(i): {"class_type": "Node", "inputs": {"a": [str(i - 1), 0]} if i else {}} for i in range(n)}
    order, stuck = topological_order(graph, set(graph))
    assert order[:3] == ["0", "1", "2"] and len(order) == n and stuck == []
    deps = dependency_map(graph, graph)
    assert len(strongly_connected(deps)) == n
    graph["0"]["inputs"] = {"a": [str(n - 1), 0]}  # close it: one cycle of all of them
    (cycle,) = dependency_cycles(graph, set(graph))
    assert len(cycle.members) == n and len(cycle.path) == n + 1
    graph[str(n)] = {"class_type": "Out", "inputs": {"a": ["7", 0]}}
    assert dependent_outputs(graph, CLASSES, only=["0", "7"]) == {"0": [str(n)], "7": [str(n)]}

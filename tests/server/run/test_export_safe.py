"""Graph text reaches an exported script only as Python literals (server/run/export_safe.py, docs/export.md).

The property test exports graphs whose node ids, titles, extra input names, string widgets, class
names and file name are hostile text, and checks the script against a reference exported from the same
graph with tame ids: the same syntax tree once constants and the exporter's own variable stems are
set aside, the same comments but the node lines (each the repr of the node's id, class and title), the
same number of lines (no raw line break or separator got in), and every hostile string present as a
constant of exactly its value.
"""

from __future__ import annotations

import ast
import io
import math
import tokenize
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from export_fuzz_graphs import STRING_FIELDS, TEMPLATE, build_graph, hostile_text, printable_text
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from xpufleet.server.run.executor import GraphValidationError
from xpufleet.server.run.export import ExportError, export_script
from xpufleet.server.run.export_safe import (
    check_node_ids,
    docstring_literal,
    py_literal,
    variable_bases,
)
from xpufleet.server.run.graph import node_id_key

EXAMPLES = 200  # ~45 s on this 2-core machine at load 6-9 (other work); docs/export.md
KEYS = list(TEMPLATE)


# --- the helpers, directly ----------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | hostile_text(),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text(3), inner, max_size=3),
                    max_leaves=8))
def test_py_literal_evaluates_to_the_value_and_holds_only_literals(value):
    src = py_literal(value)
    tree = ast.parse(src, mode="eval")
    allowed = (ast.Expression, ast.Constant, ast.List, ast.Dict, ast.Tuple, ast.Load, ast.UnaryOp, ast.USub)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):  # only float('inf' | '-inf' | 'nan')
            assert ast.unparse(node) in ("float('inf')", "float('-inf')", "float('nan')"), src
        else:
            assert isinstance(node, allowed) or (isinstance(node, ast.Name) and node.id == "float"), (src, node)
    back = eval(compile(tree, "<literal>", "eval"), {"__builtins__": {"float": float}})  # noqa: S307 - checked above
    assert _same(back, value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(b, float) and math.isnan(b):
        return isinstance(a, float) and math.isnan(a)
    if isinstance(b, list):
        return isinstance(a, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in b)
    return type(a) is type(b) and a == b


def test_py_literal_refuses_what_is_no_plain_value():
    with pytest.raises(ValueError, match="a set value cannot be written"):
        py_literal({1})
    deep: list[Any] = []
    for _ in range(30):
        deep = [deep]
    with pytest.raises(ValueError, match="nests more than"):
        py_literal(deep)


@settings(max_examples=300, deadline=None)
@given(hostile_text(10))
def test_a_docstring_literal_is_one_constant_of_exactly_the_text(text):
    src = docstring_literal(text)
    tree = ast.parse(src)
    (stmt,) = tree.body
    assert isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt.value.value == text
    assert len(src.splitlines()) == len(text.split("\n"))  # only the text's own newlines break lines


def test_variable_stems_are_distinct_identifiers_that_cannot_be_read_two_ways():
    ids = ["1", "10", "1_a", "1-a", "1.a", "a", "é", "", "nonlocal"]
    bases = variable_bases(ids)
    assert bases["1"] == "n1" and bases["10"] == "n10" and bases["a"] == "na"
    assert len(set(bases.values())) == len(ids)
    assert all(b.isidentifier() and "_" not in b for b in bases.values())


@pytest.mark.parametrize("bad", ["\n", "\r", "\u2028", "\u2029", "\x85", "\x1b", "\t", "\u202e", "\ud800", "\x00"])
def test_a_node_id_that_cannot_be_shown_is_refused_naming_the_character(bad):
    with pytest.raises(ValueError, match=f"U\\+{ord(bad):04X}") as got:
        check_node_ids(["1", f"2{bad}x"])
    assert "rename the node" in str(got.value) and bad not in str(got.value)
    check_node_ids(["1", "it's \"fine\" # {x} \\ é"])  # printable: shown as a literal


# --- the property test ---------------------------------------------------------------------------


class _Canon(ast.NodeTransformer):
    """Constants reduced to their type; the exporter's variable stems mapped onto the reference's."""

    def __init__(self, stems: dict[str, str]) -> None:
        self.stems = stems

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant(value=type(node.value).__name__)

    def _name(self, name: str) -> str:
        stem, sep, rest = name.partition("_")
        return f"{self.stems[stem]}{sep}{rest}" if sep and stem in self.stems else name

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(id=self._name(node.id), ctx=node.ctx), node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self.generic_visit(node)
        node.name = self._name(node.name)
        return node


def _parts(text: str) -> tuple[str, str, str]:
    """(docstring, library, main() and the tail) of a script. The docstring ends at the first three
    quotes: inside it every quote is escaped (docstring_literal)."""
    doc_end = text.index('"""', 3) + 3
    main_at = text.index("\n\ndef main(argv=None):", doc_end)
    return text[:doc_end], text[doc_end:main_at], text[main_at:]


def _shape(text: str, stems: dict[str, str]) -> str:
    return ast.dump(_Canon(stems).visit(ast.parse(text)))


def _comments(text: str) -> list[str]:
    return [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]


def _node_comment(nid: str, ct: str, title: Any) -> str:
    return f"# node {nid!r} ({ct!r})" + (f", title {title!r}" if isinstance(title, str) else "")


@st.composite
def hostile_graphs(draw: st.DrawFn) -> dict[str, Any]:
    ids = draw(st.lists(printable_text(4), min_size=len(KEYS), max_size=len(KEYS), unique=True))
    if draw(st.integers(0, 9)) == 7:  # now and then (not 0: Hypothesis favours it) an id no script can show
        i = draw(st.integers(0, len(KEYS) - 1))
        ids[i] += draw(st.sampled_from(["\n", "\r", "\u2028", "\u2029", "\x85", "\x1b", "\u202e"])) + ids[i]
        assume(len(set(ids)) == len(ids))
    titles = draw(st.dictionaries(st.sampled_from(KEYS), st.one_of(hostile_text(), st.integers()), max_size=len(KEYS)))
    strings = {f: draw(hostile_text()) for f in STRING_FIELDS if draw(st.booleans())}
    declared = {k: set(TEMPLATE[k][1]) for k in KEYS}
    extras = {k: {n: v for n, v in draw(st.dictionaries(hostile_text(3), hostile_text(3), max_size=2)).items()
                  if n not in declared[k]} for k in draw(st.lists(st.sampled_from(KEYS), max_size=3))}
    cls = {}
    if draw(st.integers(0, 19)) == 13:  # a class name is either a known node type or refused
        cls = {draw(st.sampled_from(KEYS)): draw(hostile_text(3))}
    return {"ids": dict(zip(KEYS, ids, strict=True)), "titles": titles, "strings": strings, "extras": extras,
            "strategy": draw(st.sampled_from(["single", "ddp"])), "source": draw(hostile_text()), "cls": cls}


def _graph(case: dict[str, Any], ids: dict[str, str], tame: bool = False) -> dict[str, Any]:
    graph = build_graph(ids, None if tame else case["titles"], None if tame else case["strings"],
                        None if tame else case["extras"], case["strategy"])
    for key, ct in ({} if tame else case["cls"]).items():
        graph[ids[key]]["class_type"] = ct
    return graph


def test_hostile_text_in_every_field_reaches_the_script_only_as_literals(record_property):
    seen: Counter[str] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(hostile_graphs())
    def check(case: dict[str, Any]) -> None:
        seen["examples"] += 1
        ids = case["ids"]
        graph = _graph(case, ids)
        try:
            text, _ = export_script(graph, case["source"])
        except ExportError as exc:
            assert "U+" in str(exc) and any(not i.isprintable() for i in ids.values()), exc
            seen["refused: unprintable id"] += 1
            return
        except GraphValidationError:
            seen["refused: invalid graph"] += 1  # an unknown class, a filename leaving its folder, ...
            return
        assert all(i.isprintable() for i in ids.values())
        # The reference: the same graph with tame ids in the same id order (so the same node order).
        ranked = sorted(KEYS, key=lambda k: node_id_key(ids[k]))
        tame = {k: str(rank + 1) for rank, k in enumerate(ranked)}
        ref_text, _ = export_script(_graph(case, tame, tame=True), "graph.json")
        mine, ref = variable_bases(list(ids.values())), variable_bases(list(tame.values()))
        stems = {mine[ids[k]]: ref[tame[k]] for k in KEYS}
        doc, lib, main = _parts(text)
        ref_doc, ref_lib, ref_main = _parts(ref_text)
        assert lib == ref_lib  # the library holds nothing from the graph
        assert _shape(main, stems) == _shape(ref_main, {})
        assert len(text.splitlines()) == len(ref_text.splitlines()) and text.count("\n") == ref_text.count("\n")
        node_lines = {_node_comment(tame[k], TEMPLATE[k][0], None): _node_comment(ids[k], TEMPLATE[k][0],
                                                                                 case["titles"].get(k))
                      for k in KEYS}
        assert _comments(main) == [node_lines.get(c, c) for c in _comments(ref_main)]
        assert all(c.isprintable() for c in _comments(main))
        (doc_stmt,) = ast.parse(doc).body
        assert f"Graph file: {Path(case['source']).name!r}." in doc_stmt.value.value.split("\n")
        constants = {n.value for n in ast.walk(ast.parse(main)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        for k in ("train", "eval", "predict"):
            assert ids[k] in constants and f"{ids[k]} ({TEMPLATE[k][0]})" in constants
        assert set(case["strings"].values()) <= constants
        seen["exported"] += 1

    check()
    print(f"export property test: {dict(seen)}")
    record_property("export_examples", dict(seen))
    assert seen["examples"] >= EXAMPLES
    assert seen["exported"] >= EXAMPLES // 3  # most examples export: the checks above ran on them

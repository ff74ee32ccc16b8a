"""What a submission needs to know about its graph, computed in a worker thread (issue 19): its validation
against this server's node classes and its runtime-graph key.

Both are linear in the graph's size but take up to a few hundred milliseconds for a 10,000-node graph
(and a sweep computes them for every child), so a route computes them with :func:`graph_facts` off the
event loop and hands the answer to :meth:`Dispatcher.admit`, which then does only the cheap decisions on
the loop (the target, the budget, the memory ledger). Pure: reads no dispatcher state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...common.errors import RequestError
from .submit import key_of


@dataclass(frozen=True)
class GraphFacts:
    """A graph's key (None: the key cannot read it) and, when it was validated, its refusal (None: valid)."""

    key: str | None
    validated: bool = False
    problem: RequestError | None = None


def validation_problem(graph: Any) -> RequestError | None:
    """The 400 a graph gets from this server's validation, or None when it passes (the same words as
    ``POST /api/runs``: every problem listed up to the cap, with ``node_errors``)."""
    from ..run.validation import GraphValidationError, format_errors, validate_report

    try:
        validate_report(graph).raise_if_invalid()
    except GraphValidationError as exc:
        return RequestError("graph: " + format_errors(exc.response), {"node_errors": exc.response.get(
            "node_errors", {}), "validation": exc.response})
    return None


def graph_facts(graph: Any, validate: bool, key_if_invalid: bool = True) -> GraphFacts:
    """The graph's key, and its validation when ``validate`` (call it in a worker thread). Without
    ``key_if_invalid`` a graph that fails validation gets no key (its refusal is all that follows)."""
    if not validate:
        return GraphFacts(key_of(graph))
    problem = validation_problem(graph)
    key = key_of(graph) if problem is None or key_if_invalid else None
    return GraphFacts(key, True, problem)

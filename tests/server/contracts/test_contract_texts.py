"""A contract model answers a refused body in the API's own words (server/contracts/base.py): its
``shape_texts`` for a body that is not an object or has unknown fields, its ``missing_texts`` for a
required field left out, a field's ``refuse(...)`` text (a callable gets the value) for its type or range,
and pydantic's wording, prefixed with the field's path, only where none is declared."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import Field

from xpufleet.server.contracts.base import OBJECT_TEXTS, Contract, ContractError, refuse, validate
from xpufleet.server.contracts.misc import CanvasEvents
from xpufleet.server.contracts.sweeps import StudySubmit


class Point(Contract):
    shape_texts = ("send a point {\"x\", \"y\"}", "unknown field(s) {unknown}; a point has {known}")
    missing_texts = {"x": "x: missing; every point has one"}
    x: Annotated[int, Field(ge=0), refuse(lambda v: f"x: a count >= 0, got {v!r}")]
    y: Annotated[int, refuse("y: an integer")] = 0
    z: int | None = None


class Bare(Contract):
    shape_texts = OBJECT_TEXTS
    b: str | None = None
    a: str | None = None


@pytest.mark.parametrize(("body", "text"), [
    ([1], "send a point {\"x\", \"y\"}"),
    ({"x": 1, "w": 2, "v": 3}, "unknown field(s) v, w; a point has x, y, z"),
    ({"y": 1}, "x: missing; every point has one"),
    ({"x": -1}, "x: a count >= 0, got -1"),
    ({"x": "1"}, "x: a count >= 0, got '1'"),  # strict: no coercion
    ({"x": 1, "y": True}, "y: an integer"),
    ({"x": 1, "z": "a"}, "z: Input should be a valid integer"),  # no text declared: pydantic's, with the path
])
def test_a_refused_body_is_answered_with_the_declared_text(body, text):
    with pytest.raises(ContractError) as err:
        validate(Point, body)
    assert err.value.message == text and err.value.status == 400


def test_the_sorted_placeholder_lists_the_fields_alphabetically():
    with pytest.raises(ContractError, match=r"^unknown field\(s\) c; known: a, b$"):
        validate(Bare, {"c": 1})
    assert validate(Bare, {"a": "x"}).a == "x"


def test_a_nested_list_item_names_its_place():
    """A canvas event's texts name events[i] (the list's rule validates each item with the event model)."""
    ok = {"type": "progress", "payload": {}, "ts": 1.0, "seq": 1}
    with pytest.raises(ContractError, match=r"^events\[1\]\.seq: must be an integer >= 1$"):
        validate(CanvasEvents, {"events": [ok, {**ok, "seq": 0}]})
    with pytest.raises(ContractError, match=r"^events\[0\]: unknown field\(s\) extra"):
        validate(CanvasEvents, {"events": [{**ok, "extra": 1}]})


def test_a_study_is_refused_by_its_model_before_its_graph_rules():
    body = {"graph": {"1": {"class_type": "X"}}, "objective": {"metric": "m"}, "n_trials": 3,
            "sampler": {"type": "grid"}}
    with pytest.raises(ContractError, match=r"^sampler.type: must be one of tpe, random, got 'grid'$"):
        validate(StudySubmit, body)
    with pytest.raises(ContractError, match=r"^n_trials: the study's trial budget"):
        validate(StudySubmit, {k: v for k, v in body.items() if k != "n_trials"})

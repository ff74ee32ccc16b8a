"""The run contract (server/contracts/runs.py) behind ``parse_run_request``: strict types, each field's own
400 text, errors in the order a client reads the body, and pydantic's wording only where a field has none."""

from __future__ import annotations

import pytest

from xpufleet.common.errors import RequestError
from xpufleet.server.contracts import runs
from xpufleet.server.contracts.base import ContractError, validate
from xpufleet.server.contracts.run_target import TARGET_FIELDS
from xpufleet.server.run.requests import OPTION_FIELDS, parse_run_request

GRAPH = {"1": {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}}}


def refused(options) -> str:
    with pytest.raises(RequestError) as info:
        parse_run_request({"graph": GRAPH, "options": options})
    assert info.value.status == 400
    return info.value.message


@pytest.mark.parametrize("options,text", [
    ({"seed": "1"}, "options.seed: must be an integer between 0 and 2^63-1"),  # no coercion from a string
    ({"seed": True}, "options.seed: must be an integer between 0 and 2^63-1"),
    ({"seed": 1.0}, "options.seed: must be an integer between 0 and 2^63-1"),
    ({"seed": 2**63}, "options.seed: must be an integer between 0 and 2^63-1"),
    ({"deterministic": "true"}, "options.deterministic: must be true or false"),
    ({"deterministic": 1}, "options.deterministic: must be true or false"),
    ({"name": 5}, "options.name: must be a string"),
    ({"record_outputs": "download"}, "options.record_outputs: must be true (kept on the worker), \"upload\" "
                                     "(also copied to this server when the run ends) or false"),
])
def test_each_field_answers_with_its_own_text(options, text):
    assert refused(options) == text


def test_the_first_error_in_body_order_is_the_answer():
    # seed comes before target in the body's fields, so it is named even though the target is wrong too
    assert refused({"seed": -1, "target": {"nope": 1}}).startswith("options.seed:")
    assert refused({"target": {"nope": 1}}).startswith("options.target has unknown field(s) nope; known: ")
    # the unknown options are named before any field is looked at
    assert refused({"seed": -1, "colour": "red"}) == ("options: unknown field(s) colour; known: "
                                                      + ", ".join(OPTION_FIELDS))


def test_the_field_lists_of_the_rules_are_the_models():
    assert OPTION_FIELDS == tuple(runs.RunOptions.model_fields)
    assert TARGET_FIELDS == tuple(runs.Target.model_fields)
    assert refused({"target": {"x": 1}}).endswith("known: " + ", ".join(sorted(TARGET_FIELDS)))


def test_accepted_values_come_back_typed():
    r = parse_run_request({"graph": GRAPH, "options": {"seed": 7, "name": " n ", "record_outputs": "upload",
                                                       "target": {"worker": "any", "memory_gib": 4}}})
    assert (r.seed, r.name, r.target.worker, r.target.memory_gib) == (7, "n", "any", 4.0)
    assert r.options == {"seed": 7, "name": "n", "record_outputs": "upload",
                         "target": {"worker": "any", "memory_gib": 4}}


def test_the_cancel_texts_and_a_field_without_its_own_text():
    with pytest.raises(ContractError) as info:
        validate(runs.Cancel, {"reason": "r" * 501})
    assert info.value.message == "reason: must be a string of at most 500 characters"
    with pytest.raises(ContractError) as info:
        validate(runs.Cancel, {"why": "x"})
    assert info.value.message == "unknown field(s) why: the body may have \"reason\""
    assert validate(runs.Cancel, {}).reason is None
    with pytest.raises(ContractError) as info:  # a model whose field declares no text: pydantic's, with the path
        validate(runs.SpreadEntry, {"worker": "a", "devices": []})
    assert info.value.message == "devices: List should have at least 1 item after validation, not 0"

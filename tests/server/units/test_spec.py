"""The service body (docs/services.md, docs/limits.md): every field validated with a 400 that names it; defaults; round trip."""

from __future__ import annotations

import copy

import pytest

from xpufleet.server.units.spec import (
    CommandProgram,
    ModelProgram,
    RestartPolicy,
    ServiceSpec,
    SpecError,
    fill_placeholders,
    parse_service,
)

MODEL = {"name": "digits", "program": {"model": {"path": "models/mlp_digits.safetensors"}},
         "unit": {"size": 2, "guard": True}, "replicas": 2, "target": {"worker": "any", "device": "cuda"}}
COMMAND = {"name": "engine", "program": {"command": ["my-server", "--port", "{port}"], "health_path": "/healthz",
                                         "infer_path": "/v1/completions", "env": {"HF_HOME": "/srv/hf"}}}


def test_a_model_service_with_its_defaults():
    spec = parse_service(MODEL)
    assert spec == ServiceSpec(name="digits", program=ModelProgram("models/mlp_digits.safetensors"), size=2,
                               guard=True, replicas=2, worker="any", device="cuda")
    assert spec.kind == "model" and spec.health_path == "/health" and spec.infer_path == "/infer"
    assert spec.restart == RestartPolicy() and spec.route_wait_s == 10 and spec.ready_timeout_s == 300


def test_a_command_service():
    spec = parse_service(COMMAND)
    assert spec.program == CommandProgram(("my-server", "--port", "{port}"), "/healthz", "/v1/completions",
                                          (("HF_HOME", "/srv/hf"),))
    assert spec.size == 1 and spec.guard is False and spec.replicas == 1 and spec.device == "auto"
    assert spec.health_path == "/healthz" and spec.infer_path == "/v1/completions"


@pytest.mark.parametrize("body", [MODEL, COMMAND])
def test_to_json_round_trips(body):
    spec = parse_service(body)
    assert parse_service(spec.to_json()) == spec
    assert ServiceSpec.from_json(spec.to_json()).to_json() == spec.to_json()


def test_a_target_string_is_the_worker():
    assert parse_service({**MODEL, "target": "gpu-box"}).worker == "gpu-box"
    assert parse_service({**MODEL, "target": {"device": "cuda:1"}}).device == "cuda:1"


def test_the_name_of_a_put_must_match():
    body = {k: v for k, v in MODEL.items() if k != "name"}
    assert parse_service(body, "digits").name == "digits"
    with pytest.raises(SpecError, match="cannot be renamed"):
        parse_service({**MODEL, "name": "other"}, "digits")


def _with(path: str, value):
    body = copy.deepcopy(MODEL)
    node = body
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    if value is _DROP:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return body


_DROP = object()


@pytest.mark.parametrize(("path", "value", "text"), [
    ("name", "Digits", "name: 1-42 lowercase"),
    ("name", "-x", "name: 1-42 lowercase"),
    ("name", "a" * 43, "name: 1-42 lowercase"),
    ("name", 3, "name:"),
    ("program", _DROP, "program: missing"),
    ("program", [], "program: must be an object"),
    ("program", {}, "exactly one of"),
    ("program", {"model": {"path": "m"}, "command": ["x"]}, "exactly one of"),
    ("program", {"model": {"path": "m"}, "health_path": "/h"}, "go with \"command\" only"),
    ("program.model.path", "", "program.model.path"),
    ("program.model.path", 3, "program.model.path"),
    ("program.model.split", "tensor", "not available yet"),
    ("program.model.split", "zigzag", "program.model.split: must be one of pipeline"),
    ("program.model.max_batch", 0, "program.model.max_batch"),
    ("program.model.max_batch", True, "program.model.max_batch"),
    ("program.model.extra", 1, "program.model: unknown field(s) extra"),
    ("unit.size", 0, "unit.size: must be an integer from 1 to 64"),
    ("unit.size", 65, "unit.size"),
    ("unit.size", 1.5, "unit.size"),
    ("unit.guard", "yes", "unit.guard: must be true or false"),
    ("unit.extra", 1, "unit: unknown field(s) extra"),
    ("replicas", 0, "replicas: the number of units"),
    ("replicas", False, "replicas"),
    ("target.worker", "local", "run on worker agents"),
    ("target.worker", "bad name!", "target.worker"),
    ("target.device", "gpu9", "target.device"),
    ("target.devices", ["cuda:0"], "target.devices is not available yet"),
    ("target.memory_gib", 4, "target.memory_gib is not available yet"),
    ("target.pool", "p", "target.pool is not available yet"),
    ("target.other", 1, "target: unknown field(s) other"),
    ("restart.max_restarts", -1, "restart.max_restarts"),
    ("restart.backoff_s", -1, "restart.backoff_s"),
    ("restart.backoff_max_s", 0.1, "at least restart.backoff_s"),
    ("routing.wait_s", 301, "routing.wait_s"),
    ("routing.request_timeout_s", 0, "routing.request_timeout_s"),
    ("ready_timeout_s", 0, "ready_timeout_s"),
    ("extra", 1, "unknown field(s) extra"),
])
def test_bad_fields_name_what_to_fix(path, value, text):
    with pytest.raises(SpecError) as info:
        parse_service(_with(path, value))
    assert info.value.status == 400
    assert text in info.value.message


@pytest.mark.parametrize(("program", "text"), [
    ({"command": []}, "non-empty list"),
    ({"command": "my-server --port 1"}, "non-empty list"),
    ({"command": [" "]}, "the program to run is empty"),
    ({"command": ["x"], "env": {"1BAD": "v"}}, "program.env"),
    ({"command": ["x"], "env": {"K": 1}}, "program.env"),
    ({"command": ["x"], "health_path": "health"}, "program.health_path"),
    ({"command": ["x"], "infer_path": "/a b"}, "program.infer_path"),
])
def test_bad_commands(program, text):
    with pytest.raises(SpecError, match=text):
        parse_service({"name": "e", "program": program})


def test_not_an_object():
    with pytest.raises(SpecError, match="must be a JSON object"):
        parse_service([MODEL])


def test_placeholders_are_filled_and_other_braces_kept():
    argv = ("srv", "--port={port}", "--host", "{host}", "--rank", "{rank}", "{size}", "{master_addr}:{master_port}",
            "{json}")
    values = {"port": "81", "host": "0.0.0.0", "rank": "1", "size": "2", "master_addr": "10.0.0.1",
              "master_port": "29500"}
    assert fill_placeholders(argv, values) == ["srv", "--port=81", "--host", "0.0.0.0", "--rank", "1", "2",
                                               "10.0.0.1:29500", "{json}"]

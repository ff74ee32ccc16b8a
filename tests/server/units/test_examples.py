"""The service example the README uses: a valid body of POST /api/services and a valid /infer request."""

from __future__ import annotations

import json
from pathlib import Path

from xpufleet.server.units.model_server import _inputs
from xpufleet.server.units.spec import ModelProgram, parse_service
from xpufleet.server.units.split import Stage

EXAMPLES = Path(__file__).resolve().parents[3] / "samples"


def test_the_service_example_serves_the_model_mlp_digits_saves():
    spec = parse_service(json.loads((EXAMPLES / "serve_mlp_digits.json").read_text()))
    graph = json.loads((EXAMPLES / "mlp_digits.json").read_text())
    (saver,) = [n for n in graph.values() if n["class_type"] == "XPUModelSaver"]
    assert isinstance(spec.program, ModelProgram) and spec.program.path == saver["inputs"]["filename"]
    assert saver["inputs"]["location"] == "outputs" and spec.size == 2 and spec.guard and spec.device == "cuda"


def test_the_request_example_fits_the_model():
    body = json.loads((EXAMPLES / "serve_mlp_digits.request.json").read_text())
    stage = Stage(module=None, start=0, end=1, layers=1, parameters=0, input_shape=[64], task="classification",
                  classes=None)
    x, output = _inputs(body, stage, 64)
    assert x.shape == (4, 64) and output == "classes"

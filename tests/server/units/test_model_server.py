"""The built-in model server's request checks and answers (its distributed path runs in the e2e tests)."""

from __future__ import annotations

import pytest
import torch

from xpufleet.server.units.model_server import _header, _inputs, _outputs, resolve_model
from xpufleet.server.units.split import SplitError, Stage


def stage(shape=(4,)) -> Stage:
    return Stage(module=torch.nn.Identity(), start=0, end=1, layers=1, parameters=0, input_shape=list(shape),
                 task="classification", classes=None)


def test_inputs_become_one_float_tensor():
    x, output = _inputs({"inputs": [[1, 2, 3, 4], [0.5, 0, 0, 0]], "output": "classes"}, stage(), 8)
    assert x.dtype == torch.float32 and x.shape == (2, 4) and output == "classes"


@pytest.mark.parametrize(("body", "text"), [
    ([1], "must be a JSON object"),
    ({"inputs": [[1, 2, 3, 4]], "x": 1}, "unknown field(s) x"),
    ({"inputs": []}, "non-empty list"),
    ({"inputs": [[1, 2, 3]]}, "shape [4]"),
    ({"inputs": [[1, 2, 3, 4], [1, 2]]}, "same shape"),
    ({"inputs": [["a", 2, 3, 4]]}, "same shape"),
    ({"inputs": [[float("nan"), 2, 3, 4]]}, "NaN"),
    ({"inputs": [[1, 2, 3, 4]] * 9}, "at most 8"),
    ({"inputs": [[1, 2, 3, 4]], "output": "logits"}, "output: must be one of raw, classes, probabilities"),
])
def test_bad_requests_say_what_to_fix(body, text):
    with pytest.raises(ValueError) as info:
        _inputs(body, stage(), 8)
    assert text in str(info.value)


def test_outputs():
    y = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    assert _outputs(y, "raw") == y.tolist()
    assert _outputs(y, "classes") == [1, 0]
    probs = _outputs(y, "probabilities")
    assert all(abs(sum(row) - 1) < 1e-6 for row in probs)


def test_the_shape_header():
    assert _header(1, (3, 64)).tolist() == [1, 2, 3, 64, 0, 0, 0, 0]
    with pytest.raises(SplitError, match="at most 6"):
        _header(1, (1,) * 7)


def test_a_missing_model_file_names_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("XPUFLEET_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not found on this worker; looked in"):
        resolve_model("models/none.safetensors")
    (tmp_path / "outputs" / "models").mkdir(parents=True)
    (tmp_path / "outputs" / "models" / "m.safetensors").write_bytes(b"x")
    assert resolve_model("models/m.safetensors") == tmp_path / "outputs" / "models" / "m.safetensors"

"""Pipeline stages (docs/services.md): the split is balanced, each rank reads only its tensors, and the stages
in sequence compute exactly what the unsplit model computes."""

from __future__ import annotations

import itertools
import random

import pytest

from xpufleet.server.units.split import SplitError, load_stage, read_spec, stage_bounds


def _brute(weights, stages):
    n = len(weights)
    best = None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = [0, *cuts, n]
        bounds = list(zip(edges, edges[1:], strict=False))
        key = (max(sum(weights[a:b]) for a, b in bounds), max(b - a for a, b in bounds))
        if best is None or key < best[0]:
            best = (key, bounds)
    return best[0]


def test_stage_bounds_are_optimal_and_contiguous():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randrange(1, 9)
        stages = rng.randrange(1, n + 1)
        weights = [rng.choice([0, 0, 1, 10, 100, 1000]) for _ in range(n)]
        bounds = stage_bounds(weights, stages)
        assert len(bounds) == stages and bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a < b for a, b in bounds) and all(b == c for (_, b), (c, _) in itertools.pairwise(bounds))
        key = (max(sum(weights[a:b]) for a, b in bounds), max(b - a for a, b in bounds))
        assert key == _brute(weights, stages)


def test_an_mlp_splits_at_its_middle():
    # Flatten, Linear(64,32), ReLU | Linear(32,16), ReLU, Linear(16,10): the activation stays with its Linear
    assert stage_bounds([0, 2080, 0, 528, 0, 170], 2) == [(0, 3), (3, 6)]


def test_fewer_layers_than_ranks():
    with pytest.raises(SplitError, match="the model has 2 layer"):
        stage_bounds([1, 1], 3)


@pytest.fixture
def saved_mlp(tmp_path):
    from xpufleet.nodes.io import save_model
    from xpufleet.nodes.models import build_model, make_spec

    spec = make_spec("mlp", {"in_features": 64, "out_features": 10, "hidden": [32, 16], "activation": "relu",
                             "dropout": 0.0, "batch_norm": True}, {"task": "classification", "num_classes": 10}, [64])
    model = build_model(spec, seed=3)
    import torch

    with torch.no_grad():  # non-trivial running statistics: they must travel with the stage
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
    path = tmp_path / "m.safetensors"
    save_model(model, path, "safetensors")
    pt = tmp_path / "m.pt"
    save_model(model, pt, "pytorch")
    return path, pt


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("fmt", [0, 1])
def test_stages_in_sequence_equal_the_unsplit_model(saved_mlp, size, fmt):
    import torch

    from xpufleet.nodes.io import load_model

    path = saved_mlp[fmt]
    full = load_model(path)
    stages = [load_stage(path, r, size) for r in range(size)]
    assert [s.start for s in stages][0] == 0 and stages[-1].end == stages[0].layers
    assert sum(s.parameters for s in stages) == sum(p.numel() for p in full.parameters())
    x = torch.randn(17, 64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        y = x
        for s in stages:
            y = s.module(y)
        ref = full(x)
    assert torch.equal(y, ref)
    assert stages[0].input_shape == [64] and stages[0].task == "classification"


def test_a_file_without_an_architecture(tmp_path):
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "bare.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(SplitError, match="no architecture spec"):
        read_spec(path)

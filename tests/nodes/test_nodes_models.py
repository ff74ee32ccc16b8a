"""Model builder nodes: sizes from the dataset info, layer-spec validation, seeds, rebuild from spec."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from xpufleet.nodes import NODE_CLASS_MAPPINGS as N
from xpufleet.nodes import runtime
from xpufleet.nodes.models import build_model, parse_sizes, spec_of


def test_mlp_sizes_come_from_the_dataset_info(digits):
    _, _, info = digits
    (model,) = N["XPUMLP"]().build("64,32", "gelu", 0.1, 0, dataset_info=info)
    linears = [m for m in model if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(64, 64), (64, 32), (32, 10)]
    assert any(isinstance(m, nn.GELU) for m in model) and any(isinstance(m, nn.Dropout) for m in model)
    assert model(torch.randn(5, 64)).shape == (5, 10)
    spec = spec_of(model)
    assert spec["builder"] == "mlp" and spec["kwargs"]["hidden"] == [64, 32]
    assert spec["input_shape"] == [64] and spec["task"] == "classification" and spec["num_classes"] == 10


def test_mlp_flattens_image_inputs_and_explicit_sizes_win(digits_images):
    _, _, info = digits_images
    (model,) = N["XPUMLP"]().build("16", dataset_info=info, out_features=3)
    assert model(torch.randn(4, 1, 8, 8)).shape == (4, 3)
    (bare,) = N["XPUMLP"]().build("8", in_features=5, out_features=2, batch_norm=True)
    assert any(isinstance(m, nn.BatchNorm1d) for m in bare)
    assert bare(torch.randn(3, 5)).shape == (3, 2)


def test_mlp_errors():
    with pytest.raises(ValueError, match="in_features is 0 and no dataset_info"):
        N["XPUMLP"]().build("8")
    with pytest.raises(ValueError, match=r"'x' is not a positive integer"):
        N["XPUMLP"]().build("8,x", in_features=4, out_features=2)
    with pytest.raises(ValueError, match="dropout must be in"):
        N["XPUMLP"]().build("8", dropout=1.0, in_features=4, out_features=2)
    assert parse_sizes("128, 64 32") == [128, 64, 32] and parse_sizes("") == []


def test_cnn_on_digit_images(digits_images):
    _, _, info = digits_images
    (model,) = N["XPUCNN"]().build("8,16", 3, "relu", 0.0, 0, dataset_info=info, fc_hidden=32)
    convs = [m for m in model if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [(1, 8), (8, 16)]
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    assert spec_of(model)["kwargs"]["image_size"] == [8, 8]


def test_cnn_rejects_tabular_data_and_even_kernels(digits, digits_images):
    with pytest.raises(ValueError, match=r"shape \[64\], not C x H x W images"):
        N["XPUCNN"]().build(dataset_info=digits[2])
    with pytest.raises(ValueError, match="kernel_size must be an odd"):
        N["XPUCNN"]().build(kernel_size=4, dataset_info=digits_images[2])


def test_sequential_with_auto_sizes_json_and_yaml(digits_images):
    _, _, info = digits_images
    spec = ('[{"type": "Conv2d", "in": "auto", "out": 4, "kernel": 3, "padding": 1}, {"type": "ReLU"},'
            ' {"type": "Flatten"}, {"type": "Linear", "in": "auto", "out": 10}]')
    (model,) = N["XPUSequential"]().build(spec, 0, dataset_info=info)
    assert model[0].in_channels == 1 and model[3].in_features == 4 * 8 * 8
    layers = spec_of(model)["kwargs"]["layers"]
    assert layers[3] == {"type": "Linear", "in_features": 256, "out_features": 10}
    yaml_spec = "- type: Flatten\n- {type: Linear, in: 64, out: 10}\n"
    (model2,) = N["XPUSequential"]().build(yaml_spec, 0)
    assert model2(torch.randn(3, 8, 8)).shape == (3, 10)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ('[{"type": "Lnear", "in": 64, "out": 10}]', r"layer 1: unknown type 'Lnear' \(did you mean 'Linear'\?\)"),
        ('[{"type": "Linear", "in": 64}]', r"layer 1 \(Linear\): missing 'out' \(out_features\)"),
        ('[{"type": "Flatten"}, {"type": "Linear", "in": 64, "out": 8, "size": 3}]',
         r"layer 2 \(Linear\): unknown key 'size'; accepted: bias, in, in_features, out, out_features"),
        ('[{"type": "Linear", "in": -3, "out": 8}]', r"layer 1 \(Linear\): 'in' must be a positive integer"),
        ('[{"type": "Dropout", "p": "high"}]', r"layer 1 \(Dropout\): 'p' must be a number"),
        ('[{"type": "Flatten"}, {"type": "Linear", "in": 32, "out": 10}]',
         r"layer 2 \(Linear\) expects 32 input features but the previous layers give 64"),
        ('[{"type": "Conv2d", "in": 1, "out": 3, "kernel": 3}]', r"layer 1 \(Conv2d\) needs C x H x W inputs per sample"),
        ('{"type": "Linear"}', "must be a non-empty list"),
        ("[1, 2]", "layer 1: each layer must be a dict"),
        ("[{: bad", "neither JSON"),
        ('[{"type": "ReLU", "inplace": true}]', r"layer 1 \(ReLU\): unknown key 'inplace'; accepted: no arguments"),
    ],
)
def test_sequential_bad_specs_name_the_layer(digits, spec, message):
    with pytest.raises(ValueError, match=message):
        N["XPUSequential"]().build(spec, 0, dataset_info=digits[2])


def test_sequential_auto_needs_an_input_shape():
    with pytest.raises(ValueError, match=r"in_features is 'auto' but the input shape is unknown"):
        N["XPUSequential"]().build('[{"type": "Linear", "in": "auto", "out": 3}]', 0)


def test_sequential_warns_when_outputs_do_not_match_classes(digits, make_run):
    run = make_run()
    with runtime.use(run.ctx):
        N["XPUSequential"]().build('[{"type": "Linear", "in": 64, "out": 7}]', 0, dataset_info=digits[2])
    assert "gives 7 outputs per sample but the dataset has 10 classes" in run.warnings("model_shape")[0]["message"]


def test_seeds_make_identical_weights_and_the_run_seed_wins(digits, make_run):
    info = digits[2]
    (a,) = N["XPUMLP"]().build("16", seed=3, dataset_info=info)
    (b,) = N["XPUMLP"]().build("16", seed=3, dataset_info=info)
    (c,) = N["XPUMLP"]().build("16", seed=4, dataset_info=info)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a[1].weight, c[1].weight)
    state = torch.get_rng_state()
    N["XPUMLP"]().build("16", seed=3, dataset_info=info)
    assert torch.equal(state, torch.get_rng_state())  # building does not disturb the global RNG
    run = make_run(seed=4)
    with runtime.use(run.ctx):
        (d,) = N["XPUMLP"]().build("16", seed=3, dataset_info=info)
    assert torch.equal(d[1].weight, c[1].weight)


def test_build_model_rebuilds_the_same_architecture(digits_images):
    (model,) = N["XPUCNN"]().build("4,8", dataset_info=digits_images[2], dropout=0.2)
    rebuilt = build_model(spec_of(model))
    assert str(rebuilt) == str(model)
    assert [k for k in rebuilt.state_dict()] == [k for k in model.state_dict()]
    with pytest.raises(ValueError, match="unknown builder"):
        build_model({"format": 1, "builder": "transformer", "kwargs": {}})


def test_sequential_conv_channel_mismatch(digits_images):
    with pytest.raises(ValueError, match=r"layer 1 \(Conv2d\) expects 3 input channels but receives 1"):
        N["XPUSequential"]().build('[{"type": "Conv2d", "in": 3, "out": 4, "kernel": 3}]', 0,
                                   dataset_info=digits_images[2])

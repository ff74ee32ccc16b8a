"""ModelSaver / ModelLoader round trips (both formats) and the Predict node."""

from __future__ import annotations

import json
import os

import pytest
import torch

from xpufleet.nodes import NODE_CLASS_MAPPINGS as N
from xpufleet.nodes import runtime


def _predict_raw(model, x):
    model.eval()
    with torch.no_grad():
        return model(x)


def _trained_models(digits, digits_images, train_node):
    """An MLP, a CNN with BatchNorm (running stats) and dropout, and a Sequential, each briefly trained."""
    (tl,) = N["XPUDataLoader"]().make(digits[0], 64, True)
    (til,) = N["XPUDataLoader"]().make(digits_images[0], 64, True)
    (mlp,) = N["XPUMLP"]().build("32,16", dropout=0.2, dataset_info=digits[2])
    (cnn,) = N["XPUCNN"]().build("4,8", dropout=0.1, dataset_info=digits_images[2])
    (seq,) = N["XPUSequential"]().build(
        '[{"type": "Flatten"}, {"type": "Linear", "in": "auto", "out": 24}, {"type": "LayerNorm", "shape": "auto"},'
        ' {"type": "Tanh"}, {"type": "Linear", "in": 24, "out": 10}]', 0, dataset_info=digits[2])
    return [
        ("mlp", train_node(mlp, tl, epochs=2)[0], digits[1].x),
        ("cnn", train_node(cnn, til, epochs=2)[0], digits_images[1].x),
        ("sequential", train_node(seq, tl, epochs=2)[0], digits[1].x),
    ]


@pytest.mark.parametrize(("fmt", "filename"), [("safetensors", "models/m.safetensors"), ("pytorch", "models/m.pt")])
def test_save_then_load_gives_identical_predictions(fmt, filename, digits, digits_images, train_node,
                                                    xpufleet_home, make_run):
    for name, model, x in _trained_models(digits, digits_images, train_node):
        run = make_run()
        with runtime.use(run.ctx):
            out = N["XPUModelSaver"]().save(model, filename.replace("m.", f"{name}."), fmt, "outputs")
        (path,) = out["result"]
        assert path == str(xpufleet_home / "outputs" / filename.replace("m.", f"{name}."))
        assert out["ui"]["text"] == [path]
        assert run.of("artifact")[0] == {"path": path, "kind": "model", "format": fmt}
        (loaded,) = N["XPUModelLoader"]().load(filename.replace("m.", f"{name}."))
        assert loaded is not model and type(loaded) is type(model)
        assert torch.equal(_predict_raw(model, x), _predict_raw(loaded, x)), name
        assert loaded.xpu_spec == model.xpu_spec
        assert not list((xpufleet_home / "outputs" / "models").glob(".*"))  # no temp files left


def test_safetensors_header_carries_the_spec(digits, xpufleet_home):
    from safetensors import safe_open

    (model,) = N["XPUMLP"]().build("8", dataset_info=digits[2])
    (path,) = N["XPUModelSaver"]().save(model, "spec_check", "safetensors")["result"]
    assert path.endswith("spec_check.safetensors")  # the format's extension is added
    with safe_open(path, framework="pt") as fh:
        meta = fh.metadata()
        keys = set(fh.keys())
    assert meta["format"] == "xpufleet-model"
    spec = json.loads(meta["xpu_spec"])
    assert spec["builder"] == "mlp" and spec["kwargs"]["in_features"] == 64 and spec["classes"][3] == "3"
    assert keys == set(model.state_dict())


def test_run_dir_location_and_no_path_outside_the_folder(digits, make_run, tmp_path, xpufleet_home):
    (model,) = N["XPUMLP"]().build("8", dataset_info=digits[2])
    run = make_run()
    with runtime.use(run.ctx):
        (p1,) = N["XPUModelSaver"]().save(model, "final.pt", "pytorch", "run_dir")["result"]
        assert p1 == str(tmp_path / "run" / "final.pt")
        (loaded,) = N["XPUModelLoader"]().load("final.pt")  # found in the run dir
    assert torch.equal(loaded[1].weight, model[1].weight)
    # issue 9: ModelSaver wrote "../../../x.safetensors" above the outputs folder, and absolute names
    # where they pointed; now every such name is refused, saying where files may go
    saver = N["XPUModelSaver"]()
    for bad, why in ((str(tmp_path / "elsewhere" / "abs.safetensors"), "is absolute"),
                     ("../../../x.safetensors", "climbs out of its folder with '..'"),
                     ("~/.ssh/authorized_keys.pt", "is absolute"), ("models/" + "x" * 300, "a name of 300 bytes")):
        with pytest.raises(ValueError, match="ModelSaver: filename") as info:
            saver.save(model, bad, "safetensors", "outputs")
        assert why in str(info.value) and "files go inside the outputs folder" in str(info.value)
        assert str(xpufleet_home) not in str(info.value)  # the folder in words, never the server's path
        assert saver.VALIDATE_INPUTS(bad) != True  # noqa: E712 - refused before a run starts, too
    with runtime.use(run.ctx), pytest.raises(ValueError, match="leads outside this run's directory"):
        (tmp_path / "run" / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
        saver.save(model, "link/escape.pt", "pytorch", "run_dir")
    assert not (tmp_path / "elsewhere").exists()
    assert not list(tmp_path.parent.glob("x.safetensors")) and saver.VALIDATE_INPUTS("models/ok.pt") is True
    with pytest.raises(ValueError, match="location 'run_dir' needs a queued run"):
        N["XPUModelSaver"]().save(model, "x.pt", "pytorch", "run_dir")


def test_saver_and_loader_errors(digits, xpufleet_home, tmp_path):
    (model,) = N["XPUMLP"]().build("8", dataset_info=digits[2])
    with pytest.raises(ValueError, match=r"does not match format 'safetensors' \(that is the pytorch format"):
        N["XPUModelSaver"]().save(model, "m.pt", "safetensors")
    N["XPUModelSaver"]().save(model, "once.pt", "pytorch")
    with pytest.raises(ValueError, match="exists and overwrite is off"):
        N["XPUModelSaver"]().save(model, "once.pt", "pytorch", "outputs", False)
    with pytest.raises(ValueError, match=r"model file 'nope.safetensors' not found; looked in: .*outputs/nope"):
        N["XPUModelLoader"]().load("nope.safetensors")
    junk = xpufleet_home / "outputs" / "junk.pt"  # absolute, inside the outputs folder: readable
    junk.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="cannot read .* as a PyTorch model file"):
        N["XPUModelLoader"]().load(str(junk))
    bare = xpufleet_home / "outputs" / "bare.pt"
    torch.save(model.state_dict(), bare)
    with pytest.raises(ValueError, match="holds weights but no architecture spec"):
        N["XPUModelLoader"]().load(str(bare))


def test_loader_reads_training_checkpoints(digits, loaders, build_mlp, train_node, xpufleet_home):
    tl, _ = loaders
    trained, _ = train_node(build_mlp(digits[2]), tl, epochs=2, checkpoint_every=2, checkpoint_dir="ck")
    (loaded,) = N["XPUModelLoader"]().load(str(xpufleet_home / "outputs" / "ck" / "epoch_0002.pt"))
    x = digits[1].x
    assert torch.equal(_predict_raw(trained, x), _predict_raw(loaded, x))


def test_saving_a_foreign_module_warns(make_run, xpufleet_home):
    run = make_run()
    with runtime.use(run.ctx):
        N["XPUModelSaver"]().save(torch.nn.Linear(3, 2), "foreign.safetensors", "safetensors")
    assert "cannot rebuild it" in run.warnings("model_spec_missing")[0]["message"]


def test_predict_node_outputs(digits, loaders, build_mlp, train_node, make_run):
    tl, vl = loaders
    trained, m = train_node(build_mlp(digits[2]), tl, epochs=10, val_dataloader=vl)
    val = digits[1]
    run = make_run()
    with runtime.use(run.ctx):
        out = N["XPUPredict"]().predict(trained, "auto", "cpu", 100, dataset=val)
    preds, summary = out["result"]
    assert preds.shape == (len(val),) and preds.dtype == torch.long
    acc = (preds == val.y).double().mean().item()
    assert acc == pytest.approx(m["final_val_accuracy"])
    assert f"accuracy vs labels {acc:.4f}" in summary and out["ui"]["text"] == [summary]
    assert run.metrics("predict_accuracy")[0]["value"] == pytest.approx(acc)
    assert "first 20: ['" in summary  # class names from the dataset info
    (probs, _) = N["XPUPredict"]().predict(trained, "probabilities", "cpu", 64, dataloader=vl)["result"]
    assert probs.shape == (len(val), 10) and torch.allclose(probs.sum(1), torch.ones(len(val)), atol=1e-5)
    assert torch.equal(probs.argmax(1), preds)
    (raw, _) = N["XPUPredict"]().predict(trained, "raw", "cpu", 64, dataset=val)["result"]
    assert torch.equal(raw.argmax(1), preds)
    with pytest.raises(ValueError, match="connect a dataset or a dataloader"):
        N["XPUPredict"]().predict(trained)


def test_predict_regression_is_raw(build_mlp):
    train_ds, val_ds, info = N["XPUDataset"]().load("diabetes")
    model = build_mlp(info, "8")
    (preds, _) = N["XPUPredict"]().predict(model, "auto", "cpu", 32, dataset=val_ds)["result"]
    assert preds.shape == (len(val_ds), 1) and preds.dtype == torch.float32


def test_loader_is_changed_follows_the_file(digits, xpufleet_home):
    loader = N["XPUModelLoader"]
    assert loader.IS_CHANGED("later.pt") != loader.IS_CHANGED("later.pt")  # missing: NaN, always re-run
    (model,) = N["XPUMLP"]().build("8", dataset_info=digits[2])
    N["XPUModelSaver"]().save(model, "later.pt", "pytorch")
    first = loader.IS_CHANGED("later.pt")
    assert first == loader.IS_CHANGED("later.pt")
    path = xpufleet_home / "outputs" / "later.pt"
    os.utime(path, ns=(first + 10**9, first + 10**9))
    assert loader.IS_CHANGED("later.pt") != first

"""Dataset and DataLoader nodes: real bundled data, synthetic shapes, CSV/safetensors files, bad input."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from xpufleet.nodes import NODE_CLASS_MAPPINGS as N
from xpufleet.nodes.tensordata import XpuTensorDataset, collate


def load(name: str, **kw):
    return N["XPUDataset"]().load(name, **kw)


@pytest.fixture(autouse=True)
def _data_root(tmp_path, monkeypatch):
    """The files these tests write lie in a data root: a graph reads only where it may (nodes/paths.py)."""
    monkeypatch.setenv("XPUFLEET_DATA_ROOTS", str(tmp_path))


@pytest.mark.parametrize(
    ("name", "features", "classes", "n_total"),
    [("digits", 64, 10, 1797), ("iris", 4, 3, 150), ("wine", 13, 3, 178), ("breast_cancer", 30, 2, 569)],
)
def test_bundled_classification_datasets(name, features, classes, n_total):
    train, val, info = load(name, val_split=0.25, seed=3)
    assert info["task"] == "classification"
    assert info["num_features"] == features and info["input_shape"] == [features]
    assert info["num_classes"] == classes == info["out_features"]
    assert len(train) + len(val) == n_total
    assert len(val) == round(n_total * 0.25)
    assert train.x.dtype == torch.float32 and train.y.dtype == torch.long
    # stratified: every class appears in the validation split
    assert set(val.y.tolist()) == set(range(classes))


def test_diabetes_is_regression_with_column_targets():
    train, _val, info = load("diabetes")
    assert info["task"] == "regression" and info["num_classes"] == 0 and info["out_features"] == 1
    assert train.y.shape == (len(train), 1) and train.y.dtype == torch.float32


def test_digits_as_image_and_resized():
    train, _val, info = load("digits", as_image=True)
    assert train.x.shape[1:] == (1, 8, 8) and info["input_shape"] == [1, 8, 8] and info["is_image"]
    train16, _, info16 = load("digits", image_size=16)
    assert train16.x.shape[1:] == (1, 16, 16) and info16["image_size"] == 16


def test_split_is_seeded_and_normalised_with_train_statistics():
    a_train, a_val, _ = load("wine", seed=7)
    b_train, b_val, _ = load("wine", seed=7)
    c_train, _, _ = load("wine", seed=8)
    assert torch.equal(a_train.x, b_train.x) and torch.equal(a_val.y, b_val.y)
    assert not torch.equal(a_train.x, c_train.x)
    # standard: train features have mean 0 / std 1; val uses the train statistics (not exactly 0/1)
    assert torch.allclose(a_train.x.mean(0), torch.zeros(13), atol=1e-5)
    assert torch.allclose(a_train.x.std(0, unbiased=False), torch.ones(13), atol=1e-4)
    assert a_val.x.mean(0).abs().max() > 1e-3
    raw_train, _, _ = load("wine", seed=7, normalize="none")
    assert raw_train.x.max() > 100  # proline is in the hundreds before normalising
    mm_train, _, _ = load("wine", seed=7, normalize="minmax")
    assert mm_train.x.min() == 0.0 and mm_train.x.max() == 1.0


@pytest.mark.parametrize(
    ("name", "kw", "shape"),
    [
        ("synthetic_classification", {"n_samples": 300, "n_features": 12, "num_classes": 4}, (12,)),
        ("synthetic_regression", {"n_samples": 300, "n_features": 5}, (5,)),
        ("synthetic_images", {"n_samples": 200, "image_size": 12, "channels": 3, "num_classes": 5}, (3, 12, 12)),
        ("synthetic_sequences", {"n_samples": 200, "seq_len": 24, "n_features": 3, "num_classes": 3}, (24, 3)),
    ],
)
def test_synthetic_datasets_have_the_requested_shapes(name, kw, shape):
    train, val, info = load(name, val_split=0.2, **kw)
    assert len(train) + len(val) == kw["n_samples"]
    assert tuple(train.x.shape[1:]) == shape and info["input_shape"] == list(shape)
    if "num_classes" in kw:
        assert info["num_classes"] == kw["num_classes"]
        assert int(train.y.max()) < kw["num_classes"]
    if name == "synthetic_sequences":
        assert info["seq_len"] == 24
    if name == "synthetic_images":
        assert info["image_size"] == 12


def test_csv_dataset_with_string_labels(tmp_path):
    path = tmp_path / "flowers.csv"
    rows = ["petal,sepal,kind"]
    rng = np.random.default_rng(0)
    for i in range(60):
        kind = ["setosa", "virginica", "versicolor"][i % 3]
        rows.append(f"{rng.normal() + i % 3:.4f},{rng.normal():.4f},{kind}")
    path.write_text("\n".join(rows) + "\n")
    train, val, info = load("csv", path=str(path), target_column="kind", val_split=0.2)
    assert info["task"] == "classification" and info["num_classes"] == 3
    assert info["classes"] == ["setosa", "versicolor", "virginica"]
    assert info["columns"] == ["petal", "sepal"] and train.x.shape[1] == 2
    assert len(train) == 48 and len(val) == 12


def test_csv_numeric_target_regression_and_integer_labels(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("a,b,y\n" + "".join(f"{i},{i * 2},{i * 0.37:.3f}\n" for i in range(40)))
    _, _, info = load("csv", path=str(path), target_column="y")
    assert info["task"] == "regression" and info["out_features"] == 1
    lab = tmp_path / "l.csv"
    lab.write_text("a,y\n" + "".join(f"{i},{[2, 10, 9][i % 3]}\n" for i in range(30)))
    train, _, info = load("csv", path=str(lab), target_column="y")
    assert info["classes"] == ["2", "9", "10"]  # numeric labels sort numerically


def test_csv_errors_name_what_to_fix(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,b,label\n1,2,x\n3,4,y\n")
    with pytest.raises(ValueError, match=r"no column 'target' among the 3 names of its first line"):
        load("csv", path=str(path))
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,target\n1,oops,0\n2,3,1\n")
    with pytest.raises(ValueError, match=r"line 2, column 2: not a number"):
        load("csv", path=str(bad))
    with pytest.raises(ValueError, match="CSV file not found"):
        load("csv", path=str(tmp_path / "missing.csv"))
    with pytest.raises(ValueError, match="needs a path"):
        load("csv")


def test_safetensors_dataset(tmp_path):
    from safetensors.torch import save_file

    x = torch.randn(50, 2, 4, 4)
    y = torch.arange(50) % 5
    path = tmp_path / "data.safetensors"
    save_file({"images": x, "labels": y}, str(path))
    train, val, info = load("safetensors", path=str(path), x_key="images", y_key="labels", normalize="none")
    assert info["input_shape"] == [2, 4, 4] and info["num_classes"] == 5 and info["is_image"]
    got = torch.cat([train.x, val.x])
    assert sorted(got.sum(dim=(1, 2, 3)).tolist()) == pytest.approx(sorted(x.sum(dim=(1, 2, 3)).tolist()), abs=1e-4)
    with pytest.raises(ValueError, match=r"has no tensor 'y' \(y_key\) among its 2 tensors"):
        load("safetensors", path=str(path), x_key="images")


def test_unknown_dataset_suggests_a_name():
    with pytest.raises(ValueError, match=r"unknown dataset 'digit' \(did you mean 'digits'\?\)"):
        load("digit")


def test_bad_split_and_option_errors():
    with pytest.raises(ValueError, match="val_split must be in"):
        load("iris", val_split=1.0)
    with pytest.raises(ValueError, match="as_image applies to"):
        load("iris", as_image=True)
    with pytest.raises(ValueError, match="unknown inputs bogus"):
        load("iris", bogus=1)


def test_dataloader_batches_are_real_torch_batches(digits):
    train, _val, _ = digits
    (loader,) = N["XPUDataLoader"]().make(train, 100, False, 0, True)
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert isinstance(loader.sampler, torch.utils.data.SequentialSampler)
    batches = list(loader)
    assert len(batches) == len(train) // 100  # drop_last
    x, y = batches[0]
    assert x.shape == (100, 64) and y.shape == (100,)
    assert torch.equal(x, train.x[:100]) and torch.equal(y, train.y[:100])


def test_dataloader_shuffle_follows_the_torch_seed(digits):
    train, _, _ = digits
    (loader,) = N["XPUDataLoader"]().make(train, 64, True)
    assert isinstance(loader.sampler, torch.utils.data.RandomSampler)
    torch.manual_seed(5)
    first = torch.cat([y for _, y in loader])
    torch.manual_seed(5)
    again = torch.cat([y for _, y in loader])
    assert torch.equal(first, again) and not torch.equal(first, train.y)
    assert sorted(first.tolist()) == sorted(train.y.tolist())  # a permutation: every sample once


def test_dataloader_with_worker_processes(digits):
    train, _, _ = digits
    (loader,) = N["XPUDataLoader"]().make(train, 256, False, 2, False)
    ys = torch.cat([y for _, y in loader])
    assert torch.equal(ys, train.y)


def test_collate_falls_back_to_default_for_other_datasets():
    ds = torch.utils.data.TensorDataset(torch.arange(10.0).view(5, 2), torch.arange(5))
    (loader,) = N["XPUDataLoader"]().make(ds, 2, False)
    x, y = next(iter(loader))
    assert x.tolist() == [[0.0, 1.0], [2.0, 3.0]] and y.tolist() == [0, 1]
    plain = XpuTensorDataset(torch.zeros(3, 2), torch.zeros(3), {})
    assert [t.shape for t in collate([plain[0], plain[1]])] == [(2, 2), (2,)]


def test_empty_validation_split_gives_an_empty_loader():
    train, val, info = load("iris", val_split=0.0)
    assert len(val) == 0 and info["n_val"] == 0 and len(train) == 150
    (loader,) = N["XPUDataLoader"]().make(val, 16, True)
    assert list(loader) == []


def test_dataloader_rejects_bad_input():
    with pytest.raises(ValueError, match="must be a dataset"):
        N["XPUDataLoader"]().make(None, 4, True)


def test_dataset_is_changed_follows_the_file(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,target\n1,0\n2,1\n")
    first = N["XPUDataset"].IS_CHANGED("csv", path=str(path))
    os.utime(path, (first + 5, first + 5))
    assert N["XPUDataset"].IS_CHANGED("csv", path=str(path)) == first + 5
    assert N["XPUDataset"].IS_CHANGED("digits") == N["XPUDataset"].IS_CHANGED("digits")

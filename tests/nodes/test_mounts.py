"""Storage mounts (docs/workers.md): references, declarations, resolution inside the folder only, and the labels a
graph names. A refused reference reads nothing: no file is opened."""

from __future__ import annotations

import builtins
import io
import json
import os
from pathlib import Path

import pytest

from xpufleet.nodes import data as data_nodes
from xpufleet.nodes import mounts, paths


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "a.csv").write_text("x,target\n1,0\n2,1\n3,0\n4,1\n5,0\n6,1\n7,0\n8,1\n9,0\n10,1\n")
    (root / "sub" / "inner.csv").symlink_to(root / "a.csv")
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "s.csv").write_text("x,target\n1,1\n")
    (root / "out.csv").symlink_to(outside / "s.csv")
    (root / "outdir").symlink_to(outside, target_is_directory=True)
    return {"root": root, "outside": outside}


@pytest.mark.parametrize("value,expected", [
    ("datasets:digits.csv", ("datasets", "digits.csv")),
    ("ds_2:sub/x.csv", ("ds_2", "sub/x.csv")),
    ("datasets:", ("datasets", "")),
    (r"C:\data\x.csv", None),  # a drive letter is not a label
    ("c:/x.csv", None),
    ("https://example.org/x.csv", None),
    ("/abs/path.csv", None),
    ("relative.csv", None),
    ("9lives:x", None),
    (3, None),
])
def test_split_ref(value, expected):
    assert mounts.split_ref(value) == expected


def test_parse_mount_specs(tmp_path):
    assert mounts.parse_mounts([f"datasets={tmp_path}"]) == {"datasets": Path(os.path.realpath(tmp_path))}
    with pytest.raises(mounts.MountError, match="write LABEL=FOLDER"):
        mounts.parse_mount_spec("datasets")
    with pytest.raises(mounts.MountError, match="invalid mount label"):
        mounts.parse_mount_spec(f"d={tmp_path}")
    with pytest.raises(mounts.MountError, match="is not a folder"):
        mounts.parse_mount_spec(f"datasets={tmp_path / 'nope'}")
    with pytest.raises(mounts.MountError, match="given twice"):
        mounts.parse_mounts([f"ds={tmp_path}", f"ds={tmp_path}"])


def test_resolve_inside_only(tree):
    m = {"datasets": tree["root"]}
    root = Path(os.path.realpath(tree["root"]))
    assert mounts.resolve("datasets:a.csv", m) == root / "a.csv"
    assert mounts.resolve("datasets:./sub//inner.csv", m) == root / "a.csv"  # a link inside stays inside
    for value, text in (
        ("datasets:../secret/s.csv", "'..' is not allowed"),
        ("datasets:sub/../../secret/s.csv", "'..' is not allowed"),
        ("datasets:sub\\..\\..\\secret\\s.csv", "'..' is not allowed"),
        ("datasets:/etc/passwd", "must be relative"),
        ("datasets:C:/x", "must be relative"),
        ("datasets:out.csv", "leads out of mount 'datasets'"),
        ("datasets:outdir/s.csv", "leads out of mount 'datasets'"),
        ("datasets:", "names no file"),
        ("other:a.csv", "mount label 'other' is not declared"),
    ):
        with pytest.raises(mounts.MountError, match=text.replace("(", r"\(")):
            mounts.resolve(value, m)


def test_mounts_come_from_the_environment(tree, monkeypatch):
    monkeypatch.setenv("XPUFLEET_MOUNTS", json.dumps({"datasets": str(tree["root"]), "x": "/bad-label"}))
    assert mounts.mounts_from_env() == {"datasets": tree["root"]}
    assert mounts.resolve("datasets:a.csv") == Path(os.path.realpath(tree["root"])) / "a.csv"
    monkeypatch.setenv("XPUFLEET_MOUNTS", "not json")
    assert mounts.mounts_from_env() == {}
    monkeypatch.delenv("XPUFLEET_MOUNTS")
    with pytest.raises(mounts.MountError, match="its mounts: none"):
        mounts.resolve("datasets:a.csv")


def test_a_refused_reference_reads_nothing(tree, monkeypatch):
    """The Dataset node with a reference that leads out: refused before any file is opened."""
    monkeypatch.setenv("XPUFLEET_MOUNTS", json.dumps({"datasets": str(tree["root"])}))
    opened: list[str] = []
    real_open, real_io_open, real_os_open = builtins.open, io.open, os.open

    def spy(path, *a, **k):
        opened.append(str(path))
        return real_open(path, *a, **k)

    def spy_os(path, *a, **k):
        opened.append(str(path))
        return real_os_open(path, *a, **k)

    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(io, "open", spy)
    monkeypatch.setattr(os, "open", spy_os)
    node = data_nodes.XPUDataset()
    for ref in ("datasets:out.csv", "datasets:../secret/s.csv", "datasets:outdir/s.csv"):
        with pytest.raises(paths.OutsideFolderError, match="Dataset: path"):
            node.load("csv", path=ref, target_column="target")
    monkeypatch.setattr(builtins, "open", real_open)
    monkeypatch.setattr(io, "open", real_io_open)
    monkeypatch.setattr(os, "open", real_os_open)
    assert not [p for p in opened if "secret" in p], opened
    # the same node reads a file inside the mount
    train, val, info = node.load("csv", path="datasets:a.csv", target_column="target", val_split=0.2)
    assert info["num_features"] == 1


def test_labels_in_graph():
    graph = {
        "1": {"class_type": "XPUDataset", "inputs": {"name": "csv", "path": "datasets:a.csv"}},
        "2": {"class_type": "XPUModelLoader", "inputs": {"path": "models:m.safetensors"}},
        "3": {"class_type": "XPUModelLoader", "inputs": {"path": ["9", 0]}},  # a link, not a reference
        "4": {"class_type": "XPUModelSaver", "inputs": {"filename": "out:x.safetensors"}},  # writes: not a mount
        "5": {"class_type": "XPUDataset", "inputs": {"name": "csv", "path": "/abs.csv"}},
        "6": "not a node",
    }
    assert mounts.labels_in_graph(graph) == ["datasets", "models"]
    assert mounts.labels_in_graph({}) == []

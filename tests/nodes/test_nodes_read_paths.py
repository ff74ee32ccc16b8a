"""Files a graph reads (nodes/paths.py): only inside this run's directory, the outputs folder, the worker's
mounts, its data roots or (hosted) ComfyUI's folders; the real path is checked (symlinks, '..'), a refusal
names the node, the path and where files may be, and no message ever shows what a file holds."""

from __future__ import annotations

import builtins
import io
import json
import os
from pathlib import Path

import pytest

from xpufleet.nodes import NODE_CLASS_MAPPINGS as N
from xpufleet.nodes import paths, runtime
from xpufleet.server.run.validation import GraphValidationError, format_errors, validate_report
from xpufleet.server.units.model_server import resolve_model

# What a secret file holds: no message may show any of it.
SECRET = "root:*:20228:0:99999:7:::\nadmin:$6$saltsalt$hashhashhash:20228:0:99999:7:::\n"
MARKERS = ("root:*", "20228", "saltsalt", "hashhash", "admin")


@pytest.fixture
def tree(tmp_path, xpufleet_home, monkeypatch):
    """A data root, a mount, this run's dir, another run's dir, and secrets outside all of them."""
    t = {name: tmp_path / name for name in ("data", "mount", "run", "other_run", "outside")}
    for folder in t.values():
        folder.mkdir()
    (t["outside"] / "shadow").write_text(SECRET)
    (t["data"] / "escape.csv").symlink_to(t["outside"] / "shadow")  # a link out of the data root
    (t["data"] / "ok.csv").write_text("a,target\n" + "".join(f"{i},{i % 2}\n" for i in range(20)))
    (t["mount"] / "m.csv").write_text("a,target\n1,0\n2,1\n3,0\n4,1\n")
    (t["other_run"] / "ck.pt").write_bytes(b"weights of another run")
    (t["run"] / "own.pt").write_bytes(b"x")
    outputs = xpufleet_home / "outputs"
    outputs.mkdir()
    (outputs / "out_link").symlink_to(t["outside"], target_is_directory=True)
    monkeypatch.setenv("XPUFLEET_DATA_ROOTS", str(t["data"]))
    monkeypatch.setenv("XPUFLEET_MOUNTS", json.dumps({"datasets": str(t["mount"])}))
    t["outputs"] = outputs
    return t


def _in_run(tree):
    return runtime.use(runtime.RunContext(emit=lambda t, p: None, run_dir=tree["run"]))


# --- the rule --------------------------------------------------------------------------------------


def test_allowed_places_resolve_to_their_real_path(tree):
    data = Path(os.path.realpath(tree["data"]))
    assert paths.read_candidates(str(tree["data"] / "ok.csv"), "x") == [data / "ok.csv"]
    assert paths.read_candidates(str(tree["data"] / "sub" / ".." / "ok.csv"), "x") == [data / "ok.csv"]
    assert paths.read_candidates("datasets:m.csv", "x") == [Path(os.path.realpath(tree["mount"])) / "m.csv"]
    assert paths.read_candidates(str(tree["mount"] / "m.csv"), "x")  # a mount's folder by path too
    assert paths.read_candidates(str(tree["outputs"] / "models" / "m.pt"), "x")  # need not exist yet
    with _in_run(tree):
        assert paths.read_candidates(str(tree["run"] / "own.pt"), "x") == [Path(os.path.realpath(tree["run"] / "own.pt"))]
        # a relative path: outputs folder, run dir, then each data root (all inside their folder)
        assert paths.read_candidates("ok.csv", "x") == [tree["outputs"] / "ok.csv", tree["run"] / "ok.csv",
                                                        data / "ok.csv"]
    assert paths.readable_file("ok.csv", "x") == data / "ok.csv"


@pytest.mark.parametrize("make,why", [
    (lambda t: "/etc/shadow", "is outside the folders graphs may read"),
    (lambda t: str(t["outside"] / "shadow"), "is outside the folders graphs may read"),
    (lambda t: str(t["data"] / ".." / "outside" / "shadow"), "is outside the folders graphs may read"),  # '..'
    (lambda t: str(t["data"] / "escape.csv"), "is outside the folders graphs may read"),  # symlink out of a root
    (lambda t: str(t["other_run"] / "ck.pt"), "is outside the folders graphs may read"),  # another run's file
    (lambda t: "~/.ssh/id_rsa", "is outside the folders graphs may read"),
    (lambda t: "../outside/shadow", "climbs out of its folder with '..'"),
    (lambda t: "out_link/shadow", "leads outside the outputs folder"),  # relative, through a link
    (lambda t: "datasets:../outside/shadow", "'..' is not allowed"),
    (lambda t: "datasets:/etc/shadow", "must be relative to the mount's folder"),
    (lambda t: "nomount:x.csv", "mount label 'nomount' is not declared"),
    (lambda t: "a\x00b", "NUL"),
])
def test_anything_else_is_refused_by_name(tree, make, why):
    value = make(tree)
    with _in_run(tree), pytest.raises(paths.OutsideFolderError) as info:
        paths.read_candidates(value, "Dataset: path")
    text = str(info.value)
    assert text.startswith("Dataset: path") and why in text, text
    if "outside the folders" in why:  # says where files may be, and how the owner adds a place
        assert "this run's directory" in text and "the outputs folder" in text
        assert f"the data roots {os.path.realpath(tree['data'])}" in text and "mounts" in text


def test_without_a_data_root_the_message_says_how_to_add_one(tree, monkeypatch):
    monkeypatch.delenv("XPUFLEET_DATA_ROOTS")
    verdict = paths.read_input_check("path", "/etc/shadow")
    assert verdict.startswith("path '/etc/shadow' is outside") and "--data-root DIR" in verdict


def test_data_roots_from_the_environment_and_the_agent_flag(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a", target_is_directory=True)
    env = {"XPUFLEET_DATA_ROOTS": os.pathsep.join([str(tmp_path / "link"), "", "relative", str(tmp_path / "a")])}
    assert paths.data_roots(env) == [Path(os.path.realpath(tmp_path / "a"))]  # real, once; relative ignored
    monkeypatch.chdir(tmp_path)
    assert paths.parse_data_roots(["a", str(tmp_path / "link")]) == [Path(os.path.realpath(tmp_path / "a"))]
    with pytest.raises(paths.DataRootError, match="is not a folder"):
        paths.parse_data_roots([str(tmp_path / "missing")])


def test_hosted_comfyuis_input_and_models_folders_are_readable(comfy_host, tmp_path, monkeypatch):
    import folder_paths

    (tmp_path / "comfy" / "input").mkdir(parents=True)
    (tmp_path / "comfy" / "input" / "d.csv").write_text("a,target\n1,0\n")
    monkeypatch.setattr(folder_paths, "get_input_directory", lambda: str(tmp_path / "comfy" / "input"),
                        raising=False)
    assert paths.readable_file("d.csv", "x") == tmp_path / "comfy" / "input" / "d.csv"
    assert paths.read_candidates(str(tmp_path / "comfy" / "models" / "checkpoints" / "m.pt"), "x")
    verdict = paths.read_input_check("path", "/etc/shadow")
    assert "ComfyUI's input folder" in verdict and "ComfyUI's models folder" in verdict


# --- every node that reads a file --------------------------------------------------------------------


def _no_secret(text: str) -> None:
    assert not [m for m in MARKERS if m in text], text


@pytest.mark.parametrize("node,inputs,name", [
    ("XPUDataset", {"name": "csv", "path": "/etc/shadow"}, "path"),
    ("XPUDataset", {"name": "safetensors", "path": "/etc/shadow"}, "path"),
    ("XPUModelLoader", {"path": "/etc/shadow"}, "path"),
    ("XPUTrainingLoop", {"resume_from": "/etc/shadow"}, "resume_from"),
])
def test_validation_refuses_etc_shadow_by_name(tree, node, inputs, name):
    verdict = N[node].VALIDATE_INPUTS(**inputs)
    assert verdict is not True and verdict.startswith(f"{name} '/etc/shadow' is outside"), verdict
    assert N[node].VALIDATE_INPUTS(**{**inputs, name: None}) is True  # linked: checked at run time
    if node == "XPUDataset":  # a built-in dataset is a name, not a path
        assert N[node].VALIDATE_INPUTS(name="digits", path="/etc/shadow") is True


def test_the_servers_graph_check_names_the_node_and_the_path(tree):
    graph = json.loads((Path(__file__).parents[2] / "samples" / "predict_saved.json").read_text())
    validate_report(graph).raise_if_invalid()  # the template as shipped passes
    graph["1"]["inputs"]["path"] = str(tree["other_run"] / "ck.pt")
    graph["2"]["inputs"].update(name="csv", path="/etc/shadow")
    with pytest.raises(GraphValidationError) as info:
        validate_report(graph).raise_if_invalid()
    text = format_errors(info.value.response)
    assert "node 1 (XPUModelLoader)" in text and f"path '{tree['other_run'] / 'ck.pt'}' is outside" in text
    assert "node 2 (XPUDataset)" in text and "path '/etc/shadow' is outside" in text


def test_nodes_refuse_at_run_time_without_opening_anything(tree, monkeypatch, make_run):
    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def spy(path, *a, **k):
        opened.append(str(path))
        return real_open(path, *a, **k)

    def spy_os(path, *a, **k):
        opened.append(str(path))
        return real_os_open(path, *a, **k)

    secret = str(tree["outside"] / "shadow")
    calls = [
        lambda p: N["XPUDataset"]().load("csv", path=p),
        lambda p: N["XPUDataset"]().load("safetensors", path=p),
        lambda p: N["XPUModelLoader"]().load(p),
        lambda p: resolve_model(p),
    ]
    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(io, "open", spy)
    monkeypatch.setattr(os, "open", spy_os)
    messages = []
    for call in calls:
        for bad in ("/etc/shadow", secret, str(tree["data"] / "escape.csv"), str(tree["other_run"] / "ck.pt")):
            with pytest.raises(paths.OutsideFolderError) as info:
                call(bad)
            messages.append(str(info.value))
    monkeypatch.undo()
    assert not [p for p in opened if "shadow" in p or "escape" in p or "other_run" in p], opened
    assert all("is outside the folders graphs may read" in m for m in messages), messages
    assert any(m.startswith("Dataset: path") for m in messages) and any(m.startswith("ModelLoader: path")
                                                                        for m in messages)


def test_training_loop_resume_from_is_refused_by_name(tree, digits, loaders, build_mlp, train_node):
    tl, _ = loaders
    with pytest.raises(ValueError) as info:
        train_node(build_mlp(digits[2]), tl, epochs=1, resume_from=str(tree["other_run"] / "ck.pt"))
    assert "resume_from: the checkpoint" in str(info.value) and "is outside the folders" in str(info.value)


def test_no_message_shows_what_a_file_holds(tree, digits, loaders, build_mlp, train_node):
    """Files inside a data root that are not what the node expects: the errors say where and what was
    expected, never a cell, a header name or a byte of the file."""
    data = tree["data"]
    (data / "shadow.csv").write_text(SECRET)
    (data / "shadow2.csv").write_text("target,root:*:20228\n1,admin-saltsalt\n")
    (data / "shadow.safetensors").write_text(SECRET)
    (data / "shadow.pt").write_text(SECRET)
    (data / "shadow.bin").write_bytes(b"\xffroot:*:20228")
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"root:*:20228": np.zeros((2, 2), np.float32)}, str(data / "named.safetensors"))
    failures = [
        lambda: N["XPUDataset"]().load("csv", path=str(data / "shadow.csv")),
        lambda: N["XPUDataset"]().load("csv", path=str(data / "shadow.csv"), target_column="root:*:20228:0:99999:7:::"),
        lambda: N["XPUDataset"]().load("csv", path=str(data / "shadow2.csv")),
        lambda: N["XPUDataset"]().load("csv", path=str(data / "shadow.bin")),
        lambda: N["XPUDataset"]().load("safetensors", path=str(data / "shadow.safetensors")),
        lambda: N["XPUDataset"]().load("safetensors", path=str(data / "named.safetensors")),
        lambda: N["XPUModelLoader"]().load(str(data / "shadow.pt")),
        lambda: N["XPUModelLoader"]().load(str(data / "shadow.safetensors")),
        lambda: train_node(build_mlp(digits[2]), loaders[0], epochs=1, resume_from=str(data / "shadow.pt")),
    ]
    for fail in failures:
        with pytest.raises(ValueError) as info:
            fail()
        text = str(info.value).replace("root:*:20228:0:99999:7:::", "TARGET")  # the input the user typed
        _no_secret(text)


def test_a_file_in_a_data_root_or_a_mount_loads(tree):
    train, val, info = N["XPUDataset"]().load("csv", path=str(tree["data"] / "ok.csv"), val_split=0.2)
    assert info["num_features"] == 1 and len(train) + len(val) == 20
    _, _, info = N["XPUDataset"]().load("csv", path="datasets:m.csv", val_split=0.25)
    assert info["n_train"] + info["n_val"] == 4

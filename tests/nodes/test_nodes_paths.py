"""Where nodes write (nodes/paths.py): every path a graph gives stays inside its folder, whatever
Hypothesis throws at the resolver (absolute, '..', '~', drives, NUL, symlinks leading out)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xpufleet.nodes import paths, runtime

PARTS = st.sampled_from(["a", "b", "..", ".", "", "~", "link", "out", "C:", "\\\\srv", "x" * 300, "é", "\x00",
                         "models", "m.pt", " ", "\\", "/"])


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "link").symlink_to(tmp_path / "outside", target_is_directory=True)  # leads out
    (root / "inner").symlink_to(root / "sub", target_is_directory=True)  # stays in
    return root


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(PARTS, min_size=1, max_size=6).map("/".join) | st.text(max_size=30))
def test_a_resolved_path_is_always_inside_its_folder(folder, text):
    try:
        target = paths.resolve_inside(folder, text, "ModelSaver: filename", "the outputs folder")
    except paths.OutsideFolderError as exc:  # the one documented refusal, saying where files may go
        assert "ModelSaver: filename" in str(exc) and "files go inside the outputs folder" in str(exc)
        assert str(folder) not in str(exc)
        return
    real, root = os.path.realpath(target), os.path.realpath(folder)
    assert os.path.commonpath([root, real]) == root and real != root
    assert paths.relative_path_problem(text) is None


@pytest.mark.parametrize("text,why", [
    ("../x.pt", "climbs out of its folder with '..'"), ("a/../../x", "with '..'"), ("a\\..\\x", "with '..'"),
    ("/etc/passwd", "is absolute"), ("~/.ssh/authorized_keys", "is absolute"), ("C:\\x.pt", "is absolute"),
    ("\\\\server\\share\\x", "is absolute"), ("", "is empty"), ("  ", "is empty"), ("a\x00b", "NUL"),
    ("x" * 256, "a name of 256 bytes"), ("a/" * 600, "at most 1024"), ("link/x.pt", "through a symbolic link"),
    ("link", "through a symbolic link"), (".", "names the folder itself"),
])
def test_refusals_name_the_problem(folder, text, why):
    with pytest.raises(paths.OutsideFolderError, match="ModelSaver: filename") as info:
        paths.resolve_inside(folder, text, "ModelSaver: filename", "the outputs folder")
    assert why in str(info.value)


def test_links_inside_the_folder_and_plain_names_are_fine(folder):
    assert paths.resolve_inside(folder, "inner/m.pt", "f", "w") == folder / "inner" / "m.pt"
    assert paths.resolve_inside(folder, " models/m.safetensors ", "f", "w") == folder / "models" / "m.safetensors"
    assert paths.resolve_inside(folder, "é" * 127, "f", "w") == folder / ("é" * 127)  # 254 bytes


def test_checkpoint_dir_goes_inside_the_run_dir_or_the_outputs_folder(tmp_path, xpufleet_home):
    assert paths.work_folder("ck", "TrainingLoop: checkpoint_dir") == xpufleet_home / "outputs" / "ck"
    ctx = runtime.RunContext(emit=lambda t, p: None, run_dir=tmp_path / "run")
    with runtime.use(ctx):
        assert paths.work_folder("ck/a", "x") == tmp_path / "run" / "ck" / "a"
        with pytest.raises(paths.OutsideFolderError, match="files go inside this run's directory"):
            paths.work_folder(str(tmp_path / "elsewhere"), "TrainingLoop: checkpoint_dir")
    from xpufleet.nodes import NODE_CLASS_MAPPINGS as N

    loop = N["XPUTrainingLoop"]
    assert loop.VALIDATE_INPUTS() is True and loop.VALIDATE_INPUTS(checkpoint_dir="ck") is True
    assert "is absolute" in loop.VALIDATE_INPUTS(checkpoint_dir="/tmp/ck")


def test_hosted_outputs_go_under_comfyuis_output_folder(comfy_host, tmp_path):
    assert paths.outputs_dir() == Path(tmp_path / "comfy" / "output" / "xpufleet")
    assert paths.resolve_output_path("models/m.pt") == tmp_path / "comfy" / "output" / "xpufleet" / "models" / "m.pt"
    with pytest.raises(paths.OutsideFolderError, match="ComfyUI's output/xpufleet"):
        paths.resolve_output_path("../../x.pt")

"""constants.home_dir: the one place the state folder is derived (issue 8: `~` was used literally)."""

from __future__ import annotations

from xpufleet.constants import ENV_HOME, home_dir


def test_a_tilde_in_xpufleet_home_is_the_users_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert home_dir({ENV_HOME: "~/xf"}) == (tmp_path / "xf").resolve()
    assert home_dir({ENV_HOME: "  ~/xf  "}) == (tmp_path / "xf").resolve()
    assert home_dir({}) == (tmp_path / ".xpufleet").resolve()
    assert home_dir({ENV_HOME: ""}) == (tmp_path / ".xpufleet").resolve()


def test_every_part_reads_the_same_folder(monkeypatch, tmp_path):
    """The predictor's snapshot folder and the sidecar's runtime file live under home_dir()."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(ENV_HOME, "~/xf")
    from xpufleet.common.runtime_file import runtime_path
    from xpufleet.predictor.calibration import calibration_path

    home = (tmp_path / "xf").resolve()
    assert home_dir() == home
    assert calibration_path().parent == home and runtime_path().parent == home

"""End to end (docs/workers.md): storage mounts. An agent declares ``--mount datasets=FOLDER``; a graph whose CSV
input is ``datasets:iris.csv`` reads that folder on that worker; ``..`` and a symbolic link out of the
folder are refused; a run naming a label its worker lacks is a 400 for a named worker and waits for one
that has it under ``any``."""

from __future__ import annotations

import csv
from pathlib import Path

import fleet_harness as fh
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def _write_iris(path: Path) -> None:
    from sklearn.datasets import load_iris

    data = load_iris()
    with open(path, "w", newline="") as fh_:
        w = csv.writer(fh_)
        w.writerow([*data.feature_names, "target"])
        for row, y in zip(data.data, data.target, strict=True):
            w.writerow([*row, int(y)])


def _csv(path: str) -> dict:
    return fh.iris_graph(name="csv", path=path, target_column="target")


def test_a_mount_label_resolves_inside_its_folder_only(fleet, tmp_path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    _write_iris(data / "iris.csv")
    (data / "sub" / "same.csv").symlink_to(data / "iris.csv")  # a link inside the mount is fine
    secret = tmp_path / "secret"
    secret.mkdir()
    _write_iris(secret / "secret.csv")
    (data / "escape.csv").symlink_to(secret / "secret.csv")

    sc = fleet.sidecar()
    mounted = fleet.agent("--name", "mounted", "--mount", f"datasets={data}", label="mounted")
    plain = fleet.agent("--name", "plain", label="plain")
    mounted.wait_connected()
    plain.wait_connected()
    w = sc.worker("mounted")
    assert w["mounts"] == [{"label": "datasets", "folder": str(data.resolve())}]
    assert sc.worker("plain")["mounts"] == []

    ok = sc.submit(_csv("datasets:iris.csv"), target="mounted")
    linked = sc.submit(_csv("datasets:sub/same.csv"), target="any")  # any: only a worker with the label
    up = sc.submit(_csv("datasets:../secret/secret.csv"), target="mounted")
    out = sc.submit(_csv("datasets:escape.csv"), target="mounted")
    absolute = sc.submit(_csv(f"datasets:{secret / 'secret.csv'}"), target="mounted")
    for rid in (ok, linked):
        run = sc.wait_run(rid, {"succeeded", "failed"})
        assert run["status"] == "succeeded", run["error"]
        assert run["worker_id"] == "mounted"
    assert sc.run(ok)["final_metrics"]["eval_accuracy"] > 0.4  # trained on the CSV the mount holds (3 classes)
    for rid, text in ((up, "'..' is not allowed"), (out, "leads out of mount 'datasets'"),
                      (absolute, "must be relative to the mount's folder")):
        run = sc.wait_run(rid, {"succeeded", "failed"})
        assert run["status"] == "failed" and text in run["error"], run["error"]

    # a named worker without the label: refused at submit, with what to do
    code, body = sc.call("POST", "/api/runs", {"graph": _csv("datasets:iris.csv"), "options": {"target": "plain"}})
    assert code == 400 and "worker 'plain' has no storage mount 'datasets'" in body["error"]
    assert "--mount datasets=FOLDER" in body["error"]
    code, body = sc.call("POST", "/api/runs", {"graph": _csv("datasets:iris.csv"), "options": {}})
    assert code == 400 and "resolves on workers only" in body["error"]

    # any: no worker has 'archive' yet; the run waits, saying why, until one that has it connects
    waiting = sc.submit(_csv("archive:iris.csv"), target="any")
    sc.wait_reason(waiting, "declares mount 'archive'")
    late = fleet.agent("--name", "archivist", "--mount", f"archive={data}", label="archivist")
    late.wait_connected()
    run = sc.wait_run(waiting, {"succeeded", "failed"})
    assert run["status"] == "succeeded" and run["worker_id"] == "archivist", run["error"]

    bad = fleet.cli("agent", "start", "--name", "x", "--mount", "datasets")
    assert bad.returncode == 2 and "write LABEL=FOLDER" in bad.stderr
    bad = fleet.cli("agent", "start", "--name", "x", "--mount", f"d={data}")
    assert bad.returncode == 2 and "invalid mount label" in bad.stderr

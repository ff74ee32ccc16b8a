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


# --- issue 29: a graph reads only what its worker allows ----------------------------------------------

SHADOW = "root:*:20228:0:99999:7:::"


def _loader_graph(path: str) -> dict:
    """ModelLoader -> Predict on iris, then ModelSaver into the run's own directory (what the probe used
    to re-serve another run's checkpoint through the artifacts route)."""
    g = fh.iris_graph()
    return {"1": g["1"], "2": g["2"],
            "20": {"class_type": "XPUModelLoader", "inputs": {"path": path}},
            "21": {"class_type": "XPUPredict", "inputs": {"model": ["20", 0], "output": "auto", "device": "cpu",
                                                           "batch_size": 64, "dataloader": ["2", 0]}},
            "22": {"class_type": "XPUModelSaver", "inputs": {"model": ["20", 0], "filename": "stolen.pt",
                                                             "format": "pytorch", "location": "run_dir"}}}


def _refused_before_it_ran(sc, rid: str, node: str, path: str) -> dict:
    run = sc.wait_run(rid, {"succeeded", "failed"})
    assert run["status"] == "failed", run
    assert f"node {node}" in run["error"] and f"path '{path}' is outside the folders graphs may read" in run["error"]
    assert SHADOW not in run["error"] and "root:" not in run["error"]
    events = sc.events(rid)
    assert not [e for e in events if e["type"] in ("node_started", "artifact")], events  # no node ran
    return run


def test_a_graph_reads_only_the_run_folder_mounts_and_data_roots_of_its_worker(fleet, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _write_iris(data / "iris.csv")
    outside = tmp_path / "outside"
    outside.mkdir()
    _write_iris(outside / "iris.csv")  # a readable CSV, but not in a place the worker allows
    (data / "link.csv").symlink_to(outside / "iris.csv")  # a link out of the data root

    sc = fleet.sidecar(XPUFLEET_DATA_ROOTS=str(data))  # the sidecar's own data root, for its local runs
    agent = fleet.agent("--name", "owned", "--data-root", str(data), label="owned")
    agent.wait_connected()

    # a run that writes a checkpoint into its own run directory on the worker
    first_graph = fh.iris_graph()
    first_graph["8"]["inputs"]["checkpoint_every"] = 1
    first = sc.submit(first_graph, target="owned")
    assert sc.wait_run(first, {"succeeded", "failed"})["status"] == "succeeded"
    ckpt = next(e["payload"]["path"] for e in sc.events(first)
                if e["type"] == "artifact" and e["payload"]["kind"] == "checkpoint")
    assert Path(ckpt).is_file()

    # queued to the worker: refused by its run's graph check, before any node runs
    shadow = sc.submit(_csv("/etc/shadow"), target="owned")
    stolen = sc.submit(_loader_graph(ckpt), target="owned")
    linked = sc.submit(_csv(str(data / "link.csv")), target="owned")
    outside_run = sc.submit(_csv(str(outside / "iris.csv")), target="owned")
    inside = sc.submit(_csv(str(data / "iris.csv")), target="owned")
    relative = sc.submit(_csv("iris.csv"), target="owned")  # found in the data root
    _refused_before_it_ran(sc, shadow, "1 (XPUDataset)", "/etc/shadow")
    _refused_before_it_ran(sc, stolen, "20 (XPUModelLoader)", ckpt)
    _refused_before_it_ran(sc, linked, "1 (XPUDataset)", str(data / "link.csv"))
    _refused_before_it_ran(sc, outside_run, "1 (XPUDataset)", str(outside / "iris.csv"))
    served = sc.ok("GET", f"/api/runs/{stolen}/artifacts")["artifacts"]
    assert not [a for a in served if "stolen" in str(a)], served  # nothing re-saved, nothing re-served
    for rid in (inside, relative):
        run = sc.wait_run(rid, {"succeeded", "failed"})
        assert run["status"] == "succeeded" and run["worker_id"] == "owned", run["error"]
    assert sc.run(inside)["final_metrics"]["eval_accuracy"] > 0.4  # trained on the data root's CSV

    # run by the sidecar itself: its own check refuses before queuing (400, naming node and path)
    for graph, node, path in ((_csv("/etc/shadow"), "1", "/etc/shadow"), (_loader_graph(ckpt), "20", ckpt)):
        code, body = sc.call("POST", "/api/runs", {"graph": graph, "options": {"target": "local"}})
        assert code == 400, body
        (err,) = body["node_errors"][node]["errors"]
        assert err["type"] == "custom_validation_failed" and f"path '{path}' is outside" in err["message"]
    local = sc.submit(_csv(str(data / "iris.csv")), target="local")  # the sidecar's data root
    assert sc.wait_run(local, {"succeeded", "failed"})["status"] == "succeeded"

    bad = fleet.cli("agent", "start", "--name", "x", "--data-root", str(tmp_path / "missing"))
    assert bad.returncode == 2 and "is not a folder" in bad.stderr

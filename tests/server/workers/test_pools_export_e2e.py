"""End to end: ``xpufleet pools export NAME --format k8s`` against a real sidecar, and the Slurm settings of
``pools create --slurm`` refused with the field named and nothing written (docs/slurm-and-k8s.md)."""

from __future__ import annotations

import fleet_harness as fh
import kubernetes_validate as kv  # a declared test dependency: missing fails, never skips
import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_export_writes_manifests_that_validate_and_carry_a_working_credential(fleet, tmp_path):
    sc = fleet.sidecar()
    assert fleet.cli("pools", "create", "spot").returncode == 0
    out_file = tmp_path / "spot.yaml"
    exported = fleet.cli("pools", "export", "spot", "--format", "k8s", "--image", "registry.example/xpufleet:1.0",
                         "--namespace", "ml", "--gpus", "2", "--instances", "3", "-o", str(out_file))
    assert exported.returncode == 0, exported.stderr
    assert "reissued" in exported.stderr  # a manual pool's credential is shown once: the export makes a new one
    assert oct(out_file.stat().st_mode & 0o777) == "0o600"
    docs = list(yaml.safe_load_all(out_file.read_text()))
    for doc in docs:
        kv.validate(doc, kv.utils.latest_version(), strict=True)
    secret, job = docs
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-1] == sc.url
    # the credential in the Secret is the pool's current one: a one-shot agent joins with it
    token = secret["stringData"]["credential"]
    agent = fleet.agent("--one-shot", "--join", token, label="k8s-like")
    agent.wait_connected()
    run = sc.wait_run(sc.submit(fh.iris_graph(), target={"pool": "spot"}), {"succeeded", "failed"})
    assert run["status"] == "succeeded", run["error"]
    # a credential given back is checked, not trusted
    code, body = sc.call("POST", "/api/pools/spot/export", {"credential": "xfp_wrong"})
    assert code == 400 and "not pool spot's current credential" in body["error"]
    code, body = sc.call("POST", "/api/pools/spot/export", {"credential": token, "namespace": "ML"})
    assert code == 400 and "--namespace 'ML' is not a Kubernetes namespace" in body["error"]
    bad = fleet.cli("pools", "create", "Spot_2")
    assert bad.returncode == 0
    refused = fleet.cli("pools", "export", "Spot_2", "--format", "k8s")
    assert refused.returncode == 2 and "cannot name Kubernetes objects" in refused.stderr, refused.stderr


def test_bad_slurm_settings_are_refused_naming_the_field_and_nothing_is_written(fleet):
    sc = fleet.sidecar()
    for slurm, needle in (({"max_jobs": 0}, "slurm.max_jobs"), ({"sbatch_args": ["--job-name=x"]}, "--job-name"),
                          ({"partition": "a b"}, "slurm.partition"), ({"colour": 1}, "unknown field(s) colour")):
        code, body = sc.call("POST", "/api/pools", {"name": "sl", "slurm": slurm})
        assert code == 400 and needle in body["error"], (slurm, body)
    assert sc.ok("GET", "/api/pools")["pools"] == []
    assert not (fleet.home / "slurm").exists()
    cli = fleet.cli("pools", "create", "sl", "--partition", "gpu")
    assert cli.returncode == 2 and "--partition only apply to a Slurm pool: add --slurm" in cli.stderr, (cli.returncode, cli.stderr)
    cli = fleet.cli("pools", "create", "sl", "--slurm", "--time-limit", "1h")
    assert cli.returncode == 2 and "slurm.time_limit" in cli.stderr, (cli.returncode, cli.stderr)

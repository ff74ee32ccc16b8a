"""The LeaderWorkerSet export: size, replicas, both templates with the contract, guard, rolling update."""

from __future__ import annotations

import yaml

from xpufleet.server.units.envcontract import CONTRACT
from xpufleet.server.units.lws import (
    API_VERSION,
    GROUP_INDEX_LABEL,
    WORKER_INDEX_LABEL,
    lws_manifest,
    to_yaml,
)
from xpufleet.server.units.spec import parse_service

MODEL = {"name": "digits", "program": {"model": {"path": "models/mlp_digits.safetensors"}},
         "unit": {"size": 2, "guard": True}, "replicas": 3, "target": {"device": "cuda"}, "drain_timeout_s": 20}


def _env(container):
    return {e["name"]: e for e in container["env"]}


def test_the_set_and_its_templates():
    lws, svc = lws_manifest(parse_service(MODEL), image="registry/xpufleet:0.1", namespace="ml")
    assert lws["apiVersion"] == API_VERSION and lws["kind"] == "LeaderWorkerSet"
    assert lws["metadata"]["name"] == "digits" and lws["metadata"]["namespace"] == "ml"
    spec = lws["spec"]
    assert spec["replicas"] == 3 and spec["startupPolicy"] == "LeaderCreated"
    assert spec["rolloutStrategy"] == {"type": "RollingUpdate",
                                       "rollingUpdateConfiguration": {"maxSurge": 1, "maxUnavailable": 0}}
    tmpl = spec["leaderWorkerTemplate"]
    assert tmpl["size"] == 2 and tmpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    for role in ("leaderTemplate", "workerTemplate"):
        (c,) = tmpl[role]["spec"]["containers"]
        env = _env(c)
        # LWS injects LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX; the rest is set here
        assert set(CONTRACT) - set(env) == {"LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"}
        assert env["RANK_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{WORKER_INDEX_LABEL}']"
        assert env["UNIT_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{GROUP_INDEX_LABEL}']"
        assert env["MASTER_ADDR"]["value"] == "$(LWS_LEADER_ADDRESS)" and env["WORLD_SIZE"]["value"] == "2"
        assert env["LOCAL_RANK"]["value"] == "0"
        assert c["image"] == "registry/xpufleet:0.1" and c["resources"] == {"limits": {"nvidia.com/gpu": 1}}
        assert c["command"] == ["python", "-m", "xpufleet.server.units.model_server"]
        assert "models/mlp_digits.safetensors" in env["XPUFLEET_UNIT_PROGRAM"]["value"]
        assert tmpl[role]["spec"]["terminationGracePeriodSeconds"] == 20
    leader = tmpl["leaderTemplate"]["spec"]["containers"][0]
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert "readinessProbe" not in tmpl["workerTemplate"]["spec"]["containers"][0]
    assert svc["kind"] == "Service" and svc["spec"]["selector"][WORKER_INDEX_LABEL] == "0"  # rank 0 only


def test_guard_off_is_restart_policy_none():
    lws, _ = lws_manifest(parse_service({**MODEL, "unit": {"size": 2, "guard": False}}))
    assert lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "None"


def test_a_command_keeps_its_argv_with_placeholders_filled():
    body = {"name": "engine", "unit": {"size": 4}, "target": {"device": "cpu"},
            "program": {"command": ["engine", "--port", "{port}", "--rank", "{rank}", "--peers", "{size}",
                                    "--leader", "{master_addr}:{master_port}"], "health_path": "/healthz",
                        "env": {"HF_HOME": "/srv/hf"}}}
    lws, _ = lws_manifest(parse_service(body), port=9000, master_port=29400)
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    leader = tmpl["leaderTemplate"]["spec"]["containers"][0]
    assert leader["command"] == ["engine", "--port", "9000", "--rank", "$(RANK_ID)", "--peers", "4",
                                 "--leader", "$(LWS_LEADER_ADDRESS):29400"]
    assert _env(leader)["HF_HOME"]["value"] == "/srv/hf" and "resources" not in leader
    assert leader["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 9000}
    assert tmpl["restartPolicy"] == "None"


def test_yaml_is_two_documents():
    docs = list(yaml.safe_load_all(to_yaml(lws_manifest(parse_service(MODEL)))))
    assert [d["kind"] for d in docs] == ["LeaderWorkerSet", "Service"]
    assert docs[0]["spec"]["leaderWorkerTemplate"]["size"] == 2

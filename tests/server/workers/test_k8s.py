"""Kubernetes manifests of a pool (server/workers/k8s.py), validated with kubernetes-validate against a
current Kubernetes schema; arbitrary names are refused with the rule or round-trip through YAML intact.
(No API server here: the manifests are checked against the schema, never applied.)"""

from __future__ import annotations

import kubernetes_validate as kv  # a declared test dependency: missing fails, never skips
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from xpufleet.server.workers.k8s import ExportError, K8sExport, manifests, to_yaml

K8S_VERSION = kv.utils.latest_version()


def _validate(docs):
    for doc in docs:
        kv.validate(doc, K8S_VERSION, strict=True)


def test_secret_and_indexed_job_validate_against_the_current_schema():
    ex = K8sExport(pool="spot", server_url="https://10.0.0.5:8288", image="registry.example/xpufleet:1.0",
                   namespace="ml", gpus=2, instances=3, fingerprint="ab" * 32)
    docs = list(yaml.safe_load_all(to_yaml(manifests(ex, "xfp_secret"))))
    _validate(docs)
    secret, job = docs
    assert secret["kind"] == "Secret" and secret["stringData"]["credential"] == "xfp_secret"
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 3
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2 and pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert c["command"][-4:] == ["--server", "https://10.0.0.5:8288", "--fingerprint", "ab" * 32]
    assert "xfp_secret" not in str(c)  # the pod gets it from the Secret, never in its command
    assert c["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "xpufleet-spot-credential", "key": "credential"}


def test_a_schema_violation_is_caught_by_the_validator():
    """The check can fail: a Job whose completions is a string is refused by the schema."""
    _secret, job = manifests(K8sExport(pool="spot", server_url="http://h:1"), "xfp_x")
    job["spec"]["completions"] = "three"
    with pytest.raises(kv.ValidationError):
        kv.validate(job, K8S_VERSION, strict=True)


@pytest.mark.parametrize("field,value,needle", [("pool", "Spot_1", "pool name"), ("namespace", "ML", "--namespace"),
                                                ("image", "bad image", "--image"), ("gpus", -1, "--gpus")])
def test_bad_values_are_refused_with_the_rule(field, value, needle):
    args = {"pool": "spot", "server_url": "http://h:1", field: value}
    with pytest.raises(ExportError, match=needle):
        manifests(K8sExport(**args), "xfp_x")


@settings(max_examples=200, deadline=None)
@given(pool=st.text(max_size=70), image=st.text(max_size=80), namespace=st.text(max_size=70))
def test_arbitrary_names_are_refused_or_round_trip_intact(pool, image, namespace):
    ex = K8sExport(pool=pool, server_url="http://h:1", image=image, namespace=namespace)
    try:
        docs = manifests(ex, "xfp_x")
    except ExportError as exc:
        assert any(w in str(exc) for w in ("pool name", "--namespace", "--image"))
        return
    back = list(yaml.safe_load_all(to_yaml(docs)))
    assert back == docs
    assert back[1]["spec"]["template"]["spec"]["containers"][0]["image"] == image
    assert back[0]["metadata"]["namespace"] == namespace == back[1]["metadata"]["namespace"]
    assert back[1]["metadata"]["labels"]["xpufleet.dev/pool"] == pool


@settings(max_examples=40, deadline=None)
@given(pool=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?", fullmatch=True),
       namespace=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?", fullmatch=True),
       image=st.from_regex(r"[a-z0-9][a-z0-9./:-]{0,40}", fullmatch=True), gpus=st.integers(0, 8))
def test_every_accepted_export_validates(pool, namespace, image, gpus):
    _validate(manifests(K8sExport(pool=pool, server_url="http://h:1", image=image, namespace=namespace,
                                  gpus=gpus), "xfp_x"))

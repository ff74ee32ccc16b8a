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


def _kubelet_expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet does to a container's command: ``$$`` -> ``$``, ``$(NAME)`` -> NAME's value when
    the container defines it (else left as written) (k8s.io/kubernetes third_party/forked/golang/expansion)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if text[i + 1] == "(" and (end := text.find(")", i + 2)) != -1:
                name = text[i + 2:end]
                out.append(env.get(name, text[i:end + 1]))
                i = end + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


@pytest.mark.parametrize("url", ["http://h:1/$(XPUFLEET_AGENT_JOIN_TOKEN)", "http://h:1/$$(XPUFLEET_HOME)",
                                 "http://h:1/a$b$", "http://h:1/$(XPUFLEET_HOME)x$(HOSTNAME)"])
def test_a_dollar_in_the_server_url_reaches_the_agent_as_written_not_expanded(url):
    """The probe's repro: $(XPUFLEET_AGENT_JOIN_TOKEN) in server_url put the credential on the command line."""
    _secret, job = manifests(K8sExport(pool="spot", server_url=url, python="/venv/$(XPUFLEET_HOME)/python"), "xfp_s")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    env = {"XPUFLEET_AGENT_JOIN_TOKEN": "xfp_s", "XPUFLEET_HOME": "/tmp/xpufleet"}
    expanded = [_kubelet_expand(part, env) for part in c["command"]]
    assert expanded[expanded.index("--server") + 1] == url and expanded[0] == "/venv/$(XPUFLEET_HOME)/python"
    assert "xfp_s" not in " ".join(expanded)
    _validate([job])


@pytest.mark.parametrize("field,value", [("server_url", "http://h:1/\n--join evil"), ("server_url", "http://h:1\u2028x"),
                                         ("server_url", "http://h:1/ a"), ("server_url", "ftp://h"),
                                         ("python", "py\x85thon"), ("python", "py\x7fthon"),
                                         ("fingerprint", "ab\ncd"), ("fingerprint", "zz"),
                                         ("node_selector", {"a": "b\n"})])
def test_a_control_character_in_any_field_is_refused(field, value):
    with pytest.raises(ExportError, match="control character|URL|fingerprint|node-selector"):
        manifests(K8sExport(**{"pool": "spot", "server_url": "https://h:1", field: value}), "xfp_x")


@settings(max_examples=200, deadline=None)
@given(path=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30))
def test_any_server_url_is_refused_or_reaches_the_agent_intact(path):
    url = "http://h:1/" + path
    try:
        _secret, job = manifests(K8sExport(pool="spot", server_url=url), "xfp_s")
    except ExportError:
        return
    back = list(yaml.safe_load_all(to_yaml([job])))[0]
    command = back["spec"]["template"]["spec"]["containers"][0]["command"]
    expanded = [_kubelet_expand(p, {"XPUFLEET_AGENT_JOIN_TOKEN": "xfp_s"}) for p in command]
    assert expanded[expanded.index("--server") + 1] == url


def test_a_pool_that_runs_comfyui_workflows_starts_its_agents_with_comfyui() -> None:
    from xpufleet.server.workers import k8s as K

    ex = K.K8sExport(pool="burst", server_url="http://10.0.0.1:8189", comfyui="/opt/ComfyUI")
    job = next(m for m in K.manifests(ex, "xfp_" + "a" * 40) if m["kind"] == "Job")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-2:] == ["--comfyui", "/opt/ComfyUI"]
    with pytest.raises(K.ExportError, match="comfyui"):
        K.check_export(K.K8sExport(pool="burst", server_url="http://10.0.0.1:8189", comfyui="/opt\n/x"))

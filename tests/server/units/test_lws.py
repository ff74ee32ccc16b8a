"""The LeaderWorkerSet export: size, replicas, both templates with the contract, guard, rolling update."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from xpufleet.server.units.envcontract import CONTRACT
from xpufleet.server.units.lws import (
    API_VERSION,
    GROUP_INDEX_LABEL,
    WORKER_INDEX_LABEL,
    lws_manifest,
    to_yaml,
)
from xpufleet.server.units.spec import SERVICE_NAME_RE, fill_placeholders, parse_service

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


# --- hostile text: what a spec says arrives in the container unchanged ------------------------------

YAML_DANGER = ["$(", "$$", "$", ")", "$(RANK_ID)", "{rank}", "{port}", "{master_addr}", "\n---\n", "...\n", ": ", "- ",
               "#", "!!python/object/apply:os.system", "&a", "*a", "'", '"', "\u2028", "\x85", "\ufeff", "%YAML 1.1",
               "\r\n", "\t", "\ud800", "\U0001f600", "{", "}", "[", "]", ",", "|", ">", "?", "@", "`", "\x1b[2J"]


def _yaml_text(nul: bool = False) -> st.SearchStrategy[str]:
    part = st.one_of(st.sampled_from(YAML_DANGER), st.text(alphabet=st.characters(exclude_categories=()), max_size=5))
    text = st.lists(part, max_size=6).map("".join)
    return text if nul else text.map(lambda s: s.replace("\x00", ""))


def kubelet_expand(text: str, lookup) -> str:
    """What the kubelet makes of a command/env value: ``$$`` is ``$``, ``$(NAME)`` is NAME's value."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and text.find(")", i + 2) != -1:
            end = text.find(")", i + 2)
            out.append(lookup(text[i + 2:end]))
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


LWS_EXAMPLES = 200  # ~30 s on this 2-core machine under load


@settings(max_examples=LWS_EXAMPLES, deadline=None)
@given(name=st.from_regex(SERVICE_NAME_RE, fullmatch=True),
       argv=st.lists(_yaml_text(), min_size=1, max_size=4).filter(lambda a: a[0].strip()),
       env=st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True), _yaml_text(), max_size=3),
       image=st.one_of(st.just("registry/xpufleet:0.1"), _yaml_text(nul=True)),
       namespace=st.one_of(st.none(), st.just("ml"), _yaml_text(nul=True)), size=st.integers(1, 4))
def test_hostile_spec_text_round_trips_through_the_yaml_and_the_kubelet(name, argv, env, image, namespace, size):
    spec = parse_service({"name": name, "unit": {"size": size}, "target": {"device": "cpu"},
                          "program": {"command": argv, "env": env}})
    try:
        docs = lws_manifest(spec, image=image, namespace=namespace, port=9000, master_port=29400)
    except ValueError as exc:
        assert ("image:" in str(exc) and image != "registry/xpufleet:0.1") or \
            ("namespace:" in str(exc) and namespace not in (None, "ml"))
        return
    loaded = list(yaml.safe_load_all(to_yaml(docs)))
    assert loaded == docs and len(loaded) == 2  # no key, document or tag came from the text
    lookup = lambda var: f"<value of {var}>"  # noqa: E731 - every variable a text might name is defined
    filled = fill_placeholders(argv, {"port": "9000", "host": "0.0.0.0", "rank": "<value of RANK_ID>",
                                      "size": str(size), "master_addr": "<value of LWS_LEADER_ADDRESS>",
                                      "master_port": "29400"})
    for role in ("leaderTemplate", "workerTemplate"):
        (c,) = loaded[0]["spec"]["leaderWorkerTemplate"][role]["spec"]["containers"]
        assert [kubelet_expand(a, lookup) for a in c["command"]] == filled
        values = {e["name"]: e.get("value") for e in c["env"]}
        assert {k: kubelet_expand(values[k], lookup) for k in env} == env
        assert c["image"] == image
    assert loaded[0]["metadata"].get("namespace") == (namespace or None)


def test_an_image_or_namespace_kubernetes_would_not_take_is_refused_naming_it():
    spec = parse_service(MODEL)
    for image in ("", "python:3.11 slim", "img\n- name: x", "\x1b[2J"):
        with pytest.raises(ValueError, match="^image: "):
            lws_manifest(spec, image=image)
    for ns in ("ML", "ml_prod", "-ml", "ml\n", "a" * 64):
        with pytest.raises(ValueError, match="^namespace: "):
            lws_manifest(spec, namespace=ns)
    assert lws_manifest(spec, image="registry.example:5000/xpufleet@sha256:ab", namespace="ml-prod")[0]

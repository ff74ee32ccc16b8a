"""Routing of ComfyUI runs (docs/comfyui.md): a named worker that cannot run the workflow is a 400 with the
check's text, one still reading its ComfyUI makes the run wait, ``any`` takes only the capable providers,
``local`` without a ComfyUI is refused, pools run ComfyUI workflows only when declared."""

from __future__ import annotations

import pytest

from xpufleet.server.comfyflow.check import provider_verdict
from xpufleet.server.comfyflow.reading import reading_of
from xpufleet.server.run.requests import parse_run_request
from xpufleet.server.scheduling import (
    Candidate,
    DeviceOffer,
    ProviderInfo,
    RunTarget,
    TargetError,
    resolve_target,
)
from xpufleet.server.scheduling.routing import SPREAD_COMFYUI, pool_without_comfyui

from ..comfyflow.readings import core_workflow, message

READING = reading_of(message())
BARE = reading_of(message(classes={}))


def prov(name: str, state: str = "ready", reading=READING, local: bool = False, devices=("cpu", "cuda:0")):
    return ProviderInfo(name, tuple(DeviceOffer(d) for d in devices), is_local=local, comfyui=state,
                        comfyui_reading=reading if state in ("ready", "failed") else None)


LOCAL = prov("local", state="none", local=True, devices=("cpu",))


def target(options: dict, graph: dict | None = None) -> RunTarget:
    return parse_run_request({"graph": graph or core_workflow(), "options": options}).target


def resolve(options: dict, *providers: ProviderInfo, pools=None, comfy_pools=(), graph=None):
    return resolve_target(target(options, graph), list(providers), pools, comfy_check=provider_verdict,
                          comfy_pools=comfy_pools)


def test_the_request_marks_a_comfyui_run_and_keeps_its_workflow() -> None:
    t = target({"target": "gpu-box"})
    assert t.is_comfyui and t.kind == "comfyui" and t.workflow == core_workflow()


def test_a_named_worker_that_can_run_it_and_one_that_cannot() -> None:
    res = resolve({"target": "gpu-box", "device": "cuda:0"}, prov("gpu-box"), LOCAL)
    assert res.candidates == (Candidate("gpu-box", ("cuda:0",)),) and not res.dynamic
    with pytest.raises(TargetError, match=r"^worker gpu-box has no node class 'EmptyImage' \(node 1\)"):
        resolve({"target": "gpu-box"}, prov("gpu-box", reading=BARE), LOCAL)
    with pytest.raises(TargetError) as exc:
        resolve({"target": "gpu-box"}, prov("gpu-box", state="none"), LOCAL)
    assert str(exc.value) == ("worker gpu-box has no ComfyUI to run workflows: start its agent with --comfyui "
                              "PATH (the ComfyUI folder)")


def test_a_named_worker_still_probing_makes_the_run_wait() -> None:
    res = resolve({"target": "gpu-box"}, prov("gpu-box", state="probing"), LOCAL)
    assert res.candidates == () and res.dynamic
    assert res.note == "worker gpu-box is still reading its ComfyUI; the run waits until it has"


def test_a_device_the_worker_lacks_is_said_before_its_comfyui() -> None:
    with pytest.raises(TargetError, match="does not offer cuda:3"):
        resolve({"target": "gpu-box", "device": "cuda:3"}, prov("gpu-box", state="none"), LOCAL)


def test_any_takes_only_the_workers_that_can_run_the_whole_workflow() -> None:
    res = resolve({"target": "any", "device": "cuda"}, prov("a", reading=BARE), prov("b"), prov("c", state="none"),
                  LOCAL)
    assert res.candidates == (Candidate("b", ("cuda:0",)),) and not res.dynamic  # fixed, like a training run


def test_any_waits_while_a_worker_that_offers_the_device_probes() -> None:
    res = resolve({"target": "any", "device": "cuda"}, prov("a", reading=BARE), prov("b", state="probing"), LOCAL)
    assert res.candidates == () and res.dynamic and "worker b is still reading" in (res.note or "")


def test_any_without_a_capable_provider_says_why_each_cannot() -> None:
    with pytest.raises(TargetError) as exc:
        resolve({"target": "any", "device": "cuda"}, prov("a", reading=BARE), prov("b", state="none"), LOCAL)
    text = str(exc.value)
    assert text.startswith("no worker seen since the server started can run this workflow on cuda: worker a has "
                           "no node class 'EmptyImage'")
    assert "worker b has no ComfyUI to run workflows" in text


def test_any_may_use_this_server_when_its_comfyui_can() -> None:
    res = resolve({"target": "any", "device": "cpu"}, prov("local", local=True, devices=("cpu",)))
    assert res.candidates == (Candidate("local", ("cpu",)),)


def test_local_without_comfyui_is_refused_and_with_one_it_runs_even_without_training_packages() -> None:
    with pytest.raises(TargetError) as exc:
        resolve({"target": "local"}, LOCAL)
    assert str(exc.value) == ("this server has no ComfyUI to run workflows: start the sidecar with --comfyui PATH, "
                              "or queue to a worker started with --comfyui")
    ready = ProviderInfo("local", (DeviceOffer("cpu"),), is_local=True, comfyui="ready", comfyui_reading=READING,
                         cannot_run="this server cannot run training graphs")
    res = resolve_target(target({"target": "local"}), [ready], comfy_check=provider_verdict)
    assert res.candidates == (Candidate("local", ("cpu",)),)


def test_pools_take_comfyui_runs_only_when_they_run_a_comfyui_and_check_instances_as_they_join() -> None:
    with pytest.raises(TargetError) as exc:
        resolve({"target": {"pool": "burst"}}, LOCAL, pools={"burst": []})
    assert str(exc.value) == pool_without_comfyui("burst")
    res = resolve({"target": {"pool": "burst"}}, LOCAL, pools={"burst": []}, comfy_pools={"burst"})
    assert res.candidates == () and res.dynamic and "no instance of pool 'burst'" in (res.note or "")
    res = resolve({"target": {"pool": "burst"}}, prov("i1", state="probing"), LOCAL, pools={"burst": ["i1"]},
                  comfy_pools={"burst"})
    assert res.candidates == () and "worker i1 is still reading" in (res.note or "")
    with pytest.raises(TargetError, match="^worker i1 has no node class"):
        resolve({"target": {"pool": "burst"}}, prov("i1", reading=BARE), LOCAL, pools={"burst": ["i1"]},
                comfy_pools={"burst"})
    res = resolve({"target": {"pool": "burst"}}, prov("i1"), LOCAL, pools={"burst": ["i1"]}, comfy_pools={"burst"})
    assert res.candidates and res.candidates[0].provider == "i1"


def test_a_comfyui_run_is_not_spread_and_a_training_graph_ignores_the_check() -> None:
    with pytest.raises(TargetError) as exc:
        resolve({"target": {"spread": [{"worker": "a", "devices": ["cuda:0"]},
                                       {"worker": "b", "devices": ["cuda:0"]}]}}, prov("a"), prov("b"), LOCAL)
    assert str(exc.value) == SPREAD_COMFYUI
    fleet = {"1": {"class_type": "XPUDataset", "inputs": {}}}
    res = resolve_target(target({"target": "gpu-box"}, fleet), [prov("gpu-box", state="none"), LOCAL],
                         comfy_check=provider_verdict)
    assert res.candidates

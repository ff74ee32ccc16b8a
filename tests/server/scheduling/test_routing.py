"""Target resolution (docs/sidecar.md) and options.target parsing: pure, every rule and wording."""

from __future__ import annotations

import pytest

from xpufleet.server.devices.names import normalize_device
from xpufleet.server.run.requests import parse_target
from xpufleet.server.scheduling import (
    Candidate,
    DeviceOffer,
    ProviderInfo,
    RunTarget,
    TargetError,
    resolve_target,
)


def prov(name: str, *devices: str, local: bool = False, online: bool = True, draining: bool = False) -> ProviderInfo:
    return ProviderInfo(name, tuple(DeviceOffer(d) for d in devices), online=online, draining=draining,
                        is_local=local)


CPU_MPS = prov("local", "cpu", "mps:0", local=True)
CPU_ONLY = prov("local", "cpu", local=True)
TWO_CARDS = prov("local", "cpu", "cuda:0", "cuda:1", local=True)


def resolve(options: dict, *providers: ProviderInfo, pools=None):
    return resolve_target(parse_target(options), list(providers), pools)


def cands(res) -> list[tuple[str, tuple[str, ...]]]:
    return [(c.provider, c.devices) for c in res.candidates]


# --- local ----------------------------------------------------------------------------------------------


def test_local_device_set_the_server_lacks_is_rejected_with_the_exact_wording():
    with pytest.raises(TargetError) as exc:
        resolve({"target": {"devices": ["cuda:0"]}}, CPU_MPS)
    assert str(exc.value) == "this server does not offer cuda:0 (it offers cpu, mps:0)"
    with pytest.raises(TargetError) as exc:
        resolve({"target": {"worker": "local", "devices": ["cuda:1", "cuda:2"]}}, TWO_CARDS)
    assert str(exc.value) == "this server does not offer cuda:2 (it offers cpu, cuda:0, cuda:1)"


def test_local_device_set_takes_every_slot_and_runs_on_the_first():
    res = resolve({"target": {"devices": ["cuda:1", "cuda:0"]}}, TWO_CARDS)
    assert cands(res) == [("local", ("cuda:1", "cuda:0"))]
    assert res.device_set and res.target == "local" and res.warnings == ()
    assert res.queue_key == "local/cuda:1,cuda:0"


def test_local_device_without_a_set_falls_back_with_a_device_fallback_warning():
    res = resolve({"device": "cuda"}, CPU_MPS)
    assert cands(res) == [("local", ("cpu",))]
    (w,) = res.warnings
    assert w["kind"] == "device_fallback"
    assert w["message"] == "The run is set to device cuda; this server offers cpu, mps:0, so the run runs on cpu."
    assert (w["requested"], w["device"]) == ("cuda", "cpu")
    # A missing index of a kind the machine has falls back to that kind's first card.
    res = resolve({"device": "cuda:5"}, TWO_CARDS)
    assert cands(res) == [("local", ("cuda:0",))] and res.warnings[0]["device"] == "cuda:0"


def test_local_device_choices():
    assert cands(resolve({}, CPU_ONLY)) == [("local", ("cpu",))]
    assert resolve({}, CPU_ONLY).queue_key == "local/auto"
    assert cands(resolve({}, TWO_CARDS)) == [("local", ("cuda:0",)), ("local", ("cuda:1",))]  # auto: any card
    assert cands(resolve({"device": "cuda"}, TWO_CARDS)) == [("local", ("cuda:0",)), ("local", ("cuda:1",))]
    assert cands(resolve({"device": "cuda:1"}, TWO_CARDS)) == [("local", ("cuda:1",))]
    assert cands(resolve({"device": "cpu"}, TWO_CARDS)) == [("local", ("cpu",))]
    assert cands(resolve({"device": "MPS"}, CPU_MPS)) == [("local", ("mps:0",))]
    assert cands(resolve({"device": "auto"}, CPU_MPS)) == [("local", ("mps:0",))]
    for res in (resolve({"device": "cuda:1"}, TWO_CARDS), resolve({}, CPU_ONLY)):
        assert res.warnings == ()


def test_device_and_a_set_together_must_agree():
    res = resolve({"device": "cuda:0", "target": {"devices": ["cuda:0", "cuda:1"]}}, TWO_CARDS)
    assert cands(res) == [("local", ("cuda:0", "cuda:1"))]
    with pytest.raises(TargetError, match="give options.device or options.target.devices, not both"):
        parse_target({"device": "cuda:1", "target": {"devices": ["cuda:0"]}})


# --- workers --------------------------------------------------------------------------------------------


def test_unknown_worker_is_rejected_with_the_exact_wording():
    with pytest.raises(TargetError) as exc:
        resolve({"target": {"worker": "x"}}, CPU_ONLY)
    assert str(exc.value) == "unknown worker 'x': no worker with this name has connected since the server started"
    with pytest.raises(TargetError, match="unknown worker 'gpu-box'"):
        resolve({"target": "gpu-box"}, CPU_ONLY, prov("other", "cpu"))


def test_worker_must_offer_the_devices():
    box = prov("gpu-box", "cpu", "cuda:0", "cuda:1")
    with pytest.raises(TargetError) as exc:
        resolve({"target": {"worker": "gpu-box", "devices": ["cuda:1", "cuda:3"]}}, CPU_ONLY, box)
    assert str(exc.value) == "worker 'gpu-box' does not offer cuda:3 (it offers cpu, cuda:0, cuda:1)"
    with pytest.raises(TargetError, match="worker 'gpu-box' does not offer xpu"):
        resolve({"target": "gpu-box", "device": "xpu"}, CPU_ONLY, box)
    with pytest.raises(TargetError, match="does not offer cuda:7"):
        resolve({"target": "gpu-box", "device": "cuda:7"}, CPU_ONLY, box)  # no fallback on a worker


def test_worker_targets_resolve_even_while_offline_the_run_waits():
    box = prov("gpu-box", "cpu", "cuda:0", "cuda:1", "cuda:2", "cuda:3", online=False)
    res = resolve({"target": {"worker": "gpu-box", "devices": ["cuda:2", "cuda:3"]}}, CPU_ONLY, box)
    assert cands(res) == [("gpu-box", ("cuda:2", "cuda:3"))]
    assert res.queue_key == "gpu-box/cuda:2,cuda:3" and res.device_set
    res = resolve({"target": "gpu-box", "device": "cuda:1"}, CPU_ONLY, box)
    assert cands(res) == [("gpu-box", ("cuda:1",))] and not res.device_set
    res = resolve({"target": "gpu-box"}, CPU_ONLY, box)  # auto: the worker's first accelerator kind
    assert [c[1] for c in cands(res)] == [("cuda:0",), ("cuda:1",), ("cuda:2",), ("cuda:3",)]
    res = resolve({"target": "gpu-box"}, CPU_ONLY, prov("gpu-box", "cpu"))
    assert cands(res) == [("gpu-box", ("cpu",))]


# --- any ------------------------------------------------------------------------------------------------


def test_any_tries_workers_in_name_order_and_this_server_last():
    res = resolve({"target": "any", "device": "cuda"}, TWO_CARDS, prov("zeta", "cpu", "cuda:0"),
                  prov("alpha", "cpu", "cuda:0", "cuda:1"), prov("mid", "cpu"))
    assert cands(res) == [("alpha", ("cuda:0",)), ("alpha", ("cuda:1",)), ("zeta", ("cuda:0",)),
                          ("local", ("cuda:0",)), ("local", ("cuda:1",))]
    assert res.target == "any" and res.queue_key == "any/cuda"


def test_any_with_a_multi_card_cuda_set_or_a_card_other_than_cuda0_runs_on_workers_only():
    box = prov("box", "cpu", "cuda:0", "cuda:1")
    res = resolve({"target": {"worker": "any", "devices": ["cuda:0", "cuda:1"]}}, TWO_CARDS, box)
    assert cands(res) == [("box", ("cuda:0", "cuda:1"))]
    res = resolve({"target": "any", "device": "cuda:1"}, TWO_CARDS, box)
    assert cands(res) == [("box", ("cuda:1",))]
    res = resolve({"target": "any", "device": "cuda:0"}, TWO_CARDS, box)
    assert cands(res) == [("box", ("cuda:0",)), ("local", ("cuda:0",))]
    with pytest.raises(TargetError) as exc:
        resolve({"target": {"worker": "any", "devices": ["cuda:0", "cuda:1"]}}, TWO_CARDS)
    assert "no worker seen since the server started offers cuda:0, cuda:1" in str(exc.value)
    assert "runs on workers only" in str(exc.value)


def test_any_without_workers_runs_here_when_this_server_offers_the_devices():
    assert cands(resolve({"target": "any"}, CPU_ONLY)) == [("local", ("cpu",))]
    assert cands(resolve({"target": "any", "device": "cuda:0"}, TWO_CARDS)) == [("local", ("cuda:0",))]
    with pytest.raises(TargetError) as exc:
        resolve({"target": "any", "device": "cuda"}, CPU_ONLY)
    assert str(exc.value) == ("no worker seen since the server started offers cuda and this server does not "
                              "either (workers: none)")


def test_any_counts_known_workers_that_are_offline_or_draining_as_candidates():
    res = resolve({"target": "any", "device": "cuda:0"}, CPU_ONLY, prov("a", "cpu", "cuda:0", online=False),
                  prov("b", "cpu", "cuda:0", draining=True))
    assert cands(res) == [("a", ("cuda:0",)), ("b", ("cuda:0",))]


def test_pools():
    a, b = prov("a", "cpu", "cuda:0"), prov("b", "cpu", "cuda:0")
    res = resolve({"target": {"pool": "spot"}}, CPU_ONLY, a, b, pools={"spot": ["b"]})
    assert cands(res) == [("b", ("cuda:0",))] and res.target == "pool:spot"
    with pytest.raises(TargetError, match="unknown pool 'nope'"):
        resolve({"target": {"pool": "nope"}}, CPU_ONLY, a)
    with pytest.raises(TargetError, match="not both"):
        parse_target({"target": {"worker": "a", "pool": "spot"}})


# --- parsing options.target ---------------------------------------------------------------------------


def test_parse_target_accepts_a_string_or_an_object():
    assert parse_target({}) == RunTarget()
    assert parse_target({"target": "any"}).worker == "any"
    assert parse_target({"target": {"worker": None}}).worker == "local"
    t = parse_target({"target": {"worker": "gpu-box", "devices": "cuda:2, cuda:3", "memory_gib": 6,
                                 "memory_source": "estimate", "wait": True}})
    assert t == RunTarget("gpu-box", ("cuda:2", "cuda:3"), None, None, 6.0, "estimate", True)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"target": 5}, "options.target must be an object"),
        ({"target": {"workers": "x"}}, "options.target has unknown field(s) workers"),
        ({"target": {"worker": ""}}, "options.target.worker must be"),
        ({"target": {"worker": "bad name!"}}, "is not a worker name"),
        ({"target": {"devices": []}}, "options.target.devices must be a non-empty list"),
        ({"target": {"devices": {"a": 1}}}, "options.target.devices must be a non-empty list"),
        ({"target": {"devices": ["cuda"]}}, "options.target.devices: invalid device 'cuda': name one card"),
        ({"target": {"devices": ["tpu:0"]}}, "options.target.devices: invalid device 'tpu:0'"),
        ({"target": {"devices": [3]}}, "options.target.devices: a device name must be a string"),
        ({"target": {"devices": ["cuda:0", "CUDA:0"]}}, "lists cuda:0 more than once"),
        ({"target": {"devices": ["cuda:0", "xpu:0"]}}, "mixes device kinds"),
        ({"target": {"devices": [f"cuda:{i}" for i in range(65)]}}, "at most 64"),
        ({"target": {"memory_gib": 0}}, "options.target.memory_gib must be a positive number"),
        ({"target": {"memory_gib": "6"}}, "options.target.memory_gib must be a positive number"),
        ({"target": {"memory_gib": True}}, "options.target.memory_gib must be a positive number"),
        ({"target": {"memory_gib": 2, "memory_source": "guess"}}, "options.target.memory_source must be one of"),
        ({"target": {"memory_source": "user"}}, "needs options.target.memory_gib"),
        ({"target": {"wait": "yes"}}, "options.target.wait must be true or false"),
        ({"target": {"pool": 1}}, "options.target.pool must be a pool name"),
        ({"device": "gpu"}, "options.device: invalid device 'gpu'"),
        ({"device": 0}, "options.device: a device name must be a string"),
        ({"device": "cpu:0"}, "cpu takes no index"),
    ],
)
def test_parse_target_rejects_bad_input_naming_the_field(options, fragment):
    with pytest.raises(TargetError) as exc:
        parse_target(options)
    assert fragment in str(exc.value)


def test_normalize_device():
    assert normalize_device(" CUDA:01 ") == "cuda:1"
    assert normalize_device("mps") == normalize_device("mps:0") == "mps:0"
    assert normalize_device("auto", allow_auto=True) == "auto"
    with pytest.raises(ValueError, match="there is one MPS device"):
        normalize_device("mps:1")
    with pytest.raises(ValueError):
        normalize_device("auto")
    assert Candidate.from_json(Candidate("w", ("cuda:0",)).to_json()) == Candidate("w", ("cuda:0",))


# --- one-shot pools, storage mounts, disabled workers (docs/workers.md) ------------------------------------


def wprov(name: str, *devices: str, mounts: tuple[str, ...] = (), disabled: bool = False) -> ProviderInfo:
    return ProviderInfo(name, tuple(DeviceOffer(d) for d in devices), mounts=frozenset(mounts), disabled=disabled)


def test_a_pool_run_waits_for_an_instance_and_is_resolved_again():
    a = prov("a", "cpu", "cuda:0")
    res = resolve({"target": {"pool": "spot"}}, CPU_ONLY, a, pools={"spot": []})
    assert res.candidates == () and res.dynamic and res.target == "pool:spot"
    assert res.note == "no instance of pool 'spot' is connected; the run waits for one to join"
    res = resolve({"target": {"pool": "spot", "devices": ["cuda:1"]}}, CPU_ONLY, a, pools={"spot": ["a"]})
    assert res.candidates == () and "no connected instance of pool 'spot' offers cuda:1" in res.note
    res = resolve({"target": {"pool": "spot"}}, CPU_ONLY, a, pools={"spot": ["a"]})
    assert cands(res) == [("a", ("cuda:0",))] and res.note is None and res.dynamic


def test_pool_instances_take_only_their_pools_runs():
    inst, other = prov("spot-1", "cpu", "cuda:0"), prov("box", "cpu", "cuda:0")
    pools = {"spot": ["spot-1"]}
    assert cands(resolve({"target": "any", "device": "cuda"}, CPU_ONLY, inst, other, pools=pools)) == [
        ("box", ("cuda:0",))]
    with pytest.raises(TargetError, match="one-shot instance of pool 'spot': target the pool"):
        resolve({"target": "spot-1"}, CPU_ONLY, inst, other, pools=pools)
    with pytest.raises(TargetError, match="no worker seen since the server started offers cuda"):
        resolve({"target": "any", "device": "cuda"}, CPU_ONLY, inst, pools=pools)


def test_a_disabled_worker_is_listed_but_never_chosen():
    off, on = wprov("off", "cpu", "cuda:0", disabled=True), wprov("on", "cpu", "cuda:0")
    with pytest.raises(TargetError, match="worker 'off' is disabled: enable it"):
        resolve({"target": "off"}, CPU_ONLY, off, on)
    assert [c.provider for c in resolve({"target": "any", "device": "cuda"}, CPU_ONLY, off, on).candidates] == ["on"]


def _mounted(options: dict, labels: tuple[str, ...], *providers: ProviderInfo, pools=None):
    import dataclasses

    return resolve_target(dataclasses.replace(parse_target(options), mounts=labels), list(providers), pools or {})


def test_mount_labels_route_to_workers_that_declare_them():
    ds = wprov("ds", "cpu", mounts=("datasets",))
    both = wprov("both", "cpu", mounts=("datasets", "models"))
    bare = wprov("bare", "cpu")
    res = _mounted({"target": "any"}, ("datasets",), CPU_ONLY, bare, both, ds)
    assert [c.provider for c in res.candidates] == ["both", "ds"] and res.dynamic  # never this server
    assert [c.provider for c in _mounted({"target": "any"}, ("datasets", "models"), CPU_ONLY, both, ds).candidates] \
        == ["both"]
    res = _mounted({"target": "any"}, ("archive",), CPU_ONLY, bare, ds)
    assert res.candidates == () and res.dynamic and "declares mount 'archive'" in res.note
    assert "--mount archive=FOLDER" in res.note
    with pytest.raises(TargetError, match="worker 'bare' has no storage mount 'datasets' \\(its mounts: none\\)"):
        _mounted({"target": "bare"}, ("datasets",), CPU_ONLY, bare)
    with pytest.raises(TargetError, match="its mounts: datasets\\)"):
        _mounted({"target": "ds"}, ("models",), CPU_ONLY, ds)
    assert [c.provider for c in _mounted({"target": "ds"}, ("datasets",), CPU_ONLY, ds).candidates] == ["ds"]
    with pytest.raises(TargetError, match="resolves on workers only"):
        _mounted({}, ("datasets",), CPU_ONLY, ds)
    # no worker offers the device at all: still the usual 400, mounts or not
    with pytest.raises(TargetError, match="offers cuda"):
        _mounted({"target": "any", "device": "cuda"}, ("datasets",), CPU_ONLY, bare)
    pooled = _mounted({"target": {"pool": "p"}}, ("datasets",), CPU_ONLY, ds, bare, pools={"p": ["ds", "bare"]})
    assert [c.provider for c in pooled.candidates] == ["ds"]


# --- a control-plane host (installed without the `train` extra) ------------------------------------------


def test_a_server_that_cannot_run_graphs_refuses_local_runs_and_routes_any_to_workers():
    from dataclasses import replace

    why = "this server cannot run graphs: torch is not installed here (pip install 'xpufleet[train]'); ..."
    control = replace(CPU_ONLY, cannot_run=why)
    with pytest.raises(TargetError) as exc:
        resolve({"target": {"worker": "local"}}, control, prov("gpu-box", "cpu", "cuda:0"))
    assert str(exc.value) == why
    res = resolve({"target": "any"}, control, prov("gpu-box", "cpu", "cuda:0"))
    assert {c[0] for c in cands(res)} == {"gpu-box"}  # never this server
    with pytest.raises(TargetError) as exc:  # no worker at all: the reason is in the 400
        resolve({"target": "any"}, control)
    assert "pip install 'xpufleet[train]'" in str(exc.value) and "workers: none" in str(exc.value)
    res = resolve({"target": "any"}, CPU_ONLY, prov("gpu-box", "cpu"))
    assert "local" in {c[0] for c in cands(res)}  # a server that can run graphs still takes its share


def test_the_refusal_names_what_is_missing():
    from xpufleet.server.sidecar.local import local_runs_refusal

    assert local_runs_refusal(lambda name: object()) == ""
    text = local_runs_refusal(lambda name: None if name in ("torch", "sklearn") else object())
    assert text.startswith("this server cannot run graphs: torch, sklearn are not installed here")
    assert "pip install 'xpufleet[train]'" in text

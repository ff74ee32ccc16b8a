"""``options.target.spread`` (ddp across workers): parsing with each entry checked like a one-worker
target (its path in the 400), the combinations refused, and resolution to one candidate over workers."""

from __future__ import annotations

import pytest

from xpufleet.server.run.requests import parse_target
from xpufleet.server.scheduling import Candidate, DeviceOffer, ProviderInfo, TargetError, resolve_target

A = ProviderInfo("a", (DeviceOffer("cpu"), DeviceOffer("cuda:0")))
B = ProviderInfo("b", (DeviceOffer("cpu"), DeviceOffer("cuda:0"), DeviceOffer("cuda:1")), online=False)
LOCAL = ProviderInfo("local", (DeviceOffer("cpu"), DeviceOffer("cuda:0")), is_local=True)


def spread(*entries) -> dict:
    return {"target": {"spread": list(entries)}}


def refused(options: dict) -> str:
    with pytest.raises(TargetError) as info:
        parse_target(options)
    return str(info.value)


def test_a_spread_target_parses_into_parts_in_rank_order():
    t = parse_target(spread({"worker": "a", "devices": ["cuda:0"]}, {"worker": " b ", "devices": "cuda:0,cuda:1"}))
    assert t.worker == "spread" and t.spread == (("a", ("cuda:0",)), ("b", ("cuda:0", "cuda:1")))


@pytest.mark.parametrize("devices, text", [
    ([], "options.target.spread[1].devices must be a non-empty list of device names like [\"cuda:0\"]"),
    (["cuda:0", "cuda:0"], "options.target.spread[1].devices lists cuda:0 more than once"),
    (["cuda:0", "xpu:0"], "options.target.spread[1].devices mixes device kinds (cuda:0, xpu:0); a set is of one kind"),
    (["gpu:0"], "options.target.spread[1].devices: "),
    (["cpu"], "options.target.spread[1].devices: cpu; a spread run trains with ddp, one rank per card, on CUDA or "
              "XPU cards only"),
    (["xpu:0"], "options.target.spread[1].devices are xpu cards, options.target.spread[0]'s are cuda"),
])
def test_each_entry_s_devices_are_checked_like_a_one_worker_target_with_its_path(devices, text):
    assert refused(spread({"worker": "a", "devices": ["cuda:0"]}, {"worker": "b", "devices": devices})) \
        .startswith(text)


def test_the_single_target_keeps_its_own_texts():
    assert refused({"target": {"worker": "a", "devices": ["cuda:0", "cuda:0"]}}) == \
        "options.target.devices lists cuda:0 more than once"


@pytest.mark.parametrize("options, text", [
    ({"target": {"spread": [{"worker": "a", "devices": ["cuda:0"]}]}},
     "options.target.spread must list two or more entries"),
    ({"target": {"spread": "a:cuda:0"}}, "options.target.spread must list two or more entries"),
    ({"target": {"spread": [{"worker": "a", "devices": ["cuda:0"]}, {"worker": "a", "devices": ["cuda:1"]}]}},
     "options.target.spread[1].worker 'a' is listed twice; give one entry per worker with all its cards"),
    ({"target": {"spread": [{"worker": "a", "devices": ["cuda:0"]}, {"worker": "local", "devices": ["cuda:0"]}]}},
     "options.target.spread[1].worker must name a worker: a spread run runs on worker agents only"),
    ({"target": {"spread": [{"worker": "a", "devices": ["cuda:0"]}, {"worker": "b c", "devices": ["cuda:0"]}]}},
     "options.target.spread[1].worker 'b c' is not a worker name"),
    ({"target": {"spread": [{"worker": "a", "devices": ["cuda:0"]}, {"devices": ["cuda:0"]}]}},
     "options.target.spread[1].worker must be a worker name"),
    ({"target": {"spread": [{"worker": "a", "devices": ["cuda:0"]}, {"worker": "b"}]}},
     "options.target.spread[1].devices: missing"),
    ({"target": {"spread": [{"worker": "a", "devices": ["cuda:0"]}, {"worker": "b", "devices": ["cuda:0"],
                                                                     "pool": "p"}]}},
     "options.target.spread[1] has unknown field(s) pool; known: worker, devices"),
    ({"target": {"spread": [{"worker": "a", "devices": ["cuda:0"]}, 7]}}, "options.target.spread[1] must be an object"),
    ({"target": {"worker": "a", "spread": [{"worker": "a", "devices": ["cuda:0"]}, {"worker": "b", "devices": ["cuda:0"]}]}},
     "give options.target.spread without options.target.worker: each entry names its worker and devices"),
    ({"target": {"pool": "p", "memory_gib": 4, "spread": [{"worker": "a", "devices": ["cuda:0"]},
                                                           {"worker": "b", "devices": ["cuda:0"]}]}},
     "give options.target.spread without options.target.pool: each entry names its worker and devices"),
    ({"device": "cuda:0", "target": {"spread": [{"worker": "a", "devices": ["cuda:0"]},
                                                {"worker": "b", "devices": ["cuda:0"]}]}},
     "give options.target.spread without options.device: each entry"),
])
def test_what_a_spread_target_refuses(options, text):
    assert refused(options).startswith(text), refused(options)


def test_a_spread_target_resolves_to_one_candidate_over_the_workers():
    t = parse_target(spread({"worker": "a", "devices": ["cuda:0"]}, {"worker": "b", "devices": ["cuda:0", "cuda:1"]}))
    res = resolve_target(t, [LOCAL, A, B])
    assert res.candidates == (Candidate("a", ("cuda:0",), (("b", ("cuda:0", "cuda:1")),)),)
    assert res.target == "a+b" and res.device_set and res.queue_key == "a+b/a:cuda:0,b:cuda:0,cuda:1"


@pytest.mark.parametrize("entry, pools, text", [
    ({"worker": "c", "devices": ["cuda:0"]}, None, "options.target.spread[1]: unknown worker 'c': no worker with this "
                                                   "name has connected since the server started"),
    ({"worker": "b", "devices": ["cuda:2"]}, None, "options.target.spread[1]: worker 'b' does not offer cuda:2 (it "
                                                   "offers cpu, cuda:0, cuda:1)"),
    ({"worker": "b", "devices": ["cuda:0"]}, {"spot": ["b"]},
     "options.target.spread[1]: worker 'b' is a one-shot instance of pool 'spot'"),
])
def test_each_entry_s_worker_is_checked_like_a_named_worker(entry, pools, text):
    t = parse_target(spread({"worker": "a", "devices": ["cuda:0"]}, entry))
    with pytest.raises(TargetError) as info:
        resolve_target(t, [LOCAL, A, B], pools)
    assert str(info.value).startswith(text), str(info.value)

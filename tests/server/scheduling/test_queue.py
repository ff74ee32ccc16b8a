"""The slot rule (docs/sidecar.md) as a pure function: order, limits, shared cards, device-set reservations."""

from __future__ import annotations

import random

import pytest

from xpufleet.server.scheduling import (
    Candidate,
    DeviceOffer,
    LimitOverrides,
    ProviderInfo,
    QueuedRun,
    SlotQueue,
    build_state,
    explain_wait,
    parse_limits,
    plan,
)


def local(*devices: str, uuids: dict[str, str] | None = None) -> ProviderInfo:
    uuids = uuids or {}
    return ProviderInfo("local", tuple(DeviceOffer(d, uuid=uuids.get(d)) for d in devices), is_local=True)


def worker(name: str, *devices: str, uuids: dict[str, str] | None = None, online: bool = True,
           draining: bool = False) -> ProviderInfo:
    uuids = uuids or {}
    return ProviderInfo(name, tuple(DeviceOffer(d, uuid=uuids.get(d)) for d in devices), online=online,
                        draining=draining)


def run(run_id: str, *cands: tuple[str, tuple[str, ...]]) -> QueuedRun:
    return QueuedRun(run_id, tuple(Candidate(p, devs) for p, devs in cands))


def on(provider: str, *devices: str) -> tuple[str, tuple[str, ...]]:
    return (provider, tuple(devices))


def placed_ids(result) -> list[str]:
    return [p.run_id for p in result.placements]


class Sim:
    """Drive plan() the way the dispatcher does: holdings grow on placement, shrink on finish."""

    def __init__(self, providers, overrides=None):
        self.providers = list(providers)
        self.overrides = overrides or LimitOverrides()
        self.queue: list[QueuedRun] = []
        self.holdings: dict[str, tuple[str, tuple[str, ...]]] = {}
        self.started: list[str] = []

    def submit(self, r: QueuedRun) -> None:
        self.queue.append(r)

    def step(self, admit=None):
        state = build_state(self.providers, self.overrides, self.holdings)
        result = plan(self.queue, state, admit=admit)
        for p in result.placements:
            self.holdings[p.run_id] = (p.provider, p.devices)
            self.started.append(p.run_id)
        done = {p.run_id for p in result.placements}
        self.queue = [r for r in self.queue if r.run_id not in done]
        return result

    def finish(self, run_id: str) -> None:
        del self.holdings[run_id]


def test_one_accelerator_slot_runs_in_submission_order():
    sim = Sim([local("cpu", "cuda:0")])
    for i in range(3):
        sim.submit(run(f"r{i}", on("local", "cuda:0")))
    assert placed_ids(sim.step()) == ["r0"]
    result = sim.step()
    assert placed_ids(result) == []
    assert "cuda:0 on this server is busy (1 of 1 slot used)" in result.waiting["r1"]
    sim.finish("r0")
    assert placed_ids(sim.step()) == ["r1"]
    sim.finish("r1")
    assert placed_ids(sim.step()) == ["r2"]
    assert sim.started == ["r0", "r1", "r2"]


def test_cpu_slot_holds_two_runs_accelerator_one():
    sim = Sim([local("cpu", "cuda:0")])
    for i in range(3):
        sim.submit(run(f"c{i}", on("local", "cpu")))
    for i in range(2):
        sim.submit(run(f"g{i}", on("local", "cuda:0")))
    result = sim.step()
    assert placed_ids(result) == ["c0", "c1", "g0"]
    assert "cpu on this server is busy (2 of 2 slots used)" in result.waiting["c2"]
    assert result.examined == 4  # every slot taken after g0: g1 is not even looked at
    state = build_state(sim.providers, holdings=sim.holdings)
    assert "cuda:0 on this server is busy (1 of 1 slot used)" in explain_wait(sim.queue[-1], state)


def test_limits_env_overrides_this_server_and_workers():
    overrides, warnings = parse_limits("cuda:0=2,gpu-box/cuda:1=3")
    assert warnings == []
    sim = Sim([local("cpu", "cuda:0", "cuda:1"), worker("gpu-box", "cpu", "cuda:0", "cuda:1")], overrides)
    for i in range(4):
        sim.submit(run(f"l0-{i}", on("local", "cuda:0")))
        sim.submit(run(f"l1-{i}", on("local", "cuda:1")))
        sim.submit(run(f"w1-{i}", on("gpu-box", "cuda:1")))
        sim.submit(run(f"w0-{i}", on("gpu-box", "cuda:0")))
    placed = placed_ids(sim.step())
    assert [p for p in placed if p.startswith("l0")] == ["l0-0", "l0-1"]  # cuda:0=2 here
    assert [p for p in placed if p.startswith("l1")] == ["l1-0"]  # default 1
    assert [p for p in placed if p.startswith("w1")] == ["w1-0", "w1-1", "w1-2"]  # gpu-box/cuda:1=3
    assert [p for p in placed if p.startswith("w0")] == ["w0-0"]  # the worker's cuda:0 keeps 1


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("cuda:0", "write DEVICE=N"),
        ("cuda:0=two", "is not an integer"),
        ("cuda:0=0", "at least 1"),
        ("cuda:0=-1", "at least 1"),
        ("gpu:0=2", "invalid device"),
        ("cuda=2", "name one card"),
        ("cpu:1=3", "cpu takes no index"),
        ("bad name/cuda:0=1", "is not a worker name"),
        ("/cuda:0=1", "is not a worker name"),
    ],
)
def test_limits_env_malformed_entries_are_skipped_with_a_warning(text, fragment):
    overrides, warnings = parse_limits(f"{text},cuda:1=4")
    assert overrides.local == {"cuda:1": 4}  # the good entry still applies
    assert overrides.workers == {}
    assert len(warnings) == 1 and fragment in warnings[0] and text.strip() in warnings[0]


def test_limits_env_normalises_and_tolerates_spacing():
    overrides, warnings = parse_limits(" CUDA:0 = 2 , , mps=3, local/xpu:1=2, box.1/cuda:2=5, ")
    assert warnings == []
    assert overrides.local == {"cuda:0": 2, "mps:0": 3, "xpu:1": 2}
    assert overrides.workers == {("box.1", "cuda:2"): 5}
    assert parse_limits(None) == (LimitOverrides(), [])
    _, dup = parse_limits("cuda:0=2,cuda:0=3")
    assert len(dup) == 1 and "overrides an earlier entry" in dup[0]


def test_one_physical_card_offered_twice_counts_once_with_the_smallest_online_limit():
    uuid = {"cuda:0": "GPU-aaaa"}
    overrides, _ = parse_limits("cuda:0=3,box/cuda:0=2")
    providers = [local("cpu", "cuda:0", uuids=uuid), worker("box", "cpu", "cuda:0", uuids=uuid)]
    state = build_state(providers, overrides)
    slot = state.slot_for("local", "cuda:0")
    assert slot is state.slot_for("box", "cuda:0")
    assert (slot.limit, slot.limit_from) == (2, "box")
    assert any("lowered to 2" in w for w in state.warnings)
    sim = Sim(providers, overrides)
    sim.submit(run("a", on("box", "cuda:0")))
    sim.submit(run("b", on("local", "cuda:0")))
    sim.submit(run("c", on("local", "cuda:0")))
    result = sim.step()
    assert placed_ids(result) == ["a", "b"]  # the runs through both providers share the card's 2 slots
    assert "cuda:0 on this server is busy (2 of 2 slots used, the same card as on worker box)" \
        in result.waiting["c"]
    # The worker goes offline: its smaller limit no longer applies; the server's 3 does.
    providers[1] = worker("box", "cpu", "cuda:0", uuids=uuid, online=False)
    sim.providers = providers
    assert placed_ids(sim.step()) == ["c"]


def test_same_machine_worker_without_its_own_override_follows_this_servers_limit():
    uuid = {"cuda:0": "GPU-bbbb"}
    overrides, _ = parse_limits("cuda:0=2")
    state = build_state([local("cpu", "cuda:0", uuids=uuid), worker("box", "cpu", "cuda:0", uuids=uuid)], overrides)
    assert state.slot_for("box", "cuda:0").limit == 2
    # Without a shared UUID the worker's card is its own slot with the default limit.
    state = build_state([local("cpu", "cuda:0"), worker("box", "cpu", "cuda:0")], overrides)
    assert state.slot_for("box", "cuda:0").limit == 1
    assert state.slot_for("box", "cuda:0") is not state.slot_for("local", "cuda:0")


def test_device_set_run_takes_all_slots_at_once():
    sim = Sim([worker("box", "cpu", "cuda:0", "cuda:1", "cuda:2")])
    sim.submit(run("set", on("box", "cuda:0", "cuda:1")))
    sim.submit(run("single", on("box", "cuda:2")))
    result = sim.step()
    assert placed_ids(result) == ["set", "single"]
    assert result.placements[0].devices == ("cuda:0", "cuda:1")
    state = build_state(sim.providers, holdings=sim.holdings)
    assert [state.slot_for("box", d).used for d in ("cuda:0", "cuda:1", "cuda:2")] == [1, 1, 1]


def test_device_set_run_at_the_head_reserves_its_free_slots():
    sim = Sim([worker("box", "cpu", "cuda:0", "cuda:1")])
    sim.submit(run("early", on("box", "cuda:0")))  # submitted before the set run: goes first
    assert placed_ids(sim.step()) == ["early"]
    sim.submit(run("set", on("box", "cuda:0", "cuda:1")))
    sim.submit(run("late", on("box", "cuda:1")))
    result = sim.step()
    assert placed_ids(result) == []  # cuda:1 is free but reserved for the set run
    assert result.reserved == {"box/cuda:1": "set"}
    assert result.waiting["set"].startswith("holding cuda:1 for this device-set run")
    assert "reserved for device-set run set" in result.waiting["late"]
    sim.finish("early")
    assert placed_ids(sim.step()) == ["set"]
    sim.finish("set")
    assert placed_ids(sim.step()) == ["late"]


def test_device_set_run_is_not_starved_by_a_stream_of_single_card_runs():
    rng = random.Random(7)
    sim = Sim([worker("box", "cpu", "cuda:0", "cuda:1")])
    n = 0

    def single() -> None:
        nonlocal n
        n += 1
        sim.submit(run(f"s{n}", on("box", rng.choice(["cuda:0", "cuda:1"]))))

    for _ in range(4):
        single()
    sim.step()
    sim.submit(run("set", on("box", "cuda:0", "cuda:1")))
    set_started_at = None
    for rnd in range(200):
        single()
        single()
        sim.step()
        if "set" in sim.started:
            set_started_at = rnd
            break
        running = [r for r in sim.holdings]
        sim.finish(rng.choice(running))  # one card frees per round, the stream never stops
    assert set_started_at is not None and set_started_at < 10
    # Nothing submitted after the set run started before it.
    order = sim.started
    later = [r for r in order[: order.index("set")] if r.startswith("s") and int(r[1:]) > 4]
    assert later == []


def test_a_waiting_device_set_run_keeps_a_free_card_from_every_later_run():
    rng = random.Random(7)
    sim = Sim([worker("box", "cpu", "cuda:0", "cuda:1")])
    sim.submit(run("s0", on("box", "cuda:0")))
    sim.step()
    sim.submit(run("set", on("box", "cuda:0", "cuda:1")))
    for i in range(1, 40):
        sim.submit(run(f"s{i}", on("box", rng.choice(["cuda:0", "cuda:1"]))))
    result = sim.step()
    assert placed_ids(result) == []  # cuda:1 is free, but held for the set run
    assert result.reserved == {"box/cuda:1": "set"}


def test_candidates_are_tried_in_order_offline_and_draining_providers_skipped():
    providers = [worker("a-box", "cpu", "cuda:0", online=False), worker("b-box", "cpu", "cuda:0", draining=True),
                 worker("c-box", "cpu", "cuda:0"), local("cpu")]
    sim = Sim(providers)
    sim.submit(run("any1", on("a-box", "cuda:0"), on("b-box", "cuda:0"), on("c-box", "cuda:0")))
    sim.submit(run("any2", on("a-box", "cuda:0"), on("b-box", "cuda:0"), on("c-box", "cuda:0")))
    result = sim.step()
    assert [(p.run_id, p.provider) for p in result.placements] == [("any1", "c-box")]
    reason = result.waiting["any2"]
    assert "worker a-box is disconnected" in reason
    assert "worker b-box is draining" in reason
    assert "cuda:0 on c-box is busy" in reason


def test_a_worker_that_no_longer_offers_a_device_makes_the_run_wait():
    sim = Sim([worker("box", "cpu")])
    sim.submit(run("r", on("box", "cuda:3")))
    result = sim.step()
    assert placed_ids(result) == []
    assert "worker box no longer offers cuda:3" in result.waiting["r"]
    sim.submit(run("unknown", on("ghost", "cuda:0")))
    assert "worker ghost is not connected" in sim.step().waiting["unknown"]


def test_admit_hook_is_an_extra_predicate_with_its_reason():
    sim = Sim([worker("a", "cpu", "cuda:0"), worker("b", "cpu", "cuda:0")])
    sim.submit(run("big", on("a", "cuda:0"), on("b", "cuda:0")))
    sim.submit(run("small", on("a", "cuda:0")))

    def admit(r, cand):
        if r.run_id == "big" and cand.provider == "a":
            return "needs 12.0 GiB, cuda:0 on a has 6.3 GiB free"
        return True

    result = sim.step(admit)
    assert [(p.run_id, p.provider) for p in result.placements] == [("big", "b"), ("small", "a")]
    sim2 = Sim([worker("a", "cpu", "cuda:0")])
    sim2.submit(run("big", on("a", "cuda:0")))
    result = sim2.step(lambda r, c: "needs 12.0 GiB")
    assert placed_ids(result) == [] and "needs 12.0 GiB" in result.waiting["big"]
    assert placed_ids(sim2.step(lambda r, c: False)) == []


def test_the_pass_stops_once_every_slot_is_taken():
    sim = Sim([worker("box", "cuda:0", "cuda:1")])
    for i in range(1000):
        sim.submit(run(f"r{i}", on("box", f"cuda:{i % 2}")))
    result = sim.step()
    assert placed_ids(result) == ["r0", "r1"]
    assert result.examined == 2  # nothing free after r1: the other 998 are not looked at
    state = build_state(sim.providers, holdings=sim.holdings)
    assert "cuda:1 on box is busy (1 of 1 slot used)" in explain_wait(sim.queue[5], state)  # r7


def test_slot_queue_looks_only_at_runs_that_want_a_free_slot():
    providers = [local("cpu", "cuda:0", "cuda:1")]
    q = SlotQueue()
    for i in range(1000):
        q.add(run(f"r{i}", on("local", "cuda:0")))
    q.add(run("last", on("local", "cuda:1")))
    holdings = {"h": ("local", ("cuda:0",))}
    state = build_state(providers, holdings=holdings)
    result = q.plan(state)
    assert placed_ids(result) == ["last"]
    # The CPU is free but nobody wants it; cuda:0 is busy: one run looked at, not 1001.
    assert result.examined == 1
    assert result.explain(q.get("r3")) == "waiting for a free slot: cuda:0 on this server is busy (1 of 1 slot used)"
    assert placed_ids(plan(list(q), state)) == ["last"]
    assert q.position("r3") == 4 and len(q) == 1001 and "r3" in q
    with pytest.raises(ValueError, match="queued already"):
        q.add(run("r3", on("local", "cuda:0")))


def _random_world(rng: random.Random):
    providers = [local("cpu", *[f"cuda:{i}" for i in range(rng.randint(0, 2))],
                       uuids={"cuda:0": "GPU-shared"})]
    for w in range(rng.randint(0, 3)):
        n = rng.randint(1, 3)
        uuids = {"cuda:0": "GPU-shared"} if rng.random() < 0.3 else {}
        providers.append(worker(f"w{w}", "cpu", *[f"cuda:{i}" for i in range(n)], uuids=uuids,
                                online=rng.random() < 0.85, draining=rng.random() < 0.1))
    text = ",".join(rng.sample(["cuda:0=2", "w0/cuda:1=2", "cpu=3", "w1/cpu=1", "junk", "w2/cuda:0=0"], 3))
    overrides, _ = parse_limits(text)
    queue = []
    for i in range(rng.randint(0, 30)):
        cands = []
        for _ in range(rng.randint(1, 3)):
            p = rng.choice(providers)
            names = [d.name for d in p.devices]
            k = 1 if rng.random() < 0.7 else min(len(names), 2)
            cands.append(Candidate(p.name, tuple(rng.sample(names, k))))
        queue.append(QueuedRun(f"q{i}", tuple(cands)))
    holdings = {}
    for i in range(rng.randint(0, 4)):
        p = rng.choice(providers)
        holdings[f"h{i}"] = (p.name, (rng.choice([d.name for d in p.devices]),))
    return providers, overrides, queue, holdings


@pytest.mark.parametrize("seed", range(300))
def test_random_worlds_keep_the_invariants(seed):
    rng = random.Random(seed)
    providers, overrides, queue, holdings = _random_world(rng)
    state = build_state(providers, overrides, holdings)
    result = plan(queue, state)
    fast = plan(queue, state, explain=False)
    assert [(p.run_id, p.provider, p.devices) for p in fast.placements] == \
        [(p.run_id, p.provider, p.devices) for p in result.placements]
    used = {k: s.used for k, s in state.slots.items()}
    by_id = {p.name: p for p in providers}
    for p in result.placements:
        prov = by_id[p.provider]
        assert prov.online and not prov.draining
        for k in p.slot_keys:
            used[k] += 1
    for k, s in state.slots.items():
        if used[k] > s.used:  # what this pass placed stays within the limit
            assert used[k] <= s.limit
    reserved = set(result.reserved)
    placed = {p.run_id for p in result.placements}
    for r in queue[: result.examined]:
        if r.run_id in placed:
            continue
        assert r.run_id in result.waiting
        for c in r.candidates:  # work-conserving: nothing it could take was left free
            prov = by_id.get(c.provider)
            if prov is None or not prov.online or prov.draining:
                continue
            keys = [state.index.get((c.provider, d)) for d in c.devices]
            if None in keys:
                continue
            assert any(used[k] >= state.slots[k].limit or k in reserved for k in keys)
    if result.examined < len(queue):  # stopped early: every usable unit is taken or reserved
        for k, s in state.slots.items():
            if s.placeable:
                assert used[k] >= s.limit or k in reserved


@pytest.mark.parametrize("seed", range(150))
def test_slot_queue_places_exactly_like_the_reference_rule(seed):
    """Random worlds and random submit/finish/cancel sequences: SlotQueue.plan == plan(list)."""
    rng = random.Random(1000 + seed)
    providers, overrides, queue, holdings = _random_world(rng)
    q = SlotQueue()
    for r in queue:
        q.add(r)
    n = len(queue)
    for _ in range(12):
        state = build_state(providers, overrides, holdings)
        admit_set = {r.run_id for r in queue if rng.random() < 0.2}

        def admit(r, c, refused=admit_set):
            return "not now" if r.run_id in refused and c.provider != "local" else True

        ref = plan(list(q), state, admit=admit)
        fast = q.plan(state, admit=admit)
        assert [(p.run_id, p.provider, p.devices) for p in fast.placements] == \
            [(p.run_id, p.provider, p.devices) for p in ref.placements]
        assert fast.reserved == ref.reserved
        for run_id, reason in fast.waiting.items():
            assert ref.waiting[run_id] == reason
        for p in ref.placements:
            q.remove(p.run_id)
            holdings[p.run_id] = (p.provider, p.devices)
        for _ in range(rng.randint(0, 3)):  # some runs finish, some are cancelled, new ones come
            if holdings:
                holdings.pop(rng.choice(sorted(holdings)))
            if len(q) and rng.random() < 0.3:
                q.remove(rng.choice([r.run_id for r in q]))
            _, _, more, _ = _random_world(random.Random(rng.random()))
            for r in more[: rng.randint(0, 3)]:
                n += 1
                q.add(QueuedRun(f"n{n}", tuple(c for c in r.candidates if c.provider in {p.name for p in providers})
                                or (Candidate("local", ("cpu",)),)))
        if rng.random() < 0.2:  # a provider goes offline or comes back
            i = rng.randrange(len(providers))
            p = providers[i]
            if not p.is_local:
                providers[i] = ProviderInfo(p.name, p.devices, online=not p.online, draining=p.draining)


def test_without_explain_the_hot_path_makes_no_texts_but_can_say_why_later():
    providers = [worker("a-box", "cpu", "cuda:0", online=False), worker("c-box", "cpu", "cuda:0", "cuda:1")]
    q = SlotQueue()
    q.add(run("first", on("c-box", "cuda:0")))
    q.add(run("second", on("a-box", "cuda:0"), on("c-box", "cuda:0")))
    q.add(run("set", on("c-box", "cuda:0", "cuda:1")))
    state = build_state(providers)
    slow = q.plan(state, explain=True)
    fast = q.plan(state, explain=False)
    assert placed_ids(fast) == placed_ids(slow) == ["first"]
    # "second" wants nothing free after "first" started: the pass does not even look at it.
    assert fast.waiting == {} and [r[0].run_id for r in fast.blocked] == ["set"]
    assert fast.reasons() == slow.waiting
    assert fast.reasons()["set"] == ("holding cuda:1 for this device-set run; waiting for a free slot: "
                                     "cuda:0 on c-box is busy (1 of 1 slot used)")
    assert fast.explain(q.get("set")) == fast.reasons()["set"]
    assert fast.explain(q.get("second")) == ("waiting for a free slot: worker a-box is disconnected; the run waits "
                                             "for it to reconnect; cuda:0 on c-box is busy (1 of 1 slot used)")


def _any_card(providers, run_id: str, rng: random.Random) -> QueuedRun:
    """A run for "any card": one candidate per device of every provider (a big candidate table)."""
    cands = [Candidate(p.name, (d.name,)) for p in providers for d in p.devices]
    rng.shuffle(cands)
    return QueuedRun(run_id, tuple(cands))


def _incremental_world(rng: random.Random):
    """Workers with 2-5 cards (some shared with this server by UUID), limits above 1 on some slots."""
    providers = [local("cpu", "cuda:0", "cuda:1", uuids={"cuda:0": "GPU-shared"})]
    for w in range(rng.randint(1, 4)):
        uuids = {"cuda:0": "GPU-shared"} if rng.random() < 0.3 else {}
        providers.append(worker(f"w{w}", "cpu", *[f"cuda:{i}" for i in range(rng.randint(2, 5))], uuids=uuids,
                                online=rng.random() < 0.9, draining=rng.random() < 0.1))
    overrides, _ = parse_limits(",".join(rng.sample(["cuda:1=2", "w0/cuda:1=3", "cpu=3", "w1/cpu=1"], 2)))
    return providers, overrides


def _incremental_run(providers, run_id: str, rng: random.Random) -> QueuedRun:
    r = rng.random()
    if r < 0.2:
        return _any_card(providers, run_id, rng)
    p = rng.choice(providers)
    names = [d.name for d in p.devices]
    if r < 0.45:  # a device set, sometimes with a second way to run
        cands = [Candidate(p.name, tuple(rng.sample(names, rng.randint(2, min(3, len(names))))))]
        if rng.random() < 0.3:
            q = rng.choice(providers)
            cands.append(Candidate(q.name, (rng.choice([d.name for d in q.devices]),)))
        return QueuedRun(run_id, tuple(cands))
    return QueuedRun(run_id, tuple(Candidate(q.name, (rng.choice([d.name for d in q.devices]),))
                                   for q in rng.sample(providers, rng.randint(1, min(2, len(providers))))))


@pytest.mark.parametrize("seed", range(60))
def test_slot_queue_decides_incrementally_exactly_like_the_reference_rule(seed):
    """The dispatcher's hot path (no admit, no texts, one state kept up to date with hold/release):
    decision after decision, SlotQueue.plan continues from its previous pass and must give the same
    placements, reservations and waiting reasons as plan() over the whole queue. Runs end, queued
    runs (device-set holders too) are cancelled, new ones come, a start fails (the run leaves the queue
    but its slots are not held), a placement is left queued, and providers change."""
    rng = random.Random(5000 + seed)
    providers, overrides = _incremental_world(rng)
    q = SlotQueue()
    n = 0
    for _ in range(rng.randint(5, 60)):
        n += 1
        q.add(_incremental_run(providers, f"r{n}", rng))
    holdings: dict[str, tuple[str, tuple[str, ...]]] = {}
    state = build_state(providers, overrides, holdings)
    incremental = 0
    for step in range(60):
        ref = plan(list(q), state, explain=False)
        before = q._serial is not None
        fast = q.plan(state, explain=False)
        incremental += before and q._upto > 0
        assert [(p.run_id, p.provider, p.devices) for p in fast.placements] == \
            [(p.run_id, p.provider, p.devices) for p in ref.placements], step
        assert fast.reserved == ref.reserved, step
        ref_reasons = ref.reasons()
        for run_id, reason in fast.reasons().items():
            if run_id in ref_reasons:
                assert reason == ref_reasons[run_id], (step, run_id)
        placements = list(fast.placements)
        if placements and rng.random() < 0.1:
            placements.pop()  # left queued: the dispatcher did not apply it; the next pass starts over
        for p in placements:
            q.remove(p.run_id)
            if rng.random() < 0.05:
                continue  # the start failed before the slots were held: they are free again
            holdings[p.run_id] = (p.provider, p.devices)
            state.hold(p.run_id, p.provider, p.devices)
        for _ in range(rng.randint(0, 3)):
            if holdings and rng.random() < 0.7:
                run_id = rng.choice(sorted(holdings))
                del holdings[run_id]
                state.release(run_id)
            if len(q) and rng.random() < 0.3:  # cancelled, often a waiting device-set run
                waiting = [r.run_id for r in q]
                sets = [r.run_id for r in q if r.is_device_set]
                q.remove(rng.choice(sets if sets and rng.random() < 0.6 else waiting))
            if rng.random() < 0.6:
                n += 1
                q.add(_incremental_run(providers, f"r{n}", rng))
        if rng.random() < 0.05:  # a provider leaves or comes back: the dispatcher builds a new state
            i = rng.randrange(1, len(providers))
            p = providers[i]
            providers[i] = ProviderInfo(p.name, p.devices, online=not p.online, draining=p.draining)
            state = build_state(providers, overrides, holdings)
    assert incremental > 20  # most decisions did continue from the previous pass


def test_slot_queue_hands_on_the_slots_of_a_cancelled_device_set_run():
    providers = [worker("box", "cpu", "cuda:0", "cuda:1", "cuda:2")]
    q = SlotQueue()
    q.add(run("busy", on("box", "cuda:0")))
    q.add(run("set", on("box", "cuda:0", "cuda:1")))
    q.add(run("one", on("box", "cuda:1")))
    q.add(run("two", on("box", "cuda:2")))
    state = build_state(providers)
    first = q.plan(state, explain=False)
    assert placed_ids(first) == ["busy", "two"] and first.reserved == {"box/cuda:1": "set"}
    for p in first.placements:
        q.remove(p.run_id)
        state.hold(p.run_id, p.provider, p.devices)
    again = q.plan(state, explain=False)  # nothing changed: nothing placed, nobody looked at
    assert placed_ids(again) == [] and again.examined == 0 and again.reserved == {"box/cuda:1": "set"}
    q.remove("set")  # cancelled: cuda:1 goes to the next run that wants it
    after = q.plan(state, explain=False)
    assert placed_ids(after) == ["one"] and after.reserved == {} and after.examined == 1
    for p in after.placements:
        q.remove(p.run_id)
        state.hold(p.run_id, p.provider, p.devices)
    state.release("busy")
    q.add(run("late", on("box", "cuda:0")))
    assert placed_ids(q.plan(state, explain=False)) == ["late"]


def test_slot_queue_starts_over_when_the_state_change_log_no_longer_reaches_back():
    providers = [worker("box", "cpu", "cuda:0", "cuda:1")]
    q = SlotQueue()
    for i in range(4):
        q.add(run(f"r{i}", on("box", "cuda:0")))
    q.add(run("set", on("box", "cuda:0", "cuda:1")))
    state = build_state(providers)
    version = state.version
    for p in q.plan(state, explain=False).placements:
        q.remove(p.run_id)
        state.hold(p.run_id, p.provider, p.devices)
    for i in range(3000):  # other runs come and go on the CPU: more changes than the log keeps
        state.hold(f"x{i}", "box", ("cpu",))
        state.release(f"x{i}")
    assert state.changes_since(version) is None and state.changes_since(state.version) == []
    state.release("r0")
    ref = plan(list(q), state, explain=False)
    fast = q.plan(state, explain=False)
    assert placed_ids(fast) == placed_ids(ref) == ["r1"] and fast.reserved == ref.reserved == {"box/cuda:1": "set"}

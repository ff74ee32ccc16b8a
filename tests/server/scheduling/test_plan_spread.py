"""The slot rule for runs spread over workers (ddp across workers): every slot on every worker at
once or nothing, reserving at the head of the queue like a device set; checked exhaustively on small
worlds, and SlotQueue against the reference plan()."""

from __future__ import annotations

import itertools

import pytest

from xpufleet.server.scheduling import (
    Candidate,
    DeviceOffer,
    ProviderInfo,
    QueuedRun,
    SlotQueue,
    build_state,
    plan,
)


def worker(name: str, *devices: str, online: bool = True, draining: bool = False) -> ProviderInfo:
    return ProviderInfo(name, tuple(DeviceOffer(d) for d in devices), online=online, draining=draining)


def spread(run_id: str, *parts: tuple[str, tuple[str, ...]]) -> QueuedRun:
    (first, devs), *extra = parts
    return QueuedRun(run_id, (Candidate(first, devs, tuple(extra)),))


def single(run_id: str, provider: str, device: str) -> QueuedRun:
    return QueuedRun(run_id, (Candidate(provider, (device,)),))


WORLD = [worker("a", "cpu", "cuda:0"), worker("b", "cpu", "cuda:0", "cuda:1"), worker("c", "cpu", "cuda:0")]
# The kinds of run a queue is made of: single cards, a device set, and spread runs over 2 and 3 workers.
KINDS = {
    "a0": lambda i: single(i, "a", "cuda:0"),
    "b0": lambda i: single(i, "b", "cuda:0"),
    "b1": lambda i: single(i, "b", "cuda:1"),
    "bset": lambda i: QueuedRun(i, (Candidate("b", ("cuda:0", "cuda:1")),)),
    "ab": lambda i: spread(i, ("a", ("cuda:0",)), ("b", ("cuda:0", "cuda:1"))),
    "ba": lambda i: spread(i, ("b", ("cuda:1",)), ("a", ("cuda:0",))),
    "abc": lambda i: spread(i, ("a", ("cuda:0",)), ("b", ("cuda:0",)), ("c", ("cuda:0",))),
}
HOLDS = {"a0": ("a", ("cuda:0",)), "b0": ("b", ("cuda:0",)), "b1": ("b", ("cuda:1",)), "c0": ("c", ("cuda:0",))}


def _queues(max_len: int):
    for n in range(1, max_len + 1):
        for kinds in itertools.product(sorted(KINDS), repeat=n):
            yield [KINDS[k](f"q{i}-{k}") for i, k in enumerate(kinds)]


def _holdings():
    for n in range(0, 3):
        for names in itertools.combinations(sorted(HOLDS), n):
            yield {f"h-{h}": HOLDS[h] for h in names}


def _slots(state, cand: Candidate) -> list[str]:
    return [state.index[pair] for pair in cand.pairs]


def test_a_spread_candidate_lists_every_part_and_round_trips_through_json():
    cand = Candidate("a", ("cuda:0",), (("b", ("cuda:0", "cuda:1")),))
    assert cand.parts == (("a", ("cuda:0",)), ("b", ("cuda:0", "cuda:1")))
    assert cand.pairs == (("a", "cuda:0"), ("b", "cuda:0"), ("b", "cuda:1"))
    assert cand.labels() == ["a/cuda:0", "b/cuda:0", "b/cuda:1"]
    assert Candidate.from_json(cand.to_json()) == cand
    assert Candidate.from_json(Candidate("a", ("cuda:0",)).to_json()) == Candidate("a", ("cuda:0",))
    assert QueuedRun("r", (cand,)).is_device_set


def test_exhaustively_a_spread_run_takes_every_slot_at_once_or_waits_holding_at_the_head():
    """Every queue of up to 3 runs from KINDS, against every holding of up to 2 cards: placements never
    exceed a slot, a spread run is placed with every part or not at all, the first waiting spread or
    set run holds each of its free slots so no later run takes one, and a run waits only when a slot
    it needs is busy or held by an earlier run. SlotQueue decides exactly like plan()."""
    checked = 0
    for holdings in _holdings():
        for queue in _queues(3):
            state = build_state(WORLD, None, holdings)
            result = plan(queue, state)
            used = {k: s.used for k, s in state.slots.items()}
            placed = {p.run_id: p for p in result.placements}
            reserved_by: dict[str, str] = {}
            for run in queue:
                cand = run.candidates[0]
                keys = _slots(state, cand)
                p = placed.get(run.run_id)
                if p is not None:
                    assert p.slot_keys == tuple(keys) and p.extra == cand.extra  # every part at once
                    assert all(used[k] < state.slots[k].limit and k not in reserved_by for k in keys)
                    for k in keys:
                        used[k] += 1
                    continue
                # it waits: some slot it needs is busy or held for an earlier set run
                assert any(used[k] >= state.slots[k].limit or k in reserved_by for k in keys), (holdings, queue)
                if run.is_device_set:  # it holds what is free of its slots; later runs cannot take those
                    for k in keys:
                        if used[k] < state.slots[k].limit and k not in reserved_by:
                            reserved_by[k] = run.run_id
                assert run.run_id in result.waiting
            assert result.reserved == reserved_by
            q = SlotQueue()
            for run in queue:
                q.add(run)
            fast = q.plan(state, explain=False)
            assert [(p.run_id, p.extra) for p in fast.placements] == [(p.run_id, p.extra) for p in result.placements]
            assert fast.reserved == result.reserved
            checked += 1
    assert checked == sum(1 for _ in _holdings()) * sum(len(KINDS) ** n for n in (1, 2, 3))


def test_a_spread_run_is_not_starved_by_single_card_runs_and_then_takes_both_workers():
    holdings = {"h": ("a", ("cuda:0",))}
    q = SlotQueue()
    q.add(spread("wide", ("a", ("cuda:0",)), ("b", ("cuda:0",))))
    for i in range(5):
        q.add(single(f"s{i}", "b", "cuda:0"))
    state = build_state(WORLD, None, holdings)
    first = q.plan(state, explain=True)
    assert first.placements == []  # b's cuda:0 is free, but held for the spread run ahead
    assert first.reserved == {"b/cuda:0": "wide"}
    assert first.waiting["wide"].startswith("holding b/cuda:0 for this device-set run; waiting for a free slot: "
                                            "cuda:0 on a is busy")
    assert "reserved for device-set run wide" in first.explain(q.get("s0"))
    state.release("h")
    second = q.plan(state, explain=False)
    (p,) = second.placements
    assert (p.run_id, p.provider, p.devices, p.extra) == ("wide", "a", ("cuda:0",), (("b", ("cuda:0",)),))
    q.remove("wide")
    state.hold("wide", p.provider, p.devices, p.extra)
    assert state.held["wide"] == ("a/cuda:0", "b/cuda:0")
    assert {k: state.slots[k].used for k in ("a/cuda:0", "b/cuda:0")} == {"a/cuda:0": 1, "b/cuda:0": 1}
    assert q.plan(state, explain=False).placements == []  # the single runs wait for b's card
    state.release("wide")
    assert [p.run_id for p in q.plan(state, explain=False).placements] == ["s0"]


@pytest.mark.parametrize("which, online, draining, text", [
    ("b", False, False, "worker b is disconnected; the run waits for it to reconnect"),
    ("b", True, True, "worker b is draining"),
])
def test_a_spread_run_waits_for_every_part_s_worker_and_says_which(which, online, draining, text):
    world = [WORLD[0], worker("b", "cpu", "cuda:0", online=online, draining=draining)]
    run = spread("wide", ("a", ("cuda:0",)), ("b", ("cuda:0",)))
    result = plan([run], build_state(world))
    assert result.placements == [] and result.reserved == {}  # nothing held through an unusable worker
    assert result.waiting["wide"] == f"waiting for a free slot: {text}"


def test_a_spread_run_on_a_card_a_worker_no_longer_offers_waits_saying_so():
    run = spread("wide", ("a", ("cuda:0",)), ("b", ("cuda:7",)))
    result = plan([run], build_state(WORLD))
    assert result.waiting["wide"] == "waiting for a free slot: worker b no longer offers cuda:7"


def test_build_state_holds_a_spread_run_on_every_part():
    state = build_state(WORLD, None, {"wide": ("a", ("cuda:0",), (("b", ("cuda:1",)),))})
    assert state.slots["a/cuda:0"].holders == ["wide"] and state.slots["b/cuda:1"].holders == ["wide"]
    state.release("wide")
    assert state.slots["a/cuda:0"].used == 0 and state.slots["b/cuda:1"].used == 0


def _random_run(rng, providers, run_id: str) -> QueuedRun:
    """A single card, a device set, or a spread run over 2-3 workers (sometimes with a second way)."""
    r = rng.random()
    workers = [p for p in providers if len(p.devices) > 1]
    if r < 0.35 and len(workers) >= 2:
        chosen = rng.sample(workers, rng.randint(2, min(3, len(workers))))
        parts = [(p.name, tuple(rng.sample([d.name for d in p.devices if d.name != "cpu"], 1))) for p in chosen]
        cands = [Candidate(parts[0][0], parts[0][1], tuple(parts[1:]))]
        if rng.random() < 0.2:
            p = rng.choice(providers)
            cands.append(Candidate(p.name, (rng.choice([d.name for d in p.devices]),)))
        return QueuedRun(run_id, tuple(cands))
    p = rng.choice(providers)
    names = [d.name for d in p.devices]
    if r < 0.5 and len(names) > 2:
        return QueuedRun(run_id, (Candidate(p.name, tuple(rng.sample(names, 2))),))
    return QueuedRun(run_id, (Candidate(p.name, (rng.choice(names),)),))


@pytest.mark.parametrize("seed", range(40))
def test_slot_queue_decides_spread_runs_incrementally_exactly_like_the_reference_rule(seed):
    """The dispatcher's hot path with spread runs in the queue: pass after pass (runs end, waiting
    spread runs are cancelled, new ones come, a worker leaves or comes back), SlotQueue continues from
    its previous pass and gives plan()'s placements and reservations; a placed spread run holds every
    part's slots under its id."""
    import random

    rng = random.Random(9000 + seed)
    providers = [worker(f"w{i}", "cpu", *[f"cuda:{j}" for j in range(rng.randint(1, 3))],
                        online=rng.random() < 0.9) for i in range(rng.randint(2, 4))]
    q = SlotQueue()
    n = 0
    for _ in range(rng.randint(5, 30)):
        n += 1
        q.add(_random_run(rng, providers, f"r{n}"))
    holdings: dict = {}
    state = build_state(providers, None, holdings)
    for step in range(40):
        ref = plan(list(q), state, explain=False)
        fast = q.plan(state, explain=False)
        assert [(p.run_id, p.provider, p.devices, p.extra) for p in fast.placements] == \
            [(p.run_id, p.provider, p.devices, p.extra) for p in ref.placements], step
        assert fast.reserved == ref.reserved, step
        for p in fast.placements:
            q.remove(p.run_id)
            holdings[p.run_id] = (p.provider, p.devices, p.extra)
            state.hold(p.run_id, p.provider, p.devices, p.extra)
            assert state.held[p.run_id] == p.slot_keys
        for _ in range(rng.randint(0, 3)):
            if holdings and rng.random() < 0.7:
                run_id = rng.choice(sorted(holdings))
                del holdings[run_id]
                state.release(run_id)
            if len(q) and rng.random() < 0.3:
                sets = [r.run_id for r in q if r.is_device_set]
                q.remove(rng.choice(sets if sets and rng.random() < 0.6 else [r.run_id for r in q]))
            if rng.random() < 0.6:
                n += 1
                q.add(_random_run(rng, providers, f"r{n}"))
        for slot in state.slots.values():
            assert slot.used <= min(o.limit for o in slot.offers)  # never over the limit, online or not
        if rng.random() < 0.05:
            i = rng.randrange(len(providers))
            p = providers[i]
            providers[i] = ProviderInfo(p.name, p.devices, online=not p.online)
            state = build_state(providers, None, holdings)

"""Admission by memory in a real (in-process) sidecar, against agents that speak the protocol by hand:
the ledger's texts (docs/memory.md) in 400s and waiting_reason, waiting and starting as memory frees, defaults and raises,
MPS and unreported cards, runs without a budget, agents that cannot cap, restarts, OOM texts, NVML use."""

from __future__ import annotations

import copy

import scripted_agent as sa  # registered by tests/server/conftest.py

GRAPH = sa.IRIS_GRAPH


def graph(epochs: int = 1, hidden: str = "16") -> dict:
    """The same runtime graph for every ``epochs`` (epochs do not count); another one per ``hidden``."""
    g = copy.deepcopy(GRAPH)
    g["7"]["inputs"]["epochs"] = epochs
    g["4"]["inputs"]["hidden"] = hidden
    return g


def real_cards(free1: float = 6.3, **kw) -> list[dict]:
    """gpu-box's cards as a real agent reports them (these tests script the figures)."""
    devices = sa.cards(2, simulated=False, **kw)
    devices[2]["free_gib"] = free1
    return devices


async def test_admit_reject_and_wait_with_the_seed_texts_then_start_when_memory_frees(xpufleet_home):
    async with sa.Sidecar(xpufleet_home) as sc:
        agent = await sc.agent("gpu-box", real_cards(), share=("cuda:1",))
        target = {"worker": "gpu-box", "devices": ["cuda:1"]}
        # a named worker rejects at once: both figures, what to change
        status, body = await sc.submit(graph(), **target, memory_gib=12)
        assert status == 400, body
        assert body["error"] == ("needs 12.0 GiB (+0.8 GiB CUDA context), cuda:1 on gpu-box has 6.3 GiB free "
                                 "(set target.wait to true to queue it until it fits)")
        status, body = await sc.submit(graph(), **target, memory_gib=30, wait=True)
        assert status == 400 and "more than cuda:1 on gpu-box has in all (24.0 GiB)" in body["error"], body
        status, body = await sc.submit(graph(), **target)
        assert status == 400 and "declares no budget: set options.target.memory_gib" in body["error"], body
        # a budget that fits is admitted: the agent gets it with the run
        status, body = await sc.submit(graph(), **target, memory_gib=4)
        assert status == 201, body
        small = body["run_id"]
        start = await agent.take(small)
        assert start["budget_gib"] == 4.0 and start["devices"] == ["cuda:1"]
        await sc.status(small, {"running"})
        run = await sc.run(small)
        assert run["budget"]["source"] == "user" and run["budget"]["label"] == "4.0 GiB" and run["n_cards"] == 1
        # wait: true queues it with the reason, the runs on the card named; the started run's use shows
        # in "free" at the next heartbeat (until then its budget counts in total - reserved - running)
        status, body = await sc.submit(graph(), **target, memory_gib=12, wait=True)
        assert status == 201, body
        big = body["run_id"]
        waiting = await sc.reason(big, "waiting for memory")
        assert waiting["status"] == "queued"
        assert waiting["waiting_reason"] == (
            f"waiting for memory: needs 12.0 GiB (+0.8 GiB CUDA context), cuda:1 on gpu-box has 6.3 GiB free "
            f"(runs {small[:8]})")
        card = (await sc.worker("gpu-box"))["devices"][2]["memory"]
        assert card["admits_by_memory"] is True and card["running_gib"] == 4.75 and card["reserved_gib"] == 0
        assert card["free_for_budgets_gib"] == 5.5 and card["in_use_gib"] == 17.7
        assert [(r["id"], r["state"], r["budget_gib"]) for r in card["runs"]] == [(small, "running", 4.0)]
        # memory frees (the heartbeat says so): the waiting run starts
        await agent.heartbeat(cuda_1=20.0)
        start = await agent.recv_type("start_run")
        assert start["run_id"] == big and start["budget_gib"] == 12.0
        await sc.status(big, {"assigned"})
        card = (await sc.worker("gpu-box"))["devices"][2]["memory"]
        assert card["reserved_gib"] == 12.75 and card["running_gib"] == 4.75


async def _run_to_end(sc, agent, run_id: str, status: str = "succeeded", peak: dict | None = None, **payload) -> dict:
    await agent.take(run_id)
    await agent.finish(run_id, status, peak, **payload)
    return await sc.status(run_id, {status})


async def test_default_budget_is_the_measured_peak_plus_20_percent_and_estimates_are_raised(xpufleet_home):
    async with sa.Sidecar(xpufleet_home) as sc:
        agent = await sc.agent("gpu-box", real_cards(free1=24.0), share=("cuda:1",))
        target = {"worker": "gpu-box", "devices": ["cuda:1"], "wait": True}
        status, body = await sc.submit(graph(epochs=1), **target, memory_gib=2)
        first = body["run_id"]
        await _run_to_end(sc, agent, first, peak=sa.cuda_peak(5.0))
        done = await sc.run(first)
        assert done["memory_peak"]["gib"] == 5.0 and done["memory_peak"]["source"] == "cuda"
        assert "high-water mark" in done["memory_peak"]["label"]
        # another seed and more epochs: the same runtime graph, so no budget means the default
        status, body = await sc.submit(graph(epochs=9), **target)
        assert status == 201, body
        run = await sc.run(body["run_id"])
        assert run["budget"] == {"gib": 6.0, "source": "measured", "from_run": first, "peak_gib": 5.0,
                                 "peak_source": "cuda", "declared_gib": None, "reason": None,
                                 "label": f"6.0 GiB (peak of run {first[:8]} + 20%)"}
        assert run["budget_gib"] == 6.0 and run["budget_source"] == "measured"
        assert (await agent.recv_type("start_run"))["budget_gib"] == 6.0
        # an unmodified "measured" suggestion sent anyway gets the same default
        status, body = await sc.submit(graph(), **target, memory_gib=6.0, memory_source="measured")
        assert (await sc.run(body["run_id"]))["budget"]["from_run"] == first
        # an estimate smaller than the measured default is raised at submit time, with the reason
        status, body = await sc.submit(graph(), **target, memory_gib=3.0, memory_source="estimate")
        run = await sc.run(body["run_id"])
        assert run["budget"]["gib"] == 6.0 and run["budget"]["declared_gib"] == 3.0
        assert run["budget"]["reason"] == (f"raised from the estimate 3.0 GiB to 6.0 GiB: run {first[:8]} of the "
                                           f"same graph on 1 card peaked at 5.0 GiB (+20%)")
        # a typed budget is never changed; a larger estimate stays (marked estimate)
        status, body = await sc.submit(graph(), **target, memory_gib=1.0)
        assert (await sc.run(body["run_id"]))["budget"]["gib"] == 1.0
        status, body = await sc.submit(graph(), **target, memory_gib=8.0, memory_source="estimate")
        assert (await sc.run(body["run_id"]))["budget"]["label"] == "8.0 GiB (est.)"
        # another graph has no peak: no budget on a shared card is rejected, asking for one
        status, body = await sc.submit(graph(hidden="32"), **target)
        assert status == 400 and "no measured peak on 1 card" in body["error"]
        # a failed run's figure is recorded but never becomes a default


async def test_a_waiting_estimate_is_raised_by_a_larger_peak_and_fails_when_no_card_can_hold_it(xpufleet_home):
    async with sa.Sidecar(xpufleet_home) as sc:
        agent = await sc.agent("gpu-box", real_cards(free1=2.0), share=("cuda:1",))
        target = {"worker": "gpu-box", "devices": ["cuda:1"], "wait": True}
        # three runs of one graph wait (2 GiB free); the first gets through on an exclusive card
        status, body = await sc.submit(graph(), **target, memory_gib=3.0, memory_source="estimate")
        estimate = body["run_id"]
        status, body = await sc.submit(graph(), **target, memory_gib=3.0)
        typed = body["run_id"]
        await sc.reason(estimate, "waiting for memory")
        status, body = await sc.submit(graph(epochs=3), worker="gpu-box", devices=["cuda:0"])
        other = body["run_id"]
        await _run_to_end(sc, agent, other, peak=sa.cuda_peak(10.0))
        # the waiting estimate is raised to 12.0 with the reason; the typed budget stays
        run = await sc.reason(estimate, "raised from the estimate 3.0 GiB to 12.0 GiB: while the run waited")
        assert run["budget"]["gib"] == 12.0 and run["budget"]["from_run"] == other
        assert run["budget_gib"] == 12.0 and run["status"] == "queued"
        status, body = await sc.call("GET", f"/api/runs/{estimate}/events?type=budget_changed")
        assert body["events"][0]["payload"]["budget_gib"] == 12.0
        assert (await sc.run(typed))["budget"]["gib"] == 3.0
        # a larger peak still: the raised budget is larger than the card, so the run fails instead of waiting
        status, body = await sc.submit(graph(epochs=4), worker="gpu-box", devices=["cuda:0"])
        await _run_to_end(sc, agent, body["run_id"], peak=sa.cuda_peak(25.0))
        failed = await sc.status(estimate, {"failed"})
        assert "to 30.0 GiB" in failed["error"] and "more than any card this run may use has" in failed["error"]
        assert (await sc.run(typed))["status"] == "queued"


async def test_a_shared_mps_card_refuses_budgets_and_an_unreported_cuda_card_waits_for_the_heartbeat(xpufleet_home):
    async with sa.Sidecar(xpufleet_home) as sc:
        mac = await sc.agent("mac", sa.cards(1, total=32.0, free=None, simulated=False, kind="mps"), share=("mps:0",))
        status, body = await sc.submit(graph(), worker="mac", devices=["mps:0"], memory_gib=4, wait=True)
        assert status == 400, body
        assert body["error"].startswith("mps:0 on mac is shared by memory, but an MPS device does not report its "
                                        "total memory, so it cannot admit runs by budget; make it exclusive")
        card = (await sc.worker("mac"))["devices"][1]["memory"]
        assert card["admits_by_memory"] is True and "does not report its total memory" in card["note"]
        await sc.share("mac", "mps:0", mode="exclusive")  # exclusive again: it runs (the slot rule decides)
        status, body = await sc.submit(graph(), worker="mac", devices=["mps:0"])
        assert status == 201 and (await mac.recv_type("start_run"))["budget_gib"] is None
        # a CUDA card that has not reported its memory yet: the run waits for the next heartbeat
        devices = real_cards()
        devices[2].update(total_gib=None, free_gib=None)
        box = await sc.agent("gpu-box", devices, share=("cuda:1",))
        status, body = await sc.submit(graph(), worker="gpu-box", devices=["cuda:1"], memory_gib=4)
        assert status == 201, body
        await sc.reason(body["run_id"], "cuda:1 on gpu-box has not reported its memory yet: the budget is decided "
                                        "after the worker's next heartbeat")
        devices[2].update(total_gib=24.0, free_gib=20.0)
        await box.heartbeat()
        assert (await box.recv_type("start_run"))["run_id"] == body["run_id"]


async def test_runs_without_a_budget_hold_a_shared_card_and_queued_ones_get_the_default_when_it_turns_shared(xpufleet_home):
    async with sa.Sidecar(xpufleet_home) as sc:
        agent = await sc.agent("gpu-box", real_cards(free1=24.0))
        target = {"worker": "gpu-box", "devices": ["cuda:1"]}
        # exclusive: a run without budget holds cuda:1, the next one queues behind its slot
        status, body = await sc.submit(graph(epochs=1), **target)
        holder = body["run_id"]
        assert (await agent.recv_type("start_run"))["budget_gib"] is None
        await agent.started(holder)
        status, body = await sc.submit(graph(epochs=2), **target)
        queued = body["run_id"]
        await sc.reason(queued, "busy (1 of 1 slot used)")
        # the card turns shared: the running run has no budget, so it holds the card alone
        await sc.share("gpu-box", "cuda:1")
        run = await sc.reason(queued, "cuda:1 on gpu-box is shared by memory and this run has no budget")
        assert "queue it again with target.memory_gib" in run["waiting_reason"]
        status, body = await sc.submit(graph(hidden="64"), **target, memory_gib=2, wait=True)
        typed = body["run_id"]
        run = await sc.reason(typed, f"is held by run {holder[:8]}, which has no budget and holds the card alone")
        card = (await sc.worker("gpu-box"))["devices"][2]["memory"]
        assert "held by run" in card["note"] and card["runs"][0] == {"id": holder, "state": "running",
                                                                      "budget_gib": None}
        # the holder succeeds with a peak: the queued run of its graph gets the default, and both start
        await agent.finish(holder, "succeeded", sa.cuda_peak(3.0))
        started = {(await agent.recv_type("start_run"))["run_id"] for _ in range(2)}
        assert started == {queued, typed}
        run = await sc.run(queued)
        assert run["budget"]["gib"] == 3.6 and run["budget"]["from_run"] == holder
        assert f"run {holder[:8]} of the same graph succeeded" in run["budget"]["reason"]


async def test_a_budgeted_run_never_starts_on_an_agent_that_cannot_cap_it(xpufleet_home):
    async with sa.Sidecar(xpufleet_home) as sc:
        old = await sc.agent("old-box", real_cards(free1=24.0), caps=False, share=("cuda:1",))
        assert (await sc.worker("old-box"))["agent_caps_memory"] is False
        status, body = await sc.submit(graph(), worker="old-box", devices=["cuda:1"], memory_gib=2)
        assert status == 400 and "cannot cap a run's memory to its budget" in body["error"], body
        # a typed budget is a cap on an exclusive card too: refused there as well, never ignored
        status, body = await sc.submit(graph(), worker="old-box", devices=["cuda:0"], memory_gib=2)
        assert status == 400 and "cannot cap a run's memory to its budget" in body["error"], body
        status, body = await sc.submit(graph(), worker="old-box", devices=["cuda:0"])
        assert status == 201 and (await old.recv_type("start_run"))["budget_gib"] is None
        await old.close()
        # admitted on a capable agent, then it comes back as an older agent before the run started
        box = await sc.agent("gpu-box", real_cards(free1=24.0), share=("cuda:1",))
        status, body = await sc.submit(graph(), worker="gpu-box", devices=["cuda:1"], memory_gib=2)
        run_id = body["run_id"]
        await box.recv_type("start_run")  # never acted on: the connection breaks
        await box.close()
        await sc.agent("gpu-box", real_cards(free1=24.0), caps=False)
        failed = await sc.status(run_id, {"failed"})
        assert "cannot cap a run's memory to its budget" in failed["error"]
        assert "reconnected before this run (budget 2.0 GiB) started" in failed["error"]


async def _running_on_a_shared_card(sc: sa.Sidecar, memory_gib: float) -> tuple[sa.ScriptedAgent, str]:
    """gpu-box, its cuda:1 (24 GiB free) shared by memory, running a run with the budget ``memory_gib``."""
    agent = await sc.agent("gpu-box", real_cards(free1=24.0), share=("cuda:1",))
    status, body = await sc.submit(graph(), worker="gpu-box", devices=["cuda:1"], memory_gib=memory_gib)
    assert status == 201, body
    await agent.take(body["run_id"])
    return agent, body["run_id"]


async def test_an_oom_under_a_budget_names_its_source_and_nvml_use_shows_in_the_run_and_workers_data(xpufleet_home):
    async with sa.Sidecar(xpufleet_home) as sc:
        agent, run_id = await _running_on_a_shared_card(sc, memory_gib=4)
        await agent.heartbeat(runs=[{"run_id": run_id, "last_seq": 1, "status": "running",
                                     "memory": {"cuda:1": 3.25}}])

        async def use() -> dict | None:
            card = (await sc.worker("gpu-box"))["devices"][2]["memory"]
            return card if card["runs"] and card["runs"][0].get("in_use_gib") else None
        card = await sc.until(use, "NVML use on the card")
        assert card["runs"][0]["in_use_gib"] == 3.25 and card["runs"][0]["in_use_source"].startswith("NVML")
        run = await sc.run(run_id)
        assert run["execution_facts"]["memory_in_use"]["max"] == {"cuda:1": 3.25}
        await agent.finish(run_id, "failed", sa.cuda_peak(4.0), error="Node 7 (XPUTrainingLoop) failed: "
                           "OutOfMemoryError: CUDA out of memory.",
                           out_of_memory={"device": "cuda:1", "budget_gib": 4.0, "simulated": False})
        failed = await sc.status(run_id, {"failed"})
        assert failed["error"] == ("out of memory on cuda:1 on gpu-box under its budget of 4.0 GiB (the budget you "
                                   "typed): declare a larger options.target.memory_gib. Node 7 (XPUTrainingLoop) "
                                   "failed: OutOfMemoryError: CUDA out of memory.")


async def test_any_waits_across_two_agents_and_starts_where_memory_frees(xpufleet_home):
    async with sa.Sidecar(xpufleet_home) as sc:
        await sc.agent("a-box", real_cards(free1=3.0, prefix="GPU-a"), share=("cuda:1",))
        b = await sc.agent("b-box", real_cards(free1=3.0, prefix="GPU-b"), share=("cuda:1",))
        # any: larger than every candidate -> rejected; wait false -> rejected; else it waits
        status, body = await sc.submit(graph(), worker="any", devices=["cuda:1"], memory_gib=40)
        assert status == 400 and body["error"].startswith("the budget is larger than every card the run may use")
        status, body = await sc.submit(graph(), worker="any", devices=["cuda:1"], memory_gib=8, wait=False)
        assert status == 400 and "(set target.wait to true to queue it until it fits)" in body["error"]
        status, body = await sc.submit(graph(), worker="any", devices=["cuda:1"], memory_gib=8)
        assert status == 201, body
        run = await sc.reason(body["run_id"], "waiting for memory")
        assert "cuda:1 on a-box has 3.0 GiB free" in run["waiting_reason"]
        assert "cuda:1 on b-box has 3.0 GiB free" in run["waiting_reason"]
        await b.heartbeat(cuda_1=20.0)
        start = await b.recv_type("start_run")
        assert start["run_id"] == body["run_id"] and start["budget_gib"] == 8.0
        assert (await sc.status(body["run_id"], {"assigned"}))["worker_id"] == "b-box"


async def test_runs_taken_over_after_a_restart_count_as_running_on_the_ledger(xpufleet_home):
    async with sa.Sidecar(xpufleet_home) as sc:
        _, run_id = await _running_on_a_shared_card(sc, memory_gib=10)
        await sc.status(run_id, {"running"})
    async with sa.Sidecar(xpufleet_home) as sc:  # the sidecar restarted; the agent kept the run
        agent = sa.ScriptedAgent(sc, "gpu-box", real_cards(free1=24.0),
                                 runs=[{"run_id": run_id, "last_seq": 1, "status": "running"}])
        welcome = await agent.connect()
        assert welcome["runs"] == {run_id: 1}
        card = (await sc.worker("gpu-box"))["devices"][2]["memory"]
        assert card["runs"] == [{"id": run_id, "state": "running", "budget_gib": 10.0, "budget_label": "10.0 GiB"}]
        assert card["running_gib"] == 10.75
        status, body = await sc.submit(graph(), worker="gpu-box", devices=["cuda:1"], memory_gib=14)
        assert status == 400 and f"has 13.2 GiB free (runs {run_id[:8]})" in body["error"], body


async def test_this_servers_own_cards_admit_by_memory_only_when_turned_on(xpufleet_home, tmp_path):
    local = [{"name": "cpu", "kind": "cpu", "total_gib": 8.0, "free_gib": 6.0},
             {"name": "cuda:0", "kind": "cuda", "uuid": "GPU-local-0", "total_gib": 24.0, "free_gib": 10.0}]

    async def off() -> None:
        async with sa.Sidecar(xpufleet_home, local_devices=local, validate_local_graphs=False) as sc:
            status, body = await sc.call("POST", "/api/runs", {"graph": graph(), "options": {
                "device": "cuda:0", "target": {"memory_gib": 4}}})
            assert status == 400, body
            assert "memory admission for this server's cards is off (XPUFLEET_LOCAL_SHARED_CARDS=cuda:0 turns it on" \
                in body["error"]

    async def on() -> None:
        async with sa.Sidecar(tmp_path / "home2", local_devices=local, local_shared=("cuda:0",),
                              validate_local_graphs=False) as sc:
            status, body = await sc.call("POST", "/api/runs", {"graph": graph(), "options": {
                "device": "cuda:0", "target": {"memory_gib": 12}}})
            assert status == 400 and "cuda:0 on this server has 10.0 GiB free" in body["error"], body
            status, body = await sc.call("POST", "/api/runs", {"graph": graph(), "options": {"device": "cuda:0"}})
            assert status == 400 and "declares no budget" in body["error"]
            status, body = await sc.call("POST", "/api/runs", {"graph": graph(), "options": {
                "device": "cuda:0", "target": {"memory_gib": 4}}})
            assert status == 201, body
            run = await sc.status(body["run_id"], {"assigned", "running", "failed", "succeeded"})
            import asyncio
            import json
            from pathlib import Path

            path = Path(run["run_dir"]) / "spec.json"
            for _ in range(600):  # the spec is written in a worker thread as the run starts (bounded: 60 s)
                if path.exists():
                    break
                await asyncio.sleep(0.1)
            spec = json.loads(path.read_text())
            assert spec["budget_gib"] == 4.0  # the run's process is capped to it (server/run/memory.py)
            await sc.status(body["run_id"], {"failed", "succeeded"}, timeout=60)

    await off()
    await on()


async def test_one_card_offered_twice_admits_by_memory_only_when_both_share_it_and_mixed_sets_are_refused(xpufleet_home):
    async with sa.Sidecar(xpufleet_home) as sc:
        a = await sc.agent("a-box", real_cards(free1=24.0, prefix="GPU-same"), share=("cuda:1",))
        await sc.agent("b-box", real_cards(free1=24.0, prefix="GPU-same"))
        card = (await sc.worker("a-box"))["devices"][2]["memory"]
        assert card == {"admits_by_memory": False, "note": "shared here, but the same card is exclusive on b-box: "
                                                           "it admits runs by slot until every provider offering "
                                                           "it shares it"}
        status, body = await sc.submit(graph(), worker="a-box", devices=["cuda:1"], memory_gib=2)
        assert status == 201 and (await a.recv_type("start_run"))["budget_gib"] == 2.0  # a typed cap, by slot
        await sc.share("b-box", "cuda:1")
        card = (await sc.worker("b-box"))["devices"][2]["memory"]
        assert card["admits_by_memory"] is True and card["key"] == "uuid:GPU-same-1"
        assert card["runs"][0]["id"] == body["run_id"]  # one ledger for the card, whoever offers it
        # a device set that mixes a shared and an exclusive card cannot run either way
        status, body = await sc.submit(graph(), worker="a-box", devices=["cuda:0", "cuda:1"], memory_gib=2)
        assert status == 400 and "mixes cards shared by memory and exclusive cards" in body["error"], body


async def test_a_run_queued_while_its_card_was_exclusive_gets_the_default_at_once_when_it_turns_shared(xpufleet_home):
    async with sa.Sidecar(xpufleet_home) as sc:
        agent = await sc.agent("gpu-box", real_cards(free1=24.0))
        target = {"worker": "gpu-box", "devices": ["cuda:1"]}
        status, body = await sc.submit(graph(epochs=1), **target)  # exclusive: no budget, measured peak 2.0
        await _run_to_end(sc, agent, body["run_id"], peak=sa.cuda_peak(2.0))
        peak_run = body["run_id"]
        status, body = await sc.submit(graph(hidden="8"), **target)  # holds the card
        holder = body["run_id"]
        await agent.take(holder)
        status, body = await sc.submit(graph(epochs=5), **target)  # queued behind the slot, no budget
        queued = body["run_id"]
        await sc.reason(queued, "busy (1 of 1 slot used)")
        assert (await sc.run(queued))["budget"] is None
        await sc.share("gpu-box", "cuda:1")
        run = await sc.reason(queued, "held by run")
        assert run["budget"]["gib"] == 2.4 and run["budget"]["from_run"] == peak_run
        assert run["budget"]["reason"] == "given the graph's default budget: its card is shared by memory"
        await agent.finish(holder, "succeeded", sa.cuda_peak(1.0))
        start = await agent.recv_type("start_run")
        assert start["run_id"] == queued and start["budget_gib"] == 2.4


async def test_a_pool_runs_budget_is_checked_against_the_pools_instances_as_they_join(xpufleet_home):
    """target.pool with memory_gib (issue 12 with issue 16's pools): like ``any``, a budget larger than
    every card of the pool's live instances is refused, one that does not fit now waits with the ledger's
    reason, and it starts on an instance once memory frees there, with its budget."""
    async with sa.Sidecar(xpufleet_home) as sc:
        status, pool = await sc.call("POST", "/api/pools", {"name": "spot"})
        assert status == 201, pool
        inst = await sc.agent("spot-1", real_cards(free1=3.0, prefix="GPU-s"), one_shot=True, share=("cuda:1",),
                              auth={"kind": "pool", "token": pool["credential"]})
        status, body = await sc.submit(graph(), pool="spot", devices=["cuda:1"], memory_gib=40)
        assert status == 400 and body["error"].startswith("needs 40.0 GiB (+0.8 GiB CUDA context), more than "
                                                          "cuda:1 on spot-1 has in all (24.0 GiB)"), body
        status, body = await sc.submit(graph(), pool="spot", devices=["cuda:1"], memory_gib=8)
        assert status == 201, body
        run = await sc.reason(body["run_id"], "has 3.0 GiB free")
        assert "cuda:1 on spot-1 has 3.0 GiB free" in run["waiting_reason"] and run["budget_gib"] == 8.0
        await inst.heartbeat(cuda_1=20.0)
        start = await inst.recv_type("start_run")
        assert start["run_id"] == body["run_id"] and start["budget_gib"] == 8.0
        assert (await sc.status(body["run_id"], {"assigned"}))["worker_id"] == "spot-1"


async def test_the_server_stops_cleanly_while_a_one_shot_instance_is_connected(xpufleet_home):
    """Closing the connections at shutdown makes a one-shot instance depart (it is forgotten): the
    registry must not be iterating its workers while that happens (it raised RuntimeError before)."""
    async with sa.Sidecar(xpufleet_home) as sc:  # it stops before it closes its agents
        status, pool = await sc.call("POST", "/api/pools", {"name": "spot"})
        assert status == 201, pool
        for name in ("spot-1", "spot-2"):
            await sc.agent(name, real_cards(prefix=f"GPU-{name}"), one_shot=True,
                           auth={"kind": "pool", "token": pool["credential"]})
        status, listed = await sc.call("GET", "/api/pools/spot")
        assert status == 200 and len(listed["instances"]) == 2, listed

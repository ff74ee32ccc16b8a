"""The ddp agreement on stop and report every K batches (nodes/ddp.py): rank 0's choice of K, and two real
ranks (gloo, a FileStore) that stop on the same batch within the documented bound, agree on reports and
on the mean batch loss, and make one small collective per interval, not per batch."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from xpufleet.constants import DDP_AGREE_INTERVAL_S, DDP_AGREE_MAX_BATCHES
from xpufleet.nodes import ddp


def test_k_follows_the_measured_speed_grows_at_most_twofold_and_is_capped():
    assert ddp.next_every(1, 1, 0.001, target_s=0.05) == 2  # fast batches: at most twice K
    assert ddp.next_every(8, 8, 0.0, target_s=0.05) == 16
    assert ddp.next_every(64, 64, 0.064, target_s=0.05) == 50  # 1 ms a batch: 50 of them in 50 ms
    assert ddp.next_every(64, 10, 1.0, target_s=0.05) == 1  # a slow-down: at once, never below 1
    assert ddp.next_every(1000, 1000, 0.001) == DDP_AGREE_MAX_BATCHES  # the cap
    assert ddp.next_every(40, 0, 0.0) == 40  # nothing measured since the last point: K stays
    assert ddp.next_every(0, 0, 0.0) == 1


def expected_stop(points: list[int], requested: int) -> int:
    """The rule: a request seen at batch R goes out at the first point >= R and is read at the point
    after that one; so every rank stops there."""
    sent = next(p for p in points if p >= requested)
    return next(p for p in points if p > sent)


def _rank(rank: int, rendezvous: str, plan: dict[str, Any], out: Any, ready: Any) -> None:
    import time

    import torch
    import torch.distributed as dist

    from xpufleet.nodes import runtime
    from xpufleet.nodes.ddp import DistributedStrategy

    role = runtime.DdpRole(rank=rank, world_size=2, cards=["cuda:0", "cuda:1"], rendezvous=Path(rendezvous),
                           loops=frozenset({"7"}), simulated=True)
    def emit(type_: str, payload: dict[str, Any]) -> None:
        if type_ == "ddp_ready":  # as the launcher does: rank 1 starts once rank 0 made the rendezvous
            ready.set()

    if rank:
        assert ready.wait(120)
    ctx = runtime.RunContext(emit=emit, placement="worker", devices=["cuda:0", "cuda:1"], ddp=role,
                             execution_facts={"simulated_devices": True})
    calls = {"n": 0}
    real = dist.all_reduce

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        return real(*args, **kwargs)

    with runtime.use(ctx):
        s = DistributedStrategy(ctx, "TrainingLoop")
        dist.all_reduce = counting
        points, stop_at, due_at, ks = [], None, [], []
        for batch in range(1, plan["batches"] + 1):
            if batch >= s._next_point:
                points.append(batch)
            time.sleep(plan["batch_s"])
            stop = rank == plan["stop_rank"] and batch >= plan["stop_at"]  # a stop stays requested
            due = rank == 0 and batch == plan["due_at"]
            decided = s.agree(stop, due, torch.tensor(float(rank + 1)), batch)
            ks.append(s._every)
            if decided[1]:
                due_at.append(batch)
            if decided[0]:
                stop_at = batch
                break
        # the epoch end: one collective for the stop and the sum of each rank's epoch loss (1 + 2)
        settled = s.settle(rank == plan["settle_stop_rank"], total=float(rank + 1)) if stop_at is None else None
        dist.all_reduce = real
        out.put({"rank": rank, "points": points, "stop_at": stop_at, "due_at": due_at, "ks": ks,
                 "collectives": calls["n"], "loss": s.batch_loss(None, 0), "settled": settled})
        dist.destroy_process_group()


def two_ranks(tmp_path: Path, **plan: Any) -> list[dict[str, Any]]:
    plan = {"batches": 400, "batch_s": 0.0, "stop_rank": 1, "stop_at": 10**9, "due_at": -1,
            "settle_stop_rank": -1, **plan}
    mp = multiprocessing.get_context("spawn")
    out, ready = mp.Queue(), mp.Event()
    rendezvous = str(tmp_path / f"rendezvous-{len(list(tmp_path.iterdir()))}")
    procs = [mp.Process(target=_rank, args=(r, rendezvous, plan, out, ready)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = sorted((out.get(timeout=240) for _ in procs), key=lambda r: r["rank"])
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    return results


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_stop_on_one_rank_stops_both_on_the_same_batch_within_two_intervals(tmp_path):
    r0, r1 = two_ranks(tmp_path, batches=6000, stop_at=1500, due_at=700)
    assert r0["points"] == r1["points"] and r0["ks"] == r1["ks"]  # the same points and K on both ranks
    assert r0["stop_at"] == r1["stop_at"] == expected_stop(r0["points"], 1500)
    assert r0["due_at"] == r1["due_at"] == [expected_stop(r0["points"], 700)]  # rank 0's report, on both
    # one small collective per point (none at the stop), not per batch: on these near-instant batches K
    # grew far past 10 (DDP_AGREE_INTERVAL_S of batches), so there are far fewer points than batches
    assert r0["collectives"] == r1["collectives"] == len(r0["points"]) - 1
    assert len(r0["points"]) <= r0["stop_at"] // 10 and max(r0["ks"]) <= DDP_AGREE_MAX_BATCHES
    assert all(b <= 2 * a for a, b in zip(r0["ks"], r0["ks"][1:], strict=False))
    # train_loss_batch: the mean over ranks (1 and 2) of the losses at the last point, at its step
    assert r0["loss"] == (r0["points"][-2], 1.5)


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_k_tracks_slow_batches_and_the_epoch_end_agrees_at_once(tmp_path):
    r0, r1 = two_ranks(tmp_path, batches=60, batch_s=0.01, settle_stop_rank=1)
    # 10 ms batches: K stays within the interval's worth of them, so a stop is never long in coming
    assert r0["ks"] == r1["ks"] and max(r0["ks"]) <= 2 * DDP_AGREE_INTERVAL_S / 0.01
    assert r0["stop_at"] is None and r0["settled"] == r1["settled"] == (True, 3.0)  # rank 1's stop, at the epoch end

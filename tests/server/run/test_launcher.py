"""The launcher with real run processes: a group of 3, one member killed with SIGKILL, a stop that
reaches every member, a process group that outlives its leader, warm and cold starts alike."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from xpufleet.server.run.launcher import (
    ColdStarter,
    GroupSpec,
    MemberSpec,
    ProcessGroup,
    group_alive,
    member_env,
    wait_group_gone,
)
from xpufleet.server.run.spec import RunSpec
from xpufleet.server.run.warm import WarmStarter

pytestmark = pytest.mark.e2e

# Trains for as long as nobody stops it (many epochs of iris); reports progress as it goes.
LONG_GRAPH = {
    "1": {"class_type": "XPUDataset", "inputs": {"name": "iris", "val_split": 0.2, "seed": 0, "normalize": "standard"}},
    "2": {"class_type": "XPUDataLoader", "inputs": {"dataset": ["1", 0], "batch_size": 4, "shuffle": True,
                                                    "num_workers": 0, "drop_last": False}},
    "3": {"class_type": "XPUMLP", "inputs": {"hidden": "16", "activation": "relu", "dropout": 0.0, "seed": 0,
                                             "dataset_info": ["1", 2]}},
    "4": {"class_type": "XPUOptimizer", "inputs": {"name": "sgd", "lr": 0.01, "weight_decay": 0.0, "momentum": 0.0}},
    "5": {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}},
    "6": {"class_type": "XPUTrainingLoop", "inputs": {
        "model": ["3", 0], "dataloader": ["2", 0], "optimizer": ["4", 0], "loss": ["5", 0], "epochs": 100000,
        "max_steps": 0, "device": "cpu", "precision": "fp32", "tensorboard": False, "strategy": "single"}},
}

STARTERS = {"warm": WarmStarter, "cold": ColdStarter}


def make_group(tmp_path: Path, n: int, stop_grace_s: float = 30.0) -> GroupSpec:
    members = []
    for rank in range(n):
        run_dir = tmp_path / f"member{rank}"
        RunSpec(run_id=f"group-{rank}", graph=LONG_GRAPH).write(run_dir)
        members.append(MemberSpec(rank, run_dir, member_env(None, {"OMP_NUM_THREADS": "1"}), run_dir / "output.log"))
    return GroupSpec("group", members, stop_grace_s)


class Seen:
    """Events per rank, and an asyncio event per rank set once it reported progress (it trains)."""

    def __init__(self, n: int) -> None:
        self.events: dict[int, list[dict[str, Any]]] = {r: [] for r in range(n)}
        self.training = {r: asyncio.Event() for r in range(n)}

    def __call__(self, rank: int, events: list[dict[str, Any]]) -> None:
        self.events[rank].extend(events)
        if any(e["type"] == "progress" for e in events):
            self.training[rank].set()


@pytest.fixture
async def groups():
    """Makes process groups and ends them at teardown, also when a test fails (no run process outlives it)."""
    made: list[ProcessGroup] = []

    def make(*args: Any, **kwargs: Any) -> ProcessGroup:
        group = ProcessGroup(*args, **kwargs)
        made.append(group)
        return group

    yield make
    for group in made:
        group.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(group.wait(), 30)


async def _all_training(seen: Seen) -> None:
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in seen.training.values())), 120)


@pytest.mark.parametrize("mode", sorted(STARTERS))
async def test_sigkill_of_one_member_ends_the_group_and_names_it(tmp_path, mode, groups):
    seen = Seen(3)
    group = groups(make_group(tmp_path, 3), seen, STARTERS[mode]())
    await group.start()
    pids = group.pids
    assert len(set(pids)) == 3
    await _all_training(seen)
    os.kill(pids[1], signal.SIGKILL)
    result = await asyncio.wait_for(group.wait(), 60)
    # wait() returned only after all three are gone
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert result.first_failure is not None and result.first_failure.rank == 1
    assert result.first_failure.cause == "killed by SIGKILL (out of memory?)"
    assert result.stop_reason == "member_failed"
    others = [e for e in result.exits if e.rank != 1]
    assert all(e.returncode is not None and e.returncode != 0 for e in others)  # ended by the launcher
    assert all(seen.events[r] for r in range(3))  # every member's events were relayed, by rank


@pytest.mark.parametrize("mode", sorted(STARTERS))
async def test_stop_reaches_every_member(tmp_path, mode, groups):
    seen = Seen(3)
    group = groups(make_group(tmp_path, 3), seen, STARTERS[mode]())
    await group.start()
    await _all_training(seen)
    group.stop("cancel")
    result = await asyncio.wait_for(group.wait(), 90)
    assert result.stop_reason == "cancel" and result.first_failure is None
    assert [e.finished["status"] for e in result.exits] == ["cancelled"] * 3
    # rank 0's run_finished was held back until the group had ended, and is handed over then
    assert result.finished_event is not None and result.finished_event["payload"]["status"] == "cancelled"
    for rank in range(3):  # each member wrote its interrupt checkpoint: the stop was cooperative
        assert (tmp_path / f"member{rank}" / "checkpoints" / "interrupt.pt").is_file()


async def test_a_stop_before_the_processes_exist_is_not_lost(tmp_path, groups):
    seen = Seen(2)
    group = groups(make_group(tmp_path, 2), seen, WarmStarter())
    group.stop("interrupt")
    await group.start()
    result = await asyncio.wait_for(group.wait(), 90)
    assert result.stop_reason == "interrupt"
    assert [e.finished["status"] for e in result.exits] == ["interrupted"] * 2


async def test_warm_members_get_their_own_environment_and_random_state(tmp_path, groups):
    """Forked children: the environment the launcher gives (not the warm parent's), and random state
    of their own: two unseeded runs of the same graph do not train the same model."""
    graph = {k: {**v, "inputs": dict(v["inputs"])} for k, v in LONG_GRAPH.items()}
    graph["3"]["inputs"]["seed"] = -1
    graph["6"]["inputs"].update(epochs=1, max_steps=3)

    members = []
    for rank in range(2):
        run_dir = tmp_path / f"m{rank}"
        RunSpec(run_id=f"env-{rank}", graph=graph).write(run_dir)
        env = member_env(None, {"CUDA_VISIBLE_DEVICES": str(7 - rank), "XPUFLEET_TEST_MARK": f"m{rank}"})
        members.append(MemberSpec(rank, run_dir, env, run_dir / "output.log"))
    group = groups(GroupSpec("env", members), lambda rank, evs: None, WarmStarter())
    await group.start()
    result = await asyncio.wait_for(group.wait(), 90)
    facts = [e.finished["execution_facts"] for e in result.exits]
    assert [f["env"]["CUDA_VISIBLE_DEVICES"] for f in facts] == ["7", "6"]
    assert [f["pid"] for f in facts] == [e.pid for e in result.exits]
    # what they inherited from the warm parent (torch, the nodes) is out of the cyclic collector's way
    assert all(f["gc_frozen_objects"] > 100_000 for f in facts), [f["gc_frozen_objects"] for f in facts]
    assert all(len(f["epoch_s"]) == 1 and len(f["epoch_cpu_s"]) == 1 for f in facts)
    assert all(e.returncode == 0 for e in result.exits)
    losses = [e.finished["final_metrics"]["train_loss"] for e in result.exits]
    assert losses[0] != losses[1]


async def test_wait_group_gone_waits_for_the_leaders_children(tmp_path):
    """A leader that exits while a child of its session still runs: the group is not gone yet."""
    marker = tmp_path / "child-done"
    child = tmp_path / "child.py"
    child.write_text(f"import time\ntime.sleep(1.5)\nopen({str(marker)!r}, 'w').close()\n")
    code = f"import subprocess, sys; subprocess.Popen([sys.executable, {str(child)!r}])"
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    assert leader.wait(timeout=30) == 0
    assert group_alive(leader.pid) and not marker.exists()
    t0 = time.monotonic()
    await wait_group_gone(leader.pid, timeout=30)
    assert not group_alive(leader.pid) and marker.exists() and time.monotonic() - t0 < 30


async def test_wait_group_gone_kills_what_outlives_the_bound(tmp_path):
    code = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])"
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    assert leader.wait(timeout=30) == 0
    await wait_group_gone(leader.pid, timeout=0.5)
    assert not group_alive(leader.pid)


def test_group_spec_checks_its_members(tmp_path):
    with pytest.raises(ValueError, match="at least one member"):
        GroupSpec("x", [])
    m = MemberSpec(1, tmp_path, {}, tmp_path / "log")
    with pytest.raises(ValueError, match="ranks 0..N-1"):
        GroupSpec("x", [m])


class _NoRank1(ColdStarter):
    """A starter that cannot start rank 1 (named cold: no warm-to-cold retry)."""

    async def start(self, member: MemberSpec, events_fd: int):
        if member.rank == 1:
            raise OSError("no more processes")
        return await super().start(member, events_fd)


def _member(tmp_path: Path, rank: int, graph: dict[str, Any]) -> MemberSpec:
    run_dir = tmp_path / f"member{rank}"
    RunSpec(run_id=f"added-{rank}", graph=graph).write(run_dir)
    return MemberSpec(rank, run_dir, member_env(None, {"OMP_NUM_THREADS": "1"}), run_dir / "output.log")


async def test_an_added_member_that_cannot_start_fails_the_group_naming_it(tmp_path, groups):
    seen = Seen(1)
    group = groups(GroupSpec("add", [_member(tmp_path, 0, LONG_GRAPH)]), seen, _NoRank1())
    await group.start()
    await _all_training(seen)
    group.add_members([_member(tmp_path, 1, LONG_GRAPH)])
    result = await asyncio.wait_for(group.wait(), 90)
    assert result.world_size == 2 and result.stop_reason == "member_failed"
    assert result.first_failure.rank == 1
    assert result.first_failure.cause == "could not be started: OSError: no more processes"
    assert result.exits[0].ended_by_group and result.exits[0].returncode == -signal.SIGTERM


async def test_members_still_running_after_rank_0_ended_are_ended(tmp_path, groups):
    short = {k: {**v, "inputs": dict(v["inputs"])} for k, v in LONG_GRAPH.items()}
    short["6"]["inputs"].update(epochs=1, max_steps=2)

    group = groups(GroupSpec("leader", [_member(tmp_path, 0, short)]), lambda r, e: None, ColdStarter())
    await group.start()
    group.add_members([_member(tmp_path, 1, LONG_GRAPH)])  # wait() covers members added after start
    result = await asyncio.wait_for(group.wait(), 120)
    assert [e.rank for e in result.exits] == [0, 1]
    assert result.exits[0].returncode == 0 and result.finished_event["payload"]["status"] == "succeeded"
    assert result.exits[1].ended_by_group and result.first_failure is None and result.stop_reason is None
    assert result.exits[1].ended_at > result.exits[0].ended_at

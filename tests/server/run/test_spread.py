"""The launcher's side of ddp across workers (server/run/spread.py): layouts, ranks across workers,
the socket interface of the advertised address, and how a part's or rank 0's group result reads."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path

import pytest

from xpufleet.constants import ENV_DDP_RANK, ENV_DDP_STORE
from xpufleet.server.run import spread
from xpufleet.server.run.launcher import GroupResult, MemberExit

Addr = namedtuple("Addr", "address")
IFACES = {"lo": [Addr("127.0.0.1"), Addr("::1")], "eth0": [Addr("10.0.0.5")]}


def layout(part: int = 0, store: str | None = None) -> spread.Layout:
    return spread.layout_of([("a", ["cuda:0"]), ("b", ["cuda:0", "cuda:1"]), ("c", ["cuda:3"])], part, store)


def test_ranks_are_numbered_across_workers_in_entry_order():
    lay = layout(1, "10.0.0.5:4000")
    assert lay.world_size == 4 and [p.first_rank for p in lay.parts] == [0, 1, 3]
    assert lay.rank_of(0) == 1 and lay.rank_of(1) == 2 and [lay.worker_of(r) for r in range(4)] == ["a", "b", "b", "c"]
    assert spread.global_cards(lay, ["cuda:0", "cuda:1"]) == ["a/cuda:0", "cuda:0", "cuda:1", "c/cuda:3"]
    assert spread.Layout.from_json(lay.to_json()) == lay


@pytest.mark.parametrize("data, text", [
    (None, "spread must be an object"),
    ({"parts": [{"worker": "a", "devices": ["cuda:0"]}], "part": 0}, "spread.parts must list two or more"),
    ({"parts": [{"worker": "a", "devices": []}, {"worker": "b", "devices": ["cuda:0"]}], "part": 0},
     "spread.parts[0] must be"),
    ({"parts": [{"worker": "a", "devices": ["cuda:0"]}, {"worker": "b", "devices": ["cuda:0"]}], "part": 2},
     "spread.part must be 0..1"),
    ({"parts": [{"worker": "a", "devices": ["cuda:0"]}, {"worker": "b", "devices": ["cuda:0"]}], "part": 1,
      "store": "nohost"}, "spread.store must be"),
])
def test_a_bad_layout_is_refused_naming_the_field(data, text):
    with pytest.raises(spread.LayoutError, match=text.replace("[", r"\[").replace("]", r"\]")):
        spread.Layout.from_json(data)


def test_the_socket_interface_is_the_one_holding_the_advertised_address():
    assert spread.interface_for("127.0.0.1", IFACES) == "lo"
    assert spread.interface_for("10.0.0.5", IFACES) == "eth0"
    assert spread.interface_for("10.9.9.9", IFACES) is None
    assert spread.interface_for("127.0.0.1", {}) == "lo"  # loopback without a listing still is lo
    assert spread.interface_for("127.0.0.1") == "lo"  # this machine's own listing
    env = spread.socket_env("127.0.0.1", {"NCCL_SOCKET_IFNAME": "ib0"})
    assert env == {"GLOO_SOCKET_IFNAME": "lo"}  # the agent's own setting wins
    with pytest.raises(spread.LayoutError, match="no network interface of this machine holds"):
        spread.socket_env("203.0.113.9", {})


def test_each_rank_of_a_part_gets_its_global_rank_and_the_store(tmp_path: Path):
    members = spread.members(tmp_path, layout(1, "10.0.0.5:4000"), {"BASE": "1"}, "10.0.0.5:4000")
    assert [m.rank for m in members] == [0, 1]
    assert [m.log_path.name for m in members] == ["output-rank1.log", "output-rank2.log"]
    env = members[1].env
    assert (env[ENV_DDP_RANK], env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"],
            env[ENV_DDP_STORE], env["BASE"]) == ("2", "2", "1", "4", "2", "10.0.0.5:4000", "1")
    assert ENV_DDP_STORE not in spread.rank_env(layout(0), 0, "10.0.0.5:4000")  # rank 0 opens it


def test_role_for_rank_0_and_a_follower(tmp_path: Path):
    graph = {"7": {"class_type": "XPUTrainingLoop", "inputs": {"strategy": "ddp"}}}
    lead = {**layout(0).to_json(), "advertise": "10.0.0.5"}
    role = spread.role_for({"graph": graph, "devices": ["cuda:0", "cpu"], "spread": lead}, tmp_path, 0, {})
    assert (role.rank, role.world_size, role.store_host, role.store_port) == (0, 4, "10.0.0.5", None)
    assert role.cards == ["cuda:0", "b/cuda:0", "b/cuda:1", "c/cuda:3"]
    follow = spread.role_for({"graph": graph, "devices": ["cuda:0", "cuda:1"], "spread": layout(1).to_json()},
                             tmp_path, 2, {ENV_DDP_STORE: "10.0.0.5:4000"})
    assert (follow.rank, follow.store_host, follow.store_port, follow.cards[2]) == (2, "10.0.0.5", 4000, "cuda:1")
    with pytest.raises(spread.LayoutError, match="has no XPUFLEET_DDP_STORE"):
        spread.role_for({"graph": graph, "devices": ["cuda:0", "cuda:1"], "spread": layout(1).to_json()},
                        tmp_path, 2, {})
    with pytest.raises(spread.LayoutError, match="no TrainingLoop with strategy ddp"):
        spread.role_for({"graph": {}, "devices": ["cuda:0"], "spread": lead}, tmp_path, 0, {})


def _exit(rank: int, rc: int, at: float, by_group: bool = False, finished=None) -> MemberExit:
    return MemberExit(rank, 100 + rank, rc, finished, ended_by_group=by_group, ended_at=at)


def test_a_part_names_its_rank_that_failed_by_itself_by_global_rank_and_worker():
    lay = layout(1, "h:1")
    killed = GroupResult([_exit(0, 1, 2.0, finished={"status": "failed", "ddp_peer_lost": True, "error": "lost"}),
                          _exit(1, -9, 1.0)], stop_reason="member_failed")
    out = spread.part_outcome(killed, lay)
    assert out["status"] == "failed" and out["failed_rank"] == 2
    assert out["error"].startswith("DDP rank 2 of 4 failed on worker b: killed by SIGKILL")
    assert out["error"].endswith("; see output-rank2.log on worker b")
    lost = GroupResult([_exit(0, 1, 1.0, finished={"status": "failed", "ddp_peer_lost": True, "error": "x"}),
                        _exit(1, -15, 1.5, by_group=True)], stop_reason="member_failed")
    assert spread.part_outcome(lost, lay) == {"status": "failed", "peer_lost": True,
                                              "error": "the ranks on worker b lost contact with the other ranks"}
    assert spread.part_outcome(GroupResult([_exit(0, 0, 1.0), _exit(1, 0, 1.0)]), lay) == {"status": "succeeded"}
    stopped = GroupResult([_exit(0, 1, 1.0, finished={"status": "cancelled"}), _exit(1, 0, 1.0)], stop_reason="cancel")
    assert spread.part_outcome(stopped, lay) == {"status": "cancelled"}
    agreed = GroupResult([_exit(0, 1, 1.0, finished={"status": "cancelled", "error": "cancelled by request"}),
                          _exit(1, 1, 1.1, finished={"status": "cancelled", "error": "cancelled by request"})])
    assert spread.part_outcome(agreed, lay) == {"status": "cancelled"}  # rank 0's stop, agreed per batch


def test_rank_0_s_worker_names_a_local_follower_by_global_rank_and_keeps_peer_lost_for_the_sidecar():
    lay = spread.layout_of([("a", ["cuda:0", "cuda:1"]), ("b", ["cuda:0"])], 0)
    rank0 = {"type": "run_finished", "payload": {"status": "failed", "error": "lost", "ddp_peer_lost": True}}
    result = GroupResult([_exit(0, 1, 2.0, finished=rank0["payload"]), _exit(1, -9, 1.0)],
                         stop_reason="member_failed", finished_event=rank0)
    out = spread.leader_finish(result, lay)
    assert out["error"].startswith("DDP rank 1 of 3 failed on worker a: killed by SIGKILL")
    assert out["execution_facts"]["ddp_failed_worker"] == "a" and out["execution_facts"]["ddp_rank0_error"] == "lost"
    alone = GroupResult([_exit(0, 1, 2.0, finished=rank0["payload"])], finished_event=rank0)
    assert spread.leader_finish(alone, spread.layout_of([("a", ["cuda:0"]), ("b", ["cuda:0"])], 0)) \
        == rank0["payload"]  # rank 0 only lost its peers: the sidecar names the cause

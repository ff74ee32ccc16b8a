"""The launcher's ddp rules as plain functions (server/run/ddp.py, spec.py, memory.py): which loops train
with ddp, what the followers run, their environment, and which rank a failed group blames."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from xpufleet.constants import ENV_DDP_RANK
from xpufleet.server.run import ddp
from xpufleet.server.run.launcher import GroupResult, MemberExit
from xpufleet.server.run.memory import rank_fractions
from xpufleet.server.run.spec import ddp_world_size

LOOP = "XPUTrainingLoop"


def node(class_type: str, **inputs):
    return {"class_type": class_type, "inputs": inputs}


GRAPH = {
    "1": node("XPUDataset", name="digits"),
    "2": node("XPUDataLoader", dataset=["1", 0], batch_size=32),
    "3": node("XPUMLP", hidden="16", dataset_info=["1", 2]),
    "4": node("XPUOptimizer", name="adam"),
    "5": node("XPULoss", name="cross_entropy"),
    "6": node(LOOP, model=["3", 0], dataloader=["2", 0], optimizer=["4", 0], loss=["5", 0], strategy="ddp"),
    "7": node("XPUEvaluate", model=["6", 0], dataloader=["2", 0]),
    "8": node("XPUModelSaver", model=["6", 0]),
}


def with_second_loop(model_from: str, strategy="ddp") -> dict:
    g = copy.deepcopy(GRAPH)
    g["10"] = node(LOOP, model=[model_from, 0], dataloader=["2", 0], optimizer=["4", 0], loss=["5", 0],
                   strategy=strategy)
    return g


def test_ddp_loops_are_the_training_loops_set_to_ddp_on_the_node():
    assert ddp.ddp_loops(GRAPH) == ["6"]
    assert ddp.ddp_loops(with_second_loop("6")) == ["6", "10"]
    assert ddp.ddp_loops(with_second_loop("6", strategy="single")) == ["6"]
    assert ddp.ddp_loops(with_second_loop("6", strategy=["99", 0])) == ["6"]  # a linked strategy is not planned
    assert ddp.ddp_loops({"1": node("XPULoss", strategy="ddp")}) == []
    assert ddp.ddp_loops("not a graph") == [] and ddp.ddp_loops({"1": "junk"}) == []


def test_followers_run_the_loops_and_what_feeds_them_only():
    assert list(ddp.follower_graph(GRAPH)) == ["1", "2", "3", "4", "5", "6"]  # not Evaluate, not ModelSaver
    seq = with_second_loop("6")
    assert list(ddp.follower_graph(seq)) == ["1", "2", "3", "4", "5", "6", "10"]
    assert ddp.follower_graph({1: node(LOOP, strategy="ddp")}) == {"1": node(LOOP, strategy="ddp")}


def test_loops_on_parallel_branches_are_found_and_refused_in_comfyui_shape():
    assert ddp.parallel_loops(GRAPH) == [] and ddp.parallel_loops_error(GRAPH) is None
    assert ddp.parallel_loops(with_second_loop("6")) == []  # in sequence
    par = with_second_loop("3")
    assert ddp.parallel_loops(par) == [("6", "10")]
    err = ddp.parallel_loops_error(par)
    assert set(err.response["node_errors"]) == {"6", "10"}
    first = err.response["node_errors"]["6"]["errors"][0]
    assert first["type"] == "ddp_parallel_loops" and first["extra_info"]["input_name"] == "strategy"
    assert "parallel branches" in first["message"] and "connect one loop's model output" in first["message"]
    three = copy.deepcopy(par)
    three["11"] = node(LOOP, model=["10", 0], strategy="ddp")
    assert ddp.parallel_loops(three) == [("6", "10"), ("6", "11")]


def test_rank_env_is_loopback_and_one_thread_unless_the_agent_sets_them():
    assert ddp.rank_env(GRAPH, 2, {}) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo",
                                          "OMP_NUM_THREADS": "1"}
    assert ddp.rank_env(GRAPH, 2, {"OMP_NUM_THREADS": "4", "NCCL_SOCKET_IFNAME": "eth9"}) == {
        "GLOO_SOCKET_IFNAME": "lo"}
    assert ddp.rank_env(GRAPH, 1, {}) == {}  # one card: no ddp
    assert ddp.rank_env(with_second_loop("6", "single") | {"6": node(LOOP, strategy="single")}, 2, {}) == {}


def test_follower_members_carry_the_rank_and_log_beside_the_runs_log(tmp_path):
    members = ddp.follower_members(tmp_path, 3, {"CUDA_VISIBLE_DEVICES": "2,0,1", "OMP_NUM_THREADS": "1"})
    assert [m.rank for m in members] == [1, 2]
    for m in members:
        assert m.run_dir == tmp_path and m.log_path == tmp_path / f"output-rank{m.rank}.log"
        assert m.env[ENV_DDP_RANK] == m.env["RANK"] == m.env["LOCAL_RANK"] == str(m.rank)
        assert m.env["WORLD_SIZE"] == m.env["LOCAL_WORLD_SIZE"] == "3"
        assert m.env["CUDA_VISIBLE_DEVICES"] == "2,0,1"  # every rank sees the run's cards; rank k uses cuda:k
    assert ddp.follower_rank({ENV_DDP_RANK: "2"}) == 2
    assert ddp.follower_rank({}) == ddp.follower_rank({ENV_DDP_RANK: "x"}) == 0
    assert ddp.follower_events_path(tmp_path, 1) == tmp_path / "ddp" / "events-rank1.jsonl"
    assert ddp.rendezvous_path(tmp_path) == tmp_path / "ddp" / "rendezvous"


def test_a_role_only_for_a_worker_run_with_cards_and_a_ddp_loop(tmp_path):
    spec = {"graph": GRAPH, "world_size": 2, "devices": ["cuda:0", "cuda:1", "cpu"], "simulated": True}
    role = ddp.role_for(spec, tmp_path, 1)
    assert (role.rank, role.world_size, role.cards, role.loops, role.simulated) == (
        1, 2, ["cuda:0", "cuda:1"], frozenset({"6"}), True)
    assert role.rendezvous == tmp_path / "ddp" / "rendezvous"
    assert ddp.rank_devices(["cuda:0", "cuda:1", "cpu"], role) == ["cuda:1", "cuda:0", "cpu"]
    assert ddp.rank_devices(["cuda:0", "cuda:1"], ddp.role_for(spec, tmp_path, 0)) == ["cuda:0", "cuda:1"]
    assert ddp.role_for({**spec, "world_size": 1}, tmp_path, 0) is None
    assert ddp.role_for({**spec, "graph": {"1": node("XPULoss")}}, tmp_path, 0) is None


@pytest.mark.parametrize(("placement", "devices", "expected"), [
    ("worker", ["cuda:0", "cuda:1"], 2),
    ("worker", ["cuda:0", "cuda:1", "cuda:2", "cpu"], 3),
    ("worker", ["xpu:0", "xpu:1"], 2),
    ("worker", ["cuda:0"], 1),
    ("worker", ["cpu"], 1),
    ("worker", ["cuda:0", "xpu:0"], 1),  # cards of two kinds cannot form one group
    ("worker", ["mps", "cpu"], 1),
    ("local", ["cuda:0", "cuda:1"], 1),  # a run on the server itself trains in one process
])
def test_ddp_world_size(placement, devices, expected):
    assert ddp_world_size(placement, devices) == expected


def test_a_rank_is_capped_to_its_own_card():
    assert rank_fractions([0.5, 0.25, 0.75], 1) == [0.0, 0.25, 0.0]
    assert rank_fractions([0.5, 0.5], 0) == [0.5, 0.0]


# --- which rank the run blames ------------------------------------------------------------------------


def finished(status="succeeded", error=None, peer_lost=False, peak=None):
    out = {"status": status, "error": error, "final_metrics": {"train_loss": 0.5},
           "execution_facts": {"strategy": "ddp"},
           "peak_memory": peak or {"measured": False, "reason": "cpu"}}
    if peer_lost:
        out["ddp_peer_lost"] = True
    return out


def exit_(rank, rc, fin=None, by_group=False, at=1.0, start_error=None):
    return MemberExit(rank, 100 + rank, rc, fin, ended_by_group=by_group, ended_at=at, start_error=start_error)


def group(*exits, stop_reason=None):
    rank0 = exits[0].finished
    event = {"seq": 9, "type": "run_finished", "payload": rank0} if rank0 is not None else None
    failure = next((e for e in sorted(exits, key=lambda e: e.ended_at) if e.failed and not e.ended_by_group), None)
    return GroupResult(list(exits), stop_reason=stop_reason or ("member_failed" if failure else None),
                       first_failure=failure, finished_event=event)


LOST = "Node 6 (XPUTrainingLoop) failed: DdpPeerLost: rank 0 of 2 lost contact with the other ranks: Connection reset"


def test_a_killed_follower_is_the_cause_even_when_rank_0_reported_first():
    result = group(exit_(0, 1, finished("failed", LOST, peer_lost=True), at=1.0), exit_(1, -9, at=1.5))
    assert ddp.root_cause(result).rank == 1
    payload = ddp.group_finish(result)
    assert payload["status"] == "failed"
    assert payload["error"] == "DDP rank 1 of 2 failed: killed by SIGKILL (out of memory?); see output-rank1.log"
    facts = payload["execution_facts"]
    assert facts["ddp_failed_rank"] == 1 and facts["ddp_rank0_error"] == LOST and facts["strategy"] == "ddp"
    assert [e["rank"] for e in facts["ddp_exits"]] == [0, 1] and "ddp_peer_lost" not in payload
    assert payload["final_metrics"] == {"train_loss": 0.5}  # rank 0's report is kept otherwise


def test_an_exception_in_a_follower_is_the_cause_when_rank_0_was_ended_by_the_launcher():
    err = "Node 6 (XPUTrainingLoop) failed: RuntimeError: boom"
    result = group(exit_(0, -15, by_group=True, at=2.0), exit_(1, 1, finished("failed", err), at=1.0))
    payload = ddp.group_finish(result)
    assert payload["error"] == f"DDP rank 1 of 2 failed: {err}; see output-rank1.log"
    assert payload["final_metrics"] == {} and payload["status"] == "failed"


def test_rank_0s_own_failure_stands():
    err = "Node 7 (XPUEvaluate) failed: ValueError: x"
    result = group(exit_(0, 1, finished("failed", err), at=1.0), exit_(1, -15, by_group=True, at=2.0))
    assert ddp.root_cause(result) is None
    assert ddp.group_finish(result)["error"] == err
    killed = group(exit_(0, -9, at=1.0), exit_(1, -15, by_group=True, at=2.0))
    assert ddp.root_cause(killed) is None and ddp.group_finish(killed) is None  # the caller says how rank 0 died


def test_a_stop_or_a_success_keeps_rank_0s_report():
    ok = group(exit_(0, 0, finished()), exit_(1, 0, finished()))
    assert ddp.root_cause(ok) is None and ddp.group_finish(ok)["status"] == "succeeded"
    stopped = group(exit_(0, 1, finished("cancelled", "cancelled by request")),
                    exit_(1, 1, finished("cancelled", "cancelled by request")), stop_reason="cancel")
    assert ddp.group_finish(stopped)["status"] == "cancelled"


def test_a_follower_that_left_early_or_never_started_is_named():
    early = group(exit_(0, 1, finished("failed", LOST, peer_lost=True), at=2.0), exit_(1, 0, finished(), at=1.0))
    assert ddp.group_finish(early)["error"] == (
        "DDP rank 1 of 2 failed: it exited before the training ended; see output-rank1.log")
    never = group(exit_(0, -15, by_group=True, at=2.0), exit_(1, None, at=1.0, start_error="OSError: no fork"))
    assert ddp.group_finish(never)["error"] == (
        "DDP rank 1 of 2 failed: could not be started: OSError: no fork; see output-rank1.log")


def test_the_first_follower_to_fail_by_itself_is_named_among_several():
    result = group(exit_(0, -15, by_group=True, at=3.0), exit_(1, -15, by_group=True, at=3.1),
                   exit_(2, -9, at=1.0), exit_(3, 1, finished("failed", "x"), at=1.2))
    assert ddp.root_cause(result).rank == 2
    assert ddp.group_finish(result)["error"].startswith("DDP rank 2 of 4 failed: killed by SIGKILL")


def test_peaks_per_card_are_the_largest_any_rank_used_and_each_rank_is_listed():
    def peak(cards):
        return {"measured": True, "unit": "GiB", "kind": "cuda_max_memory_allocated", "devices": cards}

    result = group(exit_(0, 0, finished(peak=peak({"cuda:0": 2.5, "cuda:1": 0.1}))),
                   exit_(1, 0, finished(peak=peak({"cuda:1": 2.25}))))
    merged = ddp.group_finish(result)["peak_memory"]
    assert merged["measured"] is True and merged["devices"] == {"cuda:0": 2.5, "cuda:1": 2.25}
    assert merged["ranks"]["1"]["devices"] == {"cuda:1": 2.25} and merged["unit"] == "GiB"
    cpu = ddp.merge_peaks([exit_(0, 0, finished()), exit_(1, 0, finished())])
    assert cpu["measured"] is False and set(cpu["ranks"]) == {"0", "1"}

    def simulated(card, gib):
        return {"measured": False, "simulated": True, "unit": "GiB", "kind": "simulated_tensor_bytes",
                "devices": {card: gib}}

    sim = ddp.merge_peaks([exit_(0, 0, finished(peak=simulated("cuda:0", 0.01))),
                           exit_(1, 0, finished(peak=simulated("cuda:1", 0.02)))])
    assert sim["simulated"] is True and sim["measured"] is False
    assert sim["devices"] == {"cuda:0": 0.01, "cuda:1": 0.02}


def test_a_plain_group_is_passed_through():
    single = group(exit_(0, 1, finished("failed", "boom")))
    assert ddp.group_finish(single) == finished("failed", "boom")
    assert ddp.group_finish(GroupResult([exit_(0, -9)])) is None


def test_names_are_relative_to_the_run_dir():
    assert ddp.follower_log_name(3) == "output-rank3.log"
    assert ddp.follower_events_path(Path("/r"), 2).name == "events-rank2.jsonl"

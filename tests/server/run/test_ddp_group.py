"""ddp for real (docs/ddp.md): a run on 2 simulated cards as the agent runs it, one launcher group whose
rank 0 adds rank 1 when it says ``ddp_ready`` (server/run/ddp.py), gloo on CPU processes, compared with
single-process training on the same data order in this process."""

from __future__ import annotations

import asyncio
import copy
import json
import os
from pathlib import Path
from typing import Any

import graph_parts as gp  # registered by tests/conftest.py
import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from xpufleet.nodes import NODE_CLASS_MAPPINGS as N
from xpufleet.nodes import runtime
from xpufleet.nodes.tensordata import collate
from xpufleet.server.run import ddp
from xpufleet.server.run.launcher import GroupResult, ProcessGroup, member_env, single
from xpufleet.server.run.spec import build_spec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SEED = 7
CARDS = ["cuda:0", "cuda:1"]


def graph(batch: int = 32, schedule: str | None = None, **loop: Any) -> dict[str, Any]:
    """Synthetic data: 516 training samples (8 batches of 64 + 4) and 129 validation samples (odd)."""
    if schedule:
        loop["lr_scheduler"] = ["10", 0]
    inputs = {"epochs": 3, "val_dataloader": ["3", 0], "strategy": "ddp", "accumulate_steps": 1,
              "grad_clip_norm": 0.0, **loop}
    return {
        "1": gp.dataset("synthetic_classification", n_samples=645, n_features=16, num_classes=3),
        "2": gp.loader("1", batch_size=batch), "3": gp.loader("1", 1, batch_size=50, shuffle=False),
        "4": gp.mlp("1", hidden="32"), "5": gp.optimizer(), "6": gp.loss(),
        "7": gp.training_loop("4", "2", "5", "6", **inputs), "8": gp.evaluate("7", "3"),
        "9": {"class_type": "XPUModelSaver", "inputs": {"model": ["7", 0], "filename": "model.safetensors",
                                                        "format": "safetensors", "location": "run_dir"}},
        **({"10": {"class_type": "XPULRScheduler", "inputs": {"name": schedule, "interval": "step"}}}
           if schedule else {}),
    }


class Run:
    """One ddp run, launched as the agent launches it, with rank 0's events kept."""

    def __init__(self, run_dir: Path, graph: dict[str, Any], seed: int | None = SEED, devices=CARDS) -> None:
        self.run_dir = run_dir
        self.graph = graph
        self.events: list[dict[str, Any]] = []
        self.spec = build_spec({"id": run_dir.name, "graph": graph, "options": {} if seed is None else {"seed": seed}},
                               placement="worker", slot_devices=devices, run_devices=devices,
                               aliases={d: d for d in devices}, visible_devices=devices, simulated=True)
        self.result: GroupResult | None = None
        self.finish: dict[str, Any] | None = None

    async def go(self) -> Run:
        """Launch it and wait for the group's end; a group still running when this fails is killed and
        waited for, so no rank outlives the test."""
        self.spec.write(self.run_dir)
        env = member_env(None, ddp.rank_env(self.graph, self.spec.world_size, os.environ))

        def on_events(rank: int, events: list[dict[str, Any]]) -> None:
            followers.see(rank, events)
            if rank == 0:
                self.events.extend(events)

        group = ProcessGroup(single(self.run_dir.name, self.run_dir, env), on_events)
        followers = ddp.Followers(group, self.run_dir, self.spec.world_size, env)
        try:
            await group.start()
            self.result = await asyncio.wait_for(group.wait(), 300)
        finally:
            if self.result is None:
                group.kill()
                await asyncio.wait_for(group.wait(), 60)
        self.finish = ddp.group_finish(self.result)
        return self

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [e["payload"] for e in self.events if e["type"] == type_]

    def weights(self) -> dict[str, torch.Tensor]:
        return load_file(str(self.run_dir / "model.safetensors"))


def reference(g: dict[str, Any], tmp_path: Path, seed: int = SEED, batch: int = 64) -> tuple[Any, dict[str, Any]]:
    """The same loop in one process with ``batch`` per step and the order DistributedSampler gives one
    replica (its seed + epoch permutation): the data order of the ddp run."""
    ctx = runtime.RunContext(emit=lambda t, p: None, seed=seed, devices=["cpu"], run_dir=tmp_path / "ref")
    ctx.run_dir.mkdir(exist_ok=True)
    with runtime.use(ctx):
        train, val, info = N["XPUDataset"]().load(**g["1"]["inputs"])
        loader = DataLoader(train, batch_size=batch, collate_fn=collate,
                            sampler=DistributedSampler(train, num_replicas=1, rank=0, shuffle=True, seed=seed))
        (val_loader,) = N["XPUDataLoader"]().make(val, 50, False)
        m = g["4"]["inputs"]
        (model,) = N["XPUMLP"]().build(m["hidden"], m["activation"], m["dropout"], m["seed"], dataset_info=info)
        o = g["5"]["inputs"]
        (opt,) = N["XPUOptimizer"]().make(o["name"], o["lr"], o["weight_decay"], o["momentum"])
        (loss,) = N["XPULoss"]().make("cross_entropy")
        t = {k: v for k, v in g["7"]["inputs"].items() if k not in ("model", "dataloader", "optimizer", "loss",
                                                                    "val_dataloader", "lr_scheduler")}
        t.update(strategy="single", device="cpu")
        if "10" in g:
            (t["lr_scheduler"],) = N["XPULRScheduler"]().make(**g["10"]["inputs"])
        return N["XPUTrainingLoop"]().train(model, loader, opt, loss, val_dataloader=val_loader, **t)["result"]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k].detach()).abs().max()) for k in a)


@pytest.mark.parametrize("loop", [{}, {"accumulate_steps": 2}, {"grad_clip_norm": 0.05},
                                  {"schedule": "onecycle", "max_steps": 19}],
                         ids=["plain", "accumulate_steps_2", "grad_clip_norm", "onecycle_max_steps"])
async def test_two_ranks_of_batch_32_equal_one_process_of_batch_64(tmp_path, loop):
    g = graph(32, **loop)
    run = await Run(tmp_path / "ddp", g).go()
    assert run.finish["status"] == "succeeded", run.finish
    ref_model, ref = reference(g, tmp_path)
    assert max_diff(run.weights(), ref_model.state_dict()) <= 1e-5
    fm = run.finish["final_metrics"]
    assert fm["train_loss"] == pytest.approx(ref["final_train_loss"], rel=1e-5)
    # validation over both shards of an odd-sized set counts each sample once: the single-process figures
    assert fm["val_loss"] == pytest.approx(ref["final_val_loss"], rel=1e-5)
    assert fm["val_accuracy"] == pytest.approx(ref["final_val_accuracy"])
    # ... and rank 0's own Evaluate of the whole set after the loop (one process, no sharding) agrees
    assert fm["eval_loss"] == pytest.approx(fm["val_loss"], rel=1e-6)
    assert fm["eval_accuracy"] == pytest.approx(fm["val_accuracy"])
    facts = run.finish["execution_facts"]
    assert facts["strategy"] == "ddp" and facts["world_size"] == 2 and facts["backend"] == "gloo"
    assert facts["effective_batch_size"] == 32 * loop.get("accumulate_steps", 1) * 2
    # the per-step metrics are the mean over ranks: at every step both report, the single process's value
    ddp_val = [(m["step"], m["value"]) for m in run.of("metric") if m["name"] == "val_loss_step"]
    assert [s for s, _ in ddp_val] == [s for s, _ in ref["val_loss_step"]]
    assert [v for _, v in ddp_val] == pytest.approx([v for _, v in ref["val_loss_step"]], rel=1e-5)
    ddp_batch = {m["step"]: m["value"] for m in run.of("metric") if m["name"] == "train_loss_batch"}
    common = [(ddp_batch[s], v) for s, v in ref["train_loss_batch"] if s in ddp_batch]
    assert common, (sorted(ddp_batch), ref["train_loss_batch"])
    assert [a for a, _ in common] == pytest.approx([b for _, b in common], rel=1e-4)
    assert [r["rank"] for r in facts["ddp"]["ranks"]] == [0, 1] and len(facts["ddp"]["first_batch_at"]) == 2
    assert [e["rank"] for e in facts["ddp_exits"]] == [0, 1] and all(e["returncode"] == 0 for e in facts["ddp_exits"])
    assert set(run.finish["peak_memory"]["ranks"]) == {"0", "1"}
    if loop.get("max_steps"):
        assert ref["steps"] == loop["max_steps"] and run.finish["final_metrics"]["samples_per_s"] > 0
    if loop.get("grad_clip_norm"):  # the clip really clipped: without it the weights differ
        unclipped, _ = reference(graph(32), tmp_path)
        assert max_diff(run.weights(), unclipped.state_dict()) > 1e-3


async def test_rank_0_alone_reports_and_writes_files(tmp_path):
    g = graph(32, epochs=2, checkpoint_every=1, tensorboard=True)
    run = await Run(tmp_path / "ddp", g).go()
    assert run.finish["status"] == "succeeded", run.finish
    rd = run.run_dir
    assert sorted(p.name for p in (rd / "checkpoints").iterdir()) == ["epoch_0001.pt", "epoch_0002.pt"]
    assert len(list((rd / "tensorboard").iterdir())) == 1  # one event file: rank 0's
    assert (rd / "output-rank1.log").is_file()
    rank1 = [json.loads(line) for line in (rd / "ddp" / "events-rank1.jsonl").read_text().splitlines()]
    assert rank1[-1]["type"] == "run_finished" and rank1[-1]["payload"]["status"] == "succeeded"
    # rank 1 ran only the loop and the nodes feeding it; Evaluate and ModelSaver ran on rank 0 only
    assert {e["payload"]["node"] for e in rank1 if e["type"] == "node_started"} == {"1", "2", "3", "4", "5", "6", "7"}
    assert {p["node"] for p in run.of("node_started")} == set(g)
    assert not [e for e in rank1 if e["type"] in ("metric", "artifact")]  # no metrics, files or board
    logged = [json.loads(line) for line in (rd / "events.jsonl").read_text().splitlines()]
    assert [e["type"] for e in logged] == [e["type"] for e in run.events] + ["run_finished"]
    # the checkpoint loads in one process, without DDP's "module." prefix
    from xpufleet.nodes.io import load_model

    model = load_model(rd / "checkpoints" / "epoch_0002.pt")
    assert max_diff(dict(model.state_dict()), run.weights()) == 0.0
    ready = run.of("ddp_ready")
    assert len(ready) == 1 and ready[0]["rendezvous"] == str(rd / "ddp" / "rendezvous") and ready[0]["world_size"] == 2
    (started,) = run.of("ddp_started")
    assert [r["card"] for r in started["ranks"]] == CARDS and started["backend"] == "gloo"


async def test_unseeded_ranks_share_rank_0s_order(tmp_path):
    """Without a seed, rank 0 draws the sampler seed and sends it: both ranks still see one order (the
    run still equals one process of batch 64 with that seed)."""
    g = graph(32, epochs=1, seed=-1)
    g["4"]["inputs"]["seed"] = 3
    run = await Run(tmp_path / "ddp", g, seed=None).go()
    assert run.finish["status"] == "succeeded", run.finish
    assert run.finish["final_metrics"]["val_accuracy"] > 0.5


async def test_two_ddp_loops_in_sequence_train_and_parallel_ones_fail_before_start(tmp_path):
    g = graph(32, epochs=1)
    g["10"] = {"class_type": "XPUTrainingLoop", "inputs": {**g["7"]["inputs"], "model": ["7", 0]}}
    g["8"]["inputs"]["model"] = ["10", 0]
    run = await Run(tmp_path / "seq", g).go()
    assert run.finish["status"] == "succeeded", run.finish
    assert len(run.of("ddp_ready")) == 1  # the ranks met once, for both loops
    assert run.finish["final_metrics"]["eval_accuracy"] > 0.5
    par = copy.deepcopy(g)
    par["10"]["inputs"]["model"] = ["4", 0]  # both loops now train the builder's model: parallel branches
    run = await Run(tmp_path / "par", par).go()
    assert run.finish["status"] == "failed" and "parallel branches" in run.finish["error"]
    assert set(run.finish["validation"]["node_errors"]) == {"7", "10"}
    assert not run.of("node_started") and len(run.result.exits) == 1  # nothing ran, no follower started


async def test_a_run_on_the_server_with_a_device_set_falls_back(tmp_path):
    g = graph(32, epochs=1)
    run = Run(tmp_path / "local", g)
    run.spec = build_spec({"id": "local", "graph": g, "options": {"seed": SEED}}, placement="local",
                          slot_devices=CARDS, run_devices=CARDS, aliases={d: d for d in CARDS}, visible_devices=CARDS,
                          simulated=True)
    await run.go()
    assert run.spec.world_size == 1 and run.finish["status"] == "succeeded"
    (w,) = [p for p in run.of("run_warning") if p["kind"] == "ddp_not_available"]
    assert "runs on this server (target local) train in one process, even with a device set" in w["message"]
    assert run.finish["execution_facts"]["strategy"] == "single" and len(run.result.exits) == 1

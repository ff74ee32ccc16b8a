"""The TrainingLoop's strategy seam (nodes/strategy.py, nodes/ddp.py): every ddp_not_available case of
docs/workers.md, the DataLoaders ddp can shard, the padding rule of validation, backends, the test hook."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, WeightedRandomSampler

from xpufleet.constants import ENV_TEST_DDP_RAISE
from xpufleet.nodes import NODE_CLASS_MAPPINGS as N
from xpufleet.nodes import ddp, runtime, strategy

NEEDS = "ddp needs a queued run on a worker with two or more cards"


def ctx(**fields) -> runtime.RunContext:
    return runtime.RunContext(emit=lambda t, p: None, **fields)


def role(rank=0, loops=("8",), cards=("cuda:0", "cuda:1")) -> runtime.DdpRole:
    return runtime.DdpRole(rank=rank, world_size=len(cards), cards=list(cards), rendezvous=Path("/r/ddp/rendezvous"),
                           loops=frozenset(loops), simulated=True)


@pytest.mark.parametrize(("fields", "node", "reason"), [
    ({"placement": "canvas"}, None, "the canvas Run executes in the ComfyUI process"),
    ({"placement": "local", "devices": ["cuda:0", "cuda:1"]}, None,
     "runs on this server (target local) train in one process, even with a device set"),
    ({"placement": "worker", "devices": ["cuda:0"]}, None, "this run on a worker has 1 card (cuda:0)"),
    ({"placement": "worker", "devices": ["cpu"]}, None, "this run on a worker has 0 cards (cpu)"),
    ({"placement": "worker", "devices": ["cuda:0", "xpu:0"]}, None, "cards are of different kinds (cuda:0, xpu:0)"),
    ({"placement": "worker", "devices": ["cuda:0", "cuda:1"]}, None, "this run was not started for ddp"),
    ({"placement": "worker", "devices": ["cuda:0", "cuda:1"], "ddp": role()}, "9",
     "its strategy input comes from a link"),
])
def test_every_fallback_case_says_why(fields, node, reason):
    said = strategy.ddp_unavailable_reason(ctx(**fields), node)
    assert said is not None and reason in said
    if "cards" not in reason and "link" not in reason:
        assert NEEDS in said


def test_outside_any_run_and_inside_comfyui():
    assert "outside a queued run (plain Python)" in strategy.ddp_unavailable_reason(None)
    assert NEEDS in strategy.EXPORT_REASON and "exported script" in strategy.EXPORT_REASON


def test_a_planned_loop_on_two_cards_can_train_with_ddp():
    c = ctx(placement="worker", devices=["cuda:0", "cuda:1"], ddp=role())
    assert strategy.ddp_unavailable_reason(c, "8") is None


def test_fallback_warns_once_and_trains_single(digits, loaders, build_mlp, train_node, make_run):
    run = make_run(placement="worker", devices=["cuda:0", "cuda:1"], execution_facts={"simulated_devices": True})
    with runtime.use(run.ctx):
        _, m = train_node(build_mlp(digits[2], "8"), loaders[0], epochs=1, strategy="ddp", device="auto")
    (w,) = run.warnings("ddp_not_available")
    assert w["requested"] == "ddp" and w["strategy"] == "single" and "not started for ddp" in w["message"]
    assert (m["strategy"], m["world_size"], m["backend"]) == ("single", 1, None)
    with pytest.raises(ValueError, match="strategy must be one of single, ddp"):
        strategy.resolve_strategy("fsdp")


def test_the_loaders_ddp_can_shard(digits):
    train = digits[0]
    (own,) = N["XPUDataLoader"]().make(train, 32, True)
    (plain,) = N["XPUDataLoader"]().make(train, 32, False)
    for loader in (own, plain):
        ddp.check_loader(loader, "8 (XPUTrainingLoop)")

    class Stream(IterableDataset):
        def __iter__(self):
            yield from zip(train.x, train.y, strict=True)

    with pytest.raises(ValueError, match="ddp needs a map-style dataset .* Stream is an iterable dataset"):
        ddp.check_loader(DataLoader(Stream(), batch_size=8), "8")
    weighted = DataLoader(train, batch_size=8, sampler=WeightedRandomSampler(torch.ones(len(train)), 10))
    with pytest.raises(ValueError, match=r"custom sampler \(WeightedRandomSampler\)"):
        ddp.check_loader(weighted, "8")
    with pytest.raises(ValueError, match=r"custom sampler \(RandomSampler\)"):
        ddp.check_loader(DataLoader(train, batch_size=8, sampler=torch.utils.data.RandomSampler(
            train, replacement=True)), "8")
    batches = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(train), 8, False)

    class MyBatches(torch.utils.data.BatchSampler):
        pass

    with pytest.raises(ValueError, match=r"custom sampler \(MyBatches\)"):
        ddp.check_loader(DataLoader(train, batch_sampler=MyBatches(batches.sampler, 8, False)), "8")
    with pytest.raises(ValueError, match="ddp shards torch DataLoaders; got list"):
        ddp.check_loader([1, 2], "8")


@pytest.mark.parametrize("n", [0, 1, 2, 5, 128, 129])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_sample_counts_once_over_the_shards(n, world):
    from torch.utils.data.distributed import DistributedSampler

    counts = [ddp.real_count(n, r, world) for r in range(world)]
    assert sum(counts) == n
    if n:  # what DistributedSampler hands each rank: its real samples first, the padding last
        data = list(range(n))
        for r in range(world):
            shard = list(DistributedSampler(data, num_replicas=world, rank=r, shuffle=False))
            assert sorted(set(shard[:counts[r]])) == shard[:counts[r]] and len(shard) - counts[r] <= 1


def test_backends_and_the_test_hook(monkeypatch):
    assert ddp.backend_for("cuda", simulated=True) == "gloo"
    assert ddp.backend_for("cpu") == "gloo"
    assert ddp.backend_for("cuda") == ("nccl" if torch.distributed.is_nccl_available() else "gloo")
    xccl = getattr(torch.distributed, "is_xccl_available", lambda: False)()
    assert ddp.backend_for("xpu") == ("xccl" if xccl else None)
    assert ddp.test_raise_at(1, {ENV_TEST_DDP_RAISE: "1:4"}) == 4
    assert ddp.test_raise_at(0, {ENV_TEST_DDP_RAISE: "1:4"}) is None
    assert ddp.test_raise_at(1, {}) is None and ddp.test_raise_at(1, {ENV_TEST_DDP_RAISE: "x"}) is None


def test_single_process_hooks_are_the_identity():
    s = strategy.SingleProcess()
    t = torch.ones(3)
    assert s.all_sum(t) is t and s.agree(True, False) == (True, False) and s.settle(True, total=2.5) == (True, 2.5)
    assert s.batch_loss(torch.tensor(0.5), 7) == (7, 0.5) and s.batch_loss(None, 7) is None
    assert s.real_samples(object()) is None and s.no_sync(object()) is None and s.lost_peer(RuntimeError()) is None
    assert s.facts() == {"strategy": "single", "world_size": 1, "backend": None}


def test_a_communication_error_becomes_peer_lost():
    lost_peer = ddp.DistributedStrategy.lost_peer
    fake = type("S", (), {"rank": 0, "world_size": 2})()
    err = lost_peer(fake, RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer"))
    assert isinstance(err, ddp.DdpPeerLost) and str(err).startswith("rank 0 of 2 lost contact with the other ranks")
    assert lost_peer(fake, ValueError("loss cross_entropy: bad shapes")) is None

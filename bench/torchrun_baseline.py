"""The baseline of bench/bench_ddp.py: a plain PyTorch DDP training script, as the PyTorch tutorials write
it, started with ``torchrun --nproc-per-node 2`` (or in one process with ``--single``).

It trains the model bench_ddp.py's graph builds (the same layers from the same model spec, built with
the same seed, so the same initial weights) on the same safetensors file, with
DistributedSampler(shuffle, seed) and the same per-rank batch size, Adam and cross-entropy; so both
sides see the same batches and reach the same weights. Rank 0 prints one JSON line: samples/s of the
training loop (every rank's samples), the mean loss of the last epoch over ranks, each rank's
``torch.get_num_threads()`` and when each rank finished its first batch (``time.time()``); with
``--save`` it writes the trained weights (safetensors) for the bench to compare with ours.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time


class Gathered:
    """A map-style dataset whose ``__getitems__`` returns a whole batch with one gather per tensor."""

    def __init__(self, x, y) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __getitems__(self, indices):
        import torch

        idx = torch.as_tensor(indices, dtype=torch.long)
        return self.x.index_select(0, idx), self.y.index_select(0, idx)


def train_loop(model, loader, sampler, opt, crit, epochs: int) -> tuple[float, float | None, list[float], list[float]]:
    """The tutorial's loop; returns the last epoch's mean loss, when the first batch ended, and each
    epoch's wall and CPU seconds (this process's, as the TrainingLoop times its epochs)."""
    first_batch = None
    mean = float("nan")
    epoch_s, epoch_cpu_s = [], []
    for epoch in range(epochs):
        epoch_start = time.perf_counter()
        cpu_start = time.process_time()
        sampler.set_epoch(epoch)
        running, n = 0.0, 0
        for xb, yb in loader:
            opt.zero_grad()
            loss = crit(model(xb), yb)
            loss.backward()
            opt.step()
            running += loss.item()
            n += 1
            if first_batch is None:
                first_batch = time.time()
        mean = running / max(1, n)
        epoch_s.append(time.perf_counter() - epoch_start)
        epoch_cpu_s.append(time.process_time() - cpu_start)
    return mean, first_batch, epoch_s, epoch_cpu_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="safetensors file with x (N, ...) float32 and y (N,) int64")
    ap.add_argument("--spec", required=True, help="JSON file: the model spec the graph's builder node made")
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0, help="model init and DistributedSampler seed")
    ap.add_argument("--save", default="", help="write the trained weights here (safetensors, rank 0)")
    ap.add_argument("--single", action="store_true", help="one process, no torch.distributed")
    ap.add_argument("--gather", action="store_true",
                    help="read each batch with one index_select (__getitems__), as XPU Fleet's datasets do, "
                         "instead of TensorDataset's per-sample indexing and default_collate")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file, save_file
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    from xpufleet.nodes.models import build_model

    if args.single:
        torch.set_num_threads(1)
        rank, world = 0, 1
    else:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    data = load_file(args.data)
    x, y = data["x"], data["y"]
    dataset = Gathered(x, y) if args.gather else TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                        collate_fn=(lambda batch: batch) if args.gather else None)
    with open(args.spec, encoding="utf-8") as f:
        model: nn.Module = build_model(json.load(f), seed=args.seed)
    if not args.single:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    crit = nn.CrossEntropyLoss()
    start = time.perf_counter()
    mean, first_batch, epoch_s, epoch_cpu_s = train_loop(model, loader, sampler, opt, crit, args.epochs)
    duration = time.perf_counter() - start
    samples = len(sampler) * args.epochs * world
    firsts, threads = [first_batch], [torch.get_num_threads()]
    if not args.single:
        t = torch.tensor([mean], dtype=torch.float64)
        dist.all_reduce(t)
        mean = float(t) / world
        firsts, threads = [None] * world, [None] * world
        dist.all_gather_object(firsts, first_batch)
        dist.all_gather_object(threads, torch.get_num_threads())
        # The DDP wrapper (its reducer holds the group) goes before the group: destroyed the other way
        # round, rank 0 could abort at exit ("terminate called without an active exception").
        model = model.module
        gc.collect()
        dist.destroy_process_group()
    if rank == 0:
        if args.save:
            inner = model
            save_file({k: v.detach().contiguous() for k, v in inner.state_dict().items()}, args.save)
        print(json.dumps({"samples_per_s": samples / duration, "duration_s": duration, "train_loss": mean,
                          "epoch_s": epoch_s, "epoch_cpu_s": epoch_cpu_s,
                          "first_batch_at": firsts, "threads": threads, "pid": os.getpid()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

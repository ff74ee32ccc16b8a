"""ddp training inside the TrainingLoop (docs/ddp.md, docs/workers.md "training one model on several cards").

One process per card, rank k on the run's ``cards[k]``; rank 0 is the run itself, ranks 1..N-1 are
started by the launcher when rank 0 says ``ddp_ready`` (server/run/ddp.py). Only PyTorch's own tools:

* ``torch.distributed.init_process_group`` with a ``file://`` rendezvous in the run directory (a
  FileStore: no TCP store, no port), backend NCCL on CUDA and gloo otherwise (simulated cards run on
  the CPU with gloo), every socket on the loopback interface (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``
  = lo unless the agent's environment sets them), the 30-minute collective timeout;
* ``DistributedDataParallel``: it broadcasts rank 0's weights when it wraps the model and averages the
  gradients during ``backward``; ``no_sync`` skips the all-reduce of accumulation micro-batches;
* ``DistributedSampler`` for every DataLoader of the loop, seeded with rank 0's seed (a shuffle order
  shared by every rank, new each epoch through ``set_epoch``), padding the last shard so every rank runs
  the same number of batches; validation leaves the padded samples out.

A stop and a progress report are agreed every K batches, not after every batch: a collective per batch
on top of DDP's gradient all-reduce cost about as much as the training step itself on small models,
and each extra point where both ranks must meet costs a scheduling round-trip on a busy machine. The
rule: every rank counts its batches (the same count on every rank: the sampler pads the shards to
equal length). At an agreement point a rank reads the previous point's all-reduce (started
asynchronously, long finished by now, so nothing waits) and starts the next one, on a gloo group of
its own (CPU tensors, never queued behind gradient buckets): the stop and report requests seen since
the last point, the latest batch loss (``train_loss_batch`` is the mean over ranks at that point's
step: no collective at report time) and rank 0's K. Rank 0 picks K from the time the last interval
took (:func:`next_every`: about ``DDP_AGREE_INTERVAL_S`` of batches, at least 1, at most twice the
last K, at most ``DDP_AGREE_MAX_BATCHES``); the first point is after batch 1. The end of every epoch
(or of the loop) is one more point, synchronous, where every rank already waits for the epoch's loss
sum. So every rank stops on the same batch, at most two intervals (two K's) after the request, and
no collective or host synchronisation is added per step.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any

from ..constants import (
    DDP_AGREE_INTERVAL_S,
    DDP_AGREE_MAX_BATCHES,
    DDP_COLLECTIVE_TIMEOUT_S,
    DDP_RANK_ENV_DEFAULTS,
    ENV_TEST_DDP_RAISE,
)
from . import device as devmod
from . import runtime

# Messages of communication failures that mean a peer rank went away (gloo/NCCL raise RuntimeError).
_PEER_SIGNS = ("connection reset", "connection closed", "connection refused", "broken pipe", "gloo", "nccl",
               "timed out", "socket", "peer")


class DdpPeerLost(RuntimeError):
    """A collective failed because another rank went away: a consequence, not the cause, of a failure.
    The runner marks the run's result (``ddp_peer_lost``) so the launcher reports the root cause."""


def backend_for(kind: str, simulated: bool = False) -> str | None:
    """The collective backend for cards of ``kind``: nccl on CUDA, xccl on XPU, gloo for simulated
    cards and the CPU; None when this PyTorch has none that fits."""
    import torch.distributed as dist

    if not dist.is_available():
        return None
    gloo = "gloo" if dist.is_gloo_available() else None
    if simulated or kind == "cpu":
        return gloo
    if kind == "cuda":
        return "nccl" if dist.is_nccl_available() else gloo
    if kind == "xpu":
        available = getattr(dist, "is_xccl_available", None)
        return "xccl" if available is not None and available() else None
    return None


def check_loader(loader: Any, node_label: str) -> None:
    """Raise a clear ValueError unless ddp can shard ``loader`` (map-style dataset, its own sampler)."""
    from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

    if not isinstance(loader, DataLoader):
        raise ValueError(f"{node_label}: ddp shards torch DataLoaders; got {type(loader).__name__} (connect a "
                         f"DataLoader node)")
    if isinstance(loader.dataset, IterableDataset):
        raise ValueError(f"{node_label}: ddp needs a map-style dataset (one you can index) so that each rank reads "
                         f"its own share; {type(loader.dataset).__name__} is an iterable dataset. Use a map-style "
                         f"dataset or strategy single")
    sampler = loader.sampler
    own = type(sampler) is SequentialSampler or (
        type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None
        and sampler.generator is None)
    if not own or type(loader.batch_sampler) is not BatchSampler:
        what = type(sampler).__name__ if not own else type(loader.batch_sampler).__name__
        raise ValueError(f"{node_label}: ddp replaces the DataLoader's own sampler with a DistributedSampler, but "
                         f"this DataLoader uses a custom sampler ({what}); use the DataLoader's own shuffle or "
                         f"strategy single")


def real_count(n: int, rank: int, world_size: int) -> int:
    """Samples of a dataset of ``n`` that DistributedSampler gives ``rank`` without its padding: the
    positions rank, rank + N, ... of the padded order that are below ``n``."""
    return len(range(rank, n, world_size))


def test_raise_at(rank: int, env: dict[str, str] | None = None) -> int | None:
    """The test hook ``XPUFLEET_TEST_DDP_RAISE=RANK:BATCH`` (tests only): the batch at which ``rank``
    raises, or None. Read once per loop; it never fires unless a test sets the variable."""
    raw = (os.environ if env is None else env).get(ENV_TEST_DDP_RAISE, "").strip()
    if not raw:
        return None
    who, _, at = raw.partition(":")
    try:
        return int(at) if int(who) == rank else None
    except ValueError:
        return None


def next_every(every: int, batches: int, elapsed_s: float, target_s: float = DDP_AGREE_INTERVAL_S,
               cap: int = DDP_AGREE_MAX_BATCHES) -> int:
    """Rank 0's K for an interval to come, K now being ``every``: the batches that take about
    ``target_s`` at the speed just measured (``batches`` in ``elapsed_s``), at least 1, at most
    ``2 * every`` (a speed-up is followed gradually, a slow-down at once) and at most ``cap``; with
    nothing measured (no batch since the last point) K stays."""
    every = max(1, int(every))
    if batches <= 0:
        return min(int(cap), every)
    fit = int(target_s * batches / elapsed_s) if elapsed_s > 0 else 2 * every
    return max(1, min(int(cap), 2 * every, fit))


class _ProcessState:
    """What one process keeps across its ddp loops: the groups (initialised once, by the first loop)."""

    control: Any = None
    backend: str | None = None
    listener: Any = None  # rank 0's TCPStore socket (ddp across workers)


_STATE = _ProcessState()


class DistributedStrategy:
    """The TrainingLoop on every card of the run (see the module docstring)."""

    name = "ddp"

    def __init__(self, ctx: runtime.RunContext, node_label: str) -> None:
        role = ctx.ddp
        assert role is not None
        self.ctx = ctx
        self.role = role
        self.rank = role.rank
        self.world_size = role.world_size
        self.is_main = self.rank == 0
        self.label = node_label
        self.card = role.cards[self.rank]
        self.backend = backend_for(self.card.split(":")[0], role.simulated)
        self._device = devmod.torch_device(self.card, node_label)
        self._real: dict[int, int] = {}
        self._shuffle_seed: int | None = None
        # The agreement every K batches (module docstring): counts, requests since the last point, the
        # point in flight, the last agreed train_loss_batch point.
        self._batches = 0
        self._every = 1  # K now
        self._next_point = 1
        self._point_batch = 0
        self._point_time = time.perf_counter()
        self._stop_seen = False
        self._due_seen = False
        self._pending: tuple[Any, Any] | None = None
        self._agreed_loss: tuple[int, float] | None = None
        self._total = 0.0  # the sum over ranks that the last point carried (settle's epoch train loss)
        self._raise_at = test_raise_at(self.rank)
        self._first_batch_at: float | None = None
        self._init()

    # -- set-up --

    def _init(self) -> None:
        import torch
        import torch.distributed as dist

        if dist.is_initialized():  # a second ddp loop of the same run: the ranks are already together
            self.control = _STATE.control
            return
        for key, value in DDP_RANK_ENV_DEFAULTS.items():
            if key != "OMP_NUM_THREADS":  # read by OpenMP at start-up: the launcher sets it in the env
                os.environ.setdefault(key, value)
        for key, value in (("RANK", self.rank), ("WORLD_SIZE", self.world_size)):
            os.environ[key] = str(value)  # for libraries that read them; the rendezvous is the file
        for key, value in (("LOCAL_RANK", self.rank), ("LOCAL_WORLD_SIZE", self.world_size)):
            os.environ.setdefault(key, str(value))  # across workers the launcher sets this worker's own
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
        timeout = timedelta(seconds=DDP_COLLECTIVE_TIMEOUT_S)
        where, meet = _rendezvous(self.role, timeout)
        if self.is_main:
            self.ctx.event("ddp_ready", {**where, "world_size": self.world_size, "backend": self.backend,
                                         "cards": list(self.role.cards)})
            runtime.info(f"{self.label}: ddp on {self.world_size} ranks ({', '.join(self.role.cards)}), backend "
                         f"{self.backend}; waiting for ranks 1..{self.world_size - 1}")

        def join() -> Any:
            dist.init_process_group(self.backend, **meet(), rank=self.rank, world_size=self.world_size,
                                    timeout=timeout)
            # Stop/report flags and small objects travel on a gloo group of their own (CPU tensors).
            return dist.new_group(backend="gloo", timeout=timeout)

        self.control = _STATE.control = _wait_stoppable(join, self.ctx.stop_event,
                                                        "stopped while the ddp ranks were meeting")
        _STATE.backend = self.backend
        ranks = self._gather({"rank": self.rank, "pid": os.getpid(), "card": self.card,
                              "device": str(self._device), "threads": torch.get_num_threads()})
        if self.is_main:
            self.ctx.execution_facts["ddp"] = {"world_size": self.world_size, "backend": self.backend,
                                               "rendezvous": where["rendezvous"], "ranks": ranks}
            self.ctx.event("ddp_started", {"world_size": self.world_size, "backend": self.backend, "ranks": ranks})

    def _gather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def shuffle_seed(self, seed: int | None) -> int:
        """The DistributedSampler seed: the loop's (rank 0's) seed, or rank 0's random draw sent to all."""
        if self._shuffle_seed is None:
            if seed is not None:
                self._shuffle_seed = int(seed)
            else:
                import torch
                import torch.distributed as dist

                box = [int(torch.randint(0, 2**62, ()).item()) if self.is_main else 0]
                dist.broadcast_object_list(box, src=0, group=self.control)
                self._shuffle_seed = int(box[0])
        return self._shuffle_seed

    # -- the strategy hooks (see strategy.SingleProcess) --

    def device(self, requested: str, node_label: str) -> Any:
        if requested not in ("auto", "cuda", "xpu", self.role.cards[0]):
            runtime.info(f"{node_label}: under ddp every rank trains on its own card (rank {self.rank} on "
                         f"{self.card}); the node's device {requested} applies to single-process training")
        return self._device

    def wrap_model(self, model: Any) -> Any:
        from torch.nn.parallel import DistributedDataParallel

        if self._device.type == "cuda":
            return DistributedDataParallel(model, device_ids=[self._device.index], output_device=self._device.index)
        return DistributedDataParallel(model)

    def unwrap_model(self, model: Any) -> Any:
        from torch.nn.parallel import DistributedDataParallel

        return model.module if isinstance(model, DistributedDataParallel) else model

    def prepare_loader(self, loader: Any, train: bool, seed: int | None = None) -> Any:
        from torch.utils.data import DataLoader, RandomSampler
        from torch.utils.data.distributed import DistributedSampler

        dataset = loader.dataset
        sampler = DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank,
                                     shuffle=isinstance(loader.sampler, RandomSampler),
                                     seed=self.shuffle_seed(seed), drop_last=False)
        workers = int(loader.num_workers)
        shard = DataLoader(
            dataset, batch_size=loader.batch_size, sampler=sampler, num_workers=workers,
            collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, drop_last=loader.drop_last,
            timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context if workers else None,
            generator=loader.generator, prefetch_factor=loader.prefetch_factor if workers else None,
            persistent_workers=loader.persistent_workers if workers else False,
            pin_memory_device=loader.pin_memory_device,
        )
        self._real[id(shard)] = real_count(len(dataset), self.rank, self.world_size)
        return shard

    def set_epoch(self, loader: Any, epoch: int) -> None:
        loader.sampler.set_epoch(epoch)

    def real_samples(self, loader: Any) -> int | None:
        return self._real.get(id(loader))

    def all_sum(self, values: Any) -> Any:
        import torch.distributed as dist

        dist.all_reduce(values)
        return values

    def agree(self, stop: bool, due: bool, loss: Any = None, step: int = 0) -> tuple[bool, bool]:
        """(stop, report) agreed by every rank at agreement points (see the module docstring); between
        them (False, False), the requests kept for the next point."""
        self._batches += 1
        if self._raise_at is not None and self._batches == self._raise_at:
            raise RuntimeError(f"test hook {ENV_TEST_DDP_RAISE}: rank {self.rank} raised after batch {self._batches}")
        self._stop_seen = self._stop_seen or stop
        self._due_seen = self._due_seen or due
        if self._batches < self._next_point:
            return False, False
        decided = self._read()
        if not decided[0]:  # a stop agreed: every rank stops here, nothing new goes in flight
            self._send(loss, step, async_op=True)
        return decided

    def settle(self, stop: bool, loss: Any = None, step: int = 0, total: float = 0.0) -> tuple[bool, float]:
        """The end of an epoch's batches (or of the loop): one synchronous point on every rank, which also
        sums ``total`` (the epoch's train loss) over ranks; (stop now, the sum)."""
        early = self._read()[0]  # a stop agreed by the point in flight: every rank sees it alike
        self._stop_seen = self._stop_seen or stop or early
        self._send(loss, step, async_op=False, total=total)
        return self._read()[0] or early, self._total

    def batch_loss(self, loss: Any, step: int) -> tuple[int, float] | None:
        """The latest agreed ``train_loss_batch`` point: (its step, the mean over ranks)."""
        return self._agreed_loss

    def _send(self, loss: Any, step: int, async_op: bool, total: float = 0.0) -> None:
        import torch
        import torch.distributed as dist

        now = time.perf_counter()
        every = next_every(self._every, self._batches - self._point_batch, now - self._point_time) if self.is_main else 0
        value = float(loss.detach().item()) if loss is not None else 0.0
        # SUM over ranks: the flags count requests, K and the step come from rank 0 alone.
        flags = torch.tensor([int(self._stop_seen), int(self._due_seen), every, value,
                              step if self.is_main else 0, int(loss is not None), float(total)],
                             dtype=torch.float64)
        work = dist.all_reduce(flags, group=self.control, async_op=async_op)
        self._pending = (work, flags)
        self._stop_seen = self._due_seen = False
        self._point_batch, self._point_time = self._batches, now

    def _read(self) -> tuple[bool, bool]:
        """The result of the point in flight (or just made): (stop, report); sets the next point."""
        if self._pending is None:
            return False, False
        work, flags = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        stop, due, every, loss_sum, step, with_loss, self._total = flags.tolist()
        if with_loss == self.world_size:
            self._agreed_loss = (int(step), loss_sum / self.world_size)
        self._every = max(1, int(every))
        self._next_point = self._batches + self._every
        return stop > 0, due > 0

    def no_sync(self, model: Any) -> Any:
        return model.no_sync

    def first_batch(self) -> None:
        self._first_batch_at = time.time()

    def finish(self) -> None:
        ranks = self._gather({"rank": self.rank, "pid": os.getpid(), "card": self.card,
                              "first_batch_at": self._first_batch_at})
        if self.is_main:
            facts = self.ctx.execution_facts.setdefault("ddp", {})
            facts["first_batch_at"] = [r["first_batch_at"] for r in ranks]

    def lost_peer(self, exc: BaseException) -> DdpPeerLost | None:
        """``exc`` as a :class:`DdpPeerLost` when it is a communication failure, else None."""
        import torch.distributed as dist

        if isinstance(exc, DdpPeerLost):
            return exc
        text = str(exc)
        dist_error = getattr(dist, "DistError", ())
        if isinstance(exc, dist_error) or (isinstance(exc, RuntimeError)
                                           and any(s in text.lower() for s in _PEER_SIGNS)):
            first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
            return DdpPeerLost(f"rank {self.rank} of {self.world_size} lost contact with the other ranks: {first}")
        return None

    def facts(self) -> dict[str, Any]:
        return {"strategy": self.name, "world_size": self.world_size, "backend": self.backend}


def _rendezvous(role: runtime.DdpRole, timeout: timedelta) -> tuple[dict[str, Any], Any]:
    """Where the ranks meet (what ``ddp_ready`` says) and a function giving ``init_process_group``'s
    rendezvous arguments: the FileStore in the run directory on one machine; across workers, rank 0's
    TCPStore, which rank 0 opens on its worker's advertised address (a socket bound there only, a free
    port) and the other ranks reach at ``store_host:store_port`` (server/run/spread.py)."""
    import socket

    import torch.distributed as dist

    if role.store_host is None:
        path = role.rendezvous
        if role.rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)  # a stale store from an earlier attempt would confuse the ranks
        return {"rendezvous": str(path)}, lambda: {"init_method": path.as_uri()}
    host = role.store_host
    if role.rank != 0:
        port = int(role.store_port or 0)
        return ({"rendezvous": f"tcp://{host}:{port}"},
                lambda: {"store": dist.TCPStore(host, port, role.world_size, False, timeout)})
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    store = dist.TCPStore(host, port, role.world_size, True, timeout, wait_for_workers=False,
                          master_listen_fd=listener.fileno())
    _STATE.listener = listener  # the store serves on it for the life of the process
    return {"rendezvous": f"tcp://{host}:{port}", "store": f"{host}:{port}"}, lambda: {"store": store}


def _wait_stoppable(fn: Any, stop: threading.Event, message: str) -> Any:
    """Run ``fn`` (a blocking rendezvous) in a helper thread while this one watches ``stop``: a Stop
    while the ranks are still meeting ends the run at once instead of after the 30-minute timeout."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="xpufleet-ddp-rendezvous", daemon=True)
    thread.start()
    while thread.is_alive():
        if stop.wait(0.05) and thread.is_alive():
            raise runtime.stopped(message)
        thread.join(0.05)
    if "error" in box:
        raise box["error"]
    return box["value"]


def shutdown() -> None:
    """Leave the process group at the end of a run process (a clean exit of gloo's threads)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the run's result is already out
        pass

"""The built-in model server (docs/services.md): one process per instance of a unit, ``python -m
xpufleet.server.units.model_server [INSTANCE_DIR]`` (or forked warm by starter.py).

Each rank loads only its pipeline stage of a model saved by ModelSaver (split.py), forms the unit's
torch.distributed group (gloo here; the rendezvous is rank 0's TCPStore at ``MASTER_ADDR:MASTER_PORT``
under the generation's fresh ``XPUFLEET_UNIT_RENDEZVOUS`` prefix), passes a barrier with every rank,
then reports ``unit_arrived`` (with the environment it sees) on its event pipe. Rank 0 answers HTTP:

* ``GET /health``: 200 once the barrier passed (503 while stopping or when its group broke);
* ``POST /infer`` ``{"inputs": [sample, ...], "output": "raw"|"classes"|"probabilities"}`` ->
  ``{"outputs": [...], "unit", "generation", "pid", "batch_rows"}``.

Concurrent requests are batched: while one batch runs through the pipeline, the next requests queue;
they go through together (up to ``max_batch`` rows). Rank 0 runs stage 0 and sends the activations to
rank 1 (a fixed header with the shape, then the tensor), rank k to rank k+1, the last rank back to rank 0.

Stop: SIGTERM, or (started by an agent) ``stop`` on stdin or its end (the agent went away): rank 0
answers what it has, tells the other ranks to stop, and exits 0. Without an agent (torchrun, a
Kubernetes pod) it reads no stdin. A collective that fails (a rank died) means the group
is broken: rank 0 answers ``503`` with ``X-Xpufleet-Unit-Broken`` and exits 3, so the unit is rebuilt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from ..run.events import EventSink
from ..run.launcher import EVENTS_FD_ENV
from .envcontract import BROKEN_HEADER, HOST_ENV, PORT_ENV, PROGRAM_ENV, RENDEZVOUS_ENV, contract_of
from .split import SplitError, Stage, load_stage

HEADER_LEN = 8  # [op, ndim, dims...]: activations are at most 6-dimensional
OP_STOP, OP_FORWARD = 0, 1
EXIT_BROKEN = 3
IDLE_TIMEOUT_S = 7 * 86400  # a follower waits this long for the next request
OUTPUTS = ("raw", "classes", "probabilities")


class GroupBroken(RuntimeError):
    """A collective with another rank failed: the unit's group cannot serve any more."""


def resolve_model(path: str) -> Path:
    """The model file: an absolute path, or relative to the outputs folder (where ModelSaver wrote it)."""
    from ...nodes.paths import candidate_paths

    candidates = candidate_paths(path)
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise FileNotFoundError(f"model file {path!r} not found on this worker; looked in: "
                                f"{', '.join(str(p) for p in candidates)}")
    return found


def _header(op: int, shape: tuple[int, ...] = ()) -> Any:
    import torch

    if len(shape) > HEADER_LEN - 2:
        raise SplitError(f"activations with {len(shape)} dimensions cannot pass between ranks (at most {HEADER_LEN - 2})")
    return torch.tensor([op, len(shape), *shape, *([0] * (HEADER_LEN - 2 - len(shape)))], dtype=torch.int64)


class Pipeline:
    """This rank's stage and its neighbours in the group."""

    def __init__(self, stage: Stage, rank: int, size: int, timeout: Any = None, device: Any = "cpu") -> None:
        self.stage, self.rank, self.size, self.timeout, self.device = stage, rank, size, timeout, device

    def _run(self, x: Any) -> Any:
        import torch

        with torch.inference_mode():
            return self.stage.module(x.to(self.device)).cpu()

    def _send(self, tensor: Any, dst: int) -> None:
        import torch.distributed as dist

        dist.send(_header(OP_FORWARD, tuple(tensor.shape)), dst)
        dist.send(tensor.contiguous(), dst)  # activations travel as CPU tensors (gloo)

    def _recv(self, src: int, timeout: Any = None) -> Any | None:
        """The next tensor from ``src`` (None: it said stop). ``timeout``: how long rank 0 waits for a
        batch to come back (a rank that hangs breaks the group); idle followers wait without one."""
        import torch
        import torch.distributed as dist

        header = torch.empty(HEADER_LEN, dtype=torch.int64)
        if timeout is None:
            dist.recv(header, src)
        else:
            dist.irecv(header, src).wait(timeout)
        if int(header[0]) == OP_STOP:
            return None
        shape = [int(v) for v in header[2:2 + int(header[1])]]
        out = torch.empty(shape, dtype=torch.float32)
        dist.recv(out, src)
        return out

    def forward(self, x: Any) -> Any:
        """Rank 0: the whole pipeline for one batch (stage 0 here, the rest on the other ranks)."""
        y = self._run(x)
        if self.size == 1:
            return y
        try:
            self._send(y, 1)
            out = self._recv(self.size - 1, self.timeout)
        except RuntimeError as exc:
            raise GroupBroken(f"a collective with the other ranks failed: {str(exc).splitlines()[0]}") from None
        if out is None:
            raise GroupBroken("the last rank stopped")
        return out

    def follow(self) -> int:
        """Ranks > 0: receive, run the stage, pass on, until rank 0 says stop."""
        import torch.distributed as dist

        prev, nxt = self.rank - 1, (self.rank + 1) % self.size
        while True:
            try:
                x = self._recv(prev)
                if x is None:
                    if nxt != 0:
                        dist.send(_header(OP_STOP), nxt)
                    return 0
                self._send(self._run(x), nxt)
            except RuntimeError as exc:
                raise GroupBroken(f"a collective with the other ranks failed: {str(exc).splitlines()[0]}") from None

    def stop_followers(self) -> None:
        import torch.distributed as dist

        if self.size > 1:
            dist.send(_header(OP_STOP), 1)


def _watch_stdin(stdin: Any, on_stop: Any) -> None:
    """``stop`` on stdin or its end (the agent went away) -> ``on_stop()``. Without an agent (torchrun, a
    Kubernetes pod: ``stdin`` None) only SIGTERM stops it."""
    if stdin is None:
        return

    def run() -> None:
        try:
            for line in stdin:
                if line.strip().lower() in ("stop", "interrupt"):
                    break
        except (OSError, ValueError):
            pass
        on_stop()

    threading.Thread(target=run, name="xpufleet-instance-stdin", daemon=True).start()


def _inputs(body: Any, stage: Stage, max_batch: int) -> tuple[Any, str]:
    """The request's batch as a float32 tensor (400 texts for anything else)."""
    import torch

    if not isinstance(body, dict):
        raise ValueError('the body must be a JSON object {"inputs": [sample, ...]}')
    unknown = sorted(set(body) - {"inputs", "output"})
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}; known: inputs, output")
    output = body.get("output", "raw")
    if output not in OUTPUTS:
        raise ValueError(f"output: must be one of {', '.join(OUTPUTS)}, got {output!r}")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ValueError("inputs: a non-empty list of samples")
    if len(inputs) > max_batch:
        raise ValueError(f"inputs: {len(inputs)} samples; at most {max_batch} per request (program.model.max_batch)")
    try:
        x = torch.tensor(inputs, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"inputs: every sample must be a list of numbers of the same shape ({exc})") from None
    want = stage.input_shape
    if want is not None and list(x.shape[1:]) != list(want):
        raise ValueError(f"inputs: each sample must have shape {want} (the model's input), got {list(x.shape[1:])}")
    if not torch.isfinite(x).all():
        raise ValueError("inputs: NaN or infinite values")
    return x, output


def _outputs(y: Any, output: str) -> list[Any]:
    import torch

    if output == "classes":
        return y.argmax(dim=-1).tolist()
    if output == "probabilities":
        return torch.softmax(y, dim=-1).tolist()
    return y.tolist()


async def _serve_rank0(pipe: Pipeline, program: dict[str, Any], stdin: Any, facts: dict[str, Any]) -> int:
    from concurrent.futures import ThreadPoolExecutor

    import torch
    from aiohttp import web

    loop = asyncio.get_running_loop()
    max_batch = int(program.get("max_batch") or 64)
    queue: asyncio.Queue[tuple[Any, asyncio.Future[Any]]] = asyncio.Queue()
    pool = ThreadPoolExecutor(1, thread_name_prefix="xpufleet-pipeline")
    done = asyncio.Event()
    state: dict[str, Any] = {"stopping": False, "broken": None, "busy": False, "code": 0}

    def stop() -> None:
        state["stopping"] = True
        done.set()

    _watch_stdin(stdin, lambda: loop.call_soon_threadsafe(stop))
    loop.add_signal_handler(signal.SIGTERM, stop)

    async def batcher() -> None:
        while True:
            x, fut = await queue.get()
            items, rows = [(x, fut)], len(x)
            while not queue.empty() and rows + len(queue._queue[0][0]) <= max_batch:  # type: ignore[attr-defined]
                nx, nf = queue.get_nowait()
                items.append((nx, nf))
                rows += len(nx)
            state["busy"] = True
            try:
                y = await loop.run_in_executor(pool, pipe.forward, torch.cat([i[0] for i in items]))
            except Exception as exc:  # noqa: BLE001 - a broken group ends this server
                state["broken"] = str(exc)
                for _, f in items:
                    if not f.done():
                        f.set_exception(GroupBroken(str(exc)))
                state["code"] = EXIT_BROKEN
                loop.call_later(0.2, done.set)
                return
            finally:
                state["busy"] = False
            start = 0
            for bx, f in items:
                if not f.done():
                    f.set_result((y[start:start + len(bx)], rows))
                start += len(bx)

    async def health(request: web.Request) -> web.Response:
        if state["broken"] or state["stopping"]:
            return web.json_response({"status": "broken" if state["broken"] else "stopping"}, status=503)
        return web.json_response({"status": "ok", **facts})

    async def infer(request: web.Request) -> web.Response:
        if state["broken"]:
            return web.json_response({"error": f"the unit's process group broke: {state['broken']}"}, status=503,
                                     headers={BROKEN_HEADER: "1"})
        if state["stopping"]:
            return web.json_response({"error": "this unit is stopping"}, status=503, headers={BROKEN_HEADER: "1"})
        try:
            x, output = _inputs(await request.json(), pipe.stage, max_batch)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        fut: asyncio.Future[Any] = loop.create_future()
        queue.put_nowait((x, fut))
        try:
            y, rows = await fut
        except GroupBroken as exc:
            return web.json_response({"error": f"the unit's process group broke: {exc}"}, status=503,
                                     headers={BROKEN_HEADER: "1"})
        return web.json_response({"outputs": _outputs(y, output), **facts, "batch_rows": rows})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_post("/infer", infer)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, os.environ.get(HOST_ENV, "127.0.0.1"), int(os.environ[PORT_ENV]))
    await site.start()
    task = asyncio.create_task(batcher())
    await done.wait()
    # Finish what was asked before the stop (bounded by the agent's grace), then stop the other ranks.
    while state["code"] == 0 and (not queue.empty() or state["busy"]):
        await asyncio.sleep(0.01)
    task.cancel()
    await runner.cleanup()
    if state["code"] == 0:
        try:
            await loop.run_in_executor(pool, pipe.stop_followers)
        except Exception:  # noqa: BLE001 - they are being stopped anyway
            pass
    pool.shutdown(wait=False)
    return int(state["code"])


def serve(instance_dir: Path, events_fd: int | None, stdin: Any) -> int:
    """Run one instance (rank from ``RANK``); the exit code."""
    pipe_out = os.fdopen(events_fd, "wb", buffering=0) if events_fd is not None else None
    sink = EventSink(pipe_out, Path(instance_dir) / "events.jsonl")
    try:
        return _serve(sink, stdin)
    except GroupBroken as exc:
        sink.emit("unit_error", {"error": f"the unit's process group broke: {exc}"})
        return EXIT_BROKEN
    except Exception as exc:  # noqa: BLE001 - reported to the agent, which reports it as the exit cause
        traceback.print_exc()
        sink.emit("unit_error", {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    finally:
        sink.close()


def _serve(sink: EventSink, stdin: Any) -> int:
    env = os.environ
    program = json.loads(env[PROGRAM_ENV])["model"]
    rank, size = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    import datetime

    import torch

    threads = env.get("OMP_NUM_THREADS", "").strip()
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else 1)
    stage = load_stage(resolve_model(program["path"]), rank, size)
    # The instance's card when it has a real one (its only visible card: cuda:0), else the CPU
    # (simulated cards). CUDA is first touched here, in the instance's own process.
    device = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    stage.module.to(device)
    timeout = datetime.timedelta(seconds=float(program.get("collective_timeout_s") or 60))
    if size > 1:
        import torch.distributed as dist

        # Under torchrun the elastic agent already hosts the store at MASTER_PORT: join it.
        hosted = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), size, is_master=rank == 0 and not hosted,
                              timeout=timeout)
        # The group's own timeout is long: followers wait for the next request without one (a rank that
        # dies closes its connections, which every other rank sees at once); rank 0 bounds each batch.
        dist.init_process_group("gloo", store=dist.PrefixStore(env.get(RENDEZVOUS_ENV, "unit"), store), rank=rank,
                                world_size=size, timeout=datetime.timedelta(seconds=IDLE_TIMEOUT_S))
        dist.barrier()
    facts = {"unit": env.get("UNIT_ID"), "generation": int(env.get("UNIT_GENERATION", "0") or 0),
             "pid": os.getpid(), "stage": stage.describe(), "device": str(device)}
    seen = contract_of(dict(env))
    if "CUDA_VISIBLE_DEVICES" in env:  # its one card (renumbered to cuda:0)
        seen["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
    sink.emit("unit_arrived", {"env": seen, **facts})
    pipe = Pipeline(stage, rank, size, timeout, device)
    if rank == 0:
        return asyncio.run(_serve_rank0(pipe, program, stdin, facts))
    # Followers end with the group: SIGTERM (its default action) or stop/the agent going away.
    _watch_stdin(stdin, lambda: os._exit(0))
    return pipe.follow()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xpufleet.server.units.model_server",
                                     description="One instance of a unit of the built-in model server "
                                                 "(started by a worker agent; environment: docs/services.md).")
    parser.add_argument("instance_dir", nargs="?", default=".", type=Path, help="where it writes events.jsonl")
    args = parser.parse_args(argv)
    fd = os.environ.get(EVENTS_FD_ENV)
    by_agent = bool(fd and fd.isdigit())  # an agent's launcher: stdin is its pipe, and its end means "stop"
    return serve(args.instance_dir, int(fd) if by_agent else None, sys.stdin if by_agent else None)


if __name__ == "__main__":
    sys.exit(main())

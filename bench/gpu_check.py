"""Every GPU-only path in one command (docs/gpu-check.md): ``make gpu-check`` runs this, then the tests
marked ``gpu`` (tests/gpu/, which read this run's report).

    python bench/gpu_check.py [--json FILE] [--only NAME,...]   # on a machine with a CUDA GPU
    python bench/gpu_check.py --device cpu [--only NAME,...]     # a dry run on this CPU: not a GPU check

Without a CUDA GPU it lists the checks it would run, says "no GPU: nothing checked" and exits 0. On a GPU
each check runs in a child process of its own (a crash, a hang or a CUDA error in one never stops the
others, and this process never touches CUDA), within its own time limit and the 8-minute total; one line
per check as it ends, then the JSON report (``--json``). Exit 1 when a check did not pass, 2 for bad usage.

``--device cpu`` runs each check's code path on this CPU with simulated cards (slower limits), so a typo
does not wait for the first GPU; its lines say ``cpu dry run, not a GPU figure`` and its report says
``"mode": "dry-cpu"``, ``"nothing_checked": true``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import gpu_report as R

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DRY_SCALE = 6.0  # a dry run's limits: the CPU (2 shared cores here) is far slower than a GPU
GRACE_S = 30.0  # past a check's own limit (it stops itself and its processes), the child is killed
PROBE = ("import json, torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0; "
         "print(json.dumps({'count': n, 'names': [torch.cuda.get_device_name(i) for i in range(n)], "
         "'torch': torch.__version__, 'cuda': torch.version.cuda}))")


class CheckTimeout(BaseException):
    """The check ran past its time (raised in the child by SIGALRM, so its fleet still stops). Not an
    ``Exception``: code that catches those (torch's import has such blocks) must not swallow it."""


def gpu_info() -> dict[str, Any]:
    """The CUDA GPUs torch sees, asked in a short child process (this one never initialises CUDA)."""
    try:
        proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
        info = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as exc:
        return {"available": False, "count": 0, "reason": f"the probe failed: {exc}"}
    info["available"] = info["count"] > 0
    if not info["available"]:
        info["reason"] = "torch.cuda.is_available() is False"
    return info


def check_function(name: str) -> Any:
    import gpu_checks_compute
    import gpu_checks_memory

    return {**gpu_checks_compute.CHECKS, **gpu_checks_memory.CHECKS}[name]


def child_main(name: str, device: str, work: Path, result: Path, limit_s: float) -> int:
    """In the check's own process: run it under an alarm, write its Outcome as JSON to ``result``."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise CheckTimeout(f"ran past its {limit_s:g} s")

    fn = check_function(name)
    # Imported before the alarm is armed: an alarm inside a module's first import leaves it half made
    # (numpy then fails with a RecursionError, not with the timeout). Importing torch initialises no CUDA.
    import numpy  # noqa: F401
    import sklearn.datasets  # noqa: F401
    import torch  # noqa: F401

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(0.001, limit_s))  # sub-second limits too (the tests use them)
    t0 = time.monotonic()
    try:
        outcome = fn(device, work)
    except CheckTimeout as exc:
        outcome = R.Outcome(name, "timeout", detail=str(exc), device=device)
    except Exception as exc:  # noqa: BLE001 - reported as the check's error; the other checks go on
        tail = traceback.format_exc().strip().splitlines()[-6:]
        outcome = R.Outcome(name, "error", detail=f"{type(exc).__name__}: {exc} | {' / '.join(tail)}"[:2000],
                            device=device)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    outcome.elapsed_s = round(time.monotonic() - t0, 2)
    result.write_text(json.dumps(outcome.to_json()))
    return 0


def stop_leftovers(home: Path) -> None:
    """After a killed child: stop a sidecar it left in ``home`` (``xpufleet stop``; its runs go with it)."""
    if (home / "runtime.json").exists():
        env = {**os.environ, "XPUFLEET_HOME": str(home)}
        subprocess.run([sys.executable, "-m", "xpufleet.server", "stop"], env=env, capture_output=True, timeout=90)


def run_check(check: R.Check, device: str, limit_s: float, work: Path) -> R.Outcome:
    """One check in a child process of its own session, killed (its process group) past ``limit_s`` + grace."""
    work.mkdir(parents=True, exist_ok=True)
    result = work / "outcome.json"
    cmd = [sys.executable, str(Path(__file__)), "--child", check.name, "--device", device, "--work", str(work),
           "--result", str(result), "--limit-s", str(limit_s)]
    t0 = time.monotonic()
    with open(work / "check.log", "ab") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            proc.wait(timeout=limit_s + GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            stop_leftovers(work / "home")
            return R.Outcome(check.name, "timeout", detail=f"killed after {limit_s + GRACE_S:.0f} s",
                             elapsed_s=round(time.monotonic() - t0, 2), device=device)
    if not result.exists() or json.loads(result.read_text())["status"] in ("timeout", "error"):
        stop_leftovers(work / "home")  # a sidecar its fleet could not stop (it failed while starting)
    if not result.exists():
        tail = (work / "check.log").read_text(errors="replace")[-1500:]
        return R.Outcome(check.name, "error", detail=f"the check's process exited {proc.returncode}: {tail}",
                         elapsed_s=round(time.monotonic() - t0, 2), device=device)
    return R.Outcome.from_json(json.loads(result.read_text()))


def run_all(checks: list[R.Check], device: str, keep: bool, out: Any = sys.stdout) -> list[R.Outcome]:
    """Every check in turn within the total budget (a dry run: no total, slower limits); a line each."""
    scale = 1.0 if device == "cuda" else DRY_SCALE
    total = R.TOTAL_BUDGET_S if device == "cuda" else float("inf")
    root = Path(tempfile.mkdtemp(prefix="xpufleet-gpu-check-"))
    start = time.monotonic()
    outcomes: list[R.Outcome] = []
    try:
        for check in checks:
            limit = R.time_for(check, total - (time.monotonic() - start), scale)
            if limit is None:
                o = R.Outcome(check.name, "not_run", detail="the 8-minute budget ran out before it", device=device)
            else:
                o = run_check(check, device, limit, root / check.name)
            outcomes.append(o)
            print(R.format_line(o), file=out, flush=True)
    finally:
        if keep:
            print(f"work folders kept in {root}", file=out)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return outcomes


def parse_only(text: str | None) -> list[R.Check]:
    if not text:
        return list(R.CHECKS)
    return [R.check_named(n.strip()) for n in text.split(",") if n.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="FILE", help="write the JSON report here")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cuda (default): the GPU check; cpu: a dry run of the code paths, not a GPU check")
    ap.add_argument("--only", metavar="NAME,...", help=f"some checks only: {', '.join(R.CHECK_NAMES)}")
    ap.add_argument("--keep", action="store_true", help="keep each check's work folder (homes, logs)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--limit-s", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child_main(args.child, args.device, Path(args.work), Path(args.result), args.limit_s)
    try:
        checks = parse_only(args.only)
    except ValueError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    load = os.getloadavg()
    print(f"XPU Fleet GPU check: {len(checks)} checks; {os.cpu_count()} cores, load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    gpu = gpu_info() if args.device == "cuda" else {"available": False, "count": 0, "reason": "--device cpu"}
    if args.device == "cuda" and not gpu["available"]:
        print("It would run, on a CUDA GPU:")
        print("\n".join(R.listing(checks)))
        print(f"{R.NO_GPU_TEXT} ({gpu.get('reason')})")
        outcomes = [R.Outcome(c.name, "not_run", detail=R.NO_GPU_TEXT) for c in checks]
        mode = "no-gpu"
    else:
        if args.device == "cuda":
            print(f"GPU: {gpu['count']} x {', '.join(sorted(set(gpu['names'])))} (torch {gpu['torch']}, CUDA "
                  f"{gpu['cuda']})", flush=True)
        else:
            print(f"--device cpu: a dry run of each check's code path on this CPU ({R.DRY_LABEL}); "
                  f"{R.NO_GPU_TEXT}", flush=True)
        outcomes = run_all(checks, args.device, args.keep)
        mode = "gpu" if args.device == "cuda" else "dry-cpu"
    report = R.build_report(outcomes, mode=mode, gpu=gpu, elapsed_s=time.monotonic() - t0, load_avg=load,
                            started_at=started)
    counts = ", ".join(f"{n} {s}" for s, n in report["summary"].items() if n)
    print(f"{mode}: {counts} in {report['elapsed_s']:.0f} s")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))
        print(f"report: {path}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

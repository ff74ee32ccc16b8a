"""``xpufleet pools create NAME --slurm ...`` and ``xpufleet pools export NAME --format k8s``
(docs/slurm-and-k8s.md): the options, the request bodies, and the Slurm jobs in ``xpufleet pools``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import urllib.parse
from pathlib import Path
from typing import Any

from .common import EXIT_OK, EXIT_USAGE

# option -> (API field, type); the API checks every value (server/slurm/spec.py)
SLURM_OPTIONS = {
    "--partition": ("partition", str, "the Slurm partition"),
    "--gres": ("gres", str, "GRES per job, e.g. gpu:1 (a ddp run's job asks for its whole device set)"),
    "--time-limit": ("time_limit", str, "each job's --time, e.g. 01:00:00"),
    "--account": ("account", str, "the Slurm account"),
    "--python": ("python", str, "the python (or venv's bin/python) on the nodes that imports xpufleet"),
    "--max-jobs": ("max_jobs", int, "pending + running jobs at most (default 4)"),
    "--idle-exit": ("idle_exit_s", float, "seconds an instance with no run waits before it is told to leave"),
    "--retries": ("retries", int, "jobs submitted again for a run whose job ended without joining (default 2)"),
    "--simulate-gib": ("simulate_gib", float, "tests/demos: each card Slurm gives becomes a simulated card this big"),
    "--server-url": ("server_url", str, "the URL the nodes reach this sidecar at (default: its own)"),
    "--workdir": ("workdir", str, "a folder the nodes see for outputs and the credential file, inside "
                                      "$XPUFLEET_HOME/slurm/NAME or a root in XPUFLEET_SLURM_WORKDIR_ROOTS"),
}


def add_slurm_options(c: argparse.ArgumentParser) -> None:
    """The ``--slurm`` options of ``pools create``."""
    c.add_argument("--slurm", action="store_true", help="the sidecar submits Slurm jobs whose agents join the pool")
    for opt, (dest, typ, text) in SLURM_OPTIONS.items():
        c.add_argument(opt, dest=f"slurm_{dest}", type=typ, default=None, help=text)
    c.add_argument("--sbatch-args", dest="slurm_sbatch_args", default=None, metavar="ARGS",
                   help="more sbatch options, shell-quoted, e.g. \"--qos=long --mem=8G\" (only resource options: "
                        "docs/slurm-and-k8s.md lists them)")


def slurm_body(args: argparse.Namespace) -> dict[str, Any]:
    """``{"slurm": {...}}`` for ``POST /api/pools`` (empty without --slurm; a Slurm option alone is refused)."""
    fields = {dest: getattr(args, f"slurm_{dest}") for dest, _, _ in SLURM_OPTIONS.values()}
    fields = {k: v for k, v in fields.items() if v is not None}
    if args.slurm_sbatch_args is not None:
        fields["sbatch_args"] = shlex.split(args.slurm_sbatch_args)
    if not args.slurm:
        if fields:
            given = sorted(opt for opt, (dest, _, _) in SLURM_OPTIONS.items() if dest in fields)
            given += ["--sbatch-args"] if "sbatch_args" in fields else []
            print(f"xpufleet: error: {', '.join(given)} only apply to a Slurm pool: add --slurm", file=sys.stderr)
            raise SystemExit(EXIT_USAGE)
        return {}
    return {"slurm": fields}


def print_jobs(pool: dict[str, Any]) -> None:
    """A Slurm pool's jobs under its line in ``xpufleet pools``."""
    for job in pool.get("jobs") or []:
        run = f", run {job['run_id'][:8]}" if job.get("run_id") else ""
        joined = ", joined" if job.get("joined") else ""
        print(f"  Slurm job {job['id']}: {job['status']}{joined}{run}")
        if job.get("report"):
            print(f"    {job['report']}")
    if (pool.get("slurm") or {}).get("error"):
        print(f"  Slurm: {pool['slurm']['error']}")


def add_export_parser(sub: Any) -> None:
    """``pools export NAME --format k8s ...``."""
    e = sub.add_parser("export", help="manifests that start one-shot agents joining the pool (Kubernetes)")
    e.add_argument("name", help="pool name")
    e.add_argument("--format", default="k8s", choices=["k8s"], help="k8s: a Secret and an Indexed Job")
    e.add_argument("--image", help="the container image with xpufleet installed")
    e.add_argument("--namespace", help="the Kubernetes namespace (default: default)")
    e.add_argument("--gpus", type=int, help="nvidia.com/gpu limit of each pod (default 1)")
    e.add_argument("--instances", type=int, help="pods (one-shot agents) the Job starts (default 1)")
    e.add_argument("--python", help="the python in the image (default python3)")
    e.add_argument("--node-selector", action="append", metavar="KEY=VALUE",
                   help="the pods' node selector (default nvidia.com/gpu.present=true); repeat for more")
    e.add_argument("--server-url", help="the URL the pods reach this sidecar at (default: the CLI's)")
    e.add_argument("--credential-file", help="a file holding the pool's current credential (default: a "
                                              "manual pool's credential is reissued)")
    e.add_argument("-o", "--output", help="write the manifests here (default: stdout)")


def run_export(args: argparse.Namespace, client: Any) -> int:
    """Ask the sidecar for the manifests and write them."""
    body: dict[str, Any] = {"format": args.format}
    for field in ("image", "namespace", "gpus", "instances", "python", "server_url"):
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    if args.node_selector:
        pairs = [s.split("=", 1) for s in args.node_selector]
        if any(len(p) != 2 for p in pairs):
            print("xpufleet: error: --node-selector takes KEY=VALUE", file=sys.stderr)
            return EXIT_USAGE
        body["node_selector"] = dict(pairs)
    if args.credential_file:
        body["credential"] = Path(args.credential_file).read_text().strip()
    out = client.request("POST", f"/api/pools/{urllib.parse.quote(args.name)}/export", body)
    if out["reissued"]:
        print(f"pool {args.name}: its credential was reissued for these manifests (instances that joined with "
              f"the old one go on; others need the new one)", file=sys.stderr)
    if args.output:
        Path(args.output).write_text(out["manifests"])
        Path(args.output).chmod(0o600)  # the Secret holds the credential
    else:
        sys.stdout.write(out["manifests"])
    return EXIT_OK

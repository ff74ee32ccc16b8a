"""``xpufleet study SPEC.yaml`` (start an Optuna study, show its trials live until it ends) and
``xpufleet studies [show ID | cancel ID]``.

Exit codes: 0 the study finished with a best trial; 1 it failed, was cancelled, or no trial completed;
2 a spec the server rejects (nothing was queued); 3 no sidecar; 130 detached (the study keeps running).
"""

from __future__ import annotations

import argparse
from typing import Any

from ...common.client import Client
from .batches import Kind, add_commands, follow_queued, manage
from .common import EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, client_or_exit, read_input
from .specs import load_spec, render, write_outputs

ACTIVE = ("running", "cancelling")


def add_parser(sub: Any) -> None:
    """The ``study`` and ``studies`` commands."""
    add_commands(sub, STUDIES, {"start": "start an Optuna study from a YAML spec and show its trials live",
                                "verb": "Start", "table": "the trials", "show": "one study's trials and best trial",
                                "cancel": "cancel: no new trial; queued and running trials stop"}, cmd_study, cmd_studies)


def trial_lines(study: dict[str, Any], limit: int) -> list[str]:
    obj = study["objective"]
    paths = study["parameters"]
    counts = ", ".join(f"{n} {s}" for s, n in sorted(study["counts"].items())) or "no trial yet"
    lines = [f"study {study['name']} ({study['id'][:8]}): {study['status']}; {len(study['trials'])} of "
             f"{study['n_trials']} trials: {counts}; {obj['direction']} {obj['metric']}"]
    if study.get("error"):
        lines.append(f"error: {study['error']}")
    trials = study["trials"][-limit:]
    rows = [[t["number"], t["state"], t["value"], *[t["parameters"].get(p) for p in paths], t["run_status"],
             t["worker_id"] or ("this server" if t["devices"] else None), t["devices"], t["reason"]] for t in trials]
    lines += render(["#", "STATE", obj["metric"].upper(), *paths, "RUN", "WORKER", "DEVICES", "NOTE"], rows)
    best = study.get("best_trial")
    if best is not None:
        values = ", ".join(f"{k}={v}" for k, v in best["parameters"].items())
        lines.append(f"best so far: trial {best['number']} ({values}): {obj['metric']} {best['value']:.6g}")
    return lines


def _finish(client: Client, study: dict[str, Any], args: argparse.Namespace) -> int:
    write_outputs(client, "studies", study, "trials.csv", args)
    return EXIT_OK if study["status"] == "finished" and study.get("best_trial") else EXIT_RUN_FAILED


def cmd_study(args: argparse.Namespace) -> int:
    body = read_input(load_spec, args.spec)
    if body is None:
        return EXIT_USAGE
    client = client_or_exit()
    answer = client.request("POST", "/api/studies", body)
    return follow_queued(client, STUDIES, answer, args, f"started study {answer['study_id']}: {answer['n_trials']} "
                                                        f"trials, {answer['parallel']} at a time")


def cmd_studies(args: argparse.Namespace) -> int:
    return manage(STUDIES, args)


STUDIES = Kind("studies", "study", "n_trials", "TRIALS", "STATES", trial_lines, lambda s: s["status"] not in ACTIVE,
               _finish, lambda s: f"study {s['id']}: {s['status']}")

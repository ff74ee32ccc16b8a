"""``xpufleet study SPEC.yaml`` (start an Optuna study, show its trials live until it ends) and
``xpufleet studies [show ID | cancel ID]``.

Exit codes: 0 the study finished with a best trial; 1 it failed, was cancelled, or no trial completed;
2 a spec the server rejects (nothing was queued); 3 no sidecar; 130 detached (the study keeps running).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ...common.client import Client
from .common import EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, client_or_exit, err
from .specs import LiveTable, item_path, load_spec, render, resolve_id, write_outputs
from .specs import follow as follow_item

ACTIVE = ("running", "cancelling")


def add_parser(sub: Any) -> None:
    """The ``study`` and ``studies`` commands."""
    p = sub.add_parser("study", help="start an Optuna study from a YAML spec and show its trials live",
                       description="Start a study (the body of POST /api/studies written as YAML; graph may be a "
                                   "path to a graph JSON file next to the spec) and follow it.")
    p.add_argument("spec", help="study spec (YAML)")
    p.add_argument("--no-wait", action="store_true", help="print the study id and return")
    p.add_argument("--csv", metavar="FILE", help="write the trials as CSV at the end")
    p.add_argument("--json", action="store_true", help="print the final study as JSON")
    p.set_defaults(func=cmd_study)

    s = sub.add_parser("studies", help="list studies, show one, cancel one")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    ssub = s.add_subparsers(dest="studies_command", metavar="{list,show,cancel}")
    ssub.add_parser("list", help="studies, newest first")
    show = ssub.add_parser("show", help="one study's trials and best trial")
    show.add_argument("study_id")
    show.add_argument("--csv", metavar="FILE", help="write the trials as CSV ('-': standard output)")
    show.add_argument("--watch", action="store_true", help="follow it live until it ends")
    cancel = ssub.add_parser("cancel", help="cancel: no new trial; queued and running trials stop")
    cancel.add_argument("study_id")
    cancel.add_argument("--reason", help="recorded on each cancelled run")
    s.set_defaults(func=cmd_studies)


def _path(item_id: str, tail: str = "") -> str:
    return item_path("studies", item_id, tail)


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


def follow(client: Client, study_id: str, view: LiveTable) -> dict[str, Any]:
    """Long-poll the study, redrawing its table, until it has ended."""
    return follow_item(client, "studies", study_id, view, trial_lines, lambda item: item["status"] not in ACTIVE)


def _finish(client: Client, study: dict[str, Any], args: argparse.Namespace) -> int:
    write_outputs(client, "studies", study, "trials.csv", args)
    return EXIT_OK if study["status"] == "finished" and study.get("best_trial") else EXIT_RUN_FAILED


def _resolve(client: Client, prefix: str) -> str:
    return resolve_id(client, "studies", prefix)


def cmd_study(args: argparse.Namespace) -> int:
    try:
        body = load_spec(args.spec)
    except ValueError as exc:
        err(str(exc))
        return EXIT_USAGE
    client = client_or_exit()
    answer = client.request("POST", "/api/studies", body)
    study_id = answer["study_id"]
    if args.no_wait:
        print(study_id)
        return EXIT_OK
    print(f"started study {study_id}: {answer['n_trials']} trials, {answer['parallel']} at a time", file=sys.stderr)
    try:
        study = follow(client, study_id, LiveTable())
    except KeyboardInterrupt:
        err(f"detached from study {study_id}; it keeps running (stop it with: xpufleet studies cancel {study_id})")
        return 130
    return _finish(client, study, args)


def cmd_studies(args: argparse.Namespace) -> int:
    client = client_or_exit()
    command = args.studies_command or "list"
    if command == "list":
        page = client.request("GET", "/api/studies", params={"limit": 100})
        if args.json:
            print(json.dumps(page, indent=2))
            return EXIT_OK
        rows = [[s["id"][:8], s["name"], s["status"], s["n_trials"],
                 ", ".join(f"{n} {st}" for st, n in sorted(s["counts"].items())), s["objective"]["metric"]]
                for s in page["studies"]]
        for line in render(["ID", "NAME", "STATUS", "TRIALS", "STATES", "OBJECTIVE"], rows):
            print(line)
        return EXIT_OK
    study_id = _resolve(client, args.study_id)
    if command == "cancel":
        study = client.request("POST", _path(study_id, "/cancel"), {"reason": args.reason} if args.reason else None)
        print(f"study {study['id']}: {study['status']}")
        return EXIT_OK
    if args.watch:
        study = follow(client, study_id, LiveTable())
    else:
        study = client.request("GET", _path(study_id))
        if not (args.json or args.csv == "-"):
            for line in trial_lines(study, 10**6):
                print(line)
    code = _finish(client, study, args)
    return code if study["status"] not in ACTIVE else EXIT_OK

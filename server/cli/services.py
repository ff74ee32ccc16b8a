"""``xpufleet serve SPEC.json`` and ``xpufleet services ...``: distributed inference Units (docs/services.md).

``serve`` creates a service from the body of ``POST /api/services`` (options override its fields);
``services list|show|update|delete|export|infer`` manage it. ``show`` exits 1 when the service is
``failed`` (its restart budget is spent), so a script sees it; ``--wait`` waits for ``ready`` (or, for
``update``, for the rolling update to end) and exits 1 when it ends otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from ...common.client import Client
from .common import EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, client_or_exit, command_group, err

POLL_S = 0.5  # services have no push channel: a bounded poll


def add_parser(sub: Any) -> None:
    """The ``serve`` and ``services`` commands."""
    p = sub.add_parser("serve", help="start a service of distributed inference units from a spec file",
                       description="Create a service: SPEC.json is the body of POST /api/services "
                                   "(samples/serve_mlp_digits.json); the options override its fields.")
    p.add_argument("spec", help="the service spec (JSON)")
    p.add_argument("--name", help="service name")
    p.add_argument("--replicas", type=int, help="number of units")
    p.add_argument("--size", type=int, help="instances per unit (one card each)")
    guard = p.add_mutually_exclusive_group()
    guard.add_argument("--guard", dest="guard", action="store_true", default=None,
                       help="any instance failing restarts the whole unit (new generation, barrier)")
    guard.add_argument("--no-guard", dest="guard", action="store_false", help="only the failed instance restarts")
    p.add_argument("--target", help="\"any\" (default) or a worker name")
    p.add_argument("--device", help="each instance's card: auto, cuda, cuda:N, xpu, cpu")
    _wait_options(p)
    p.set_defaults(func=cmd_serve)

    s, ssub, json_opt = command_group(sub, "services", "list and manage services (distributed inference units)",
                                      "Services of the running sidecar",
                                      ("show", "update", "delete", "export", "infer"), "every service with its units")
    c = ssub.add_parser("show", help="one service: units and instances (exit 1 when it failed)", parents=[json_opt])
    c.add_argument("name")
    c = ssub.add_parser("update", help="rolling update to a new spec (whole units, make-before-break)",
                        parents=[json_opt])
    c.add_argument("name")
    c.add_argument("spec", help="the new spec (JSON, the body of PUT /api/services/NAME)")
    _wait_options(c, json_flag=False)
    c = ssub.add_parser("delete", help="drain and stop every unit, then remove the service", parents=[json_opt])
    c.add_argument("name")
    c = ssub.add_parser("export", help="write the service as a Kubernetes manifest")
    c.add_argument("name")
    c.add_argument("--format", default="lws", choices=["lws"], help="lws: a LeaderWorkerSet and its Service")
    c.add_argument("--image", help="the container image (one with xpufleet installed)")
    c.add_argument("--namespace", help="the Kubernetes namespace")
    c.add_argument("-o", "--output", help="write to this file instead of stdout")
    c = ssub.add_parser("infer", help="send one request (a JSON file, the body of /infer) and print the answer")
    c.add_argument("name")
    c.add_argument("request", help="the request body (samples/serve_mlp_digits.request.json)")
    s.set_defaults(func=cmd_services)


def _wait_options(p: argparse.ArgumentParser, json_flag: bool = True) -> None:
    p.add_argument("--wait", action="store_true", help="wait until it is ready (update: until the update ends)")
    p.add_argument("--timeout", type=float, default=600.0, help="with --wait: give up after this many seconds")
    if json_flag:
        p.add_argument("--json", action="store_true", help="machine-readable output")


def _read(path: str, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SystemExit(_usage(f"cannot read the {what} {path}: {exc.strerror or exc}")) from None
    except ValueError as exc:
        raise SystemExit(_usage(f"the {what} {path} is not valid JSON: {exc}")) from None


def _usage(msg: str) -> int:
    err(msg)
    return EXIT_USAGE


def cmd_serve(args: argparse.Namespace) -> int:
    body = _read(args.spec, "service spec")
    if not isinstance(body, dict):
        return _usage(f"{args.spec} must hold a JSON object (the body of POST /api/services)")
    if args.name:
        body["name"] = args.name
    if args.replicas is not None:
        body["replicas"] = args.replicas
    if args.size is not None or args.guard is not None:
        unit = dict(body.get("unit") or {})
        if args.size is not None:
            unit["size"] = args.size
        if args.guard is not None:
            unit["guard"] = args.guard
        body["unit"] = unit
    if args.target or args.device:
        target = body.get("target") if isinstance(body.get("target"), dict) else {}
        target = dict(target)
        if args.target:
            target["worker"] = args.target
        if args.device:
            target["device"] = args.device
        body["target"] = target
    client = client_or_exit()
    svc = client.request("POST", "/api/services", body)
    if not args.wait:
        _emit(args, svc)
        return EXIT_OK
    return _wait_ready(client, svc["name"], args)


def _path(name: str, tail: str = "") -> str:
    return f"/api/services/{urllib.parse.quote(name)}{tail}"


def _wait_ready(client: Client, name: str, args: argparse.Namespace, update: bool = False) -> int:
    deadline = time.monotonic() + args.timeout
    while True:
        svc = client.request("GET", _path(name))
        upd = svc.get("update") or {}
        if update:
            done = upd.get("state") not in ("rolling", "rolling_back")
            ok = upd.get("state") == "done"
        else:
            done = svc["state"] in ("ready", "failed")
            ok = svc["state"] == "ready"
        if done or time.monotonic() >= deadline:
            _emit(args, svc)
            if not done:
                err(f"service {name} is still {svc['state']} after {args.timeout:g} s")
            return EXIT_OK if done and ok else EXIT_RUN_FAILED
        time.sleep(POLL_S)


def cmd_services(args: argparse.Namespace) -> int:
    cmd = getattr(args, "services_command", None) or "list"
    if cmd == "export":
        return _export(args)
    client = client_or_exit()
    if cmd == "list":
        out = client.request("GET", "/api/services")
        if args.json:
            print(json.dumps(out, indent=2))
            return EXIT_OK
        if not out["services"]:
            print("no services: `xpufleet serve samples/serve_mlp_digits.json` starts one")
        for svc in out["services"]:
            _print_service(svc, brief=True)
        return EXIT_OK
    if cmd == "show":
        svc = client.request("GET", _path(args.name))
        _emit(args, svc)
        return EXIT_RUN_FAILED if svc["state"] == "failed" else EXIT_OK
    if cmd == "update":
        body = _read(args.spec, "service spec")
        svc = client.request("PUT", _path(args.name), body)
        if svc.get("unchanged"):
            print(f"service {args.name}: the spec is unchanged; nothing to update")
            return EXIT_OK
        if not args.wait:
            _emit(args, svc)
            return EXIT_OK
        return _wait_ready(client, args.name, args, update=True)
    if cmd == "delete":
        out = client.request("DELETE", _path(args.name), timeout=600)
        print(json.dumps(out, indent=2) if args.json else f"service {out['deleted']} deleted "
              f"({len(out['units'])} unit(s) stopped)")
        return EXIT_OK
    out = client.request("POST", _path(args.name, "/infer"), _read(args.request, "request"), timeout=600)
    print(json.dumps(out, indent=2))
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    client = client_or_exit()
    params = {"format": args.format, "image": args.image, "namespace": args.namespace}
    text = client.request("GET", _path(args.name, "/export"), params=params, raw=True).decode("utf-8")
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output} (kubectl apply -f {args.output})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _emit(args: argparse.Namespace, svc: dict[str, Any]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(svc, indent=2))
    else:
        _print_service(svc, brief=False)


def _print_service(svc: dict[str, Any], brief: bool) -> None:
    print(f"service {svc['name']}: {svc['state']} (version {svc['version']}, {svc['ready_units']}/{svc['replicas']} "
          f"unit(s) ready)")
    upd = svc.get("update")
    if upd:
        why = f": {upd['reason']}" if upd.get("reason") else ""
        print(f"  update {upd['from_version']} -> {upd['to_version']}: {upd['state']}{why}")
    for u in svc["units"]:
        detail = f" ({u['detail']})" if u.get("detail") else ""
        print(f"  unit {u['id']}: {u['state']}{detail}, generation {u['generation']}, guard "
              f"{'on' if u['guard'] else 'off'}, {u['restarts_in_window']} restart(s) of {u['restart_budget']}")
        if u.get("failed_reason") and u["state"] == "failed":
            print(f"    failed: {u['failed_reason']}")
        if brief:
            continue
        for i in u["instances"]:
            where = f"{i['worker']} {i['device']}" if i["worker"] else f"waiting for a card ({i['waiting_reason']})"
            last = f", last exit: {i['last_exit']}" if i.get("last_exit") else ""
            print(f"    rank {i['rank']}: {where}, pid {i['pid'] or '-'}, {i['state']}, "
                  f"{i['restarts']} restart(s){last}")

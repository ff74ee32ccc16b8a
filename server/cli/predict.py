"""``xpufleet predict WORKFLOW.json [--platform P] [--worker W --device D] [--server URL] [--json]``.

Without ``--worker``/``--server`` the prediction is computed here, for this machine's device (this
process's snapshot; torch is imported to see Intel/AMD cards). With ``--worker`` (or ``--server``) the
sidecar's ``POST /api/predict`` answers, using the worker card's heartbeat figures; the sidecar's URL
and token come from ``$XPUFLEET_HOME/runtime.json`` unless ``--server`` names the URL.

Exit codes (as the rest of ``xpufleet``): 0 answered; 1 the sidecar failed; 2 bad input (file, JSON,
workflow, option, unknown device or card); 3 no sidecar reachable, or it refused the token.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

from .common import EXIT_OK, EXIT_UNREACHABLE
from .common import EXIT_RUN_FAILED as EXIT_FAILED
from .common import EXIT_USAGE as EXIT_BAD_INPUT

# The exit codes are every xpufleet command's (cli/common.py): a bad file or option is a usage error.
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``predict`` sub-command to an argparse subparsers object (sets ``func=run``)."""
    p = subparsers.add_parser(
        "predict",
        help="predict a workflow's success rate on a device (docs/predictor.md's P_success)",
        description="Scan a ComfyUI workflow (UI or API JSON, or a PNG ComfyUI saved) for its model files "
        "and predict its success rate on this machine's device or a worker's card.",
    )
    p.add_argument("workflow", help="workflow file: UI or API format JSON, or a ComfyUI PNG")
    p.add_argument("--platform", help="nvidia, intel or another configured name (default: the device's)")
    p.add_argument("--worker", help="predict on this worker's card (asks the sidecar)")
    p.add_argument("--device", help="device, e.g. cuda:1 (with --worker: the worker's card)")
    p.add_argument("--server", help="sidecar URL (default: from $XPUFLEET_HOME/runtime.json)")
    p.add_argument("--json", action="store_true", help="print the full answer as JSON")
    p.add_argument("--weight-bytes", action="store_true", help="P3: weight bytes from safetensors/GGUF headers")
    p.add_argument("--topology", action="store_true", help="P3: peak over models resident together")
    p.add_argument("--activation-overhead", nargs="?", const=True, type=_fraction, metavar="FRACTION",
                   help="P3: add activation overhead (default fraction 0.2 of M_peak)")
    p.add_argument("--calibration", action="store_true", help="P3: scale by measured run peaks")
    p.set_defaults(func=run)
    return p


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= v <= 4:
        raise argparse.ArgumentTypeError("a fraction from 0 to 4")
    return v


def png_workflow(data: bytes) -> Any:
    """The workflow ComfyUI embedded in a PNG (``workflow`` tEXt chunk, else ``prompt``)."""
    pos, found = len(_PNG_SIGNATURE), {}
    while pos + 8 <= len(data):
        length, ctype = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if ctype == b"tEXt":
            key, _, value = chunk.partition(b"\x00")
            found[key.decode("latin-1")] = value.decode("utf-8", "replace")
        elif ctype == b"iTXt":
            key, _, rest = chunk.partition(b"\x00")
            compressed, _method = rest[0], rest[1]
            _lang, _, rest = rest[2:].partition(b"\x00")
            _tkey, _, text = rest.partition(b"\x00")
            found[key.decode("latin-1")] = (zlib.decompress(text) if compressed else text).decode("utf-8", "replace")
        elif ctype == b"IEND":
            break
    for key in ("workflow", "prompt"):
        if key in found:
            return json.loads(found[key])
    raise ValueError("the PNG holds no ComfyUI workflow (no 'workflow' or 'prompt' text chunk)")


def load_workflow(path: str) -> Any:
    """Read a workflow file; ValueError saying what is wrong with it."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if data.startswith(_PNG_SIGNATURE):
        return png_workflow(data)
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None


def _options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if args.weight_bytes:
        opts["weight_bytes"] = True
    if args.topology:
        opts["topology"] = True
    if args.activation_overhead is not None:
        opts["activation_overhead"] = args.activation_overhead
    if args.calibration:
        opts["calibration"] = True
    return opts


def _remote(args: argparse.Namespace, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST the request to the sidecar through the one client: (exit code, answer or {"error"})."""
    from ...common.client import ApiError, Client, SidecarUnreachable
    from ...common.runtime_file import read_runtime

    runtime = read_runtime() or {}
    url = (args.server or runtime.get("url") or "").rstrip("/")
    if not url:
        return EXIT_UNREACHABLE, {"error": "no sidecar: none is running (no runtime.json); start one with "
                                      "`xpufleet start` or pass --server URL"}
    same = url == str(runtime.get("url") or "").rstrip("/")
    client = Client(url, runtime.get("token"), timeout=60.0,
                    fingerprint=runtime.get("tls_fingerprint") if same else None)
    try:
        return EXIT_OK, client.request("POST", "/api/predict", body)
    except ApiError as exc:
        msg = exc.message
        if exc.status in (401, 403):
            code = EXIT_UNREACHABLE
            msg = f"{msg}; is the runtime file from another server?"
        else:
            code = EXIT_BAD_INPUT if 400 <= exc.status < 500 else EXIT_FAILED
        return code, {"error": f"sidecar: {msg} (HTTP {exc.status})"}
    except SidecarUnreachable as exc:
        return EXIT_UNREACHABLE, {"error": f"sidecar not reachable: {exc}"}


def _local(args: argparse.Namespace, workflow: Any) -> tuple[int, dict[str, Any]]:
    from ...predictor.service import predict_workflow
    from ...predictor.snapshot import take_snapshot

    try:
        snap = take_snapshot(args.device, import_torch=True)
        return EXIT_OK, predict_workflow(workflow, snap, platform=args.platform, options=_options(args))
    except ValueError as exc:
        return EXIT_BAD_INPUT, {"error": str(exc)}


def format_answer(a: dict[str, Any]) -> str:
    """The human-readable report."""
    e = a["explanation"]
    i, m = e["intermediates"], e["models"]
    snap = a["snapshot"]
    where = f"{snap.get('worker')}/{snap['device']}" if snap.get("worker") else snap["device"]
    if a.get("p_success") is None:  # a missing model file: no rate (docs/predictor.md, "Missing model files")
        first = a["missing"][0] if a.get("missing") else {}
        head = (f"Success rate: none ({a['label']['en']} / {a['label']['zh']}): "
                f"{first.get('name') or 'no file chosen'} (node {first.get('node')})")
    else:
        head = f"Success rate: {a['p_success']}%  {a['label']['en']} / {a['label']['zh']}"
    lines = [
        head,
        f"  device {where} {snap.get('name') or ''}  platform {e['platform']} (gamma {e['gamma']:g})"
        + ("  [SIMULATED figures]" if a.get("simulated") else ""),
        f"  M_peak {'>= ' if m.get('lower_bound') else ''}{m['m_peak_gb']:.2f} GB   M_total {m['m_total_gb']:.2f} GB   V_eff {i['v_eff_gb']:.2f} GB"
        f"   RAM free {i['c_ram_gb']:.2f} GB   virtual {i['s_virt_gb']:.2f} GB",
        f"  P_peak {i['p_peak']:.3f}   P_load {i['p_load']:.3f} ({i['p_load_branch']})",
    ]
    if a["models"]:
        lines.append("Models:")
        for r in a["models"]:
            size = f"{r['size_gb']:8.2f} GB" if r["status"] == "found" else f"{'-':>8}   "
            lines.append(f"  {r['status']:<10} {size}  {r['folder']}/{r['name']}  (node {r['node']} {r['class_type']})")
    else:
        lines.append("Models: none found in the workflow")
    for w in a.get("warnings") or []:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run ``xpufleet predict``; prints the answer (or the error on stderr) and returns the exit code."""
    try:
        workflow = load_workflow(args.workflow)
    except ValueError as exc:
        print(f"xpufleet predict: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.worker and not args.device:
        print("xpufleet predict: --worker needs --device (the worker's card, e.g. cuda:0)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.worker or args.server:
        body: dict[str, Any] = {"workflow": workflow, "options": _options(args)}
        if args.platform:
            body["platform"] = args.platform
        if args.worker:
            body["worker"] = args.worker
        if args.device:
            body["device"] = args.device
        code, answer = _remote(args, body)
    else:
        code, answer = _local(args, workflow)
    if code != EXIT_OK:
        from .text import safe

        print(f"xpufleet predict: {safe(answer['error'], lines=True)}", file=sys.stderr)
        return code
    from .text import safe  # model names and warnings come from the workflow file

    print(json.dumps(answer, indent=2, ensure_ascii=False) if args.json else safe(format_answer(answer), lines=True))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m xpufleet.server.cli.predict``) until the main CLI wires it in."""
    parser = argparse.ArgumentParser(prog="xpufleet")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

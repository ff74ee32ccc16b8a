"""Results come home (docs/comfyui.md): a ComfyUI run's output files, made on a fleet card, copied into the
output folder of the ComfyUI that shows it, so its page can show them (``/view``) and they stay with its
other results.

``POST /xpufleet/runs/{run_id}/home`` (body ``{}``) on ComfyUI's server: for a succeeded run, reads the
run's recorded outputs from the sidecar (``GET /api/runs/{id}/outputs``, each node's manifest, each file;
the layout of docs/comfyui.md "Recorded outputs of a ComfyUI run") through the one sidecar client
(common/client.py), with the browser's pairing as its bearer, and writes each image, video, audio or other
file into ``<ComfyUI output>/xpufleet/<run id>/<node>_<file>``. Answers ``{"run_id", "subfolder", "files":
[{node, class_type, file, kind, media_type, bytes, subfolder, type: "output", url, copied}]}``; ``url`` is
ComfyUI's own ``/view`` address of the copy.

- Idempotent: a file already there with the size the manifest names is not fetched again.
- Names: the run id is checked (letters, digits, ``-``, ``_``); node ids and file names are made safe
  (server/run/outputs.py ``safe_name``), so no name leads out of the run's folder; a folder on the way that
  is a symbolic link, or a symbolic link where a file goes, is refused (403) and nothing is written there.
- Limits: ``MAX_FILE_BYTES`` per file, ``MAX_RUN_BYTES`` and ``MAX_FILES`` per run (413 naming the file).
- Guarded like the plugin's other routes that act on the fleet (guard.py: Host, Origin, preflight,
  pairing).

A training run submitted with ``record_outputs: "upload"`` also brings its saved models home (issue 30
§2): for each ModelSaver of its graph, the model recorded at the node feeding it (weights as safetensors,
its architecture in the manifest) is written into ComfyUI's model folder for the plugin
(``models/xpufleet/<ModelSaver's filename>``, ``.safetensors``) in ModelSaver's own format, so a
ModelLoader given the same filename finds it. The answer lists them under ``models``.
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
import urllib.parse
from pathlib import Path
from typing import Any

from ...common import atomic
from ...common.errors import ApiError
from ...constants import PLUGIN_NAME, home_dir
from ..run.outputs import record_mode, safe_name

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
HOME_KINDS = frozenset({"image", "video", "audio", "file"})  # what a ComfyUI output node writes
MAX_FILE_BYTES = 1024 * 1024 * 1024  # the sidecar reads no larger file whole (workers/outputs.py)
MAX_RUN_BYTES = 8 * 1024 * 1024 * 1024
MAX_FILES = 2000
MAX_NAME_CHARS = 200
_TIMEOUT_S = 120.0  # one request to the sidecar (a file of up to MAX_FILE_BYTES on loopback)

_q = urllib.parse.quote
SAVER_CLASS = "XPUModelSaver"
_MARK = ".xpufleet-home.json"  # beside a model that came home: which run's (not one of ComfyUI's model files)


def check_run_id(run_id: Any) -> str:
    if not isinstance(run_id, str) or not RUN_ID.match(run_id):
        raise ApiError(400, f"run id {str(run_id)[:80]!r} is not a run id (letters, digits, '-' and '_', at most 64)")
    return run_id


def local_name(node: str, file: str) -> str:
    """The copy's file name: node and file made safe, one flat folder per run."""
    name = f"{safe_name(node)}_{safe_name(file)}"
    if len(name) > MAX_NAME_CHARS:  # keep the extension
        stem, dot, ext = name.rpartition(".")
        name = f"{stem[:MAX_NAME_CHARS - len(ext) - 1]}.{ext}" if dot and len(ext) <= 16 else name[:MAX_NAME_CHARS]
    return name


def run_folder(output_dir: Path, run_id: str, make: bool = True) -> Path:
    """``<output>/xpufleet/<run id>`` (made with ``make``); 403 when a part of it is a symbolic link or leads
    elsewhere."""
    root = Path(output_dir).resolve()
    folder = root / PLUGIN_NAME / check_run_id(run_id)
    for part in (root / PLUGIN_NAME, folder):
        if part.is_symlink():
            raise ApiError(403, f"{part} is a symbolic link: a run's results are written only into a real folder "
                                f"inside ComfyUI's output folder {root}", {"refused": "symlink"})
    if not make:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    if folder.resolve() != folder or not folder.is_relative_to(root):
        raise ApiError(403, f"{folder} leads outside ComfyUI's output folder {root}", {"refused": "outside"})
    return folder


def view_url(name: str, subfolder: str) -> str:
    """ComfyUI's own address of an output file."""
    return "/view?" + urllib.parse.urlencode({"filename": name, "subfolder": subfolder, "type": "output"})


def _sidecar_error(exc: Exception) -> ApiError:
    from ...common.client import ApiError as ClientError

    if isinstance(exc, ClientError):
        extra = exc.body if isinstance(exc.body, dict) else None
        extra = {k: v for k, v in (extra or {}).items() if k != "error"} or None
        return ApiError(exc.status, f"the sidecar: {exc.message}", extra)
    return ApiError(503, str(exc))


def model_path(filename: Any) -> str:
    """ModelSaver's filename as a path inside the model folder: each part made safe, ``.safetensors``;
    400 for a name with ``..`` or none."""
    parts = [p for p in re.split(r"[\\/]+", str(filename or "")) if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ApiError(400, f"ModelSaver's filename {str(filename)[:200]!r} cannot come home: give it a name "
                            f"inside its folder (no '..')")
    parts = [safe_name(p) for p in parts]
    stem, dot, _ext = parts[-1].rpartition(".")
    parts[-1] = f"{stem if dot else parts[-1]}.safetensors"
    return "/".join(parts)


def with_model_metadata(data: bytes, spec: Any) -> bytes:
    """A recorded model (safetensors, weights only) with ModelSaver's metadata (format, version, the
    architecture) so ModelLoader rebuilds it; the tensors' bytes are kept as they are."""
    from ...nodes.lib.modelfile import MODEL_FORMAT, MODEL_VERSION

    if len(data) < 8:
        raise ApiError(502, "the recorded model is not a safetensors file")
    n = struct.unpack("<Q", data[:8])[0]
    try:
        header = json.loads(data[8:8 + n])
    except ValueError:
        raise ApiError(502, "the recorded model is not a safetensors file") from None
    header["__metadata__"] = {"format": MODEL_FORMAT, "version": str(MODEL_VERSION), "xpu_spec": json.dumps(spec)}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data[8 + n:]


def _inside(root: Path, rel: str) -> Path:
    """``root/rel`` made (its folders), or 403 when a folder on the way is a symbolic link or leads out."""
    root = root.resolve()
    target = root.joinpath(*rel.split("/"))
    part = root
    for name in rel.split("/")[:-1]:
        part = part / name
        if part.is_symlink():
            raise ApiError(403, f"{part} is a symbolic link: a model comes home only into a real folder",
                           {"refused": "symlink"})
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.parent.resolve().is_relative_to(root) or target.is_symlink():
        raise ApiError(403, f"{target} leads outside ComfyUI's model folder {root}", {"refused": "symlink"})
    return target


def bring_models(client: Any, rid: str, run: dict[str, Any], manifest: Any, models_dir: Path) -> list[dict[str, Any]]:
    """A training run's saved models into ``models_dir`` (see the module's text); ``manifest(node)``: a
    recorded node's manifest."""
    out = []
    for saver, spec in sorted((run.get("graph") or {}).items()):
        if not isinstance(spec, dict) or spec.get("class_type") != SAVER_CLASS:
            continue
        link = (spec.get("inputs") or {}).get("model")
        if not (isinstance(link, list) and len(link) == 2):
            continue
        source, index = str(link[0]), link[1]
        try:
            recorded = manifest(source)
        except Exception:
            continue  # the node feeding it recorded nothing
        model = next((o for o in recorded.get("outputs") or []
                      if o.get("kind") == "model" and o.get("index") == index and o.get("file")), None)
        if model is None:
            continue
        rel = model_path((spec.get("inputs") or {}).get("filename"))
        target = _inside(models_dir, rel)
        mark = target.with_name(f".{target.name}{_MARK}")
        said = {"run_id": run.get("id"), "node": source, "file": model["file"]}
        copied = False
        try:
            kept = json.loads(mark.read_text()) if target.is_file() else None
        except (OSError, ValueError):
            kept = None
        if kept != said:
            data = client.request("GET", f"/api/runs/{rid}/outputs/{_q(source, safe='')}/{_q(model['file'], safe='')}",
                                  raw=True, timeout=_TIMEOUT_S)
            if len(data) > MAX_FILE_BYTES:
                raise ApiError(413, f"the model of node {source} is more than {MAX_FILE_BYTES} bytes")
            _write(target, with_model_metadata(data, model.get("spec")))
            _write(mark, json.dumps(said).encode())
            copied = True
        out.append({"node": saver, "from_node": source, "file": rel, "folder": f"models/{PLUGIN_NAME}",
                    "bytes": target.stat().st_size, "copied": copied})
    return out


def bring_home(client: Any, run_id: str, output_dir: Path, models_dir: Path | None = None) -> dict[str, Any]:
    """Copy run ``run_id``'s output files (see the module's text); ``client``: common.client.Client."""
    from ...common.client import ApiError as ClientError
    from ...common.client import SidecarUnreachable

    rid = _q(check_run_id(run_id), safe="")
    try:
        run = client.request("GET", f"/api/runs/{rid}")
        if run.get("status") != "succeeded":
            raise ApiError(409, f"run {run_id} is {run.get('status')}: its results come home once it has succeeded")
        try:
            listing = client.request("GET", f"/api/runs/{rid}/outputs")
        except ClientError as exc:
            if exc.status not in (404, 409):
                raise
            # a training run that recorded nothing here, or whose outputs stay on a worker not connected now:
            # nothing to bring home (an answer, not an error: the page asks for every run that recorded outputs)
            return {"run_id": run_id, "subfolder": f"{PLUGIN_NAME}/{run_id}", "files": [], "models": [],
                    "unavailable": exc.message}
        folder = run_folder(output_dir, run_id, make=False)  # made with its first file
        subfolder = f"{PLUGIN_NAME}/{run_id}"
        files: list[dict[str, Any]] = []
        total = 0
        manifests: dict[str, Any] = {}

        def manifest_of(node: str) -> Any:
            if node not in manifests:
                manifests[node] = client.request("GET", f"/api/runs/{rid}/outputs/{_q(node, safe='')}")
            return manifests[node]

        for entry in listing.get("nodes") or []:
            node = str(entry.get("node"))
            manifest = manifest_of(node)
            for out in manifest.get("outputs") or []:
                stored, kind = out.get("file"), out.get("kind")
                if not isinstance(stored, str) or not stored or kind not in HOME_KINDS:
                    continue  # inline values, a training run's tensors
                if len(files) >= MAX_FILES:
                    raise ApiError(413, f"run {run_id} has more than {MAX_FILES} output files: copy them with "
                                        f"GET /api/runs/{run_id}/outputs instead")
                size = out.get("bytes")
                if isinstance(size, int) and size > MAX_FILE_BYTES:
                    raise ApiError(413, f"{stored} of node {node} is {size} bytes, more than the "
                                        f"{MAX_FILE_BYTES} a file may have to come home")
                name = local_name(node, stored)
                target = folder / name
                copied = False
                if target.is_symlink():
                    raise ApiError(403, f"{target} is a symbolic link: not written through",
                                   {"refused": "symlink"})
                if not (target.is_file() and isinstance(size, int) and target.stat().st_size == size):
                    data = client.request("GET", f"/api/runs/{rid}/outputs/{_q(node, safe='')}/{_q(stored, safe='')}",
                                          raw=True, timeout=_TIMEOUT_S)
                    if len(data) > MAX_FILE_BYTES:
                        raise ApiError(413, f"{stored} of node {node} is more than {MAX_FILE_BYTES} bytes")
                    if total + len(data) > MAX_RUN_BYTES:
                        raise ApiError(413, f"run {run_id}'s files are more than {MAX_RUN_BYTES} bytes together")
                    _write(run_folder(output_dir, run_id) / name, data)
                    copied = True
                nbytes = target.stat().st_size
                total += nbytes
                files.append({"node": node, "class_type": manifest.get("class_type") or entry.get("class_type"),
                              "file": name, "kind": kind, "media_type": out.get("media_type"),
                              "name": out.get("name"), "index": out.get("index"), "bytes": nbytes,
                              "subfolder": subfolder, "type": "output", "url": view_url(name, subfolder),
                              "copied": copied})
        models: list[dict[str, Any]] = []
        if models_dir is not None and run.get("kind") != "comfyui" and record_mode(run.get("options") or {}) == "upload":
            models = bring_models(client, rid, run, manifest_of, models_dir)
    except ClientError as exc:
        raise _sidecar_error(exc) from None
    except SidecarUnreachable as exc:
        raise ApiError(503, str(exc)) from None
    return {"run_id": run_id, "subfolder": subfolder, "files": files, "models": models}


def _write(target: Path, data: bytes) -> None:
    """A temporary file in the same folder, renamed over ``target`` (a reader sees all of it or none; a
    symbolic link in ``target``'s place is replaced, never written through)."""
    atomic.write_bytes(target, data)


def _output_dir() -> Path:
    import folder_paths  # type: ignore[import-not-found]  # ComfyUI's

    return Path(folder_paths.get_output_directory())


def _models_dir() -> Path | None:
    """ComfyUI's ``models/xpufleet`` (the first folder ModelLoader looks in after ``output/xpufleet``)."""
    from ...nodes import paths

    found = paths.model_dirs()
    return found[0] if found else None


def add_home_routes(routes: Any, prefix: str) -> None:
    """Register ``POST <prefix>/runs/{run_id}/home`` behind the guard (paired: it reads the fleet's runs)."""
    from aiohttp import web

    from ...common.client import Client
    from ...common.http import read_object
    from .guard import Access, add_route, pairing_of
    from .proxy import find_sidecar, no_sidecar_message

    locks: dict[str, asyncio.Lock] = {}

    async def home(request: web.Request) -> web.Response:
        run_id = check_run_id(request.match_info["run_id"])
        await read_object(request, set(), optional=True, max_bytes=1024)
        pairing = pairing_of(request)
        found = find_sidecar(home_dir())
        if found is None:
            raise ApiError(503, no_sidecar_message(home_dir()))
        client = Client(found.url, pairing, timeout=_TIMEOUT_S, fingerprint=found.fingerprint)
        # two clicks copy once (a copy racing another is still safe: each file is renamed into place)
        lock = locks.setdefault(run_id, asyncio.Lock())
        try:
            async with lock:
                answer = await asyncio.to_thread(bring_home, client, run_id, _output_dir(), _models_dir())
        finally:
            if not lock.locked():
                locks.pop(run_id, None)
        return web.json_response(answer)

    add_route(routes, "POST", f"{prefix}/runs/{{run_id}}/home", home, Access(paired=True))

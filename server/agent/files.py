"""What an agent serves from its run folders, read in chunks for the sidecar: the outputs a run recorded
(``record_outputs``, docs/workers.md), and, while the worker is connected, the run's own folder (its output log
and the files its nodes wrote) and a listing of that folder, for the Runs panel (docs/runs-panel.md).
Every read is confined to the folder its scope names: a path that leads out is no such file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..run.outputs import outputs_dir
from ..workers.protocol import READ_SCOPES as SCOPES

LISTING_MAX = 2_000  # files in one listing (one chunk holds it whole)


class OutputsUnavailable(Exception):
    """A read this agent cannot answer (``status``: the HTTP code the sidecar returns)."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


def read_output_chunk(run_dir: Path, run_id: str, name: str, offset: int, length: int,
                      worker: str, scope: str = "outputs") -> tuple[bytes, int, bool]:
    """``(data, file size, eof)`` of ``name`` in ``scope``: under the run's recorded outputs (``outputs``),
    under its run folder (``run``), or the run folder's listing as JSON (``listing``, ``name`` unused);
    OutputsUnavailable when there is no such file there."""
    if scope not in SCOPES:
        raise OutputsUnavailable(f"scope {scope!r}: use one of {', '.join(SCOPES)}", 400)
    if scope == "listing":
        return _chunk(run_listing(run_dir, run_id, worker), offset, length)
    root = outputs_dir(run_dir) if scope == "outputs" else Path(run_dir)
    if not root.is_dir():
        what = "recorded outputs" if scope == "outputs" else "run folder"
        raise OutputsUnavailable(f"worker {worker} keeps no {what} for run {run_id} "
                                 f"(it did not record them, or its folder was removed)", 404)
    real_root = os.path.realpath(root)
    path = os.path.realpath(os.path.join(real_root, name))
    if not path.startswith(real_root + os.sep) or not os.path.isfile(path):
        what = "recorded no file" if scope == "outputs" else "has no file"
        raise OutputsUnavailable(f"run {run_id} {what} {name!r} on worker {worker}", 404)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        fh.seek(offset)
        data = fh.read(length)
    return data, size, offset + len(data) >= size


def run_listing(run_dir: Path, run_id: str, worker: str) -> bytes:
    """The run folder's files as JSON ``{"files": [{path, size, modified}], "truncated"}``: plain files only
    (no link, no ``.tmp`` being written), paths relative to the folder, at most LISTING_MAX."""
    root = Path(run_dir)
    if not root.is_dir():
        raise OutputsUnavailable(f"worker {worker} keeps no run folder for run {run_id} (it was removed)", 404)
    files: list[dict[str, object]] = []
    truncated = False
    for folder, dirs, names in os.walk(root):  # never into a linked folder (followlinks is off)
        dirs.sort()
        for name in sorted(names):
            path = Path(folder) / name
            if path.is_symlink() or not path.is_file() or name.endswith(".tmp"):
                continue
            if len(files) >= LISTING_MAX:
                truncated = True
                break
            st = path.stat()
            files.append({"path": path.relative_to(root).as_posix(), "size": st.st_size, "modified": st.st_mtime})
        if truncated:
            break
    return json.dumps({"files": files, "truncated": truncated}).encode("utf-8")


def _chunk(data: bytes, offset: int, length: int) -> tuple[bytes, int, bool]:
    part = data[offset:offset + length]
    return part, len(data), offset + len(part) >= len(data)

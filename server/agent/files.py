"""What an agent serves from its run folders: the outputs a run recorded (``record_outputs``, SPEC W5),
read in chunks for the sidecar, confined to the run's ``recorded_outputs`` folder."""

from __future__ import annotations

import os
from pathlib import Path

from ..run.outputs import outputs_dir


class OutputsUnavailable(Exception):
    """A recorded-outputs read this agent cannot answer (``status``: the HTTP code the sidecar returns)."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


def read_output_chunk(run_dir: Path, run_id: str, name: str, offset: int, length: int,
                      worker: str) -> tuple[bytes, int, bool]:
    """``(data, file size, eof)`` of ``name`` under the run's recorded outputs; OutputsUnavailable when
    there is no such file there (a path that leads out of the folder is no such file)."""
    root = outputs_dir(run_dir)
    if not root.is_dir():
        raise OutputsUnavailable(f"worker {worker} keeps no recorded outputs for run {run_id} "
                                 f"(it did not record them, or its folder was removed)", 404)
    real_root = os.path.realpath(root)
    path = os.path.realpath(os.path.join(real_root, name))
    if not path.startswith(real_root + os.sep) or not os.path.isfile(path):
        raise OutputsUnavailable(f"run {run_id} recorded no file {name!r} on worker {worker}", 404)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        fh.seek(offset)
        data = fh.read(length)
    return data, size, offset + len(data) >= size

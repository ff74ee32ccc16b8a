"""The one way this package replaces a file: a unique temp file in the target's folder, written, fsynced,
then renamed over the target (``os.replace``), so a reader sees the old file or the new one and never a
part; on any failure the temp file is removed and the target is left as it was.

The temp name comes from ``tempfile.mkstemp`` (unique within a process and across processes, unlike a
pid-based name that two threads of one process share). The file gets ``mode`` before the rename: 0o600
for anything holding a secret (tokens, credentials, keys).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PUBLIC = 0o644
PRIVATE = 0o600  # tokens, credentials, private keys: readable by the owner only


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], *, mode: int = PUBLIC) -> Iterator[Path]:
    """Yield a temp path next to ``target``; when the block ends without an error, fsync what was
    written there, give it ``mode`` and rename it over ``target``. Creates the target's folder."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_atomic(target: str | os.PathLike[str], writer: Callable[[Path], None], *, mode: int = PUBLIC) -> Path:
    """Call ``writer(temp_path)`` and move its result over ``target`` (see :func:`atomic_path`)."""
    with atomic_path(target, mode=mode) as tmp:
        writer(tmp)
    return Path(target)


def write_bytes(target: str | os.PathLike[str], data: bytes, *, mode: int = PUBLIC) -> Path:
    """Replace ``target`` with ``data``, atomically."""
    return write_atomic(target, lambda tmp: tmp.write_bytes(data), mode=mode)


def write_text(target: str | os.PathLike[str], text: str, *, mode: int = PUBLIC) -> Path:
    """Replace ``target`` with ``text`` (UTF-8), atomically."""
    return write_bytes(target, text.encode("utf-8"), mode=mode)


def write_json(target: str | os.PathLike[str], data: Any, *, mode: int = PUBLIC, indent: int | None = 2) -> Path:
    """Replace ``target`` with ``data`` as JSON, atomically (the text is made before the file is touched,
    so a value JSON cannot hold fails with the old file intact)."""
    return write_text(target, json.dumps(data, indent=indent), mode=mode)


def publish_dir(built: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """Rename a folder built completely beside ``target`` (same file system) to ``target``, which must
    not exist or be empty: readers see no folder or the whole one."""
    os.replace(built, target)
    return Path(target)

"""The running xpufleet as a tarball for an SSH worker's host, and its build id.

The bundle holds the package's own files (``xpufleet/__init__.py``, ``constants.py`` and every file of
``nodes/``, ``server/`` and ``predictor/``), read from where this process imported xpufleet, so the
host runs exactly this code. The build id is the version plus a digest of those files: an editable
install that changed without a version bump still updates the host.
"""

from __future__ import annotations

import functools
import hashlib
import io
import tarfile
from pathlib import Path

from ...constants import VERSION

SUBPACKAGES = ("nodes", "server", "predictor")
TOP_FILES = ("__init__.py", "constants.py")


def package_root() -> Path:
    """The folder this process imported ``xpufleet`` from."""
    from ... import constants

    return Path(constants.__file__).resolve().parent


def package_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """``(name in the archive, file)`` of every file the bundle holds, sorted."""
    root = root or package_root()
    out = [(f"xpufleet/{name}", root / name) for name in TOP_FILES if (root / name).is_file()]
    for sub in SUBPACKAGES:
        for path in sorted((root / sub).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
                out.append((f"xpufleet/{path.relative_to(root).as_posix()}", path))
    return sorted(out)


@functools.lru_cache(maxsize=4)
def bundle(root: Path | None = None) -> tuple[str, bytes]:
    """``(build id, tar.gz bytes)`` of the package (made once per process and root)."""
    files = package_files(root)
    digest = hashlib.sha256()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for name, path in files:
            data = path.read_bytes()
            digest.update(name.encode() + b"\0" + data + b"\0")
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return f"{VERSION}+{digest.hexdigest()[:16]}", buf.getvalue()

"""This machine's RAM and commit charge (docs/predictor.md's C_ram and S_virt): psutil for free RAM,
``CommitLimit``/``Committed_AS`` of ``/proc/meminfo`` on Linux, ``GlobalMemoryStatusEx`` on Windows.
Shared by the agent's CPU entry and the predictor's snapshot."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any


@dataclass
class HostMemory:
    """Bytes; ``notes`` say what could not be read (its figure is then 0)."""

    ram_free: int = 0
    commit_used: int = 0
    commit_limit: int = 0
    notes: list[str] = field(default_factory=list)


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as bytes by key (values there are kB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1)
    return out


def memorystatusex_type() -> Any:
    import ctypes

    class MEMORYSTATUSEX(ctypes.Structure):
        _fields_ = [
            ("dwLength", ctypes.c_ulong),
            ("dwMemoryLoad", ctypes.c_ulong),
            ("ullTotalPhys", ctypes.c_ulonglong),
            ("ullAvailPhys", ctypes.c_ulonglong),
            ("ullTotalPageFile", ctypes.c_ulonglong),
            ("ullAvailPageFile", ctypes.c_ulonglong),
            ("ullTotalVirtual", ctypes.c_ulonglong),
            ("ullAvailVirtual", ctypes.c_ulonglong),
            ("ullAvailExtendedVirtual", ctypes.c_ulonglong),
        ]

    return MEMORYSTATUSEX


def windows_memory_status(kernel32: Any = None) -> dict[str, int]:
    """Commit charge through ``GlobalMemoryStatusEx`` (bytes): ``commit_limit`` is ullTotalPageFile,
    ``commit_used`` = ullTotalPageFile - ullAvailPageFile, ``ram_free`` ullAvailPhys. ``kernel32``
    defaults to ``ctypes.windll.kernel32`` (Windows only); tests pass a stand-in."""
    import ctypes

    if kernel32 is None:
        kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    status = memorystatusex_type()()
    status.dwLength = ctypes.sizeof(status)
    if not kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):
        raise OSError("GlobalMemoryStatusEx failed")
    return {
        "ram_free": int(status.ullAvailPhys),
        "commit_limit": int(status.ullTotalPageFile),
        "commit_used": int(status.ullTotalPageFile - status.ullAvailPageFile),
    }


def host_memory(platform: str | None = None, meminfo_path: str = "/proc/meminfo", kernel32: Any = None) -> HostMemory:
    """RAM free and commit charge of this machine, with notes for what could not be read."""
    platform = platform or sys.platform
    out = HostMemory()
    try:
        import psutil

        out.ram_free = int(psutil.virtual_memory().available)
    except Exception as exc:  # psutil missing or failing: say so, keep zeros
        out.notes.append(f"RAM free unknown: {exc}")
    if platform.startswith("win"):
        try:
            st = windows_memory_status(kernel32)
            out.commit_used, out.commit_limit = st["commit_used"], st["commit_limit"]
            if not out.ram_free:
                out.ram_free = st["ram_free"]
        except Exception as exc:
            out.notes.append(f"commit charge unknown: GlobalMemoryStatusEx: {exc}")
    elif platform.startswith("linux"):
        try:
            with open(meminfo_path, encoding="ascii") as f:
                info = parse_meminfo(f.read())
            out.commit_used, out.commit_limit = info["Committed_AS"], info["CommitLimit"]
            if not out.ram_free and "MemAvailable" in info:
                out.ram_free = info["MemAvailable"]
        except OSError as exc:
            out.notes.append(f"commit charge unknown: {meminfo_path}: {exc}")
        except KeyError:
            out.notes.append(f"commit charge unknown: {meminfo_path} has no CommitLimit/Committed_AS")
    else:
        out.notes.append(f"commit charge is not read on {platform}; S_virt counts as 0")
    return out

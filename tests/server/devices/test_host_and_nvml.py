"""The device layer's host memory (RAM, commit charge) and its one NVML wrapper (stand-ins: no GPU here)."""

from __future__ import annotations

import ctypes
import sys
from types import SimpleNamespace

import pytest

from xpufleet.server.devices import host as H
from xpufleet.server.devices.nvml import Nvml, NvmlCard, reset_shared, shared, visible_order

GiB = 1024**3


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/meminfo is Linux's")
def test_linux_commit_from_proc_meminfo():
    info = H.parse_meminfo(open("/proc/meminfo").read())
    host = H.host_memory()
    assert host.commit_limit == info["CommitLimit"]
    assert host.commit_used == pytest.approx(info["Committed_AS"], rel=0.2)  # it moves
    import psutil

    assert host.ram_free == pytest.approx(psutil.virtual_memory().available, rel=0.2)


def test_meminfo_file_parsed_exactly(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       32000000 kB\nMemAvailable:   1000 kB\nCommitLimit:    20971520 kB\n"
                 "Committed_AS:    5242880 kB\nHugePages_Total:       0\n")
    host = H.host_memory("linux", meminfo_path=str(f))
    assert host.commit_limit == 20 * GiB and host.commit_used == 5 * GiB
    broken = tmp_path / "broken"
    broken.write_text("MemTotal: 1 kB\n")
    host = H.host_memory("linux", meminfo_path=str(broken))
    assert host.commit_limit == 0 and any("CommitLimit" in n for n in host.notes)


class Kernel32StandIn:
    """Fills MEMORYSTATUSEX as Windows would; records the dwLength it was handed."""

    def __init__(self, ok: bool = True):
        self.ok = ok
        self.seen_length = None

    def GlobalMemoryStatusEx(self, ref):  # noqa: N802 (Windows' name)
        st = ref._obj
        self.seen_length = st.dwLength
        if not self.ok:
            return 0
        st.ullTotalPhys = 64 * GiB
        st.ullAvailPhys = 40 * GiB
        st.ullTotalPageFile = 80 * GiB
        st.ullAvailPageFile = 50 * GiB
        return 1


def test_windows_commit_through_global_memory_status_stand_in():
    k = Kernel32StandIn()
    st = H.windows_memory_status(k)
    assert k.seen_length == ctypes.sizeof(H.memorystatusex_type())  # the struct size Windows checks
    assert st == {"ram_free": 40 * GiB, "commit_limit": 80 * GiB, "commit_used": 30 * GiB}
    host = H.host_memory("win32", kernel32=k)
    assert host.commit_limit == 80 * GiB and host.commit_used == 30 * GiB
    failing = H.host_memory("win32", kernel32=Kernel32StandIn(ok=False))
    assert failing.commit_limit == 0 and any("GlobalMemoryStatusEx failed" in n for n in failing.notes)


def test_commit_not_read_elsewhere_says_so():
    host = H.host_memory("darwin")
    assert host.commit_limit == 0 and any("darwin" in n for n in host.notes)




CARDS = [NvmlCard(0, "GPU-aaaaaaaa-0000-0000-0000-000000000001", "NVIDIA A", 24 * GiB, 20 * GiB),
         NvmlCard(1, "GPU-bbbbbbbb-0000-0000-0000-000000000002", "NVIDIA B", 80 * GiB, 70 * GiB)]


@pytest.mark.parametrize(("visible", "names"), [
    (None, ["NVIDIA A", "NVIDIA B"]),
    ("1,0", ["NVIDIA B", "NVIDIA A"]),
    ("GPU-bbbbbbbb", ["NVIDIA B"]),  # a UUID prefix, as CUDA accepts it
    ("gpu-BBBBBBBB,0", ["NVIDIA B", "NVIDIA A"]),  # case does not matter
    ("0,7,1", ["NVIDIA A"]),  # CUDA stops at the first entry it cannot resolve
    ("MIG-1234,0", []),
    ("bbbbbbbb", []),  # a bare UUID without GPU- is not a CUDA entry
    ("", []),
])
def test_visible_order_reads_cuda_visible_devices_as_cuda_does(visible, names):
    assert [c.name for c in visible_order(CARDS, visible)] == names


def test_shared_nvml_retries_a_failed_init_after_a_while(monkeypatch):
    calls = []

    def init():
        calls.append(1)
        raise RuntimeError("driver not loaded (stand-in)")

    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=init))
    reset_shared()
    try:
        first = shared()
        assert not first.ok and "driver not loaded" in first.reason
        assert shared() is first and len(calls) == 1  # not retried at once
        monkeypatch.setattr("xpufleet.server.devices.nvml.RETRY_S", 0.0)
        assert shared() is not first and len(calls) == 2
    finally:
        reset_shared()


def test_a_card_whose_memory_cannot_be_read_has_no_figures(monkeypatch):
    def memory(h):
        raise RuntimeError("not supported (stand-in)")

    mod = SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: i,
                          nvmlDeviceGetUUID=lambda h: b"GPU-cccc", nvmlDeviceGetName=lambda h: "NVIDIA C",
                          nvmlDeviceGetMemoryInfo=memory)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    (card,) = Nvml().cards()
    assert (card.uuid, card.name, card.total, card.free) == ("GPU-cccc", "NVIDIA C", None, None)

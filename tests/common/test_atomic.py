"""The one atomic writer: whole file or nothing, unique temp names, mode, temp removed on failure."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from xpufleet.common import atomic


def test_it_replaces_the_file_whole_with_the_mode_asked(tmp_path):
    target = tmp_path / "sub" / "state.json"
    atomic.write_json(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    atomic.write_text(target, "secret", mode=atomic.PRIVATE)
    assert target.read_text() == "secret" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(target.parent) == ["state.json"]  # no temp file left


def test_a_failing_writer_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "model.bin"
    atomic.write_bytes(target, b"old")

    def half(tmp):
        tmp.write_bytes(b"ne")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic.write_atomic(target, half)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["model.bin"]
    with pytest.raises(TypeError):  # not JSON: refused before the file is touched
        atomic.write_json(target, {"x": object()})
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["model.bin"]


def test_threads_of_one_process_never_share_a_temp_file(tmp_path):
    """pid-based temp names collide between threads; each writer here gets its own."""
    target = tmp_path / "shared.txt"
    seen: list[str] = []
    lock = threading.Lock()

    def writer(tmp):
        with lock:
            seen.append(tmp.name)
        tmp.write_text("x" * 10000)

    threads = [threading.Thread(target=atomic.write_atomic, args=(target, writer)) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(seen) == 16 and len(set(seen)) == 16
    assert target.read_text() == "x" * 10000 and os.listdir(tmp_path) == ["shared.txt"]


def test_a_built_folder_is_published_whole(tmp_path):
    built = tmp_path / ".out.tmp"
    (built / "a").mkdir(parents=True)
    (built / "a" / "f.txt").write_text("1")
    atomic.publish_dir(built, tmp_path / "out")
    assert (tmp_path / "out" / "a" / "f.txt").read_text() == "1" and not built.exists()

"""The export injection probe, replayed (docs/export.md): a node id that ends a comment line and puts
code into ``main()``, and its variants in every other field, through ``xpufleet export``. Ids that
cannot be shown are refused with exit 2 and no file; everything else exports a script that RUNS
(a one-epoch digits MLP) without creating any of the files its payloads try to touch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from export_fuzz_graphs import TEMPLATE, build_graph

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

RUN_KEYS = [k for k in TEMPLATE if k not in ("load", "predict")]  # ModelLoader needs a saved file first


def payloads(marker_dir: Path, tag: str) -> list[str]:
    """Texts that each try to touch ``marker_dir/<tag>-<n>`` from a different quoting context."""
    touch = [f"__import__('os').system('touch {marker_dir}/{tag}-{n}')" for n in range(6)]
    return [f"1\n    {touch[0]}  #",  # the probe's shape: end a comment line
            f"1'); {touch[1]}  #", f'1"); {touch[2]}  #', f'1"""; {touch[3]}; """', f"1\\'); {touch[4]} #",
            f"1\r    {touch[5]}  #"]


def export(graph: dict, tmp: Path, name: str = "graph.json") -> tuple[subprocess.CompletedProcess, Path]:
    src = tmp / name
    src.write_text(json.dumps(graph), encoding="utf-8")
    out = tmp / "script.py"
    done = subprocess.run([sys.executable, "-m", "xpufleet.server", "export", str(src), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    return done, out


@pytest.mark.parametrize("sep", ["\n", "\r", "\u2028", "\u2029", "\x85", "\x1b[2J", "\u202e"])
def test_a_node_id_with_a_line_break_or_control_character_is_refused_with_exit_2(tmp_path, sep):
    ids = {k: str(i + 1) for i, k in enumerate(RUN_KEYS)}
    ids["train"] = f"1{sep}    __import__('os').system('touch {tmp_path}/pwned')  #"
    done, out = export(build_graph(ids, keys=RUN_KEYS), tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and f"U+{ord(sep[0]):04X}" in done.stderr
    assert "rename the node" in done.stderr and sep not in done.stderr.rstrip("\n")  # one escaped line
    assert not out.exists() and not (tmp_path / "pwned").exists()


def test_payloads_in_every_other_field_export_a_script_that_runs_without_running_them(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    ids = {k: str(i + 1) for i, k in enumerate(RUN_KEYS)}
    ids["train"], ids["eval"] = (f"8'); __import__('os').system('touch {marks}/id-{n}') #" for n in (0, 1))
    titles = {k: payloads(marks, f"title-{k}")[i % 6] for i, k in enumerate(RUN_KEYS)}
    strings = {("data", "target_column"): payloads(marks, "col")[0], ("data", "x_key"): payloads(marks, "xkey")[3],
               ("data", "y_key"): payloads(marks, "ykey")[5], ("data", "path"): payloads(marks, "path")[1],
               ("save", "filename"): "models/" + payloads(marks, "file")[2].replace("/", "_") + ".safetensors"}
    extras = {"mlp": {payloads(marks, "input")[0]: payloads(marks, "inputval")[1]}}
    graph = build_graph(ids, titles, strings, extras, strategy="ddp", keys=RUN_KEYS)
    name = payloads(marks, "name")[3].replace("/", "_") + "\u2028.json"  # the graph file's own name
    done, script = export(graph, tmp_path, name)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    compile(script.read_text(encoding="utf-8"), str(script), "exec")
    metrics = tmp_path / "metrics.json"
    ran = subprocess.run([sys.executable, str(script), "--device", "cpu", "--outputs", str(tmp_path / "out"),
                          "--run-dir", str(tmp_path / "run"), "--metrics", str(metrics)],
                         capture_output=True, text=True, timeout=400, cwd=str(tmp_path),
                         env={**os.environ, "OMP_NUM_THREADS": "1", "XPUFLEET_HOME": str(tmp_path)})
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    assert list(marks.iterdir()) == []  # no payload ran
    got = json.loads(metrics.read_text())
    assert set(got) == {ids["train"], ids["eval"]} and got[ids["train"]]["epochs_completed"] == 1
    saved = tmp_path / "out" / strings[("save", "filename")]
    assert saved.is_file()  # the hostile filename arrived intact, as data
    assert (tmp_path / "out" / "models" / "seq.pt").is_file()  # the Sequential with "bias": false (not JSON)

"""``xpufleet export`` on graphs it must refuse: exit 2, one clear line, no script written."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest

from xpufleet.server.cli.export import run_export


@pytest.mark.parametrize("nid", ["1\n    __import__('os').system('touch x')  #", "1\r2", "1\u20282", "1\x852"])
def test_an_unshowable_node_id_exits_2_naming_it_escaped(tmp_path, capsys, nid):
    graph = {nid: {"class_type": "XPUDataset", "inputs": {"name": "iris"}},
             "2": {"class_type": "XPUDataLoader", "inputs": {"dataset": [nid, 0], "batch_size": 8}}}
    src = tmp_path / "g.json"
    src.write_text(json.dumps(graph))
    out = tmp_path / "train.py"
    assert run_export(Namespace(graph=str(src), output=str(out))) == 2
    err = capsys.readouterr().err
    assert err.startswith("xpufleet: node id ") and "rename the node" in err and err.count("\n") == 1
    assert not out.exists() and list(tmp_path.iterdir()) == [src]

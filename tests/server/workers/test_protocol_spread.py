"""The messages of ddp across workers (server/workers/protocol.py): ``start_run``'s optional layout,
``start_part`` (with rank 0's store), ``stop_part`` and ``part_finished``."""

from __future__ import annotations

import pytest

from xpufleet.server.workers import protocol

LAYOUT = {"parts": [{"worker": "a", "devices": ["cuda:0"]}, {"worker": "b", "devices": ["cuda:0", "cuda:1"]}],
          "part": 1, "store": "10.0.0.5:4000"}
RUN = {"run_id": "r1", "graph": {"1": {"class_type": "XPULoss", "inputs": {}}}, "options": {}, "devices": ["cuda:0"],
       "budget_gib": None}


def test_spread_messages_round_trip_in_their_direction():
    lead = protocol.decode(protocol.encode("start_run", **RUN, spread={**LAYOUT, "part": 0, "store": None}),
                           protocol.SIDECAR_TO_AGENT)
    assert lead["spread"]["part"] == 0
    assert protocol.decode(protocol.encode("start_part", **RUN, spread=LAYOUT), protocol.SIDECAR_TO_AGENT)
    assert protocol.decode(protocol.encode("stop_part", run_id="r1", reason="x"), protocol.SIDECAR_TO_AGENT)
    done = protocol.encode("part_finished", run_id="r1", part=1, status="failed", failed_rank=2,
                           error="DDP rank 2 of 3 failed on worker b: killed")
    assert protocol.decode(done, protocol.AGENT_TO_SIDECAR)["failed_rank"] == 2
    with pytest.raises(protocol.ProtocolError, match="unknown message type 'part_finished'"):
        protocol.decode(done, protocol.SIDECAR_TO_AGENT)


@pytest.mark.parametrize("mtype, fields, needle", [
    ("start_part", {**RUN, "spread": {**LAYOUT, "store": None}}, "'spread.store' must name rank 0's store"),
    ("start_part", {**RUN, "spread": {**LAYOUT, "part": 5}}, "spread.part must be 0..1"),
    ("start_part", {**RUN}, "spread must be an object"),
    ("start_run", {**RUN, "spread": {"parts": [], "part": 0}}, "spread.parts must list two or more"),
    ("part_finished", {"run_id": "r1", "part": 1, "status": "exploded"}, "'status' must be succeeded, cancelled"),
    ("part_finished", {"run_id": "r1", "status": "failed"}, "missing field 'part'"),
    ("part_finished", {"run_id": "r1", "part": 1, "status": "failed", "peer_lost": "yes"}, "'peer_lost' must be"),
])
def test_bad_spread_messages_name_the_field(mtype, fields, needle):
    with pytest.raises(protocol.ProtocolError, match=needle):
        protocol.validate({"type": mtype, **fields})

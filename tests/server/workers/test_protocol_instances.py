"""The instance messages of the agent protocol (inference units): validated, with the field to fix."""

from __future__ import annotations

import pytest

from xpufleet.server.workers import protocol

START = {"type": "start_instance", "unit_id": "digits-1", "service": "digits", "rank": 1, "size": 2, "generation": 3,
         "attempt": 0, "device": "cuda:0", "program": {"model": {"path": "m.safetensors"}},
         "env": {"RANK": "1"}, "pick_ports": False}
STATE = {"type": "instance_state", "unit_id": "digits-1", "rank": 0, "generation": 3, "attempt": 0,
         "state": "starting", "port": 8000, "master_port": 29500, "address": "127.0.0.1"}


def test_valid_messages_and_their_direction():
    assert protocol.decode(protocol.encode("start_instance", **{k: v for k, v in START.items() if k != "type"}),
                           protocol.SIDECAR_TO_AGENT)["rank"] == 1
    assert protocol.validate(STATE, protocol.AGENT_TO_SIDECAR) is STATE
    protocol.validate({"type": "stop_instance", "unit_id": "u-1", "rank": 0, "mode": "graceful", "grace_s": 5},
                      protocol.SIDECAR_TO_AGENT)
    protocol.validate({"type": "instances", "instances": [{k: v for k, v in STATE.items() if k != "type"}]},
                      protocol.AGENT_TO_SIDECAR)
    protocol.validate({**STATE, "state": "exited", "returncode": -9, "cause": "killed by SIGKILL"})
    with pytest.raises(protocol.ProtocolError, match="unknown message type"):
        protocol.validate(START, protocol.AGENT_TO_SIDECAR)


@pytest.mark.parametrize(("msg", "text"), [
    ({**START, "rank": -1}, "'rank' must be >= 0"),
    ({**START, "size": 0}, "'size' must be >= 1"),
    ({**START, "program": {}}, "exactly one of 'model' and 'command'"),
    ({**START, "env": {"RANK": 1}}, "'env' must map names to strings"),
    ({**START, "pick_ports": "yes"}, "pick_ports"),
    ({k: v for k, v in START.items() if k != "device"}, "missing field 'device'"),
    ({**STATE, "state": "ready"}, "'state' must be one of"),
    ({**STATE, "pid": "12"}, "field 'pid' must be an integer"),
    ({**STATE, "env": {"A": 1}}, "every value of 'env' must be a string"),
    ({"type": "stop_instance", "unit_id": "u", "rank": 0, "mode": "nicely"}, "'mode' must be one of kill, graceful"),
    ({"type": "instances", "instances": [1]}, "each entry must be an object"),
    ({"type": "instances", "instances": [{"unit_id": "u", "rank": 0, "generation": 1, "attempt": 0}]}, "'state'"),
])
def test_bad_messages_name_the_field(msg, text):
    with pytest.raises(protocol.ProtocolError, match=text):
        protocol.validate(msg)

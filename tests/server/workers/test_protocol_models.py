"""The agent protocol's models (server/contracts/agent_protocol.py): one per message type, the one source of
its validation and of the docs' field tables; the wire stays the dicts both sides send."""

from __future__ import annotations

import json

import pytest

from xpufleet.server.contracts import agent_protocol as ap
from xpufleet.server.sidecar import make_protocol_docs
from xpufleet.server.workers import protocol

EVENT = {"type": "event", "run_id": "r1", "seq": 2, "event_type": "progress", "payload": {"value": 0.5}, "ts": 1.5}


def test_every_message_type_has_a_model_and_a_direction():
    assert protocol.AGENT_TO_SIDECAR == frozenset(ap.AGENT_MESSAGES)
    assert protocol.SIDECAR_TO_AGENT == frozenset(ap.SIDECAR_MESSAGES)
    assert not protocol.AGENT_TO_SIDECAR & protocol.SIDECAR_TO_AGENT
    assert len(protocol.ALL_TYPES) == 21  # with comfyui (issue 30)


def test_every_field_says_what_it_holds():
    """A refusal is made from the field's description unless the model gives the field its own text."""
    for model in ap.models():
        for name, info in model.model_fields.items():
            assert info.description or name in model.ALWAYS, (model.__name__, name)


def test_the_docs_tables_are_generated_from_the_models():
    assert make_protocol_docs.main(["--check"]) == 0, "run python -m xpufleet.server.sidecar.make_protocol_docs"
    section = make_protocol_docs.section()
    for mtype in protocol.ALL_TYPES:
        assert f"| `{mtype}` |" in section
    for model in ap.models():
        for field in model.model_fields:
            assert f"#### {model.__name__}" in section and f"| `{field}`" in section, (model.__name__, field)


def test_the_wire_is_the_message_itself():
    """validate hands back the very dict it got (unknown fields kept, nothing coerced), and encode is its
    compact JSON: agents and sidecars of this version read each other's frames as before."""
    newer = {**EVENT, "added_later": [1, 2]}
    assert protocol.validate(newer) is newer
    text = protocol.encode("event", **{k: v for k, v in EVENT.items() if k != "type"})
    assert text == json.dumps(EVENT, separators=(",", ":"))
    assert protocol.decode(text, protocol.AGENT_TO_SIDECAR) == EVENT
    whole = {**EVENT, "seq": 3, "ts": 2}  # an int where a float is declared stays an int
    assert protocol.validate(whole)["ts"] == 2 and isinstance(whole["ts"], int)


WELCOME = {"type": "welcome", "name": "a", "server_version": "0.1.0", "runs": {}}
RUN = {"type": "start_run", "run_id": "r", "graph": {}, "devices": ["cpu"]}


@pytest.mark.parametrize(("msg", "text"), [
    ({**RUN, "budget_gib": "2"}, "start_run: 'budget_gib' must be a number or null"),
    ({**RUN, "spread": []}, "start_run: spread must be an object {parts, part, store}"),
    ({**RUN, "devices": ["cpu", ""]}, "start_run: 'devices' must list at least one device name"),
    ({k: v for k, v in RUN.items() if k != "graph"}, "start_run: missing field 'graph' (the run's graph (API prompt "
                                                     "format))"),
    ({**WELCOME, "runs": {"r1": "3"}}, "welcome: every value of 'runs' must be an integer seq"),
    ({**WELCOME, "heartbeat_interval_s": -1}, "welcome: 'heartbeat_interval_s' must be more than 0 seconds"),
    ({"type": "credential", "credential": ""}, "credential: 'credential' must not be empty"),
    ({"type": "ack", "run_id": "r", "seq": 1.0}, "ack: field 'seq' must be the last stored seq, got float"),
    ({"type": "outputs_data", "request_id": "q", "ok": "yes"}, "outputs_data: field 'ok' must be whether the file "
                                                                "was read, got str"),
    ({"type": "heartbeat", "devices": [1]}, "heartbeat: each device must be an object"),
    ({"type": "heartbeat", "devices": [{"kind": "cpu"}]}, "heartbeat: a device lacks its 'name' (e.g. 'cuda:0')"),
    ({"type": "heartbeat", "devices": [], "runs": [{"run_id": "r", "last_seq": "1"}]},
     "heartbeat: run 'r' field 'last_seq' must be an integer"),
    ({"type": "reject"}, "reject: missing field 'reason' (why the connection is refused)"),
])
def test_refusals_name_the_field(msg, text):
    with pytest.raises(protocol.ProtocolError) as info:
        protocol.validate(msg)
    assert str(info.value) == text


async def test_messages_skips_a_bad_frame_and_ends_at_the_close():
    import aiohttp

    class Frame:
        def __init__(self, type_: aiohttp.WSMsgType, data: str = "") -> None:
            self.type = type_
            self.data = data

    async def frames():
        for f in (Frame(aiohttp.WSMsgType.TEXT, json.dumps(EVENT)), Frame(aiohttp.WSMsgType.TEXT, "{oops"),
                  Frame(aiohttp.WSMsgType.TEXT, json.dumps({**EVENT, "type": "welcome"})),
                  Frame(aiohttp.WSMsgType.TEXT, json.dumps({**EVENT, "seq": 3})), Frame(aiohttp.WSMsgType.CLOSE),
                  Frame(aiohttp.WSMsgType.TEXT, json.dumps(EVENT))):
            yield f

    bad: list[protocol.ProtocolError] = []
    got = [m async for m in protocol.messages(frames(), protocol.AGENT_TO_SIDECAR, bad.append)]
    assert [m["seq"] for m in got] == [2, 3]
    assert ["must be JSON" in str(bad[0]), "unknown message type 'welcome'" in str(bad[1])] == [True, True]

"""Request bodies (common/jsonbody.py): depth refused before parsing, lone surrogates and
huge integers refused naming the field, and the depth scan agrees with a reference on random JSON."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xpufleet.common.errors import ApiError
from xpufleet.common.jsonbody import decode_body, lone_surrogate_field, nests_deeper_than
from xpufleet.constants import MAX_JSON_DEPTH


def nested(depth: int) -> bytes:
    """The probe's body: a graph whose input value is a list nested ``depth`` deep."""
    inner = "[" * depth + "]" * depth
    return ('{"graph":{"1":{"class_type":"XPULoss","inputs":{"name":' + inner + '}}}}').encode()


def refused(body: bytes) -> str:
    with pytest.raises(ApiError) as info:
        decode_body(body)
    assert info.value.status == 400
    return info.value.message


def test_json_nested_1000_deep_is_refused_before_parsing():
    assert "more than 64 levels deep (the limit)" in refused(nested(1000))
    assert "more than 64 levels deep" in refused(b"[" * 5_000_000)  # never reaches the parser
    assert decode_body(nested(MAX_JSON_DEPTH - 4))["graph"]["1"]["class_type"] == "XPULoss"  # 64 levels in all


def test_brackets_inside_strings_do_not_count():
    body = json.dumps({"s": "[" * 10_000, "t": "\\\"[[[" * 100, "k" + "{" * 100: 1}).encode()
    assert not nests_deeper_than(body) and decode_body(body)["s"] == "[" * 10_000


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet="[]{}\"\\ax", max_size=6),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                    max_leaves=40),
       st.integers(0, 8))
def test_depth_scan_agrees_with_the_parsed_value(value, limit):
    def depth(v) -> int:
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        return 0

    assert nests_deeper_than(json.dumps(value).encode(), limit) == (depth(value) > limit)


def test_lone_surrogates_are_refused_naming_the_field():
    msg = refused(b'{"options":{"name":"\\ud800x"}}')
    assert msg.startswith("options.name: holds a lone UTF-16 surrogate")
    msg = refused(b'{"graph":{"1":{"class_type":"XPULoss","inputs":{"n\\udfffme":"x"}}}}')
    assert msg.startswith("a key of graph.1.inputs")
    assert refused(b'{"a":[1,"\\udc00"]}').startswith("a[1]:")
    assert decode_body(b'{"e":"\\ud83d\\ude00", "t":"\\\\ud800"}') == {"e": "\U0001f600", "t": "\\ud800"}  # a pair; an escaped backslash
    assert lone_surrogate_field({"ok": ["fine"]}) is None


def test_not_json_values_get_a_400():
    assert "4300 digits" in refused(b"[" + b"9" * 5000 + b"]")
    assert "NaN is not a JSON value" in refused(b'{"a": NaN}')
    assert "Infinity is not a JSON value" in refused(b'[-Infinity]')
    assert refused(b'{"a":\xff}') == "the body is not UTF-8 JSON"
    assert refused(b"{").startswith("the body is not valid JSON")

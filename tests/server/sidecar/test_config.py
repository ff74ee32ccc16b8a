"""How a sidecar runs: XPUFLEET_LOCAL_SHARED_CARDS (this server's cards admitted by memory, off by default)."""

from __future__ import annotations

import pytest

from xpufleet.server.sidecar.config import SidecarConfig, parse_local_shared


def test_local_shared_cards_are_off_by_default_and_named_per_card(tmp_path, monkeypatch):
    monkeypatch.delenv("XPUFLEET_LOCAL_SHARED_CARDS", raising=False)
    assert SidecarConfig.from_env(tmp_path).local_shared == ()
    monkeypatch.setenv("XPUFLEET_LOCAL_SHARED_CARDS", " cuda:1, mps ,cuda:1")
    assert SidecarConfig.from_env(tmp_path).local_shared == ("cuda:1", "mps:0")
    assert parse_local_shared("") == ()


@pytest.mark.parametrize(("text", "needle"), [("cpu", "cpu is not a CUDA or MPS card"),
                                               ("xpu:0", "xpu:0 is not a CUDA or MPS card"),
                                               ("cuda", "name one card"), ("gpu0", "invalid device")])
def test_a_bad_entry_names_the_variable(text, needle):
    with pytest.raises(ValueError, match="XPUFLEET_LOCAL_SHARED_CARDS") as exc:
        parse_local_shared(text)
    assert needle in str(exc.value)

"""The instance environment (docs/services.md): every name common frameworks read, fresh rendezvous per generation."""

from __future__ import annotations

from xpufleet.server.units.envcontract import CONTRACT, RENDEZVOUS_ENV, contract_of, instance_env, is_loopback


def test_the_contract():
    env = instance_env(service="digits", unit_id="digits-1", generation=3, rank=1, size=2, master_addr="127.0.0.1",
                       master_port=29500, rendezvous="digits-1-g3-abcd")
    assert {k: env[k] for k in CONTRACT} == {
        "RANK_ID": "1", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500", "LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1",
        "UNIT_ID": "digits-1", "UNIT_GENERATION": "3"}
    assert env[RENDEZVOUS_ENV] == "digits-1-g3-abcd" and env["LOCAL_WORLD_SIZE"] == "1"
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"  # all on this machine
    remote = instance_env(service="d", unit_id="d-1", generation=1, rank=0, size=2, master_addr="10.1.2.3",
                          master_port=1, rendezvous="r")
    assert "GLOO_SOCKET_IFNAME" not in remote and remote["MASTER_ADDR"] == "10.1.2.3"


def test_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("127.8.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.0.0.1") and not is_loopback("") and not is_loopback(None) and not is_loopback("gpu-box")


def test_contract_of_keeps_only_the_contract():
    env = {"RANK": "0", "PATH": "/bin", "UNIT_ID": "u", RENDEZVOUS_ENV: "k"}
    assert contract_of(env) == {"RANK": "0", "UNIT_ID": "u", RENDEZVOUS_ENV: "k"}

"""The contract of ``POST /api/pairing/redeem`` (docs/security.md): a browser pairs with a one-time pairing
code (``xpufleet pair`` prints one) or with the sidecar's session token pasted, and names itself."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from .base import OBJECT_TEXTS, Contract, ContractError, refuse

PAIRING_NAME_CHARS = 100
REDEEM_TEXT = ("send {\"code\": \"<code>\"} (the pairing code `xpufleet start` or `xpufleet pair` printed) or "
               "{\"token\": \"<token>\"} (the sidecar's session token, in $XPUFLEET_HOME/runtime.json)")
NAME_TEXT = f"name: a label of at most {PAIRING_NAME_CHARS} printable characters (e.g. 'ComfyUI on my laptop')"


class PairingRedeem(Contract):
    """A pairing code or the session token, exchanged for a durable pairing secret; ``name`` labels it."""

    shape_texts = OBJECT_TEXTS
    code: Annotated[str | None, Field(min_length=1, max_length=200), refuse(REDEEM_TEXT)] = None
    token: Annotated[str | None, Field(min_length=1, max_length=200), refuse(REDEEM_TEXT)] = None
    name: Annotated[str | None, Field(min_length=1, max_length=PAIRING_NAME_CHARS), refuse(NAME_TEXT)] = None

    @model_validator(mode="after")
    def _one_credential(self) -> PairingRedeem:
        if (self.code is None) == (self.token is None):
            raise ContractError(REDEEM_TEXT)
        if self.name is not None and not self.name.isprintable():
            raise ContractError(NAME_TEXT)
        return self

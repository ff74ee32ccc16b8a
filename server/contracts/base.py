"""The base of every contract model and the one way a body is validated against one.

Why pydantic v2: every ComfyUI environment already has it (ComfyUI's own requirements install it), so the
plugin gains no dependency; msgspec would be a new one. Its ``model_json_schema`` gives the OpenAPI
document's schemas, so the validation and the document cannot drift.

The 400 texts are the API's (tests assert them): a field's type or range error is answered with the text
its :func:`refuse` marker gives, a cross-field rule raises :class:`ContractError` with its own text, and
pydantic's wording only reaches a client for a field that declares no text (``<path>: <pydantic message>``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError, WrapValidator, model_validator

from ...common.errors import not_available  # noqa: F401 - re-exported to the contract modules

M = TypeVar("M", bound=BaseModel)


class ContractError(ValueError):
    """A body a contract refuses: ``message`` names the field and what to fix; ``status`` (400, 413 for a
    size limit) and ``extra`` (joined to the answer, e.g. ``node_errors``) go to the HTTP answer."""

    def __init__(self, message: str, status: int = 400, extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.extra = dict(extra or {})


class Contract(BaseModel):
    """A JSON body: unknown fields are refused, nothing is coerced (``"1"`` is not an integer).

    ``shape_texts`` (optional): the route's own answers for a body that is not an object and for unknown
    fields, ``{unknown}``, ``{known}`` and ``{sorted}`` replaced by the field names; ``missing_texts``: a required field's
    own answer when it is left out (the API's 400 texts, checked in this order before the fields)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    shape_texts: ClassVar[tuple[str, str] | None] = None
    missing_texts: ClassVar[Mapping[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, data: Any) -> Any:
        if cls.shape_texts is None:
            return data
        not_object, unknown_text = cls.shape_texts
        if not isinstance(data, Mapping):
            raise ContractError(not_object)
        if cls.model_config.get("extra") == "forbid":
            unknown = sorted(set(data) - set(cls.model_fields))
            if unknown:
                raise ContractError(unknown_text.replace("{unknown}", ", ".join(map(str, unknown)))
                                    .replace("{known}", ", ".join(cls.model_fields))
                                    .replace("{sorted}", ", ".join(sorted(cls.model_fields)) or "none"))
        for name, text in cls.missing_texts.items():
            if name not in data:
                raise ContractError(text)
        return data


def refuse(text: str | Callable[[Any], str]) -> WrapValidator:
    """An ``Annotated`` marker: any type or range error of the field it wraps is answered with ``text``
    (a callable gets the refused value: ``lambda v: f"mode: ..., got {v!r}"``)."""

    def wrap(value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            found = first_contract_error(exc)
            raise (found if found is not None else ContractError(text if isinstance(text, str) else text(value))
                   ) from None

    return WrapValidator(wrap)


# The answers of common/http.py read_object, for the bodies that kept them.
OBJECT_TEXTS = ("the body must be a JSON object", "unknown field(s) {unknown}; known: {sorted}")


def ruled(documented: Any) -> PlainValidator:
    """A field passed as sent, documented as ``documented``: a rule function checks it after the model
    (its rules need more than the field: the graph a sweep parameter names, another field)."""
    return PlainValidator(lambda value: value, json_schema_input_type=documented)


def first_contract_error(exc: ValidationError) -> ContractError | None:
    """The first :class:`ContractError` a validator raised inside ``exc``, if any."""
    for err in exc.errors(include_url=False):
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, ContractError):
            return cause
    return None


def to_contract_error(exc: ValidationError) -> ContractError:
    """The answer for a refused body: the first error (pydantic lists them in field order, as a client
    reads the body), as its field's own text."""
    found = first_contract_error(exc)
    if found is not None:
        return found
    err = exc.errors(include_url=False)[0]
    path = ".".join(str(p) for p in err["loc"]) or "the body"
    if err["type"] == "extra_forbidden":
        return ContractError(f"{path}: unknown field")
    if err["type"] == "missing":
        return ContractError(f"{path}: missing")
    return ContractError(f"{path}: {err['msg']}")


def validate(model: type[M], body: Any) -> M:
    """``body`` validated into ``model``; raises :class:`ContractError` naming the field to fix."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise to_contract_error(exc) from None


def component_schemas(models: list[type[BaseModel]], ref_template: str = "#/components/schemas/{model}"
                      ) -> dict[str, Any]:
    """The JSON schemas of ``models`` and of every model they use, keyed by model name (the OpenAPI
    document's ``components/schemas``)."""
    out: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=ref_template, mode="validation")
        for name, sub in schema.pop("$defs", {}).items():
            out.setdefault(name, _untitled(sub))
        out[model.__name__] = _untitled(schema)
    return out


def _untitled(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without the titles pydantic derives from field names (noise in a document)."""
    schema = {k: v for k, v in schema.items() if k != "title"}
    props = schema.get("properties")
    if isinstance(props, dict):
        schema["properties"] = {name: {k: v for k, v in prop.items() if k != "title"} for name, prop in props.items()}
    return schema

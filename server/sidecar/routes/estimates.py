"""``POST /api/estimates`` (docs/memory.md; docs/workers.md, "sharing a card"): the memory budget the Queue on... dialog
suggests for a graph.

The body is a run's body (``{"graph", "options"}``, validated as ``POST /api/runs`` validates it; options
optional): the target says how many cards a run gets and which cards it may use. The answer is the
measured default when a successful run of the same runtime graph on as many cards has a peak (its run
named; the estimate is then not built), else the static estimate with every item and the total, ``rough``
with the reasons when it had to skip or guess (the field then stays empty: ``budget_gib`` null). The
estimate is built on the meta device in a worker thread (it may take up to 5 s), never on the event loop,
and so are the body's parsing and the graph key. A graph that runs a model in more than
``ESTIMATE_MAX_MODEL_USES`` places gets no estimate ("too large to estimate", rough) instead of a build.
The server never applies an estimate by itself: a run gets one only when it is sent as its budget
(``target.memory_gib`` with ``memory_source: "estimate"``). ``notes`` carry what the dialog shows in the
field's place (a shared MPS card, a card that has not reported its memory yet).
"""

from __future__ import annotations

import asyncio
import functools
import logging

from aiohttp import web

from ....common.errors import ApiError
from ....predictor.estimate import estimate_graph
from ...contracts.runs import EstimateRequest
from ...ledger.budget import Suggestion, suggest
from ...ledger.fit import NO_TOTAL, UNREPORTED
from ...memory.submit import key_of
from ...run.requests import RunRequest, run_request_of
from ...scheduling import TargetError
from .. import openapi
from ..workflow_estimate import estimate_workflow
from .common import Body, body, dispatcher_of

log = logging.getLogger("xpufleet.estimates")

routes = web.RouteTableDef()


@routes.post("/api/estimates")
@body(EstimateRequest, off_loop=True, then=run_request_of)  # linear, but ~100 ms for 10,000 nodes: off the loop
async def estimate(request: web.Request, sent: Body[EstimateRequest]) -> web.Response:
    req: RunRequest = sent.built
    d = dispatcher_of(request)
    try:
        resolution = d.resolve(req.target)
    except TargetError as exc:
        raise ApiError(400, str(exc)) from None
    adm = d.memory
    state = d.slot_state()
    split = adm.split(resolution.candidates, state)
    mem_keys = [adm.keys_of(c, state) for c in split.memory]
    n_cards = len(resolution.candidates[0].devices) if resolution.candidates else 1
    key = await asyncio.to_thread(key_of, req.graph)  # linear, but up to ~1 s for 10,000 nodes (issue 19)
    default = adm.default_for(key, n_cards, mem_keys)
    loop = asyncio.get_running_loop()
    estimator = estimate_workflow if req.target.is_comfyui else estimate_graph  # a ComfyUI run: M_peak of its files
    try:  # the meta-device build blocks for up to MEMORY_ESTIMATE_TIMEOUT_S: off the event loop
        suggestion = await loop.run_in_executor(None, functools.partial(suggest, req.graph, default, estimate=estimator,
                                                                      n_cards=n_cards))
    except ValueError as exc:
        raise ApiError(400, f"graph: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - an estimator bug: no estimate, said so, never a 500
        log.exception("the static estimate failed")
        suggestion = Suggestion("none", None, None, rough=True, reasons=(f"the estimate failed: {type(exc).__name__}: "
                                                                         f"{exc}",), n_cards=n_cards)
    notes = []
    for keys in mem_keys:
        for k in keys:
            if adm.ledger.card_status(k, 1) in (NO_TOTAL, UNREPORTED):
                text = adm.ledger.card_text(k, 1)
                if text and text not in notes:
                    notes.append(text)
    out = {**suggestion.to_json(), "graph_key": key, "shared_cards": bool(split.memory), "notes": notes,
           "applied": False}
    return web.json_response(out)


SUGGESTION = {
    "type": "object",
    "required": ["source", "budget_gib", "total_gib", "items", "rough", "reasons", "from_run", "n_cards"],
    "properties": {
        "source": {"type": "string", "enum": ["measured", "estimate", "none"],
                   "description": "measured: peak + 20% of a successful run of the same graph on as many cards"},
        "budget_gib": {"type": ["number", "null"], "description": "what the budget field is prefilled with "
                                                                  "(null: rough, or no estimate)"},
        "total_gib": {"type": ["number", "null"], "description": "the items added up"},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "gib": {"type": "number"}, "bytes": {"type": "integer"},
            "label": {"type": "string"}}}},
        "rough": {"type": "boolean"}, "reasons": {"type": "array", "items": {"type": "string"}},
        "from_run": {"type": ["string", "null"]}, "n_cards": {"type": "integer"},
        "graph_key": {"type": ["string", "null"]}, "shared_cards": {"type": "boolean"},
        "notes": {"type": "array", "items": {"type": "string"}},
        "applied": {"type": "boolean", "description": "always false: the server never applies an estimate"},
        "elapsed_s": {"type": "number"},
    },
}


def setup(app: web.Application) -> None:
    app.add_routes(routes)
    openapi.describe(app, "post", "/api/estimates", {
        "summary": "The memory budget the Queue on... dialog suggests: the measured default, or the static "
                   "estimate item by item (never applied by the server)",
        "responses": {"200": {"description": "the suggestion", "content": {"application/json": {
            "schema": SUGGESTION}}},
            **{str(c): {"description": "error", "content": {"application/json": {"schema": openapi.ERROR}}}
               for c in (400, 401, 403, 413)}},
    })

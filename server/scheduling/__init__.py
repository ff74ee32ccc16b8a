"""The slot rule (docs/sidecar.md) and routing choice (docs/sidecar.md) as pure functions: no I/O, no clock.

Modules: ``offers`` (providers and their devices), ``limits`` (1 per accelerator, 2 per CPU, the
overrides), ``state`` (slots keyed by UUID), ``plan`` (the reference pass), ``queue`` (SlotQueue, the
incremental pass the dispatcher uses), ``waiting`` (waiting_reason texts), ``routing`` (a target ->
candidates). Parsing ``options.target`` is API validation and lives in ``run/requests.py``.

Vocabulary
----------
* A **provider** offers devices and starts runs: the sidecar itself (provider ``local``) or a worker
  agent (provider = the worker's name). :class:`ProviderInfo` is what the rule needs to know about one.
* A **slot** is one physical device. Its key is the device's UUID when the provider reported one, else
  ``"<provider>/<device>"``. One physical card offered by several providers (the sidecar and a worker on
  the same machine, or two agents on one GPU server) is ONE slot: every run through any of them counts
  against it, and its limit is the smallest limit among the providers offering it that are online.
* A provider's limit for one of its devices: an override from ``XPUFLEET_RUN_QUEUE_MAX_CONCURRENT``
  (``cuda:0=2`` = this server's cuda:0, ``gpu-box/cuda:1=3`` = worker gpu-box's cuda:1), else 1 for an
  accelerator and 2 for a CPU. A worker without its own override on a card the sidecar also offers
  (same UUID) uses the sidecar's override for that card, so ``cuda:0=2`` raises it too.
* A **queued run** lists its **candidates** in preference order: each is a provider plus the provider's
  names of the devices the run would take (one device, or a device set taking every slot at once).

:func:`plan` walks the queue in submission order and places every run whose slots are free. A device-set
run that cannot start takes (reserves) whatever of its slots is free as it waits, so runs submitted after
it cannot take those slots and a stream of single-card runs cannot starve it. An optional ``admit``
callback is an extra admission predicate (the memory ledger of docs/memory.md plugs in there).

:func:`routing.resolve_target` turns a parsed target into candidates (docs/sidecar.md), with the
exact 400 wording of the seed, and ``device_fallback`` warnings for a local run whose device is missing.
"""

from .limits import LimitOverrides, default_limit, parse_limits
from .offers import DeviceOffer, ProviderInfo, short_id
from .plan import AdmitFn, Candidate, Placement, Plan, QueuedRun, explain_wait, plan
from .queue import SlotQueue
from .routing import MEMORY_SOURCES, Resolution, RunTarget, TargetError, resolve_target
from .state import SlotState, build_state, slot_key

__all__ = [
    "MEMORY_SOURCES", "AdmitFn", "Candidate", "DeviceOffer", "LimitOverrides", "Placement", "Plan", "ProviderInfo",
    "QueuedRun", "Resolution", "RunTarget", "SlotQueue", "SlotState", "TargetError", "build_state",
    "default_limit", "explain_wait", "parse_limits", "plan", "resolve_target", "short_id", "slot_key",
]

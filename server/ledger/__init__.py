"""Memory-shared cards (docs/memory.md, docs/workers.md "sharing a card"): pure rules, no I/O.

* :mod:`.graph_key`: the runtime-graph key that measured peaks are filed under.
* :mod:`.fit`: the per-card ledger, the fit rule, the rejection and waiting texts, and an incremental
  queue of runs waiting for memory.
* :mod:`.budget`: which budget a run gets (typed, measured peak + 20%, estimate) and when it is raised.
"""

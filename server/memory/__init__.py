"""Memory-shared cards in the sidecar (docs/memory.md; docs/workers.md, "sharing a card"): the I/O around the pure rules
of :mod:`..ledger`.

* :mod:`.peaks`: what a finished run's ``peak_memory`` says (CUDA peak, MPS driver-held memory, a
  simulated card's tensor bytes), pure;
* :mod:`.records`: the SQLite tables (each run's graph key, number of cards and budget; every finished
  run's per-card peak);
* :mod:`.admission`: :class:`~.admission.MemoryAdmission`, the dispatcher's memory part: which cards admit
  by memory, the ledger fed by heartbeats, the queue of runs waiting for memory, budgets at submit time and
  while waiting; it gets the store, the provider table and callables from the dispatcher, never the
  dispatcher itself;
* :mod:`.texts`: why a run waits for memory (plain functions); :mod:`.outcomes`: an OOM's text and the
  NVML per-run use (:class:`~.outcomes.RunUsage`);
* :mod:`.views`: the budget and memory fields of the Runs and Workers data.
"""

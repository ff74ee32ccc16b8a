"""Everything that runs runs, one subpackage per part (docs/architecture.md draws the map):

* ``devices/``: the device layer (one name parser, renumbering, simulated cards, the probe, inventory);
* ``scheduling/``: the slot rule and the routing choice, pure;
* ``run/``: one run's processes (spec, launcher, runner, graph executor);
* ``sidecar/``: the aiohttp app, its routes, dispatcher, store, local provider;
* ``workers/``: the sidecar's side of worker agents;
* ``agent/``: the worker agent process;
* ``ledger/``: memory-shared cards' rules (graph key, fit rule and texts, budgets, the memory queue), pure;
* ``memory/``: the sidecar's admission by memory on shared cards (ledger fed by heartbeats, budgets, peaks);
* ``cli/``: the ``xpufleet`` command;
* ``comfy/``: the routes the plugin adds to ComfyUI's own server.
"""

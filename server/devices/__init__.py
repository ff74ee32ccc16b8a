"""The device layer: one name parser (names.py), in-run renumbering (renumbering.py), simulated cards
(simulated.py), the probe of this machine's real devices (probe.py) and an agent's inventory
(inventory.py). Shared by the agent, the sidecar, the scheduler, the nodes and the predictor."""

from .inventory import Inventory, environment_summary
from .names import (
    DeviceSpecError,
    device_index,
    device_kind,
    is_accelerator,
    normalize_device,
    parse_device_list,
)
from .renumbering import Renumbering, renumber
from .simulated import (
    SimulatedCard,
    parse_simulate,
    set_simulated_free,
    simulated_file,
    simulated_uuid,
    write_simulated_file,
)

__all__ = [
    "DeviceSpecError", "Inventory", "Renumbering", "SimulatedCard", "device_index", "device_kind",
    "environment_summary", "is_accelerator", "normalize_device", "parse_device_list", "parse_simulate", "renumber",
    "set_simulated_free", "simulated_file", "simulated_uuid", "write_simulated_file",
]

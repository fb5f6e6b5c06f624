"""Statistical procedures as registered parts (``preset=...``): protocol, modules, registry."""

from napari_attnreg.core.stats.procedures.base import (
    STATISTICS_KEYS,
    THRESHOLD_KEYS,
    MapText,
    Procedure,
)
from napari_attnreg.core.stats.procedures.registry import (
    DEFAULT_PROCEDURE,
    get_procedure,
    procedure_names,
    procedures_reading,
    register,
    unregister,
)

__all__ = ["DEFAULT_PROCEDURE", "STATISTICS_KEYS", "THRESHOLD_KEYS", "MapText", "Procedure",
           "get_procedure", "procedure_names", "procedures_reading", "register", "unregister"]

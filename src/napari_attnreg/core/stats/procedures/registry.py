"""The registry of statistical procedures: the only place a preset name is looked up.

Examples
--------
>>> procedure_names()
('stepdown', 'directional', 'paper')
>>> get_procedure("paper").one_sided
False
"""

from __future__ import annotations

from napari_attnreg.core.stats.procedures import directional, paper, stepdown
from napari_attnreg.core.stats.procedures.base import Procedure

DEFAULT_PROCEDURE = "stepdown"
_REGISTRY: dict[str, Procedure] = {}


def register(procedure: Procedure) -> Procedure:
    """Make ``procedure`` available under its ``name`` (to every route and front end).

    Raises
    ------
    ValueError
        When the name is empty or already taken.
    """
    if not procedure.name or procedure.name in _REGISTRY:
        raise ValueError(f"a procedure needs a new, non-empty name; {procedure.name!r} is "
                         f"{'taken' if procedure.name else 'empty'}.")
    _REGISTRY[procedure.name] = procedure
    return procedure


def unregister(name: str) -> None:
    """Remove a procedure (tests that register their own); the default cannot be removed."""
    if name == DEFAULT_PROCEDURE:
        raise ValueError(f"the default procedure {name!r} cannot be removed.")
    _REGISTRY.pop(name, None)


def procedure_names() -> tuple[str, ...]:
    """The registered preset names, the default first."""
    return tuple(_REGISTRY)


def get_procedure(name: str) -> Procedure:
    """The procedure called ``name``.

    Raises
    ------
    ValueError
        For an unknown name, listing the choices.
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"preset={name!r} is not supported; use one of {procedure_names()} "
                         f"('{DEFAULT_PROCEDURE}' is the default).") from None


def procedures_reading(option: str) -> tuple[str, ...]:
    """Names of the procedures an option of one procedure family applies to."""
    return tuple(name for name, proc in _REGISTRY.items() if proc.applies(option))


for _module in (stepdown, directional, paper):
    register(_module.PROCEDURE)

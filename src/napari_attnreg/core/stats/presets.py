"""Presets: which statistical procedure a run uses, and the defaults that go with it.

A thin layer over :mod:`napari_attnreg.core.stats.procedures`, kept for the names callers
already import. Each procedure is one module there (``stepdown``, the default;
``directional``; ``paper``) that owns its defaults, rules, mask, maps and legends. A preset
only fills options the caller left unset; explicit options win.

``"stepdown"`` asks "does this image's attention concentrate on anything more than null
images made of its own half-patch blocks do, and on which patches?". ``"directional"`` asks
"is this token's attention *higher* than noise input gives?" with π0 = 1 (the tokens of one
attention map share the softmax's random normalisation, so on a noise image their p-values
move together and an estimated π0 calls far too many of them significant). ``"paper"`` is
the published procedure of Chung & Laletin (AISTATS 2026) unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from napari_attnreg.core.stats.procedures import (
    DEFAULT_PROCEDURE,
    THRESHOLD_KEYS,
    get_procedure,
    procedure_names,
)

DEFAULT_PRESET = DEFAULT_PROCEDURE
#: The built-in presets, the default first (call :func:`presets` for those registered later).
PRESETS = procedure_names()

__all__ = ["DEFAULT_PRESET", "PRESETS", "PRESET_DEFAULTS", "RULES_BY_PRESET", "THRESHOLD_KEYS",
           "check_preset", "default_thresholds", "presets", "resolve_options", "rules_for"]


class _ByPreset(Mapping[str, Any]):
    """A read-only view ``preset name → one attribute of its procedure`` (always current)."""

    def __init__(self, attribute: str) -> None:
        self._attribute = attribute

    def __getitem__(self, name: str) -> Any:
        if name not in procedure_names():
            raise KeyError(name)
        return getattr(get_procedure(name), self._attribute)

    def __iter__(self) -> Iterator[str]:
        return iter(procedure_names())

    def __len__(self) -> int:
        return len(procedure_names())


#: Options whose default depends on the preset (``None`` in a RunConfig means "from preset").
PRESET_DEFAULTS: Mapping[str, Mapping[str, Any]] = _ByPreset("defaults")
#: The significance rules each preset offers (the step-down rules need its step p-values).
RULES_BY_PRESET: Mapping[str, tuple[str, ...]] = _ByPreset("rules")


def presets() -> tuple[str, ...]:
    """The registered preset names, the default first."""
    return procedure_names()


def check_preset(preset: str) -> str:
    """Return ``preset`` if known, else raise a ValueError that lists the choices."""
    get_procedure(preset)
    return preset


def resolve_options(preset: str, options: dict[str, Any]) -> dict[str, Any]:
    """Fill the preset-dependent options that are ``None`` (or absent) from the preset.

    Raises
    ------
    ValueError
        For an explicit option the preset cannot honour (e.g. a two-sided p-value under
        ``"directional"``, or the position null under ``"paper"``).
    """
    return get_procedure(preset).resolve(options)


def rules_for(preset: str) -> tuple[str, ...]:
    """The significance rules a result of ``preset`` offers (front ends list only these)."""
    return get_procedure(preset).rules


def default_thresholds(preset: str) -> dict[str, Any]:
    """The rule and thresholds a preset starts with."""
    return get_procedure(preset).default_thresholds()

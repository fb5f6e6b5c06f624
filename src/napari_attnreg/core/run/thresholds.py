"""One value for the significance rule and its thresholds, passed whole between layers.

:class:`Thresholds` is a read-only mapping (``rule``, ``z_th``, ``p_th``, ``l_th``,
``q_th``), so every function that took the old ``dict`` takes it unchanged, and it is
checked by the option validator once, when it is made.

Example
-------
>>> t = Thresholds.from_preset("directional")
>>> t.rule, t.q_th
('q', 0.1)
>>> t.replace(q_th=0.05)["q_th"]
0.05

``Thresholds.of(result)`` reads the thresholds a result applies.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from dataclasses import replace as _replace
from typing import Any

from napari_attnreg.core.run.options import validate_options
from napari_attnreg.core.stats.procedures import DEFAULT_PROCEDURE, THRESHOLD_KEYS, get_procedure


@dataclass(frozen=True)
class Thresholds(Mapping):
    """The significance rule and the thresholds it reads (``z_th=None``: no z mask)."""

    rule: str
    z_th: float | None
    p_th: float
    l_th: float
    q_th: float

    def __post_init__(self) -> None:
        checked = validate_options({k: getattr(self, k) for k in THRESHOLD_KEYS})
        for name in ("p_th", "l_th", "q_th", "rule"):
            if checked[name] is None:
                raise ValueError(f"{name} must be set in a Thresholds value.")
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @classmethod
    def from_preset(cls, preset: str) -> Thresholds:
        """The rule and thresholds ``preset`` starts with."""
        return cls(**get_procedure(preset).default_thresholds())

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any],
                     preset: str = DEFAULT_PROCEDURE) -> Thresholds:
        """Fill the keys ``values`` lacks from ``preset`` (other keys are ignored; the default
        preset when none is named)."""
        given = {k: values[k] for k in THRESHOLD_KEYS if k in values}
        return cls(**{**get_procedure(preset).default_thresholds(), **given})

    @classmethod
    def of(cls, result: Any) -> Thresholds:
        """The thresholds ``result`` applies by default (its ``thresholds_used``).

        Examples
        --------
        >>> Thresholds.of(result).rule                 # doctest: +SKIP
        'forwardstop'
        """
        return cls.from_mapping(result.thresholds_used, result.preset)

    from_result = of  # the name of 0.1

    def replace(self, **changes: Any) -> Thresholds:
        """A copy with ``changes`` applied (and checked)."""
        return _replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """A plain ``dict`` of the five keys (for JSON and ``**`` into a RunConfig)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __getitem__(self, key: str) -> Any:
        if key not in THRESHOLD_KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(THRESHOLD_KEYS)

    def __len__(self) -> int:
        return len(THRESHOLD_KEYS)

"""The explorer's view state: plain traitlets that every panel links its controls to.

Panels never talk to each other; they read and write these traits (the anywidget / ipympl
manner: a small model with synced traits). The run settings and the thresholds traits are
kept in step with the explorer's :class:`~napari_attnreg.session.Session` by
:class:`~.session_link.SessionLink`: the thresholds traits show the selected result's
thresholds. A value that fails validation raises ``TraitError`` and leaves both the trait and
its control as they were.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import traitlets as t

from napari_attnreg.core.results.display import MAPS_BY_KEY
from napari_attnreg.core.run.engine import RunConfig
from napari_attnreg.core.run.options import NULL_METHODS, RULES, default_for, validate_options
from napari_attnreg.core.run.service import available_devices
from napari_attnreg.core.run.thresholds import Thresholds
from napari_attnreg.core.stats.presets import (
    DEFAULT_PRESET,
    THRESHOLD_KEYS,
    default_thresholds,
    presets,
)
from napari_attnreg.notebook import render
from napari_attnreg.notebook.option_controls import check_opacity
from napari_attnreg.notebook.views import DRAW_MODES
from napari_attnreg.session.model import check_rule

#: Overlay choices: (label shown, state value); the value is a core.display map key.
#: The soft map and the p map are named per preset (:func:`overlay_options`).
OVERLAYS = (
    ("regularized attention", "regularized"),
    ("raw attention", "attention"),
    ("posterior", "posterior"),
    ("−log10 p", "pvalue"),
    ("none (image only)", "none"),
)


def overlay_options(preset: str, map_label: str = "attention") -> list[tuple[str, str]]:
    """:data:`OVERLAYS` with the soft map and the p map named as ``preset`` computes them
    (step-down: "evidence (1 − adjusted p)", its adjusted p), as napari names their layers,
    and the raw and regularized maps after the map tested (``"raw attention rollout"``: a
    rollout result's colour bar says "attention rollout (raw)", not attention)."""
    names = {"attention": f"raw {map_label}", "regularized": f"regularized {map_label}"}
    return [(MAPS_BY_KEY[value].title(preset) if value in ("posterior", "pvalue")
             else names.get(value, label), value) for label, value in OVERLAYS]
class NumberTrait(t.Float):
    """A float trait that refuses a bool with the words the constructor uses.

    traitlets' ``Float`` turns ``True`` into ``1.0`` before any ``@validate`` sees it:
    ``explorer.opacity = True`` drew the overlay opaque and ``explorer.p_th = True`` kept
    every patch, where ``AttentionExplorer(..., opacity=True)`` is refused.
    """

    def validate(self, obj: Any, value: Any) -> Any:
        if isinstance(value, (bool, np.bool_)):
            try:
                if self.name == "opacity":
                    check_opacity(value)
                else:
                    validate_options({self.name: value})
            except ValueError as err:
                raise t.TraitError(str(err)) from None
            raise t.TraitError(f"{self.name} must be a number, got {value!r} (a bool).")
        return super().validate(obj, value)


#: The engine's defaults (the tiling options' among them).
RUN_DEFAULTS = RunConfig()
_PRESET = default_thresholds(DEFAULT_PRESET)


class ExplorerState(t.HasTraits):
    """Traits shared by the explorer's panels (each control is linked to one of them)."""

    model_name = t.Unicode("demo")
    method = t.Enum(NULL_METHODS, default_value=default_for("method", DEFAULT_PRESET))
    n_boot = t.Int(default_for("n_boot"))
    seed = t.Int(default_for("seed"))
    device = t.Unicode(default_for("device"))
    tiled = t.Bool(RUN_DEFAULTS.tiled)
    tile_overlap = t.Int(RUN_DEFAULTS.tile_overlap, allow_none=True)  # None: a quarter tile
    tile_scale = NumberTrait(RUN_DEFAULTS.tile_scale)
    preset = t.Enum(presets(), default_value=DEFAULT_PRESET)
    #: The preset of what the thresholds show (the selected result's, else ``preset``): its
    #: rules are the ones offered.
    shown_preset = t.Enum(presets(), default_value=DEFAULT_PRESET)
    #: How the shown result's map is called ("attention", "attention rollout", "CDAM"): the
    #: raw and regularized overlays are named after it.
    shown_map = t.Unicode("attention")
    rule = t.Enum(RULES, default_value=_PRESET["rule"])
    q_th = NumberTrait(_PRESET["q_th"])
    p_th = NumberTrait(_PRESET["p_th"])
    l_th = NumberTrait(_PRESET["l_th"])
    z_th = NumberTrait(_PRESET["z_th"], allow_none=True)
    overlay = t.Enum([v for _, v in OVERLAYS] + ["p"], default_value="regularized")  # "p": old name
    colormap = t.Unicode("auto")
    opacity = NumberTrait(0.6)
    outline = t.Bool(True)
    draw_mode = t.Enum(DRAW_MODES, default_value="off")
    slice_index = t.Tuple()
    running = t.Bool(False)
    status = t.Unicode("")

    def thresholds(self) -> Thresholds:
        """The rule and thresholds the controls set (``z_th`` None: no z mask)."""
        return Thresholds(**{key: getattr(self, key) for key in THRESHOLD_KEYS})

    @t.observe("preset")
    def _preset_changed(self, change: dict) -> None:
        # the null method follows the preset; its thresholds come through the session (which
        # leaves a selected result's own alone)
        self.method = default_for("method", change["new"])

    @t.validate("device")
    def _valid_device(self, proposal: dict) -> str:
        devices = available_devices()
        if proposal["value"] not in devices:
            raise t.TraitError(f"device {proposal['value']!r} is not available on this machine; "
                               f"choose one of {', '.join(devices)}.")
        return proposal["value"]

    @t.validate("n_boot", "seed", "tile_scale", "tile_overlap", "q_th", "p_th", "l_th", "z_th",
                "method")
    def _valid_option(self, proposal: dict) -> Any:
        # the core's one validator, so a value refused here is refused with the same words
        # by napari, the CLI and regularize()
        name = proposal["trait"].name
        try:
            return validate_options({name: proposal["value"]})[name]
        except ValueError as err:
            raise t.TraitError(str(err)) from None

    @t.validate("rule")
    def _valid_rule(self, proposal: dict) -> str:
        # the rules of the shown result's preset only: explorer.rule = "q" over a step-down
        # result was taken, and every redraw, table and export failed after it
        rule = self._valid_option(proposal)
        try:
            check_rule(rule, self.shown_preset)
        except ValueError as err:
            raise t.TraitError(str(err)) from None
        return rule

    @t.validate("overlay")
    def _valid_overlay(self, proposal: dict) -> str:
        return "pvalue" if proposal["value"] == "p" else proposal["value"]

    @t.validate("opacity")
    def _valid_opacity(self, proposal: dict) -> float:
        # as the constructor refuses it: explorer.opacity = 5 showed 5 on the slider's
        # readout while the overlay was drawn at 1
        try:
            return check_opacity(proposal["value"])
        except ValueError as err:
            raise t.TraitError(str(err)) from None

    @t.validate("colormap")
    def _valid_colormap(self, proposal: dict) -> str:
        if proposal["value"] != "auto":
            render.colormap_lut(proposal["value"])
        return proposal["value"]


class StateTrait:
    """``explorer.q_th`` reads and sets ``explorer.state.q_th`` (the explorer's public names).

    The explorer holds its state instead of being it; this keeps ``explorer.preset = "paper"``
    and friends working.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.__doc__ = f"The state's ``{name}`` trait."

    def __get__(self, explorer: Any, owner: type | None = None) -> Any:
        return self if explorer is None else getattr(explorer.state, self.name)

    def __set__(self, explorer: Any, value: Any) -> None:
        setattr(explorer.state, self.name, value)

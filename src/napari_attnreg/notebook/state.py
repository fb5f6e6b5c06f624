"""The explorer's state: plain traitlets that every panel links its controls to.

Panels never talk to each other; they read and write these traits, and the explorer
observes them (the anywidget / ipympl manner: a small model with synced traits). A value
that fails validation raises ``TraitError`` and leaves both the trait and its control as
they were.
"""

from __future__ import annotations

import math

import ipywidgets as widgets
import traitlets as t

from ..core.engine import RunConfig
from ..core.nulls import NULL_METHODS
from ..core.presets import DEFAULT_PRESET, PRESETS, THRESHOLD_KEYS, default_thresholds
from ..core.regularize import RULES
from ..core.tiling import TILE_OVERLAP_MAX, TILE_SCALE_RANGE
from . import render
from .views import DRAW_MODES

#: Overlay choices: (label shown, state value); the value is a core.display map key.
OVERLAYS = (
    ("regularized attention", "regularized"),
    ("raw attention", "attention"),
    ("posterior", "posterior"),
    ("−log10 p", "pvalue"),
    ("none (image only)", "none"),
)
#: The engine's defaults (the tiling options' among them).
RUN_DEFAULTS = RunConfig()
_PRESET = default_thresholds(DEFAULT_PRESET)


def available_devices() -> list[str]:
    """Compute devices that exist on this machine (``auto`` first)."""
    import torch

    names = ["auto", "cpu"]
    if torch.cuda.is_available():
        names += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        names.append("mps")
    return names


class ExplorerState(widgets.VBox):
    """Traits shared by the explorer's panels (each control is linked to one of them)."""

    model_name = t.Unicode("demo")
    method = t.Enum(NULL_METHODS, default_value="normal")
    n_boot = t.Int(200)
    seed = t.Int(0)
    device = t.Unicode("auto")
    tiled = t.Bool(RUN_DEFAULTS.tiled)
    tile_overlap = t.Int(RUN_DEFAULTS.tile_overlap)
    tile_scale = t.Float(RUN_DEFAULTS.tile_scale)
    preset = t.Enum(PRESETS, default_value=DEFAULT_PRESET)
    rule = t.Enum(RULES, default_value=_PRESET["rule"])
    q_th = t.Float(_PRESET["q_th"])
    p_th = t.Float(_PRESET["p_th"])
    l_th = t.Float(_PRESET["l_th"])
    z_th = t.Float(_PRESET["z_th"], allow_none=True)
    overlay = t.Enum([v for _, v in OVERLAYS] + ["p"], default_value="regularized")  # "p": old name
    colormap = t.Unicode("auto")
    opacity = t.Float(0.6)
    outline = t.Bool(True)
    draw_mode = t.Enum(DRAW_MODES, default_value="off")
    slice_index = t.Tuple()
    running = t.Bool(False)
    status = t.Unicode("")

    def thresholds(self) -> dict:
        """The rule and thresholds the controls set (``z_th`` None: no z mask)."""
        return {key: getattr(self, key) for key in THRESHOLD_KEYS}

    @t.observe("preset")
    def _preset_changed(self, change: dict) -> None:
        """The thresholds take the new preset's defaults (one re-render)."""
        with self.hold_trait_notifications():
            for key, value in default_thresholds(change["new"]).items():
                setattr(self, key, value)

    @t.validate("device")
    def _valid_device(self, proposal: dict) -> str:
        devices = available_devices()
        if proposal["value"] not in devices:
            raise t.TraitError(f"device {proposal['value']!r} is not available on this machine; "
                               f"choose one of {', '.join(devices)}.")
        return proposal["value"]

    @t.validate("z_th")
    def _valid_z_th(self, proposal: dict) -> float | None:
        value = proposal["value"]
        if value is not None and not math.isfinite(value):
            raise t.TraitError(f"z_th must be a finite number or None (no z mask), got {value}.")
        return value

    @t.validate("overlay")
    def _valid_overlay(self, proposal: dict) -> str:
        return "pvalue" if proposal["value"] == "p" else proposal["value"]

    @t.validate("colormap")
    def _valid_colormap(self, proposal: dict) -> str:
        if proposal["value"] != "auto":
            render.colormap_lut(proposal["value"])
        return proposal["value"]

    @t.validate("p_th", "l_th", "q_th")
    def _valid_fraction(self, proposal: dict) -> float:
        value = float(proposal["value"])
        if not 0.0 <= value <= 1.0:
            raise t.TraitError(f"{proposal['trait'].name} must be in [0, 1], got {value}.")
        return value

    @t.validate("n_boot")
    def _valid_n_boot(self, proposal: dict) -> int:
        if proposal["value"] < 1:
            raise t.TraitError(f"n_boot must be at least 1, got {proposal['value']}.")
        return proposal["value"]

    @t.validate("tile_scale")
    def _valid_tile_scale(self, proposal: dict) -> float:
        value = float(proposal["value"])
        lo, hi = TILE_SCALE_RANGE
        if not lo <= value <= hi:
            raise t.TraitError(f"tile_scale must be in [{lo:g}, {hi:g}] (1 = native pixels, "
                               f"2 = half size), got {value}.")
        return value

    @t.validate("tile_overlap")
    def _valid_tile_overlap(self, proposal: dict) -> int:
        value = proposal["value"]
        if not 0 <= value <= TILE_OVERLAP_MAX:
            raise t.TraitError(f"tile_overlap must be 0–{TILE_OVERLAP_MAX} pixels (a multiple of "
                               f"the patch size), got {value}.")
        return value

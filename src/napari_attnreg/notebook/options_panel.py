"""Run options: model, statistics preset, null method, B, seed, device and tiling."""

from __future__ import annotations

import ipywidgets as W

from ..core.display import PRESET_HELP, TILED_LABEL, TILING_HELP
from ..core.nulls import NULL_METHODS
from ..core.presets import PRESETS
from ..core.tiling import TILE_OVERLAP_MAX, TILE_SCALE_RANGE
from .model_picker import ModelPicker
from .state import ExplorerState, available_devices

#: Width of a labelled control in the side panel, and of its label.
CONTROL_WIDTH = "340px"
LABEL_STYLE = {"description_width": "110px"}
#: Controls locked while a run computes (the run uses the values it started with).
RUN_INPUTS = ("model", "preset", "method", "n_boot", "seed", "device", "tiled")


def labelled(widget_type: type, description: str, tooltip: str, **kwargs) -> W.Widget:
    """A control of the side panel: one width, one label width, a tooltip on every control."""
    return widget_type(description=description, tooltip=tooltip,
                       layout=W.Layout(width=CONTROL_WIDTH), style=dict(LABEL_STYLE), **kwargs)


def link_all(state: ExplorerState, controls: dict[str, W.Widget], traits: dict[str, str]) -> None:
    """Link each control's ``value`` to its trait (the state is the source of the first sync)."""
    for key, trait in traits.items():
        W.link((state, trait), (controls[key], "value"))


class OptionsPanel(W.VBox):
    """What to compute. Changing these takes effect at the next Run."""

    def __init__(self, state: ExplorerState) -> None:
        super().__init__()
        self.state = state
        devices = available_devices()
        self.controls: dict[str, W.Widget] = {
            "model": ModelPicker(description="model", layout=W.Layout(width=CONTROL_WIDTH),
                                 style=dict(LABEL_STYLE)),
            "preset": labelled(
                W.Dropdown, "statistics",
                "Which question the statistics answer.\n"
                + "\n".join(f"• {PRESET_HELP[p]}" for p in PRESETS)
                + "\nChanging it resets the thresholds; press Run to compute with it.",
                options=[(p, p) for p in PRESETS]),
            "method": labelled(W.Dropdown, "null method",
                               "How the bootstrap null images are drawn from this image.",
                               options=list(NULL_METHODS)),
            "n_boot": labelled(W.BoundedIntText, "bootstrap B",
                               "Number of null images; more gives finer p-values.",
                               min=1, max=100_000),
            "seed": labelled(W.IntText, "seed", "Random seed of the null images."),
            "device": labelled(W.Dropdown, "device",
                               "Where to compute: auto = GPU (cuda, mps) when there is one.",
                               options=devices),
            "tiled": W.Checkbox(description=TILED_LABEL, indent=False,
                                tooltip=TILING_HELP["tiled"]),
            "tile_overlap": labelled(W.BoundedIntText, "overlap px", TILING_HELP["tile_overlap"],
                                     min=0, max=TILE_OVERLAP_MAX),
            "tile_scale": labelled(W.BoundedFloatText, "downsample ÷", TILING_HELP["tile_scale"],
                                   min=TILE_SCALE_RANGE[0], max=TILE_SCALE_RANGE[1], step=0.5),
        }
        link_all(state, self.controls, {
            "model": "model_name", "preset": "preset", "method": "method", "n_boot": "n_boot",
            "seed": "seed", "device": "device", "tiled": "tiled",
            "tile_overlap": "tile_overlap", "tile_scale": "tile_scale"})
        state.observe(lambda _c: self.sync(), names=["running", "tiled"])
        self.children = tuple(self.controls.values())
        self.sync()

    def sync(self) -> None:
        """Lock the inputs during a run; the tiling options only apply to tiled runs."""
        busy = self.state.running
        for name in RUN_INPUTS:
            self.controls[name].disabled = busy
        for name in ("tile_overlap", "tile_scale"):
            self.controls[name].disabled = busy or not self.state.tiled

"""Run options: model, statistics preset, null method, B, seed, device, tiling, advanced.

Every control except the model picker is built from the core's option metadata.
Changing these takes effect at the next Run.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as W

from napari_attnreg.core.run.options import OPTIONS, option
from napari_attnreg.notebook.advanced_panel import AdvancedPanel
from napari_attnreg.notebook.model_picker import ModelPicker
from napari_attnreg.notebook.option_controls import CONTROL_WIDTH, LABEL_WIDTH, build_control
from napari_attnreg.notebook.state import ExplorerState, available_devices

#: Options with a control here; each is a trait of the same name on the explorer.
MAIN_OPTIONS = ("preset", "method", "n_boot", "seed", "device", "tiled", "tile_overlap",
                "tile_scale")
#: Controls locked while a run computes (the run uses the values it started with).
RUN_INPUTS = ("model", "preset", "method", "n_boot", "seed", "device", "tiled")


#: Main controls whose state always holds a value (the preset fills it): no "unset" entry.
_STATE_CHOICES = {"method": {"options": [(option("method").label_of(c), c)
                                         for c in option("method").choices]}}


def link_all(state: ExplorerState, controls: dict[str, W.Widget], traits: dict[str, str]) -> None:
    """Link each control's ``value`` to its trait (the state is the source of the first sync).

    A number that may be unset (e.g. the tile overlap, empty = a quarter tile) has a text box;
    its link turns "" into None and back, and leaves the trait alone for text that is no number.
    """
    for key, trait in traits.items():
        opt = option(trait) if trait in OPTIONS else None
        if isinstance(controls[key], W.Text) and opt is not None and opt.kind in ("int", "float"):
            W.link((state, trait), (controls[key], "value"),
                   transform=(_number_text, _text_number(state, trait, opt.kind)))
        else:
            W.link((state, trait), (controls[key], "value"))


def _number_text(value: Any) -> str:
    return "" if value is None else str(value)


def _text_number(state: ExplorerState, trait: str, kind: str):
    def parse(text: str) -> Any:
        text = text.strip()
        if not text:
            return None
        try:
            return int(text) if kind == "int" else float(text)
        except ValueError:
            return getattr(state, trait)  # not a number: keep the value in force
    return parse


def device_control() -> W.Dropdown:
    """The devices that exist here (the option itself accepts any device name)."""
    opt = option("device")
    return W.Dropdown(options=available_devices(), description=opt.label, tooltip=opt.help,
                      layout=W.Layout(width=CONTROL_WIDTH),
                      style={"description_width": LABEL_WIDTH})


class OptionsPanel(W.VBox):
    """What to compute: the main options, then the advanced ones (collapsed)."""

    def __init__(self, state: ExplorerState, run_options: dict[str, Any]) -> None:
        super().__init__()
        self.state = state
        self.controls: dict[str, W.Widget] = {
            "model": ModelPicker(description="model", layout=W.Layout(width=CONTROL_WIDTH),
                                 style={"description_width": LABEL_WIDTH})}
        for name in MAIN_OPTIONS:
            self.controls[name] = device_control() if name == "device" else build_control(
                name, **_STATE_CHOICES.get(name, {}))
        link_all(state, self.controls, {"model": "model_name",
                                        **{name: name for name in MAIN_OPTIONS}})
        self.advanced = AdvancedPanel(run_options)
        state.observe(lambda _c: self.sync(), names=["running", "tiled", "preset", "method"])
        self.children = (*self.controls.values(), self.advanced)
        self.sync()

    def sync(self) -> None:
        """Lock the inputs during a run; grey out options this preset / method / tiling ignores."""
        busy = self.state.running
        for name in RUN_INPUTS:
            self.controls[name].disabled = busy
        for name in ("tile_overlap", "tile_scale"):
            self.controls[name].disabled = busy or not self.state.tiled
        self.advanced.applicable = {
            name: opt.applies(preset=self.state.preset, method=self.state.method,
                              tiled=self.state.tiled)
            for name, opt in self.advanced.options.items()}
        self.advanced.disabled = busy

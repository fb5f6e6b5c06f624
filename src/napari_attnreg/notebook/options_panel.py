"""Run options: model, statistics preset, null method, B, device, tiling; the advanced ones.

Every control except the model picker is built from the core's option metadata, which also
places it (``Option.advanced``: in the collapsed *Advanced options*) and greys out what the
preset, null method and tiling leave unread (:func:`~napari_attnreg.core.run.options.
applicable_options`). Options the explorer holds as traits are linked to them wherever they
sit. Changing these takes effect at the next Run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as W
import traitlets as t

from napari_attnreg.core.run.options import OPTIONS, applicable_options, option, panel_options
from napari_attnreg.notebook.advanced_panel import ELSEWHERE, STATE_OPTIONS, AdvancedPanel
from napari_attnreg.notebook.model_picker import ModelPicker
from napari_attnreg.notebook.option_controls import CONTROL_WIDTH, LABEL_WIDTH, build_control
from napari_attnreg.notebook.state import ExplorerState, available_devices

#: Run settings that decide which other options apply.
DECIDING = ("preset", "method", "tiled")


#: Main controls whose state always holds a value (the preset fills it): no "unset" entry.
_STATE_CHOICES = {"method": {"options": [(option("method").label_of(c), c)
                                         for c in option("method").choices]}}


def link_all(state: ExplorerState, controls: dict[str, W.Widget], traits: dict[str, str],
             on_invalid: Callable[[str], Any] | None = None) -> None:
    """Link each control's ``value`` to its trait (the state is the source of the first sync).

    A number that may be unset (e.g. the tile overlap, empty = a quarter tile) has a text box:
    "" is None; text that is no number, or a number the option refuses, goes to
    ``on_invalid`` with the core's words and the box shows the value in force again.
    """
    for key, trait in traits.items():
        opt = option(trait) if trait in OPTIONS else None
        if isinstance(controls[key], W.Text) and opt is not None and opt.kind in ("int", "float"):
            _link_number_text(state, trait, controls[key], opt.kind, opt.label,
                              on_invalid or _raise)
        else:
            W.link((state, trait), (controls[key], "value"))


def _raise(message: str) -> None:
    raise ValueError(message)


def _number_text(value: Any) -> str:
    return "" if value is None else str(value)


def _link_number_text(state: ExplorerState, trait: str, box: W.Text, kind: str, label: str,
                      on_invalid: Callable[[str], Any]) -> None:
    # a W.link raised the trait's refusal (99999) inside the comm handler: a traceback in
    # the kernel's log, nothing in the widget, and the box kept showing what is not used
    def show(_change: Any = None) -> None:
        box.value = _number_text(getattr(state, trait))

    def parse(change: dict) -> None:
        text = change["new"].strip()
        try:
            value = None if not text else int(text) if kind == "int" else float(text)
        except ValueError:
            show()
            on_invalid(f"{label}: {text!r} is not a number; leave it empty for auto.")
            return
        try:
            setattr(state, trait, value)
        except t.TraitError as err:
            show()
            on_invalid(str(err))

    show()
    state.observe(show, trait)
    box.observe(parse, "value")


def device_control() -> W.Dropdown:
    """The devices that exist here (the option itself accepts any device name)."""
    opt = option("device")
    return W.Dropdown(options=available_devices(), description=opt.label, tooltip=opt.help,
                      layout=W.Layout(width=CONTROL_WIDTH),
                      style={"description_width": LABEL_WIDTH})


class OptionsPanel(W.VBox):
    """What to compute: the basic options, then the advanced ones (collapsed).

    ``controls`` holds the model picker and every control linked to an explorer trait
    (basic or advanced); ``advanced.controls`` the ones read back at Run.
    """

    def __init__(self, state: ExplorerState, run_options: dict[str, Any],
                 on_invalid: Callable[[str], Any] | None = None) -> None:
        super().__init__()
        self.state = state
        self.controls: dict[str, W.Widget] = {
            "model": ModelPicker(description="model", layout=W.Layout(width=CONTROL_WIDTH),
                                 style={"description_width": LABEL_WIDTH})}
        for name in STATE_OPTIONS:
            self.controls[name] = device_control() if name == "device" else build_control(
                name, **_STATE_CHOICES.get(name, {}))
        link_all(state, self.controls, {"model": "model_name",
                                        **{name: name for name in STATE_OPTIONS}}, on_invalid)
        self.advanced = AdvancedPanel(run_options, bound={n: self.controls[n]
                                                          for n in STATE_OPTIONS})
        main = {**self.controls, **self.advanced.main_controls}
        basic = [main[o.name] for o in panel_options(advanced=False, skip=ELSEWHERE)
                 if o.name in main]
        state.observe(lambda _c: self.sync(), names=["running", *DECIDING])
        self.children = (self.controls["model"], *basic, self.advanced)
        self.sync()

    def sync(self) -> None:
        """Lock the inputs during a run; grey out options this preset / method / tiling ignores."""
        busy = self.state.running
        applicable = applicable_options({name: getattr(self.state, name) for name in DECIDING})
        for name, control in self.controls.items():
            control.disabled = busy or (name in OPTIONS and name not in applicable)
        self.advanced.applicable = {name: name in applicable for name in self.advanced.options}
        self.advanced.disabled = busy

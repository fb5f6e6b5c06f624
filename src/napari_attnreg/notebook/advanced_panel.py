"""Advanced run options, collapsed by default: every core option without a control of its own.

The explorer's keyword arguments (``chunk_size=4``, ``target_size="native"`` ...) start here,
and Run reads them back; the core validates them at the start of the run.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as W
from traitlets import TraitError

from napari_attnreg.core.run.options import OPTIONS, Option
from napari_attnreg.notebook.option_controls import build_control, control_value, show_value

#: Options with a control of their own elsewhere (traits of the explorer), or set with the image.
ELSEWHERE = {"preset", "method", "n_boot", "seed", "device", "tiled", "tile_scale",
             "tile_overlap", "rule", "q_th", "p_th", "l_th", "z_th", "channel_axis"}
GROUP_TITLES = {"bootstrap": "Null images", "statistics": "Statistics", "model": "Model",
                "image": "Image", "tiling": "Tiling", "compute": "Compute"}


def advanced_options() -> list[Option]:
    """The options this panel shows, in the core's order."""
    return [o for o in OPTIONS.values() if o.name not in ELSEWHERE]


class AdvancedPanel(W.Accordion):
    """One collapsed section; ``values()`` gives the options that are set."""

    def __init__(self, initial: dict[str, Any] | None = None) -> None:
        self.options = {o.name: o for o in advanced_options()}
        self.controls: dict[str, W.Widget] = {name: build_control(o)
                                              for name, o in self.options.items()}
        self._initial: dict[str, tuple[Any, Any]] = {}  # name -> (value, control value)
        #: whether each option changes a run with the current preset, null method and tiling
        self.applicable: dict[str, bool] = dict.fromkeys(self.controls, True)
        for name, value in (initial or {}).items():
            if name in self.controls:
                self._show_initial(name, value)
        rows: list[W.Widget] = []
        for group, title in GROUP_TITLES.items():
            members = [c for n, c in self.controls.items() if self.options[n].group == group]
            if members:
                rows += [W.HTML(f"<i>{title}</i>"), *members]
        super().__init__(children=[W.VBox(rows)], selected_index=None,
                         layout=W.Layout(width="370px"))
        self.set_title(0, "Advanced options")

    def _show_initial(self, name: str, value: Any) -> None:
        control = self.controls[name]
        try:
            show_value(self.options[name], control, value)
        except TraitError:  # e.g. pi0_method=0.8: not one of the listed choices
            control.disabled = True
            control.tooltip = f"Set in code to {value!r}. " + control.tooltip
        # what the control showed at the start: while it still does, Run uses the value itself
        # (a tuple target_size or a numeric pi0_method survive the round trip this way)
        self._initial[name] = (value, control.value)

    def values(self) -> dict[str, Any]:
        """Options that differ from the engine's defaults (unset ones are left out).

        Raises
        ------
        ValueError
            A number box holding something that is not a number.
        """
        out = {}
        for name, opt in self.options.items():
            if not self.applicable.get(name, True):  # the preset fixes it, or nothing reads it
                continue
            initial, shown = self._initial.get(name, (None, object()))
            control = self.controls[name]
            value = initial if control.value == shown else control_value(opt, control)
            if value is not None and value != opt.default:
                out[name] = value
        return out

    @property
    def disabled(self) -> bool:
        return all(c.disabled for c in self.controls.values())

    @disabled.setter
    def disabled(self, value: bool) -> None:
        for name, control in self.controls.items():
            fixed = name in self._initial and control.tooltip.startswith("Set in code")
            control.disabled = value or fixed or not self.applicable.get(name, True)

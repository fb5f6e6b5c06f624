"""Advanced run options, collapsed by default: every option the metadata marks ``advanced``.

The core's ``Option.advanced`` decides what sits here, grouped as in napari and ``--help``.
Options the explorer holds as traits (the tiling ones) are linked to them by the options
panel and only placed here; every other option's control is read back by :meth:`values`.
The explorer's keyword arguments (``chunk_size=4``, ``target_size="native"`` ...) start here,
and Run reads them back; the core validates them at the start of the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ipywidgets as W
import numpy as np
from traitlets import TraitError

from napari_attnreg.core.run.options import GROUP_TITLES, Option, panel_options
from napari_attnreg.notebook.option_controls import build_control, control_value, show_value
from napari_attnreg.notebook.state import ExplorerState
from napari_attnreg.session.model import same_setting

#: Set with the image (the explorer's ``channel_axis`` argument); thresholds have their own panel.
ELSEWHERE = ("channel_axis",)
#: Run options the explorer holds as traits of the same name (``explorer.n_boot = 500``).
STATE_OPTIONS = tuple(o.name for o in panel_options(skip=ELSEWHERE)
                      if o.name in ExplorerState.class_own_traits())


def read_back_options() -> list[Option]:
    """The options whose controls :meth:`AdvancedPanel.values` reads, in the core's order."""
    return panel_options(skip=(*ELSEWHERE, *STATE_OPTIONS))


#: The widest a control of the section may be: the section's width less its margins.
FIT_WIDTH = "calc(100% - 4px)"


def _fit(widget: W.Widget) -> W.Widget:
    """Let ``widget`` shrink to the section's width. The section's content box is narrower
    than the side panel's 360 px controls (the accordion's padding): in JupyterLab they were
    cut at the right edge, boxes without their right end, and the section scrolled sideways
    under a typed value, hiding the labels' first letters. Each widget also has a margin of
    2 px a side (ipywidgets' ``--jp-widgets-margin``), outside its width."""
    widget.layout.max_width = FIT_WIDTH
    return widget


class AdvancedPanel(W.Accordion):
    """One collapsed section; ``values()`` gives the options that are set.

    Parameters
    ----------
    initial : dict, optional
        Option values given in code (the explorer's ``**run_options``).
    bound : mapping, optional
        Controls linked to explorer traits; the advanced ones among them are placed here too.
    """

    def __init__(self, initial: dict[str, Any] | None = None,
                 bound: Mapping[str, W.Widget] | None = None) -> None:
        self.options = {o.name: o for o in read_back_options()}
        self.controls: dict[str, W.Widget] = {name: build_control(o)
                                              for name, o in self.options.items()}
        self._initial: dict[str, tuple[Any, Any]] = {}  # name -> (value, control value)
        #: whether each option changes a run with the current preset, null method and tiling
        self.applicable: dict[str, bool] = dict.fromkeys(self.controls, True)
        for name, value in (initial or {}).items():
            if name in self.controls:
                self._show_initial(name, value)
        #: read-back controls of options the metadata places above Advanced (none today)
        self.main_controls = {n: c for n, c in self.controls.items() if not self.options[n].advanced}
        placed = {**self.controls, **(bound or {})}
        rows: list[W.Widget] = []
        for group, title in GROUP_TITLES.items():
            members = [placed[o.name] for o in panel_options(advanced=True)
                       if o.group == group and o.name in placed]
            if members:
                rows += [W.HTML(f"<i>{title}</i>"), *members]
        for row in rows:
            _fit(row)
        super().__init__(children=[W.VBox(rows)], selected_index=None,
                         layout=W.Layout(width="370px"))
        self.set_title(0, "Advanced options")

    def hold(self, name: str, value: Any, shown: str) -> None:
        """Run with ``value`` while control ``name`` shows the text ``shown`` (a concept
        ``target``: "concept from 2 regions"); editing the control replaces it."""
        self.controls[name].value = shown
        self._initial[name] = (value, shown)

    def held(self, name: str) -> Any:
        """The value :meth:`hold` set, while its control still shows it (else None)."""
        value, shown = self._initial.get(name, (None, object()))
        return value if self.controls[name].value == shown else None

    def place_after(self, name: str, widget: W.Widget) -> None:
        """Show ``widget`` right under the control of option ``name``."""
        rows = list(self.children[0].children)
        rows.insert(rows.index(self.controls[name]) + 1, _fit(widget))
        self.children[0].children = tuple(rows)

    def show_setting(self, name: str, value: Any) -> None:
        """Show a value set in code (``session.update_settings``) in its control, so the
        next Run, which pushes the panel's values to the session, keeps it."""
        held = self.held(name)
        if held is not None and same_setting(held, value):  # e.g. a concept already held
            return
        current = self.values().get(name, self.options[name].default)
        if not same_setting(current, value):
            self._show_initial(name, value)

    def _show_initial(self, name: str, value: Any) -> None:
        control = self.controls[name]
        if isinstance(value, np.ndarray):  # a concept given in code: its numbers stay here
            self.hold(name, value, "concept (given in code)")
            return
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
            if value is not None and not same_setting(value, opt.default):
                out[name] = value
        return out

    @property
    def disabled(self) -> bool:
        """Whether every read-back control is locked (during a run)."""
        return all(c.disabled for c in self.controls.values())

    @disabled.setter
    def disabled(self, value: bool) -> None:
        for name, control in self.controls.items():
            fixed = name in self._initial and control.tooltip.startswith("Set in code")
            control.disabled = value or fixed or not self.applicable.get(name, True)


"""Live thresholds: the rule, its threshold sliders and the optional z mask.

Moving these re-renders the overlay, the counts and the ROI table; nothing is recomputed.
Labels, ranges, steps and tooltips come from the core's option metadata. The sliders are
wide (a 0–1 threshold over a ~350 px track: a 60 px drag moves it by about 0.17) and show
their value in an editable readout, so a precise value can also be typed.
"""

from __future__ import annotations

import ipywidgets as W

from napari_attnreg.core.run.options import option
from napari_attnreg.core.stats.presets import rules_for
from napari_attnreg.notebook.option_controls import build_control
from napari_attnreg.notebook.options_panel import link_all
from napari_attnreg.notebook.state import ExplorerState

#: Slider width: label (150 px) + track (about 350 px) + readout; about the width of the image above.
SLIDER_WIDTH = "580px"
SLIDER_LABEL_WIDTH = "150px"  # "α FWER / p threshold" whole, not cut
#: z threshold the slider shows while the z mask is off.
Z_TH_WHEN_ON = 0.0


def threshold_slider(name: str) -> W.FloatSlider:
    """A slider for a threshold option, from its metadata."""
    opt = option(name)
    decimals = opt.decimals if opt.decimals is not None else 2
    # continuous_update=False: the overlay follows on release, not on every pixel of a drag
    # (a large image would queue dozens of renders); the readout follows the drag live
    return W.FloatSlider(min=opt.minimum, max=opt.maximum, step=opt.step, readout=True,
                         readout_format=f".{decimals}f", continuous_update=False,
                         description=opt.label, tooltip=opt.help,
                         layout=W.Layout(width=SLIDER_WIDTH),
                         style={"description_width": SLIDER_LABEL_WIDTH})


class ThresholdsPanel(W.VBox):
    """The rule and its thresholds, linked to the state's ``rule`` and ``*_th`` traits.

    Those traits show the selected result's thresholds (:class:`~.session_link.SessionLink`);
    the rules offered are those of its preset (``state.shown_preset``).
    """

    def __init__(self, state: ExplorerState) -> None:
        super().__init__()
        self.state = state
        rule = option("rule")
        self.controls: dict[str, W.Widget] = {
            # the state always holds a rule (the preset's until changed): no "unset" entry
            "rule": build_control(rule, options=self._rule_options(state.shown_preset)),
            **{name: threshold_slider(name) for name in ("q_th", "p_th", "l_th")},
            # z_th may be None (no z mask): a checkbox and a slider, kept in step by hand
            "z_mask": W.Checkbox(description="", indent=False, layout=W.Layout(width="28px"),
                                 tooltip="Tick to apply the z mask, untick for none. "
                                         + option("z_th").help),
            "z_th": threshold_slider("z_th"),
        }
        link_all(state, self.controls, {"q_th": "q_th", "p_th": "p_th", "l_th": "l_th"})
        self._syncing = False
        # the rule list depends on the preset: a plain link would push a paper rule into the
        # step-down list (the state changes its rule before anyone sees the new preset)
        self.controls["rule"].observe(self._from_rule_control, "value")
        state.observe(lambda _c: self.sync_rule(), names=["rule", "shown_preset"])
        self.sync_rule()
        self.controls["z_th"].value = Z_TH_WHEN_ON if state.z_th is None else state.z_th
        self.controls["z_mask"].observe(self._from_z_controls, "value")
        self.controls["z_th"].observe(self._from_z_controls, "value")
        state.observe(lambda _c: self.sync_z(), names=["z_th"])
        self.sync_z()
        c = self.controls
        self.children = (c["rule"], c["q_th"], c["p_th"], c["l_th"],
                         W.HBox([c["z_th"], c["z_mask"]], layout=W.Layout(align_items="center")))

    @staticmethod
    def _rule_options(preset: str) -> list[tuple[str, str]]:
        rule = option("rule")
        return [(rule.label_of(r), r) for r in rules_for(preset)]

    def sync_rule(self) -> None:
        """Show the state's rule among the rules of the preset of what it shows."""
        dropdown = self.controls["rule"]
        self._syncing = True
        try:
            options = self._rule_options(self.state.shown_preset)
            if self.state.rule not in [v for _, v in options]:  # mid-change: the preset's rules
                options = self._rule_options_all()
            if list(dropdown.options) != options:
                dropdown.options = options
            dropdown.value = self.state.rule
        finally:
            self._syncing = False

    @staticmethod
    def _rule_options_all() -> list[tuple[str, str]]:
        rule = option("rule")
        return [(rule.label_of(r), r) for r in rule.choices]

    def _from_rule_control(self, change: dict) -> None:
        if not self._syncing and change["new"] is not None:
            self.state.rule = change["new"]

    def sync_z(self) -> None:
        box, slider = self.controls["z_mask"], self.controls["z_th"]
        self._syncing = True
        try:
            box.value = self.state.z_th is not None
            if self.state.z_th is not None:
                slider.value = self.state.z_th
            slider.disabled = self.state.z_th is None
        finally:
            self._syncing = False

    def _from_z_controls(self, _change: dict) -> None:
        if self._syncing:
            return
        box, slider = self.controls["z_mask"], self.controls["z_th"]
        # the slider keeps its value while the mask is off, so ticking the box restores it
        self.state.z_th = float(slider.value) if box.value else None

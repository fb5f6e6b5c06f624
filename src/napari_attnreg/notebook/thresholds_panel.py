"""Live thresholds: the rule, its threshold sliders and the optional z mask.

Moving these re-renders the overlay, the counts and the ROI table; nothing is recomputed.
The sliders are wide (a 0–1 threshold over a ~280 px track: about 0.004 per pixel) and show
their value in an editable readout, so a precise value can also be typed.
"""

from __future__ import annotations

import ipywidgets as W

from ..core.display import RULE_HELP, RULE_LABELS
from ..core.regularize import RULES
from .options_panel import CONTROL_WIDTH, labelled, link_all
from .state import ExplorerState

#: Slider width: label (60 px) + track (about 280 px) + readout.
SLIDER_WIDTH = "400px"
SLIDER_STYLE = {"description_width": "60px"}
#: z threshold the slider shows while the z mask is off.
Z_TH_WHEN_ON = 0.0


def threshold_slider(description: str, tooltip: str, *, lo: float = 0.0, hi: float = 1.0,
                     step: float = 0.005, fmt: str = ".3f") -> W.FloatSlider:
    # continuous_update=False: the overlay follows on release, not on every pixel of a drag
    # (a large image would queue dozens of renders); the readout follows the drag live
    return W.FloatSlider(min=lo, max=hi, step=step, readout=True, readout_format=fmt,
                         continuous_update=False, description=description, tooltip=tooltip,
                         layout=W.Layout(width=SLIDER_WIDTH), style=dict(SLIDER_STYLE))


class ThresholdsPanel(W.VBox):
    """The rule and its thresholds, linked to the state's ``rule`` and ``*_th`` traits."""

    def __init__(self, state: ExplorerState) -> None:
        super().__init__()
        self.state = state
        self.controls: dict[str, W.Widget] = {
            "rule": labelled(W.Dropdown, "rule", "Which patches count as significant:\n"
                             + "\n".join(f"• {RULE_HELP[r]}" for r in RULES),
                             options=[(RULE_LABELS[r], r) for r in RULES]),
            "q_th": threshold_slider("q ≤", "False discovery rate of rule 'q': 0.1 = about 10% "
                                            "of the highlighted patches may be noise."),
            "p_th": threshold_slider("p ≤", "Per-patch p-value threshold of rule 'p'."),
            "l_th": threshold_slider("lfdr ≤", "Local fdr threshold of rule 'lfdr' "
                                               "(posterior = 1 − lfdr).", step=0.01, fmt=".2f"),
            # z_th may be None (no z mask): a checkbox and a slider, kept in step by hand
            "z_mask": W.Checkbox(description="z mask", indent=False,
                                 layout=W.Layout(width=CONTROL_WIDTH),
                                 tooltip="Also require z ≥ threshold (the paper's mask). Off: "
                                         "no z mask, the directional default."),
            "z_th": threshold_slider("z ≥", "Standardised log-attention threshold of the z mask.",
                                     lo=-3.0, hi=6.0, step=0.05, fmt=".2f"),
        }
        link_all(state, self.controls, {"rule": "rule", "q_th": "q_th", "p_th": "p_th",
                                        "l_th": "l_th"})
        self._syncing = False
        self.controls["z_th"].value = Z_TH_WHEN_ON if state.z_th is None else state.z_th
        self.controls["z_mask"].observe(self._from_z_controls, "value")
        self.controls["z_th"].observe(self._from_z_controls, "value")
        state.observe(lambda _c: self.sync_z(), names=["z_th"])
        self.sync_z()
        self.children = tuple(self.controls.values())

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

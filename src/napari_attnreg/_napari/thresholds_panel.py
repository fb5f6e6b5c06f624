"""Live thresholds: the rule and its thresholds, re-applied to stored results without a re-run."""

from __future__ import annotations

from typing import Any

from qtpy.QtCore import Qt, Signal
from qtpy.QtWidgets import QCheckBox, QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QWidget
from superqt import QLabeledDoubleSlider
from superqt.utils import qdebounced

from ..core.display import RULE_HELP, RULE_LABELS
from ..core.presets import DEFAULT_PRESET, default_thresholds
from ..core.regularize import RULES

#: z threshold shown while the z mask is off (the paper's 0, a natural first value).
Z_TH_WHEN_ON = 0.0
#: A slider drag fires many events; the layers are re-thresholded once per pause this long (ms).
SETTLE_MS = 40


def _slider(lo: float, hi: float, value: float, decimals: int, tip: str) -> QLabeledDoubleSlider:
    slider = QLabeledDoubleSlider(Qt.Orientation.Horizontal)
    slider.setRange(lo, hi)
    slider.setDecimals(decimals)
    slider.setSingleStep(10.0 ** -decimals * 10)
    slider.setValue(value)
    slider.setToolTip(tip)
    for child in slider.findChildren(QWidget):  # the slider's own value box and bar
        child.setToolTip(tip)
    return slider


class ThresholdsPanel(QGroupBox):
    """Rule, q/p/lfdr thresholds and the optional z mask.

    ``changed`` fires once per pause of the controls (debounced), with the thresholds dict.
    """

    changed = Signal(dict)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Thresholds (live, no recomputation)", parent)
        self.setToolTip("Moving these redraws the regularized and significant layers of the "
                        "chosen image (edits painted into its significant labels are replaced).")
        defaults = default_thresholds(DEFAULT_PRESET)
        self.rule_combo = QComboBox()
        for rule in RULES:
            self.rule_combo.addItem(RULE_LABELS[rule], rule)
            self.rule_combo.setItemData(self.rule_combo.count() - 1, RULE_HELP[rule],
                                        Qt.ItemDataRole.ToolTipRole)
        self.rule_combo.setToolTip("Which patches count as significant (the regularized map keeps "
                                   "their attention, the outline marks them).")
        self.q_th_slider = _slider(0.0, 1.0, defaults["q_th"], 3,
                                   "q ≤: false discovery rate; 0.1 = about 10% of the highlighted "
                                   "patches may be noise (rule 'q').")
        self.p_th_slider = _slider(0.0, 1.0, defaults["p_th"], 3,
                                   "p ≤: per-patch p-value threshold (rule 'p').")
        self.l_th_slider = _slider(0.0, 1.0, defaults["l_th"], 3,
                                   "lfdr ≤: local false discovery rate threshold (rule 'lfdr'); "
                                   "posterior = 1 − lfdr.")
        self.z_mask_check = QCheckBox("z mask")
        self.z_mask_check.setToolTip("Also require z ≥ threshold (the paper's mask, on by default "
                                     "under 'paper'). Off: no z mask (the directional default).")
        self.z_th_slider = _slider(-3.0, 5.0, Z_TH_WHEN_ON, 2,
                                   "z ≥: standardised log-attention threshold of the z mask.")
        z_row = QHBoxLayout()
        z_row.addWidget(self.z_mask_check)
        z_row.addWidget(self.z_th_slider, 1)
        form = QFormLayout(self)
        form.addRow("Rule", self.rule_combo)
        form.addRow("q ≤", self.q_th_slider)
        form.addRow("p ≤", self.p_th_slider)
        form.addRow("lfdr ≤", self.l_th_slider)
        form.addRow("z ≥", z_row)

        self.rule_combo.currentIndexChanged.connect(self.schedule)
        self.z_mask_check.toggled.connect(self._on_z_mask_toggled)
        for slider in self._sliders():
            slider.valueChanged.connect(self.schedule)
        self.set_thresholds(defaults)

    def _sliders(self) -> tuple[QLabeledDoubleSlider, ...]:
        return (self.q_th_slider, self.p_th_slider, self.l_th_slider, self.z_th_slider)

    def thresholds(self) -> dict[str, Any]:
        """Rule and thresholds as the controls set them (``z_th`` None: z mask off)."""
        z_th = float(self.z_th_slider.value()) if self.z_mask_check.isChecked() else None
        return {"rule": self.rule_combo.currentData(), "z_th": z_th,
                "p_th": float(self.p_th_slider.value()), "l_th": float(self.l_th_slider.value()),
                "q_th": float(self.q_th_slider.value())}

    def set_thresholds(self, thresholds: dict[str, Any]) -> None:
        """Show ``thresholds`` (e.g. a preset's defaults); one ``changed`` follows."""
        controls = (self.rule_combo, self.z_mask_check, *self._sliders())
        for control in controls:
            control.blockSignals(True)
        self.rule_combo.setCurrentIndex(self.rule_combo.findData(thresholds["rule"]))
        for key, slider in (("q_th", self.q_th_slider), ("p_th", self.p_th_slider),
                            ("l_th", self.l_th_slider)):
            slider.setValue(float(thresholds[key]))
        z_on = thresholds["z_th"] is not None
        self.z_mask_check.setChecked(z_on)
        self.z_th_slider.setValue(float(thresholds["z_th"]) if z_on else Z_TH_WHEN_ON)
        self.z_th_slider.setEnabled(z_on)
        for control in controls:
            control.blockSignals(False)
        self.schedule()

    def _on_z_mask_toggled(self, on: bool) -> None:
        self.z_th_slider.setEnabled(on)
        self.schedule()

    @qdebounced(timeout=SETTLE_MS)
    def schedule(self, *_: Any) -> None:
        """Emit ``changed`` once the controls have been still for ``SETTLE_MS``."""
        self.changed.emit(self.thresholds())

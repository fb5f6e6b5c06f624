"""Live thresholds: the rule and its thresholds, re-applied to stored results without a re-run.

Labels, ranges, choices and help come from the core's option metadata; the value read
back is the core's :class:`~napari_attnreg.core.run.thresholds.Thresholds`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qtpy.QtCore import Qt, Signal
from qtpy.QtWidgets import QCheckBox, QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QWidget
from superqt import QLabeledDoubleSlider
from superqt.utils import qdebounced

from napari_attnreg.core.results.display import RULE_HELP
from napari_attnreg.core.run.options import option
from napari_attnreg.core.run.thresholds import Thresholds
from napari_attnreg.core.stats.presets import DEFAULT_PRESET, rules_for

#: z threshold shown while the z mask is off (the paper's 0, a natural first value).
Z_TH_WHEN_ON = 0.0
#: A slider drag fires many events; the layers are re-thresholded once per pause this long (ms).
SETTLE_MS = 40


def _slider(name: str, value: float) -> QLabeledDoubleSlider:
    opt = option(name)
    slider = QLabeledDoubleSlider(Qt.Orientation.Horizontal)
    slider.setRange(opt.minimum, opt.maximum)
    slider.setDecimals(opt.decimals or 2)
    slider.setSingleStep(opt.step or 0.01)
    slider.setValue(value)
    tip = opt.help
    slider.setToolTip(tip)
    for child in slider.findChildren(QWidget):  # the slider's own value box and bar
        child.setToolTip(tip)
    return slider


class ThresholdsPanel(QGroupBox):
    """Rule, q/p/lfdr thresholds and the optional z mask.

    ``changed`` fires once per pause of the analyst's moves (debounced), with the
    :class:`Thresholds` they set; showing thresholds with :meth:`set_thresholds` fires nothing
    (the dock shows what its session already holds).
    """

    changed = Signal(object)  # Thresholds
    #: A rule the offered preset lacks was chosen in code (``setCurrentIndex``; clicks and keys
    #: skip greyed items): the box went back to the rule in force; the text says why.
    refused = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Thresholds (live, no recomputation)", parent)
        self.setToolTip("Moving these redraws the regularized and significant layers of the "
                        "chosen image (edits painted into its significant labels are replaced).")
        defaults = Thresholds.from_preset(DEFAULT_PRESET)
        rule = option("rule")
        self.rule_combo = QComboBox()
        for choice in rule.choices:
            self.rule_combo.addItem(rule.label_of(choice), choice)
            self.rule_combo.setItemData(self.rule_combo.count() - 1, RULE_HELP.get(choice, ""),
                                        Qt.ItemDataRole.ToolTipRole)
        self.rule_combo.setToolTip(rule.help)
        self.q_th_slider = _slider("q_th", defaults["q_th"])
        self.p_th_slider = _slider("p_th", defaults["p_th"])
        self.l_th_slider = _slider("l_th", defaults["l_th"])
        self.z_mask_check = QCheckBox(option("z_th").label)
        self.z_mask_check.setToolTip(option("z_th").help)
        self.z_th_slider = _slider("z_th", Z_TH_WHEN_ON)
        z_row = QHBoxLayout()
        z_row.addWidget(self.z_mask_check)
        z_row.addWidget(self.z_th_slider, 1)
        form = QFormLayout(self)
        form.addRow("Rule", self.rule_combo)
        form.addRow("α / q ≤", self.q_th_slider)
        form.addRow("α FWER / p ≤", self.p_th_slider)
        form.addRow("lfdr ≤", self.l_th_slider)
        form.addRow("z ≥", z_row)

        self._preset = DEFAULT_PRESET
        self._rule_in_force = self.rule_combo.currentIndex()
        self.rule_combo.currentIndexChanged.connect(self._on_rule_chosen)
        self.z_mask_check.toggled.connect(self._on_z_mask_toggled)
        for slider in self._sliders():
            slider.valueChanged.connect(self.schedule)
        self.offer_rules(DEFAULT_PRESET)
        self.set_thresholds(defaults)

    def offer_rules(self, preset: str) -> None:
        """Enable only the rules a result of ``preset`` has (e.g. ForwardStop for step-down)."""
        offered = rules_for(preset)
        self._preset = preset
        model = self.rule_combo.model()
        for i in range(self.rule_combo.count()):
            model.item(i).setEnabled(self.rule_combo.itemData(i) in offered)

    def _on_rule_chosen(self, index: int) -> None:
        # a greyed rule reaches here only from code; applied, it raised in the debounced slot
        # (the result has no map for it), so the box goes back to the rule in force
        item = self.rule_combo.model().item(index) if index >= 0 else None
        if item is not None and not item.isEnabled():
            rule = self.rule_combo.itemData(index)
            self.rule_combo.blockSignals(True)
            self.rule_combo.setCurrentIndex(self._rule_in_force)
            self.rule_combo.blockSignals(False)
            offered = ", ".join(option("rule").label_of(r) for r in rules_for(self._preset))
            self.refused.emit(
                f"The rule {option('rule').label_of(rule)!r} does not apply to "
                f"{option('preset').label_of(self._preset).split(' (')[0]} results; kept "
                f"{self.rule_combo.currentText()!r}. Rules offered: {offered}.")
            return
        self._rule_in_force = index
        self.schedule()

    def _sliders(self) -> tuple[QLabeledDoubleSlider, ...]:
        return (self.q_th_slider, self.p_th_slider, self.l_th_slider, self.z_th_slider)

    def thresholds(self) -> Thresholds:
        """Rule and thresholds as the controls set them (``z_th`` None: z mask off)."""
        z_th = float(self.z_th_slider.value()) if self.z_mask_check.isChecked() else None
        return Thresholds(rule=self.rule_combo.currentData(), z_th=z_th,
                          p_th=float(self.p_th_slider.value()),
                          l_th=float(self.l_th_slider.value()),
                          q_th=float(self.q_th_slider.value()))

    def set_thresholds(self, thresholds: Mapping[str, Any]) -> None:
        """Show ``thresholds`` (e.g. the selected result's); no ``changed`` follows."""
        controls = (self.rule_combo, self.z_mask_check, *self._sliders())
        for control in controls:
            control.blockSignals(True)
        self.rule_combo.setCurrentIndex(self.rule_combo.findData(thresholds["rule"]))
        self._rule_in_force = self.rule_combo.currentIndex()
        for key, slider in (("q_th", self.q_th_slider), ("p_th", self.p_th_slider),
                            ("l_th", self.l_th_slider)):
            slider.setValue(float(thresholds[key]))
        z_on = thresholds["z_th"] is not None
        self.z_mask_check.setChecked(z_on)
        self.z_th_slider.setValue(float(thresholds["z_th"]) if z_on else Z_TH_WHEN_ON)
        self.z_th_slider.setEnabled(z_on)
        for control in controls:
            control.blockSignals(False)

    def _on_z_mask_toggled(self, on: bool) -> None:
        self.z_th_slider.setEnabled(on)
        self.schedule()

    @qdebounced(timeout=SETTLE_MS)
    def schedule(self, *_: Any) -> None:
        """Emit ``changed`` once the controls have been still for ``SETTLE_MS``."""
        self.changed.emit(self.thresholds())

    def flush(self) -> None:
        """Emit a pending ``changed`` now (before the dock selects another result, so a move
        made just before goes to the result it was made on)."""
        self.schedule.flush()

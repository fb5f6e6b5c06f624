"""Run options: statistics preset, null images, device, tiling, and the advanced ones.

Every control is built from the core's option metadata (:mod:`.option_controls`); this
panel only decides where each goes and which apply to the current preset or null method.
"""

from __future__ import annotations

from typing import Any

from qtpy.QtCore import Qt, Signal
from qtpy.QtWidgets import QFormLayout, QLabel, QPushButton, QVBoxLayout, QWidget
from superqt import QCollapsible

from napari_attnreg._napari.option_controls import make_control, set_value, value_of
from napari_attnreg.core.results.display import PRESET_HELP
from napari_attnreg.core.run.engine import resolve_device
from napari_attnreg.core.run.options import OPTIONS, default_for, option
from napari_attnreg.core.stats.presets import DEFAULT_PRESET

#: Shown above Advanced, in this order.
BASIC = ("preset", "method", "n_boot", "device", "tiled")
#: Set elsewhere in the dock: the thresholds panel and the image/channels rows.
ELSEWHERE = ("rule", "q_th", "p_th", "l_th", "z_th", "channel_axis", "channels", "merge")


class OptionsPanel(QWidget):
    """Options of a run; ``preset_changed(preset)`` fires when the statistics preset changes."""

    preset_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        from napari_attnreg.core.run.service import available_devices

        super().__init__(parent)
        self.controls: dict[str, QWidget] = {}
        for name, opt in OPTIONS.items():
            if name in ELSEWHERE:
                continue
            choices = tuple(available_devices()) if name == "device" else None
            self.controls[name] = make_control(opt, default_for(name, DEFAULT_PRESET), choices)
        presets = self.controls["preset"]
        for i in range(presets.count()):  # each preset's own explanation on its item
            presets.setItemData(i, PRESET_HELP.get(presets.itemData(i), ""),
                                Qt.ItemDataRole.ToolTipRole)
        self.device_label = QLabel()
        self.device_label.setToolTip("The device 'auto' resolves to on this machine.")
        self.form = QFormLayout()
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        for name in BASIC:
            self._add_row(self.form, name)
            if name == "device":
                self.form.addRow("", self.device_label)
        self.advanced_form = QFormLayout()
        for name in self.controls:
            if name not in BASIC:
                self._add_row(self.advanced_form, name)
        box = QWidget()
        box.setLayout(self.advanced_form)
        self.advanced = QCollapsible("Advanced")
        tip = "Seed, null-image details, statistics details, model block/head, input size, " \
              "tiling and compute options."
        self.advanced.setToolTip(tip)
        for button in self.advanced.findChildren(QPushButton):  # the expand/collapse toggle
            button.setToolTip(tip)
        self.advanced.addWidget(box)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(self.form)
        layout.addWidget(self.advanced)

        self.controls["device"].currentIndexChanged.connect(self._on_device_changed)
        self.controls["method"].currentIndexChanged.connect(self._on_method_changed)
        self.controls["tiled"].toggled.connect(self._on_tiled_toggled)
        self.controls["preset"].currentIndexChanged.connect(self._on_preset_changed)
        self._on_device_changed()
        self._on_method_changed()
        self._on_tiled_toggled(self.value("tiled"))
        self._apply_preset_options()

    def _add_row(self, form: QFormLayout, name: str) -> None:
        control = self.controls[name]
        opt = option(name)
        label = "" if opt.kind == "bool" else opt.label  # a checkbox names itself
        form.addRow(label, control)
        row_label = form.labelForField(control)
        if row_label is not None:
            row_label.setToolTip(opt.help)

    # ---- values ----------------------------------------------------------------------------
    def value(self, name: str) -> Any:
        return value_of(self.controls[name], option(name))

    def set(self, name: str, value: Any) -> None:
        set_value(self.controls[name], option(name), value)

    def preset(self) -> str:
        return self.value("preset")

    # ---- reactions -----------------------------------------------------------------------
    def _set_row_visible(self, name: str, visible: bool) -> None:
        control = self.controls[name]
        control.setVisible(visible)
        for form in (self.form, self.advanced_form):
            label = form.labelForField(control)
            if label is not None:
                label.setVisible(visible)

    def _on_device_changed(self, *_: Any) -> None:
        try:
            dev = resolve_device(self.value("device"))
        except ValueError:
            self.device_label.setText("<span style='color:#e55'>not available here</span>")
            return
        text = f"→ {dev.type}"
        if dev.type == "cuda":
            import torch

            text += f" ({torch.cuda.get_device_name(dev)})"
        self.device_label.setText(text)

    def _applies(self, name: str) -> bool:
        return option(name).applies(preset=self.preset(), method=self.value("method"),
                                    tiled=self.value("tiled"))

    def _on_method_changed(self, *_: Any) -> None:
        for name, opt in OPTIONS.items():
            if opt.methods is not None and name in self.controls:
                self._set_row_visible(name, self._applies(name))

    def _on_tiled_toggled(self, tiled: bool) -> None:
        for name, opt in OPTIONS.items():
            if opt.tiled_only and name in self.controls:
                self.controls[name].setEnabled(tiled)
        self.controls["target_size"].setEnabled(not tiled)  # tiles are the model's input size

    def apply_settings(self, defaults: Any) -> None:
        """Start from the user's plugin settings (preset, B, device; napari Preferences)."""
        self.set("preset", defaults.preset)
        self.set("n_boot", defaults.n_boot)
        devices = self.controls["device"]
        if devices.findData(defaults.device) >= 0:  # a device this machine lacks stays 'auto'
            self.set("device", defaults.device)

    def _apply_preset_options(self) -> None:
        preset = self.preset()
        for name, opt in OPTIONS.items():
            if opt.preset_dependent and name in self.controls:
                self.set(name, default_for(name, preset))
        for name, opt in OPTIONS.items():  # e.g. the paper's two-sided options under directional
            if opt.presets != OPTIONS["preset"].choices and name in self.controls:
                self.controls[name].setEnabled(preset in opt.presets)

    def _on_preset_changed(self, *_: Any) -> None:
        self._apply_preset_options()
        self.preset_changed.emit(self.preset())

    # ---- read back -----------------------------------------------------------------------
    def config_kwargs(self) -> dict[str, Any]:
        """:class:`RunConfig` keyword arguments of these controls."""
        values = {name: self.value(name) for name in self.controls}
        for name in self.controls:
            opt = option(name)
            if values["preset"] not in opt.presets:  # fixed by this preset: "from the preset"
                values[name] = None
            elif opt.tiled_only and not values["tiled"]:  # untiled: no stale tiling metadata
                values[name] = opt.default
        return values

"""Run options: statistics preset, null images, device, tiling, and the advanced ones.

Every control is built from the core's option metadata (:mod:`.option_controls`); this
panel only decides where each goes and which apply to the current preset or null method.
"""

from __future__ import annotations

from typing import Any

from qtpy.QtCore import Qt, Signal
from qtpy.QtWidgets import QFormLayout, QLabel, QPushButton, QVBoxLayout, QWidget
from superqt import QCollapsible

from ..core.display import PRESET_HELP
from ..core.engine import resolve_device
from ..core.options import OPTIONS, default_for, option
from ..core.presets import DEFAULT_PRESET
from .option_controls import make_control, set_value, value_of

#: Shown above Advanced, in this order.
BASIC = ("preset", "method", "n_boot", "device", "tiled")
#: Set elsewhere in the dock: the thresholds panel and the image/channels rows.
ELSEWHERE = ("rule", "q_th", "p_th", "l_th", "z_th", "channel_axis", "channels", "merge")
#: The statistics options the directional preset fixes by construction (one-sided p⁺,
#: lfdr⁺ from p⁺), and the one only it uses.
FIXED_BY_DIRECTIONAL = ("p_method", "alternative", "null")
DIRECTIONAL_ONLY = ("null_pool",)
#: Options that apply to some null methods only.
FOR_METHODS = {"std_factor": ("normal",), "per_channel": ("normal", "uniform"),
               "block_size": ("patch",)}
TILED_ONLY = ("tile_scale", "tile_overlap", "null_scope")


class OptionsPanel(QWidget):
    """Options of a run; ``preset_changed(preset)`` fires when the statistics preset changes."""

    preset_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        from ..core.service import available_devices

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

    def _on_method_changed(self, *_: Any) -> None:
        method = self.value("method")
        for name, methods in FOR_METHODS.items():
            self._set_row_visible(name, method in methods)

    def _on_tiled_toggled(self, tiled: bool) -> None:
        for name in TILED_ONLY:
            self.controls[name].setEnabled(tiled)
        self.controls["target_size"].setEnabled(not tiled)  # tiles are the model's input size

    def _apply_preset_options(self) -> None:
        preset = self.preset()
        for name, opt in OPTIONS.items():
            if opt.preset_dependent and name in self.controls:
                self.set(name, default_for(name, preset))
        directional = preset == "directional"
        for name in FIXED_BY_DIRECTIONAL:
            self.controls[name].setEnabled(not directional)
        for name in DIRECTIONAL_ONLY:
            self.controls[name].setEnabled(directional)

    def _on_preset_changed(self, *_: Any) -> None:
        self._apply_preset_options()
        self.preset_changed.emit(self.preset())

    # ---- read back -----------------------------------------------------------------------
    def config_kwargs(self) -> dict[str, Any]:
        """:class:`RunConfig` keyword arguments of these controls."""
        values = {name: self.value(name) for name in self.controls}
        directional = values["preset"] == "directional"
        # options a preset fixes go as None ("from the preset"), the others as shown
        for name in FIXED_BY_DIRECTIONAL if directional else DIRECTIONAL_ONLY:
            values[name] = None
        if not values["tiled"]:  # untiled runs keep the tiling defaults: no stale metadata
            values.update({name: option(name).default for name in TILED_ONLY})
        return values

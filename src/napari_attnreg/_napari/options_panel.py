"""Run options: statistics preset, null images, device, tiling, and the advanced ones.

Every control is built from the core's option metadata (:mod:`.option_controls`), and the
metadata places it: ``Option.advanced`` puts it under *Advanced* (by group), and
:func:`~napari_attnreg.core.run.options.applicable_options` greys out what the current
preset, null method and tiling do not read.
"""

from __future__ import annotations

from typing import Any

from qtpy.QtCore import Qt, Signal
from qtpy.QtWidgets import QFormLayout, QLabel, QPushButton, QVBoxLayout, QWidget
from superqt import QCollapsible

from napari_attnreg._napari.option_controls import make_control, set_value, value_of
from napari_attnreg.core.results.display import PRESET_HELP
from napari_attnreg.core.run.engine import resolve_device
from napari_attnreg.core.run.options import (
    GROUP_TITLES,
    OPTIONS,
    applicable_options,
    default_for,
    option,
    panel_options,
    reset_inapplicable,
)
from napari_attnreg.core.stats.presets import DEFAULT_PRESET

#: Set elsewhere in the dock, with the image's channels (the thresholds have their own panel).
ELSEWHERE = ("channel_axis", "channels", "merge")
#: Run settings that decide which other options apply.
DECIDING = ("preset", "method", "tiled")
#: Options only a slide (a pyramid read again from its file) reads: for another image the
#: dock drops them, so they are greyed out while it is the image chosen.
SLIDE_ONLY = ("level", "mpp")


class OptionsPanel(QWidget):
    """Options of a run; ``preset_changed(preset)`` fires when the statistics preset changes."""

    preset_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        from napari_attnreg.core.run.service import available_devices

        super().__init__(parent)
        self.controls: dict[str, QWidget] = {}
        self._slide = True  # the chosen image is a slide, or none is chosen (set_slide)
        self.concept: Any = None  # 'Concept from ROI' (attach_concept), the napari dock's
        for opt in panel_options(skip=ELSEWHERE):
            choices = tuple(available_devices()) if opt.name == "device" else None
            self.controls[opt.name] = make_control(opt, default_for(opt.name, DEFAULT_PRESET),
                                                   choices)
        presets = self.controls["preset"]
        for i in range(presets.count()):  # each preset's own explanation on its item
            presets.setItemData(i, PRESET_HELP.get(presets.itemData(i), ""),
                                Qt.ItemDataRole.ToolTipRole)
        self.device_label = QLabel()
        self.device_label.setToolTip("The device 'auto' resolves to on this machine.")
        self.form = QFormLayout()
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        for opt in panel_options(advanced=False, skip=ELSEWHERE):
            self._add_row(self.form, opt.name)
        self.advanced_form = QFormLayout()
        for group, title in GROUP_TITLES.items():
            members = [o for o in panel_options(advanced=True, skip=ELSEWHERE) if o.group == group]
            if members:
                self.advanced_form.addRow(QLabel(f"<i>{title}</i>"))
            for opt in members:
                self._add_row(self.advanced_form, opt.name)
        self.advanced = self._collapsible(self.advanced_form)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(self.form)
        layout.addWidget(self.advanced)

        self.controls["device"].currentIndexChanged.connect(self._on_device_changed)
        self.controls["method"].currentIndexChanged.connect(self._update_applicable)
        self.controls["tiled"].toggled.connect(self._update_applicable)
        self.controls["preset"].currentIndexChanged.connect(self._on_preset_changed)
        self._on_device_changed()
        self._apply_preset_options()

    @staticmethod
    def _collapsible(form: QFormLayout) -> QCollapsible:
        """The collapsed *Advanced* section holding ``form``."""
        box = QWidget()
        box.setLayout(form)
        advanced = QCollapsible("Advanced")
        groups = [t.lower() for g, t in GROUP_TITLES.items()
                  if any(o.group == g for o in panel_options(advanced=True, skip=ELSEWHERE))]
        tip = "Options an analyst seldom changes: " + ", ".join(groups) + "."
        advanced.setToolTip(tip)
        for button in advanced.findChildren(QPushButton):  # the expand/collapse toggle
            button.setToolTip(tip)
        advanced.addWidget(box)
        return advanced

    def _add_row(self, form: QFormLayout, name: str) -> None:
        control = self.controls[name]
        opt = option(name)
        label = "" if opt.kind == "bool" else opt.label  # a checkbox names itself
        form.addRow(label, control)
        row_label = form.labelForField(control)
        if row_label is not None:
            row_label.setToolTip(opt.help)
        if name == "device":
            form.addRow("", self.device_label)

    # ---- values ----------------------------------------------------------------------------
    def value(self, name: str) -> Any:
        """The value control ``name`` shows (``target``: the concept, while one is held)."""
        if name == "target" and self.concept is not None and self.concept.vector is not None:
            return self.concept.vector
        return value_of(self.controls[name], option(name))

    def set(self, name: str, value: Any) -> None:
        """Show ``value`` in control ``name`` (a concept ``target`` goes to the concept row)."""
        if name == "target" and self.concept is not None and self.concept.adopt(value):
            self.controls["target"].clear()
            return
        set_value(self.controls[name], option(name), value)

    def attach_concept(self, concept: QWidget) -> None:
        """Place 'Concept from ROI' (:mod:`.concept_roi`) under the target; while it holds a
        concept, that is the target, and typing a target forgets it."""
        self.concept = concept
        row, _ = self.advanced_form.getWidgetPosition(self.controls["target"])
        self.advanced_form.insertRow(row + 1, "", concept)
        self.controls["target"].textEdited.connect(lambda _text: concept.clear())

    def preset(self) -> str:
        """The statistics preset chosen."""
        return self.value("preset")

    # ---- reactions -----------------------------------------------------------------------
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

    def _update_applicable(self, *_: Any) -> None:
        """Grey out the options the preset, null method and tiling leave unread."""
        applicable = applicable_options({name: self.value(name) for name in DECIDING})
        if not self._slide:
            applicable -= set(SLIDE_ONLY)
        for name, control in self.controls.items():
            control.setEnabled(name in applicable)
            for form in (self.form, self.advanced_form):
                label = form.labelForField(control)
                if label is not None:
                    label.setEnabled(name in applicable)

    def set_slide(self, slide: bool) -> None:
        """Grey out *Slide level* and *Slide resolution* unless the chosen image is a slide
        (``slide``; True also when no image is chosen): another image ignores them."""
        if slide != self._slide:
            self._slide = slide
            self._update_applicable()

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
        self._update_applicable()

    def _on_preset_changed(self, *_: Any) -> None:
        self._apply_preset_options()
        self.preset_changed.emit(self.preset())

    # ---- read back -----------------------------------------------------------------------
    def config_kwargs(self) -> dict[str, Any]:
        """:class:`RunConfig` keyword arguments of these controls.

        Options the run does not read go back to unset (None: the preset's; else the
        default), so its metadata records nothing stale (e.g. an untiled run's tile overlap).
        """
        return reset_inapplicable({name: self.value(name) for name in self.controls})

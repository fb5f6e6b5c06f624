"""Qt controls built from the core's option metadata (:data:`napari_attnreg.core.run.options.OPTIONS`).

Label, kind, choices and their labels, range, step, decimals, "empty" meaning and tooltip
all come from :class:`~napari_attnreg.core.run.options.Option`; nothing here repeats them.
"""

from __future__ import annotations

from typing import Any

from qtpy.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QLineEdit, QSpinBox, QWidget

from napari_attnreg.core.run.options import Option, ascii_int

#: Qt spin boxes hold 32-bit integers; larger maxima (e.g. the seed's) are capped here.
QT_INT_MAX = 2**31 - 1
#: What an empty value (None) shows as, where it is not "auto" (chosen by the engine or the
#: preset, as each option's help says): here it means none at all.
EMPTY_TEXT = {"merge": "none", "channel_axis": "none", "z_th": "none"}


def make_control(opt: Option, value: Any = None, choices: tuple | None = None) -> QWidget:
    """A control for ``opt`` showing ``value`` (default: the option's own default)."""
    value = opt.default if value is None else value
    if opt.kind == "choice" or choices is not None:
        control: QWidget = QComboBox()
        if opt.allow_none:  # "none" would read as the tail's real choice "none"
            control.addItem(EMPTY_TEXT.get(opt.name, "auto"), None)
        for choice in choices if choices is not None else opt.choices:
            control.addItem(opt.label_of(choice), choice)
    elif opt.kind == "bool":
        control = QCheckBox(opt.label)
    elif opt.kind == "int":
        control = QSpinBox()
        low = int(opt.minimum if opt.minimum is not None else -QT_INT_MAX)
        high = int(min(opt.maximum if opt.maximum is not None else QT_INT_MAX, QT_INT_MAX))
        if opt.allow_none:  # one step below the minimum stands for "empty"
            low -= 1
            control.setSpecialValueText(EMPTY_TEXT.get(opt.name, "auto"))
        control.setRange(low, high)
        control.setSingleStep(int(opt.step or 1))
    elif opt.kind == "float":
        control = QDoubleSpinBox()
        decimals = opt.decimals if opt.decimals is not None else 2
        control.setDecimals(decimals)
        low = opt.minimum if opt.minimum is not None else -1e9
        if opt.allow_none:  # one shown digit below the minimum stands for "empty"; the
            low -= 10.0 ** -decimals  # minimum itself stays a value one can choose
            control.setSpecialValueText(EMPTY_TEXT.get(opt.name, "auto"))
        control.setRange(low, opt.maximum if opt.maximum is not None else 1e9)
        control.setSingleStep(opt.step or 0.1)
    else:
        control = QLineEdit()
        control.setPlaceholderText(str(opt.default) if opt.default is not None else "")
    control.setToolTip(opt.help)
    control.setObjectName(opt.name)
    set_value(control, opt, value)
    return control


def set_value(control: QWidget, opt: Option, value: Any) -> None:
    """Show ``value`` in a control made by :func:`make_control`."""
    if isinstance(control, QComboBox):
        index = control.findData(value)
        if index < 0 and value is not None:  # a value the choices lack: show it, never another
            control.addItem(opt.label_of(value), value)
            index = control.count() - 1
        control.setCurrentIndex(max(index, 0))
    elif isinstance(control, QCheckBox):
        control.setChecked(bool(value))
    elif isinstance(control, (QSpinBox, QDoubleSpinBox)):
        control.setValue(control.minimum() if value is None else value)
    else:
        control.setText("" if value is None else str(value))


def value_of(control: QWidget, opt: Option) -> Any:
    """The option value a control shows (None where the option allows "empty")."""
    if isinstance(control, QComboBox):
        return control.currentData()
    if isinstance(control, QCheckBox):
        return control.isChecked()
    if isinstance(control, (QSpinBox, QDoubleSpinBox)):
        if opt.allow_none and control.value() == control.minimum():
            return None
        return control.value()
    text = control.text().strip()
    if not text:
        return None if opt.allow_none else opt.default
    if opt.name in ("head", "target_size") and ascii_int(text) is not None:
        return ascii_int(text)  # a head number / a long side in pixels
    return text


def choose_item(combo: QComboBox, data: Any) -> bool:
    """Select the item of ``combo`` whose data *is* ``data`` (e.g. a layer); False if none."""
    for i in range(combo.count()):
        if combo.itemData(i) is data:
            combo.setCurrentIndex(i)
            return True
    return False

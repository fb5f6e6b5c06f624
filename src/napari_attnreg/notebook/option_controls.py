"""Controls built from the core's option metadata (``core.options.OPTIONS``).

Labels, choices and their labels, ranges, steps and tooltips all come from the core, so the
notebook shows what napari and ``attnreg --help`` show; nothing is copied here.
"""

from __future__ import annotations

import numbers
from typing import Any

import ipywidgets as W

from napari_attnreg.core.run.options import Option, option

#: Width of a labelled control in the side panel, and of its label.
CONTROL_WIDTH = "360px"
LABEL_WIDTH = "140px"
#: Shown for an option left to the preset or to the engine (``None``).
UNSET = ""
UNSET_LABELS = {"preset": "(from preset)", "none": "(auto)"}


def check_opacity(value: Any) -> float:
    """``value`` as the overlay's opacity (a display setting, not a run option).

    Raises
    ------
    ValueError
        Unless ``value`` is a number in [0, 1] (NaN and bools are refused).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
        raise ValueError(f"opacity must be a number in [0, 1] (0: image only, 1: overlay "
                         f"opaque), got {value!r}.")
    return float(value)


def _style(label_width: str = LABEL_WIDTH) -> dict[str, str]:
    return {"description_width": label_width}


def labelled(widget_type: type, description: str, tooltip: str, **kwargs: Any) -> W.Widget:
    """A side-panel control that is not a run option (display settings), same geometry."""
    return widget_type(description=description, tooltip=tooltip,
                       layout=W.Layout(width=CONTROL_WIDTH), style=_style(), **kwargs)


def choice_options(opt: Option) -> list[tuple[str, Any]]:
    """Dropdown ``(label, value)`` pairs; an unset entry first where the option may be None."""
    pairs = [(opt.label_of(c), c) for c in opt.choices]
    if opt.preset_dependent or opt.allow_none:
        unset = UNSET_LABELS["preset" if opt.preset_dependent else "none"]
        pairs.insert(0, (unset, UNSET))
    return pairs


def build_control(opt: Option | str, *, width: str = CONTROL_WIDTH,
                  label_width: str = LABEL_WIDTH, **overrides: Any) -> W.Widget:
    """One control for an option: a drop-down, number box, checkbox or text box.

    Numbers that may be unset (``allow_none``) get a text box where empty means unset.
    ``overrides`` replace widget arguments (e.g. ``options=`` of a device list).
    """
    opt = option(opt) if isinstance(opt, str) else opt
    common = {"description": opt.label, "tooltip": opt.help,
              "layout": W.Layout(width=width), "style": _style(label_width)}
    if opt.kind == "bool":
        kwargs = {"description": opt.label, "tooltip": opt.help, "indent": False}
        control = W.Checkbox(**{**kwargs, **overrides})
    elif opt.kind == "choice":
        control = W.Dropdown(**{**common, "options": choice_options(opt), **overrides})
    elif opt.kind in ("int", "float") and not opt.allow_none:
        bounded = W.BoundedIntText if opt.kind == "int" else W.BoundedFloatText
        limits = {k: v for k, v in (("min", opt.minimum), ("max", opt.maximum),
                                    ("step", opt.step)) if v is not None}
        control = bounded(**{**common, **limits, **overrides})
    else:
        placeholder = "auto" if opt.allow_none else ""
        control = W.Text(**{**common, "placeholder": placeholder, "continuous_update": False,
                            **overrides})
    if opt.default is not None and "value" not in overrides:
        show_value(opt, control, opt.default)  # starts at the engine's default
    return control


def control_value(opt: Option, control: W.Widget) -> Any:
    """The option value a control holds (``None`` for unset); the core validates it later."""
    value = control.value
    if opt.kind == "choice":
        return None if value == UNSET else value
    if isinstance(control, W.Text):
        text = value.strip()
        if not text:
            return None
        if opt.kind in ("int", "float"):
            try:
                return int(text) if opt.kind == "int" else float(text)
            except ValueError:
                raise ValueError(f"{opt.label}: {text!r} is not a number; leave it empty for "
                                 "auto.") from None
        return text
    return value


def show_value(opt: Option, control: W.Widget, value: Any) -> None:
    """Put an option value into its control (``None`` shows as unset)."""
    if opt.kind == "choice":
        control.value = UNSET if value is None else value
    elif isinstance(control, W.Text):
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        control.value = "" if value is None else str(value)
    else:
        control.value = value

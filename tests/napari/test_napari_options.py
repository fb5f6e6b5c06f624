"""The dock's run options: the core's metadata places them and says which apply."""

from __future__ import annotations

import dataclasses

import pytest

from napari_attnreg.core.run import options as opts

pytestmark = pytest.mark.gui


def _rows(form) -> list[str]:
    """Option names of a form's controls (and ``"# title"`` for a section heading), in order."""
    from qtpy.QtWidgets import QFormLayout, QLabel

    out = []
    for row in range(form.rowCount()):
        item = form.itemAt(row, QFormLayout.ItemRole.FieldRole) or form.itemAt(
            row, QFormLayout.ItemRole.SpanningRole)
        widget = item.widget()
        if widget.objectName() in opts.OPTIONS:
            out.append(widget.objectName())
        elif isinstance(widget, QLabel) and widget.text().startswith("<i>"):
            out.append("# " + widget.text()[3:-4])
    return out


@pytest.fixture
def panel(qtbot):
    from napari_attnreg._napari.options_panel import OptionsPanel

    widget = OptionsPanel()
    qtbot.addWidget(widget)
    return widget


def test_basic_and_advanced_rows_follow_the_metadata(panel):
    from napari_attnreg._napari.options_panel import ELSEWHERE

    assert _rows(panel.form) == ["preset", "method", "n_boot", "tiled", "device"]
    assert _rows(panel.form) == [o.name for o in opts.panel_options(advanced=False,
                                                                     skip=ELSEWHERE)]
    expected = []
    for group, title in opts.GROUP_TITLES.items():
        members = [o.name for o in opts.panel_options(advanced=True, skip=ELSEWHERE)
                   if o.group == group]
        expected += [f"# {title}", *members] if members else []
    assert _rows(panel.advanced_form) == expected
    assert "seed" in expected and "tile_overlap" in expected
    assert "null images" in panel.advanced.toolTip()


def test_flipping_advanced_in_the_metadata_moves_the_row(qtbot, monkeypatch):
    from napari_attnreg._napari.options_panel import OptionsPanel

    names = ("seed", "precision", "n_boot")
    table = tuple(dataclasses.replace(o, advanced=not o.advanced) if o.name in names else o
                  for o in opts._OPTIONS)
    monkeypatch.setattr(opts, "_OPTIONS", table)
    monkeypatch.setattr(opts, "OPTIONS", {o.name: o for o in table})
    panel = OptionsPanel()
    qtbot.addWidget(panel)
    basic, advanced = _rows(panel.form), _rows(panel.advanced_form)
    assert {"seed", "precision"} <= set(basic) and "n_boot" in advanced
    assert "n_boot" not in basic and "seed" not in advanced


@pytest.mark.parametrize(("preset", "method", "tiled"), [
    ("stepdown", "patch", False), ("directional", "normal", False),
    ("paper", "pixel", True), ("directional", "patch", True)])
def test_options_a_run_does_not_read_are_greyed_and_unset(panel, preset, method, tiled):
    panel.set("preset", preset)
    panel.set("method", method)
    panel.set("tiled", tiled)
    applicable = opts.applicable_options({"preset": preset, "method": method, "tiled": tiled})
    greyed = {name for name, control in panel.controls.items() if not control.isEnabled()}
    assert greyed == set(panel.controls) - applicable
    label = panel.advanced_form.labelForField(panel.controls["std_factor"])
    assert label.isEnabled() == ("std_factor" in applicable)  # the row's label greys too
    kwargs = panel.config_kwargs()
    for name in greyed:  # nothing stale in the run's metadata
        assert kwargs[name] == opts.option(name).unset, name


def test_the_weights_dialog_lists_every_weight_file_ending():
    from napari_attnreg._napari.model_picker import WEIGHT_FILTER
    from napari_attnreg.core.models.weights import WEIGHT_SUFFIXES

    assert all(f"*{suffix}" in WEIGHT_FILTER for suffix in WEIGHT_SUFFIXES)


def test_unset_reads_auto_and_never_repeats_a_real_choice(panel):
    tail = panel.controls["tail"]  # None: gpd for tiled runs, none otherwise
    texts = [tail.itemText(i) for i in range(tail.count())]
    assert len(texts) == len(set(texts)) and texts[0] == "auto"
    assert panel.controls["tile_overlap"].specialValueText() == "auto"  # a quarter tile
    assert panel.controls["block_size"].specialValueText() == "auto"  # half a patch, or one

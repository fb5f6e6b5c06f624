"""The explorer's run controls are built from the core's option metadata, advanced ones too.

The metadata also places them (``Option.advanced``), says which apply, and the explorer's
arguments go through the core's one validator.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

from napari_attnreg.core.run import options as opts
from napari_attnreg.core.run.options import OPTIONS, option, options_in, validate_options
from napari_attnreg.core.stats.presets import rules_for
from napari_attnreg.notebook import AttentionExplorer
from napari_attnreg.notebook.advanced_panel import (
    ELSEWHERE,
    STATE_OPTIONS,
    AdvancedPanel,
    read_back_options,
)
from napari_attnreg.notebook.option_controls import UNSET, build_control, control_value
from napari_attnreg.notebook.options_panel import OptionsPanel
from napari_attnreg.notebook.state import ExplorerState

THRESHOLDS = {o.name for o in options_in("thresholds")}


@pytest.fixture
def explorer(blob_image, tiny_backbone):
    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=8, device="cpu", view="image",
                           chunk_size=4, target_size=(96, 80), pi0_method=0.8,
                           preset="directional")
    yield ex
    ex.close()


def test_main_controls_show_the_cores_labels_choices_ranges_and_help(explorer):
    for name in (*STATE_OPTIONS, "rule", "q_th", "p_th", "l_th", "z_th"):
        opt, control = option(name), explorer.controls[name]
        assert control.description == opt.label and control.tooltip == opt.help, name
        if name == "rule":  # the rules of the state's preset
            assert [v for _, v in control.options] == list(rules_for(explorer.preset))
        elif opt.kind == "choice":
            assert [v for _, v in control.options] == list(opt.choices), name
            assert [label for label, _ in control.options] == [opt.label_of(c)
                                                               for c in opt.choices]
        if name == "tile_overlap":  # may be empty (a quarter tile): a text box
            continue
        if hasattr(control, "min") and opt.minimum is not None:
            assert (control.min, control.max) == (opt.minimum, opt.maximum), name


def test_every_other_option_is_an_advanced_control():
    panel = AdvancedPanel()
    shown = set(panel.controls)
    assert shown == {o.name for o in read_back_options()}
    assert shown | set(STATE_OPTIONS) | THRESHOLDS | set(ELSEWHERE) == set(OPTIONS)
    assert STATE_OPTIONS == ("preset", "method", "n_boot", "seed", "tiled", "tile_scale",
                             "tile_overlap", "device")  # the explorer's traits, in core order
    assert panel.selected_index is None  # collapsed until opened
    assert panel.values() == {}  # nothing set: the engine's and the preset's defaults


def _placement(panel: OptionsPanel) -> tuple[list[str], list[str]]:
    """Names of the option controls above Advanced, and of those inside it."""
    names = {id(c): n for n, c in {**panel.controls, **panel.advanced.controls}.items()}
    main = [names[id(c)] for c in panel.children if id(c) in names and names[id(c)] != "model"]
    inside = [names[id(c)] for c in panel.advanced.children[0].children if id(c) in names]
    return main, inside


def test_the_metadata_places_each_option_above_or_under_advanced():
    panel = OptionsPanel(ExplorerState(), {})
    main, inside = _placement(panel)
    assert main == [o.name for o in opts.panel_options(advanced=False, skip=ELSEWHERE)]
    assert main == ["preset", "method", "n_boot", "tiled", "device"]
    assert inside == [o.name for g in opts.GROUP_TITLES
                      for o in opts.panel_options(advanced=True, skip=ELSEWHERE) if o.group == g]
    assert {"seed", "tile_overlap", "tile_scale", "chunk_size"} <= set(inside)
    assert panel.children[-1] is panel.advanced


def _flip_advanced(monkeypatch, names: tuple[str, ...]) -> None:
    """Swap basic and advanced for ``names`` in the core's option table."""
    table = tuple(dataclasses.replace(o, advanced=not o.advanced) if o.name in names else o
                  for o in opts._OPTIONS)
    monkeypatch.setattr(opts, "_OPTIONS", table)
    monkeypatch.setattr(opts, "OPTIONS", {o.name: o for o in table})


def test_flipping_advanced_in_the_metadata_moves_the_control(monkeypatch):
    # a trait (seed), a read-back option (precision), a tiling trait and a basic one
    _flip_advanced(monkeypatch, ("seed", "precision", "tile_scale", "n_boot"))
    main, inside = _placement(OptionsPanel(ExplorerState(), {}))
    assert {"seed", "precision", "tile_scale"} <= set(main) and "n_boot" in inside
    assert set(main).isdisjoint(inside)


def test_constructor_options_start_in_the_advanced_controls_and_reach_the_run(explorer):
    adv = explorer.options_panel.advanced
    assert adv.controls["chunk_size"].value == "4"
    assert adv.values() == {"chunk_size": 4, "target_size": (96, 80), "pi0_method": 0.8}
    assert adv.controls["pi0_method"].disabled  # 0.8 is not a listed choice: shown, kept
    adv.controls["std_factor"].value = 2.0
    adv.controls["null_pool"].value = "position"
    adv.controls["chunk_size"].value = ""  # empty = auto
    values = adv.values()
    assert values["std_factor"] == 2.0 and values["null_pool"] == "position"
    assert "chunk_size" not in values
    result = explorer.run(wait=True)
    assert result is not None, explorer.status
    md = result.metadata
    assert (md["std_factor"], md["null_pool"], md["pi0_method"]) == (2.0, "position", 0.8)
    assert tuple(md["target_size"]) == (96, 80) and md["chunk_size_requested"] is None


def test_bad_advanced_values_get_the_cores_message(explorer):
    adv = explorer.options_panel.advanced
    adv.controls["memory_fraction"].value = 1.0
    adv.controls["head"].value = "seven"
    assert explorer.run(wait=True) is None
    assert explorer.status.startswith("head must be 'mean' or a head number")
    adv.controls["head"].value = "mean"
    explorer.method = "patch"  # block size only applies to patch nulls
    adv.controls["block_size"].value = "big"
    with pytest.raises(ValueError, match="Block size.*not a number"):
        adv.values()


def test_bad_constructor_options_fail_at_once(blob_image, tiny_backbone):
    with pytest.raises(ValueError, match="chunk_size must be a whole number"):
        AttentionExplorer(blob_image, tiny_backbone, view="image", chunk_size=2.5)


def test_builder_kinds():
    assert build_control("keep_nulls").description == option("keep_nulls").label
    merge = build_control("merge")
    assert merge.options[0] == ("(auto)", UNSET) and control_value(option("merge"), merge) is None
    pool = build_control("null_pool")
    assert pool.options[0] == ("(from preset)", UNSET)
    chunk = build_control("chunk_size")
    chunk.value = " 12 "
    assert control_value(option("chunk_size"), chunk) == 12
    assert np.isclose(build_control("memory_fraction").max, option("memory_fraction").maximum)


def test_advanced_options_a_preset_ignores_are_greyed_and_not_sent(tiny_backbone):
    from napari_attnreg.notebook import AttentionExplorer

    explorer = AttentionExplorer(np.zeros((32, 32), np.float32) + np.eye(32, dtype=np.float32),
                                 model=tiny_backbone)
    advanced = explorer.options_panel.advanced
    # the step-down default: neither the paper's nor the directional options, but its tail
    assert advanced.controls["alternative"].disabled and advanced.controls["null_pool"].disabled
    assert not advanced.controls["tail"].disabled
    explorer.preset = "directional"
    assert advanced.controls["alternative"].disabled and not advanced.controls["null_pool"].disabled
    assert advanced.controls["tail"].disabled
    explorer.preset = "paper"
    assert not advanced.controls["alternative"].disabled and advanced.controls["null_pool"].disabled
    explorer.method = "patch"
    assert not advanced.controls["block_size"].disabled and advanced.controls["std_factor"].disabled
    advanced.controls["std_factor"].value = 3.0  # changed, but a patch null ignores it
    assert "std_factor" not in advanced.values()
    explorer.close()


@pytest.mark.parametrize(("argument", "value"), [("n_boot", 1.5), ("n_boot", True),
                                                 ("seed", 2.0), ("tiled", 1),
                                                 ("tile_scale", 0.0), ("p_th", 2)])
def test_explorer_arguments_are_refused_with_the_cores_words(blob_image, argument, value):
    with pytest.raises(ValueError) as core:
        validate_options({argument: value})
    with pytest.raises(ValueError) as err:
        AttentionExplorer(blob_image, "demo", view="image", **{argument: value})
    assert str(err.value) == str(core.value)  # never rounded (1.5 -> 1) or cast (True -> 1)


@pytest.mark.parametrize("opacity", [5, -0.1, math.nan, True, "0.5"])
def test_a_bad_opacity_names_the_allowed_range(blob_image, opacity):
    with pytest.raises(ValueError, match=r"opacity must be a number in \[0, 1\]"):
        AttentionExplorer(blob_image, "demo", view="image", opacity=opacity)


@pytest.mark.parametrize("opacity", [5, -0.1, math.nan, "0.5"])
def test_a_bad_opacity_set_later_is_refused_as_at_construction(blob_image, opacity):
    # explorer.opacity = 5 was taken: the slider's readout said 5, the overlay drew at 1
    import traitlets

    ex = AttentionExplorer(blob_image, "demo", view="image", opacity=0.3)
    with pytest.raises(traitlets.TraitError) as err:  # as explorer.n_boot = -3 is refused
        ex.opacity = opacity
    if not isinstance(opacity, str):  # a string: traitlets' own "expected a float"
        assert "opacity must be a number in [0, 1]" in str(err.value)
    assert ex.opacity == 0.3 and ex.controls["opacity"].value == 0.3
    ex.opacity = 1
    assert ex.opacity == 1.0 and ex.controls["opacity"].value == 1.0
    ex.close()


@pytest.mark.parametrize(("name", "value"), [("opacity", True), ("opacity", np.bool_(False)),
                                             ("p_th", True), ("q_th", False), ("l_th", True),
                                             ("z_th", True), ("tile_scale", True)])
def test_a_bool_set_later_is_refused_not_taken_as_one_or_zero(blob_image, name, value):
    # traitlets' Float turned True into 1.0 before any validator saw it: explorer.opacity =
    # True drew the overlay opaque, explorer.p_th = True kept every patch
    import traitlets

    ex = AttentionExplorer(blob_image, "demo", view="image", opacity=0.3)
    before = getattr(ex, name)
    shown = ex.controls[name].value if name in ex.controls else None
    with pytest.raises(traitlets.TraitError, match=rf"{name} must be a number") as err:
        setattr(ex, name, value)
    assert repr(value) in str(err.value)
    assert getattr(ex, name) == before
    if name in ex.controls:
        assert ex.controls[name].value == shown
    ex.close()


def test_a_rule_the_shown_results_preset_lacks_is_refused_and_the_explorer_keeps_working(
        blob_image, tiny_backbone):
    # explorer.rule = "q" over a step-down result was taken (the dropdown still showing
    # ForwardStop); the canvas, the ROI table and every export then raised "a step-down
    # result has no 'p' map"
    import traitlets

    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=8, device="cpu", view="image")
    ex.run(wait=True)
    with pytest.raises(traitlets.TraitError, match="rule='q' is not available under "
                                                   "preset='stepdown'"):
        ex.rule = "q"
    assert ex.rule == ex.controls["rule"].value == "forwardstop"
    assert ex.session.thresholds().rule == "forwardstop"
    ex.add_roi(rectangle=(10, 10, 60, 60))
    assert len(ex.roi_table()) == 1 and ex.rendered is not None
    ex.preset = "directional"  # the next run's preset: its rules once its result is shown
    ex.run(wait=True)
    ex.rule = "q"
    assert ex.result.thresholds_used["rule"] == "q"
    ex.close()


def test_explorer_arguments_are_normalised(blob_image):
    ex = AttentionExplorer(blob_image, "demo", view="image", n_boot=np.int64(12),
                           seed=np.int32(3), tiled=np.bool_(False), opacity=np.float32(0.5))
    assert (ex.n_boot, ex.seed, ex.tiled, ex.opacity) == (12, 3, False, 0.5)
    assert type(ex.n_boot) is int and type(ex.seed) is int
    ex.close()


def test_an_untiled_run_records_no_tiling_and_a_tiled_one_no_input_size(blob_image):
    from napari_attnreg.notebook.pipeline import run_config

    ex = AttentionExplorer(blob_image, "demo", view="image", target_size=64, tile_scale=2.0)
    options = ex.options_panel.advanced.values()
    assert run_config(ex.session, options).tile_scale == 1.0
    assert run_config(ex.session, options).target_size == 64
    ex.tiled = True
    assert ex.options_panel.advanced.controls["target_size"].disabled
    config = run_config(ex.session, ex.options_panel.advanced.values())
    assert config.tile_scale == 2.0 and config.target_size == "model"
    ex.close()


def test_a_bad_tile_overlap_typed_in_its_box_is_said_in_the_status(blob_image, tiny_backbone):
    # 99999 raised a TraitError inside the comm handler (a traceback in the kernel's log,
    # nothing in the widget); "abc" stayed in the box while the quarter-tile default ran
    ex = AttentionExplorer(blob_image, tiny_backbone, view="image", n_boot=4, device="cpu",
                           tile_overlap=16)
    ex.run(wait=True)
    box = ex.controls["tile_overlap"]
    box.value = "99999"
    assert "tile_overlap must be a whole number in [0, 4096], got 99999" in ex.status
    assert (ex.tile_overlap, box.value) == (16, "16") and ex.result is not None
    box.value = "abc"
    assert "'abc' is not a number" in ex.status and (ex.tile_overlap, box.value) == (16, "16")
    box.value = " 32 "
    assert ex.tile_overlap == 32
    box.value = ""
    assert ex.tile_overlap is None
    ex.tile_overlap = 8  # code moves the box
    assert box.value == "8"
    ex.close()

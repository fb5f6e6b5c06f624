"""The notebook model dropdown: catalogue grouped by domain, free text under 'other'."""

from __future__ import annotations

import pytest

from napari_attnreg.core.models import catalogue, hub

pytest.importorskip("ipywidgets")


@pytest.fixture
def explorer(blob_image, tiny_backbone):
    from napari_attnreg.notebook.explorer import AttentionExplorer

    ex = AttentionExplorer(blob_image, tiny_backbone, n_boot=12, device="cpu", view="image")
    yield ex
    ex.close()


def test_options_grouped_by_domain_then_other():
    from napari_attnreg.notebook.model_picker import OTHER, catalogue_options

    options = catalogue_options()
    domains = [label.split(" · ")[0] for label, value in options if value != OTHER]
    assert domains == sorted(domains, key=catalogue.DOMAINS.index)  # grouped, domain order
    assert {v for _, v in options} == {e.id for e in catalogue.CATALOGUE} | {OTHER}
    assert options[-1][1] == OTHER
    assert {v: label for label, v in options}["virchow2"].endswith("(gated)")


def test_picker_value_follows_dropdown_text_and_state():
    from napari_attnreg.notebook.model_picker import OTHER, ModelPicker

    picker = ModelPicker()
    assert picker.value == "demo" and "synthetic fluorescence" in picker.access.value
    picker.dropdown.value = "h-optimus-0"
    assert picker.value == "h-optimus-0"
    assert "pathology" in picker.access.value and "Apache-2.0" in picker.access.value
    picker.value = "uni2-h"  # set from the explorer's state
    assert picker.dropdown.value == "uni2-h" and "request access" in picker.access.value
    assert "huggingface.co/MahmoodLab/UNI2-h" in picker.access.value
    picker.value = "vit_small_patch16_224"
    assert picker.dropdown.value == OTHER and picker.other.value == "vit_small_patch16_224"
    assert picker.other.layout.display is None and picker.access.value == ""
    # typed: kept as typed, described from the catalogue
    picker.other.value = "hf:microsoft/rad-dino"
    assert picker.value == "hf:microsoft/rad-dino" and picker.dropdown.value == OTHER
    assert "radiology" in picker.access.value and picker.other.layout.display is None
    picker.disabled = True
    assert picker.dropdown.disabled and picker.other.disabled


def test_explorer_model_control_and_offline_message(explorer, monkeypatch):
    from napari_attnreg.notebook.model_picker import ModelPicker

    control = explorer.controls["model"]
    assert isinstance(control, ModelPicker)
    control.dropdown.value = "uni"
    assert explorer.model_name == "uni"
    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert explorer.run(wait=True) is None
    assert explorer.status.startswith("Could not download 'MahmoodLab/UNI'")
    assert hub.FILE_HINT in explorer.status and "load_backbone" not in explorer.status


def test_hiding_the_text_box_keeps_the_dropdown_visible():
    from ipywidgets import Layout

    from napari_attnreg.notebook.model_picker import ModelPicker

    shared = Layout(width="360px")  # the explorer passes one layout for the picker's controls
    picker = ModelPicker(layout=shared)
    assert picker.value == "demo" and picker.other.layout.display == "none"
    assert picker.dropdown.layout.display != "none"  # was hidden with the text box
    assert picker.other.layout is not picker.dropdown.layout
    assert picker.other.layout.width == picker.dropdown.layout.width == "360px"


def test_weight_file_endings_come_from_the_core():
    from napari_attnreg.core.models.weights import WEIGHT_SUFFIXES
    from napari_attnreg.notebook.model_picker import ModelPicker
    from napari_attnreg.notebook.pipeline import model_spec

    assert all(suffix in ModelPicker().other.tooltip for suffix in WEIGHT_SUFFIXES)
    for suffix in WEIGHT_SUFFIXES:  # a name ending so is a file, even one not there yet
        assert model_spec(f"missing{suffix}", arch=None, given=None).source == "file"

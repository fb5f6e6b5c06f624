"""The catalogue model picker in the dock widget."""

from __future__ import annotations

import pytest
from qtpy.QtCore import Qt

from napari_attnreg.core.models import catalogue, hub
from napari_attnreg.core.run.service import ModelSpec

pytestmark = pytest.mark.gui


def test_picker_groups_by_domain_and_shows_access(qtbot):
    from napari_attnreg._napari.model_picker import CataloguePicker

    picker = CataloguePicker()
    qtbot.addWidget(picker)
    combo = picker.combo
    texts = [combo.itemText(i) for i in range(combo.count())]
    headings = [t for t in texts if t.startswith("— ")]
    assert headings == ["— pathology —", "— radiology —", "— natural —"]
    for i, text in enumerate(texts):  # headings cannot be chosen
        enabled = bool(combo.model().item(i).flags() & Qt.ItemFlag.ItemIsEnabled)
        assert enabled == (text not in headings)
    # all but the bundled test articles (the demo has its own source entry in the widget)
    assert len(texts) - len(headings) == sum(e.domain != "demo" for e in catalogue.CATALOGUE)
    picker.set_model_id("uni")
    assert picker.model_id() == "uni" and "(gated)" in combo.currentText()
    text = picker.access_label.text()
    assert (
        "pathology" in text
        and "CC-BY-NC-ND-4.0" in text
        and "huggingface.co/MahmoodLab/UNI" in text
    )
    picker.set_model_id("rad-dino")
    assert (
        "radiology" in picker.access_label.text() and "open download" in picker.access_label.text()
    )
    with pytest.raises(ValueError, match="not in the catalogue"):
        picker.set_model_id("nope")


def test_catalogue_source_runs_and_offline_failure_names_the_file_option(
    viewer_widget, cells_image, run_and_wait, monkeypatch
):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    widget.model.source_combo.setCurrentIndex(widget.model.source_combo.findData("catalogue"))
    assert not widget.model.catalogue_picker.isHidden() and widget.model.timm_edit.isHidden()
    widget.model.catalogue_picker.set_model_id("uni")
    assert widget.model_spec().source == "catalogue" and widget.model_spec().name == "uni"
    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    outcome = run_and_wait(widget)
    assert outcome.message.startswith("Could not download 'MahmoodLab/UNI'")
    assert outcome.message.endswith(hub.FILE_HINT) and "load_backbone" not in outcome.message


def test_the_model_of_a_saved_result_as_the_picker_chooses_it(tmp_path, tiny_backbone):
    """A result's provenance (the backbone's name and weights, as a run writes them) maps to
    the picker's source, or to a reason it cannot."""
    from napari_attnreg._napari.model_picker import spec_of_result
    from napari_attnreg.core.models.backbones import load_backbone

    def provenance(bb):
        return {"model": bb.name, "weights": bb.weights}

    assert spec_of_result(provenance(load_backbone("demo"))) == (ModelSpec("demo", "demo"), "")
    random = load_backbone("vit_tiny_patch16_224", pretrained=False)
    spec, why = spec_of_result(provenance(random))
    assert spec is None and "random (untrained) weights" in why
    spec, why = spec_of_result(provenance(tiny_backbone))
    assert spec is None and "given in code" in why
    folder = tmp_path / "hf_folder"
    folder.mkdir()
    spec, _ = spec_of_result({"model": "hf_folder", "weights": str(folder)})
    assert spec == ModelSpec("file", str(folder), arch=None)  # a folder names its own arch
    spec, _ = spec_of_result({"model": "uni", "weights": "pretrained"})
    assert spec == ModelSpec("catalogue", "uni")
    spec, _ = spec_of_result({"model": "vit_small_patch8_224.dino", "weights": "pretrained"})
    assert spec == ModelSpec("timm", "vit_small_patch8_224.dino")
    assert spec_of_result({})[0] is None

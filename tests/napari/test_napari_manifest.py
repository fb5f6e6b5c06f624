"""Manifest, dock-widget registration, sample data and the image-layer list."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import napari_attnreg

pytestmark = pytest.mark.gui

MANIFEST = Path(napari_attnreg.__file__).parent / "napari.yaml"


def test_manifest_validates_and_lists_contributions():
    from npe2 import PluginManifest

    manifest = PluginManifest.from_file(MANIFEST)
    manifest.validate_imports()
    assert manifest.name == "napari-attnreg"
    assert [w.display_name for w in manifest.contributions.widgets] == ["Attention Regularization"]
    keys = {s.key for s in manifest.contributions.sample_data}
    assert {"cell", "immunohistochemistry", "retina", "demo_cells"} <= keys


def test_add_plugin_dock_widget(make_napari_viewer):
    from napari_attnreg._napari.widget import AttentionWidget

    viewer = make_napari_viewer()
    _dock, widget = viewer.window.add_plugin_dock_widget("napari-attnreg", "Attention Regularization")
    assert isinstance(widget, AttentionWidget)
    assert widget.model_spec().source == "demo"  # the UI default is the bundled model
    assert widget.device_label.text().startswith("→ ")


@pytest.mark.parametrize("key, shape", [("cell", (660, 550)), ("immunohistochemistry", (512, 512, 3)),
                                        ("retina", (1411, 1411, 3))])
def test_skimage_samples_open(make_napari_viewer, key, shape):
    viewer = make_napari_viewer()
    layers = viewer.open_sample("napari-attnreg", key)
    assert layers[0].data.shape == shape
    assert layers[0].rgb == (len(shape) == 3)


def test_demo_sample_opens(make_napari_viewer):
    from napari_attnreg.samples import DATA_DIR, DEMO_IMAGE

    if not (DATA_DIR / DEMO_IMAGE).is_file():
        pytest.fail(f"the demo-model engineer's sample image {DATA_DIR / DEMO_IMAGE} is missing")
    viewer = make_napari_viewer()
    layers = viewer.open_sample("napari-attnreg", "demo_cells")
    assert layers[0].name == "demo cells" and layers[0].data.ndim == 2


def test_image_list_follows_layers(viewer_widget):
    viewer, widget = viewer_widget

    def names():
        return [widget.layer_combo.itemText(i) for i in range(widget.layer_combo.count())]

    assert names() == []
    a = viewer.add_image(np.zeros((32, 32)), name="a")
    viewer.add_points([[1, 1]], name="pts")  # not an image: not listed
    b = viewer.add_image(np.zeros((32, 32)), name="b")
    assert names() == ["a", "b"]
    widget.set_layer(a)
    a.name = "renamed"
    assert names() == ["renamed", "b"]
    assert widget.current_layer() is a
    viewer.layers.remove(a)
    assert names() == ["b"] and widget.current_layer() is b

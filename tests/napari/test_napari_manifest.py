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
    (reader,) = manifest.contributions.readers
    assert reader.accepts_directories and "*.dcm" in reader.filename_patterns
    assert {tuple(w.filename_extensions) for w in manifest.contributions.writers} == {
        (".ome.tif", ".ome.tiff"), ()}
    assert set(manifest.contributions.configurations["run"].properties) == {
        "model", "device", "n_boot", "preset"}


def test_npe2_validate_passes_with_imports():
    """What a plugin index runs: the manifest validates and every python_name imports."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(napari_attnreg.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "npe2", "validate", "--imports", str(MANIFEST)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0 and "valid!" in out.stdout, out.stdout + out.stderr


def test_settings_choices_match_the_core():
    from npe2 import PluginManifest

    from napari_attnreg.core.run.engine import RunConfig
    from napari_attnreg.core.stats.presets import DEFAULT_PRESET, PRESETS

    props = PluginManifest.from_file(MANIFEST).contributions.configurations["run"].properties
    assert tuple(props["preset"].enum) == PRESETS and props["preset"].default == DEFAULT_PRESET
    assert props["n_boot"].default == RunConfig().n_boot
    assert props["device"].default == RunConfig().device


def test_run_defaults_follow_the_user_settings(plugin_settings, npe2pm):
    from napari.settings import get_plugin_settings
    from npe2 import PluginManifest

    from napari_attnreg._napari.settings import run_defaults

    assert run_defaults().n_boot == 200  # not registered: the manifest's defaults
    npe2pm.register(PluginManifest.from_file(MANIFEST))
    settings = get_plugin_settings("napari-attnreg").run
    settings.n_boot, settings.preset, settings.device, settings.model = 50, "paper", "cpu", "uni"
    assert run_defaults() == type(run_defaults())(model="uni", device="cpu", n_boot=50,
                                                  preset="paper")
    settings.model = "  "  # an emptied text field falls back to the default model
    assert run_defaults().model == "demo"


def test_reader_declines_what_it_does_not_read(tmp_path):
    from napari_attnreg._napari.io import get_reader

    (tmp_path / "a.png").write_bytes(b"\x89PNG")
    assert get_reader(str(tmp_path / "a.png")) is None
    assert get_reader(str(tmp_path)) is None  # a folder without DICOM files


@pytest.fixture
def our_plugin(npe2pm):
    """Our manifest registered with a hermetic npe2 plugin manager."""
    from npe2 import PluginManifest

    npe2pm.register(PluginManifest.from_file(MANIFEST))
    return npe2pm


def test_open_dicom_folder_and_ome_tiff_in_napari(tmp_path, our_plugin):
    import tifffile
    from napari.components import ViewerModel

    pytest.importorskip("pydicom")
    from test_io_readers import write_ct_slice

    folder = tmp_path / "ct"
    folder.mkdir()
    for k in range(3):
        write_ct_slice(folder / f"s{k}.dcm", 3.0 * k, k, np.full((8, 6), 1100 + k))
    viewer = ViewerModel()
    (layer,) = viewer.open(str(folder), plugin="napari-attnreg")
    assert layer.data.shape == (3, 8, 6) and tuple(layer.scale) == pytest.approx((3.0, 0.7, 0.5))
    assert tuple(layer.contrast_limits) == pytest.approx((-160.0, 240.0))
    assert layer.metadata["dicom"]["modality"] == "CT"
    ome = tmp_path / "cells.ome.tif"
    tifffile.imwrite(ome, np.zeros((2, 2, 8, 8), np.uint16), ome=True,
                     metadata={"axes": "ZCYX", "PhysicalSizeX": 0.3, "PhysicalSizeY": 0.3,
                               "PhysicalSizeZ": 1.5})
    layers = viewer.open(str(ome), plugin="napari-attnreg")
    assert len(layers) == 2  # one layer per channel
    assert tuple(layers[0].scale) == pytest.approx((1.5, 0.3, 0.3))
    assert str(layers[0].units[-1]) == "micrometer"


def test_save_output_layers_through_napari_and_read_them_back(tmp_path, our_plugin):
    from napari.components import ViewerModel

    viewer = ViewerModel()
    meta = {"attnreg": {"kind": "regularized", "preset": "directional", "source": "img",
                        "run": {"model": "demo", "n_boot": 12, "seed": 1},
                        "thresholds": {"rule": "q", "q_th": 0.1}}}
    image = viewer.add_image(np.random.default_rng(0).random((6, 7)), name="img · regularized",
                             scale=(16.0, 16.0), translate=(7.5, 7.5), metadata=meta)
    labels = viewer.add_labels(np.eye(6, 7, dtype=np.int32), name="img · significant",
                               scale=(4.0, 4.0), metadata=meta)
    written = viewer.layers.save(str(tmp_path / "results"), selected=False,
                                 plugin="napari-attnreg")
    assert {Path(p).name for p in written} >= {"img_regularized.ome.tif",
                                               "img_significant.ome.tif", "provenance.json"}
    (back,) = ViewerModel().open(str(tmp_path / "results" / "img_regularized.ome.tif"),
                                 plugin="napari-attnreg")
    np.testing.assert_allclose(back.data, image.data, rtol=1e-6)
    assert tuple(back.scale) == pytest.approx((16.0, 16.0))
    viewer.layers.selection = {labels}
    single = viewer.layers.save(str(tmp_path / "sig.ome.tif"), selected=True,
                                plugin="napari-attnreg")
    assert [Path(p).name for p in single] == ["sig.ome.tif", "sig.provenance.json"]


def test_add_plugin_dock_widget(make_napari_viewer):
    from napari_attnreg._napari.widget import AttentionWidget

    viewer = make_napari_viewer()
    _dock, widget = viewer.window.add_plugin_dock_widget("napari-attnreg", "Attention Regularization")
    assert isinstance(widget, AttentionWidget)
    assert widget.model_spec().source == "demo"  # the UI default is the bundled model
    assert widget.options.device_label.text().startswith("→ ")


@pytest.mark.parametrize("key, shape", [("cell", (660, 550)), ("immunohistochemistry", (512, 512, 3)),
                                        ("retina", (1411, 1411, 3))])
def test_skimage_samples_open(make_napari_viewer, key, shape):
    viewer = make_napari_viewer()
    layers = viewer.open_sample("napari-attnreg", key)
    assert layers[0].data.shape == shape
    assert layers[0].rgb == (len(shape) == 3)
    assert layers[0].metadata["source_path"] == f"skimage.data.{key}"


def test_demo_sample_opens(make_napari_viewer):
    from napari_attnreg.samples import DATA_DIR, DEMO_IMAGE

    if not (DATA_DIR / DEMO_IMAGE).is_file():
        pytest.fail(f"the demo-model engineer's sample image {DATA_DIR / DEMO_IMAGE} is missing")
    viewer = make_napari_viewer()
    layers = viewer.open_sample("napari-attnreg", "demo_cells")
    assert layers[0].name == "demo cells" and layers[0].data.ndim == 2
    assert Path(layers[0].metadata["source_path"]).is_file()


def test_image_list_follows_layers(viewer_widget):
    viewer, widget = viewer_widget

    def names():
        combo = widget.source.layer_combo
        return [combo.itemText(i) for i in range(combo.count())]

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


def test_gui_runs_on_pyqt6_without_the_pyqt5_deprecation_toast(make_napari_viewer, notifications,
                                                              qtbot):
    """napari 0.8 deprecated PyQt5 and shows a toast on the first window; we run on PyQt6."""
    import qtpy

    assert qtpy.API_NAME == "PyQt6", f"GUI tests run on {qtpy.API_NAME}; install napari[pyqt6]"
    make_napari_viewer(show=True)
    qtbot.wait(50)  # let the first showEvent run
    assert not [n for n in notifications if "PyQt5" in str(n.message)]


def test_sample_menu_title_named_in_the_readme_is_the_one_napari_shows():
    """napari titles a plugin's Open Sample submenu with the manifest's display name."""
    from npe2 import PluginManifest

    manifest = PluginManifest.from_file(MANIFEST)
    readme = (Path(napari_attnreg.__file__).parents[2] / "README.md")
    if not readme.is_file():
        pytest.skip("installed without the source tree")
    text = " ".join(readme.read_text().split())
    assert f"File → Open Sample → {manifest.display_name}" in text
    assert "Open Sample → napari-attnreg" not in text

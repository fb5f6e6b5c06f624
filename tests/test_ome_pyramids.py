"""OME-TIFF pyramids (bfconvert / QuPath / tifffile sub-IFDs): opened in napari as multiscale
layers in their physical units, and run from the dock as slide pyramids are (the finest level
the untiled budget holds, or tiled at full resolution), without a slide's tissue mask."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

tifffile = pytest.importorskip("tifffile")
pytest.importorskip("zarr")
pytest.importorskip("dask")

SIZE = 2048


def _pixels(size: int, channels: int | None = None, rgb: bool = False) -> np.ndarray:
    """Textured blobs on a dark background; ``rgb``: uint8 colour, else uint16 channels."""
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[:size, :size] / size
    blobs = sum(np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 0.004)
                for cy, cx in rng.random((12, 2)))
    base = blobs / blobs.max()
    if rgb:
        img = np.stack([base * 200, base * 80 + 30, base * 160], -1)
        return (img + rng.random(img.shape) * 40).astype(np.uint8)
    planes = [np.roll(base, 97 * c, axis=1) * (3000 + 500 * c) + rng.random(base.shape) * 300
              for c in range(channels or 1)]
    img = np.stack(planes) if channels else planes[0]
    return img.astype(np.uint16)


def write_pyramid(path: Path, img: np.ndarray, axes: str, levels: int = 3, size: float = 0.5,
                  unit: str = "µm", names: list[str] | None = None) -> Path:
    """An OME-TIFF pyramid as bfconvert writes one: level 0 with ``levels - 1`` sub-IFDs, each
    half the size of the one before, tiled 256²."""
    metadata = {"axes": axes, "PhysicalSizeX": size, "PhysicalSizeY": size,
                "PhysicalSizeXUnit": unit, "PhysicalSizeYUnit": unit}
    if names:
        metadata["Channel"] = {"Name": names}
    photometric = "rgb" if axes == "YXS" else "minisblack"
    step = (slice(None),) if axes.startswith("C") else ()
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(img, tile=(256, 256), subifds=levels - 1, photometric=photometric,
                  metadata=metadata)
        for k in range(1, levels):
            f = 2 ** k
            tif.write(img[(*step, slice(None, None, f), slice(None, None, f))].copy(),
                      tile=(256, 256), subfiletype=1, photometric=photometric)
    return path


def _level(path: Path, level: int) -> np.ndarray:
    return tifffile.imread(path, series=0, level=level)


@pytest.fixture(scope="module")
def rgb_pyramid(tmp_path_factory) -> Path:
    """2048² RGB, 0.5 µm per pixel, levels 1/2 and 1/4."""
    return write_pyramid(tmp_path_factory.mktemp("ome") / "tissue.ome.tif",
                         _pixels(SIZE, rgb=True), "YXS")


@pytest.fixture(scope="module")
def cyx_pyramid(tmp_path_factory) -> Path:
    """2048² fluorescence, three named uint16 channels, 500 nm per pixel (in nm)."""
    return write_pyramid(tmp_path_factory.mktemp("ome") / "cells.ome.tif",
                         _pixels(SIZE, channels=3), "CYX", size=500.0, unit="nm",
                         names=["DAPI", "GFP", "RFP"])


# -- the reader --------------------------------------------------------------------------------

def test_an_ome_pyramid_opens_as_a_lazy_multiscale_layer_in_micrometres(rgb_pyramid,
                                                                        monkeypatch):
    from napari_attnreg._napari.io import get_reader
    from napari_attnreg.core.run import lazy
    from napari_attnreg.io.readers import ImageInfo

    reader = get_reader(str(rgb_pyramid))
    [(data, kwargs, kind)] = reader(str(rgb_pyramid))
    # all the levels, full resolution first, none of them read yet
    assert kind == "image" and kwargs["multiscale"] and kwargs["rgb"]
    assert [level.shape for level in data] == [(SIZE >> k, SIZE >> k, 3) for k in range(3)]
    assert not any(isinstance(level, np.ndarray) for level in data)
    assert kwargs["scale"] == (0.5, 0.5) and kwargs["units"] == ("µm", "µm")
    assert kwargs["name"] == "tissue"  # named as a single-resolution OME-TIFF is
    slide = kwargs["metadata"]["slide"]
    assert slide == {"path": str(rgb_pyramid), "kind": "ome", "level": 0, "mpp": 0.5,
                     "downsample": 1.0, "levels": 3, "run_level": 0}
    # a microscope's image: the OME pixel size and kind, not a slide's "pathology"
    info = ImageInfo.from_layer_metadata(kwargs["metadata"])
    assert info.pixel_size == (0.5, 0.5) and info.unit == "µm" and info.kind == "microscopy"
    np.testing.assert_array_equal(np.asarray(data[2]), _level(rgb_pyramid, 2))

    # above the untiled budget, an untiled run in the dock reads the finest level it holds
    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", 1024 * 1024)
    [(_, kwargs, _)] = reader(str(rgb_pyramid))
    assert kwargs["metadata"]["slide"]["run_level"] == 1


def test_the_channels_of_a_fluorescence_pyramid_are_layers_each_with_its_channel(cyx_pyramid):
    from napari.layers.utils.stack_utils import split_channels

    from napari_attnreg._napari.io import read_ome_tiff_layers as read

    [(data, kwargs, kind)] = read(str(cyx_pyramid))
    assert kwargs["channel_axis"] == 0 and kwargs["multiscale"]
    assert kwargs["name"] == ["cells · DAPI", "cells · GFP", "cells · RFP"]
    # 500 nm in the file: shown in nm as before, the run's record in µm as a slide's
    assert kwargs["units"] == ("nm", "nm") and kwargs["scale"] == (500.0, 500.0)
    # napari's channel split hands each layer its own record, naming its channel
    layers = split_channels(data, **kwargs)
    assert [meta["metadata"]["slide"]["channel"] for _, meta, _ in layers] == [0, 1, 2]
    assert {meta["metadata"]["slide"]["mpp"] for _, meta, _ in layers} == {0.5}
    gfp = layers[1][0]
    assert [level.shape for level in gfp] == [(SIZE >> k, SIZE >> k) for k in range(3)]
    np.testing.assert_array_equal(np.asarray(gfp[1]), _level(cyx_pyramid, 1)[1])


def test_a_single_resolution_ome_tiff_opens_as_before(tmp_path):
    from napari_attnreg.io.ometiff import read_ome_tiff_layers

    path = tmp_path / "flat.ome.tif"
    img = _pixels(256, channels=2)
    tifffile.imwrite(path, img, ome=True, metadata={"axes": "CYX", "PhysicalSizeX": 0.25,
                                                    "PhysicalSizeY": 0.25})
    [(data, kwargs, kind)] = read_ome_tiff_layers(path)
    assert isinstance(data, np.ndarray) and data.shape == (2, 256, 256)
    assert "multiscale" not in kwargs and "slide" not in kwargs["metadata"]
    assert kwargs["channel_axis"] == 0 and kwargs["scale"] == (0.25, 0.25)


def test_a_layer_the_writer_saved_reopens_as_it_was_saved(tmp_path):
    from napari_attnreg._napari.io import read_ome_tiff_layers as read
    from napari_attnreg._napari.io import write_outputs

    data = _pixels(128)
    meta = {"name": "saved", "scale": (0.5, 0.5), "translate": (3.0, 4.0),
            "units": ("µm", "µm"), "metadata": {}}
    [path, *_] = write_outputs(str(tmp_path / "saved.ome.tif"), [(data, meta, "image")])
    [(again, kwargs, kind)] = read(path)
    np.testing.assert_array_equal(np.asarray(again), data)
    assert kind == "image" and kwargs["name"] == "saved" and "multiscale" not in kwargs
    assert kwargs["translate"] == [3.0, 4.0] and "slide" not in kwargs["metadata"]


# -- one level for a run -----------------------------------------------------------------------

def test_a_level_is_read_by_its_ome_axes_one_channel_or_all(cyx_pyramid):
    from napari_attnreg.io.ometiff import open_ome_level

    level1 = _level(cyx_pyramid, 1)
    gfp = open_ome_level(cyx_pyramid, level=1, channel=1)
    assert gfp.shape == (1024, 1024) and gfp.channel_axis is None
    assert gfp.level == 1 and gfp.downsample == 2.0 and gfp.mpp == pytest.approx(1.0)
    np.testing.assert_array_equal(gfp.read(slice(100, 300), slice(7, 900)),
                                  level1[1, 100:300, 7:900])
    every = open_ome_level(cyx_pyramid, level=1)  # three channels: channels last
    np.testing.assert_array_equal(every.read(slice(0, 50), slice(0, 60)),
                                  np.moveaxis(level1[:, :50, :60], 0, -1))
    # the thumbnail (tissue masks, intensity ranges) is a coarser level of the same channel
    np.testing.assert_array_equal(gfp.overview(), _level(cyx_pyramid, 2)[1])
    # a resolution between levels: the level at least as fine, resampled
    coarse = open_ome_level(cyx_pyramid, mpp=1.5, channel=0)
    assert coarse.level == 1 and coarse.scale == pytest.approx(1.5)
    with pytest.raises(ValueError, match="no channel 3"):
        open_ome_level(cyx_pyramid, channel=3)
    with pytest.raises(ValueError, match="levels 0–2"):
        open_ome_level(cyx_pyramid, level=3)


def test_the_command_line_reads_a_level_of_a_fluorescence_pyramid_by_its_axes(tmp_path):
    # a CYX pyramid at --level was read as a slide's (H, W, colour) level: "3x256 px"
    from napari_attnreg.cli import main
    from napari_attnreg.core.results.result import AttentionResult

    path = write_pyramid(tmp_path / "cells.ome.tif", _pixels(1024, channels=3), "CYX")
    out = tmp_path / "out"
    assert main(["run", str(path), "--tiled", "--level", "2", "--out", str(out), "--n-boot",
                 "4", "--device", "cpu", "--quiet"]) == 0
    result = AttentionResult.load(next(out.glob("*.attnreg.npz")))
    md = result.metadata
    assert result.image_shape == (256, 256) and md["slide_level"] == 2
    assert result.spatial["scale"] == pytest.approx((2.0, 2.0))
    assert md["image_kind"] == "microscopy" and md["tissue_mask"] == "none"


# -- napari and its dock -----------------------------------------------------------------------

def _dock(viewer):
    from napari_attnreg._napari.widget import AttentionWidget

    widget = AttentionWidget(viewer)
    viewer.window.add_dock_widget(widget)
    widget.options.controls["device"].setCurrentText("cpu")
    widget.options.controls["n_boot"].setValue(8)
    return widget


def _dock_run(widget, qtbot):
    with qtbot.waitSignal(widget.run_finished, timeout=120_000):
        assert widget.run() is not None, widget.run_panel.status_label.text()
    record = widget.current_record()
    assert record is not None, widget.run_panel.status_label.text()
    return record


def _on_full_resolution(record, layer, full: int) -> None:
    """The attention map's corner tokens lie on the layer's full-resolution pixels they
    cover (an untiled run resizes the level read to the model's input: a token spans
    ``full / n`` level-0 pixels)."""
    attention = record.outputs["attention"]
    n = attention.data.shape[0]
    span = full / n
    assert np.asarray(attention.data_to_world((0, 0))) == pytest.approx(
        layer.data_to_world(((span - 1) / 2,) * 2))
    assert np.asarray(attention.data_to_world((n - 1, n - 1))) == pytest.approx(
        layer.data_to_world((full - (span + 1) / 2,) * 2))


@pytest.mark.gui
def test_napari_opens_an_ome_pyramid_as_a_multiscale_layer(rgb_pyramid, make_napari_viewer):
    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py

    viewer = make_napari_viewer()
    [layer] = viewer.open(str(rgb_pyramid), plugin="napari-attnreg")
    assert layer.multiscale and len(layer.data) == 3 and layer.rgb
    assert layer.data.shape == (SIZE, SIZE, 3)
    assert tuple(layer.scale) == pytest.approx((0.5, 0.5))
    assert [str(u) for u in layer.units] == ["micrometer", "micrometer"]
    assert layer.metadata["slide"]["kind"] == "ome"


@pytest.mark.gui
def test_an_untiled_dock_run_reads_the_finest_level_the_budget_holds_and_lies_on_level_0(
        rgb_pyramid, make_napari_viewer, qtbot, monkeypatch, tmp_path):
    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py

    from napari_attnreg._napari.figure import export_figure
    from napari_attnreg.core.run import lazy

    # a budget of level 1's pixels: level 0 (2048²) is too large to hold, level 1 is not
    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", 1024 * 1024)
    viewer = make_napari_viewer()
    [layer] = viewer.open(str(rgb_pyramid), plugin="napari-attnreg")
    widget = _dock(viewer)
    record = _dock_run(widget, qtbot)
    result = record.results[()]
    md = result.metadata
    assert result.image_shape == (1024, 1024) and md["slide_level"] == 1
    # the OME pixel size of the level read, and a microscope's image (before: a run of a
    # multiscale layer was refused, and level 0 read whole was above the budget)
    assert result.spatial["scale"] == pytest.approx((1.0, 1.0))
    assert md["image_kind"] == "microscopy"
    _on_full_resolution(record, layer, SIZE)
    assert export_figure(viewer, record, layer, tmp_path / "pyramid.png").is_file()


@pytest.mark.gui
def test_a_tiled_dock_run_reads_full_resolution_tile_by_tile_without_a_tissue_mask(
        tmp_path, make_napari_viewer, qtbot, monkeypatch):
    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py

    from napari_attnreg.core.run.lazy import LazyImage
    from napari_attnreg.io import ometiff

    path = write_pyramid(tmp_path / "stained.ome.tif", _pixels(1024, rgb=True), "YXS", levels=2)
    reads: list[tuple[int, int]] = []  # (h, w) of each read of level 0
    read = ometiff._LevelView.__getitem__

    def counted(self, key):
        block = read(self, key)
        if self.shape[:2] == (1024, 1024):
            reads.append(block.shape[:2])
        return block

    monkeypatch.setattr(ometiff._LevelView, "__getitem__", counted)
    viewer = make_napari_viewer()
    [layer] = viewer.open(str(path), plugin="napari-attnreg")
    widget = _dock(viewer)
    widget.options.controls["tiled"].setChecked(True)
    pending = widget._build_job()
    assert isinstance(pending.job.stack, LazyImage) and pending.grid is None
    assert pending.job.stack.analysed_shape == (1024, 1024)
    assert pending.job.config.extra["slide_level"] == 0 and not reads  # nothing read yet
    record = _dock_run(widget, qtbot)
    result = record.results[()]
    md = result.metadata
    # microscopy: every tile run, no automatic mask, no tissue layer
    assert md["tissue_mask"] == "none" and md["image_kind"] == "microscopy"
    assert not any(name.endswith("tissue") for name in (lay.name for lay in viewer.layers))
    assert result.spatial["scale"] == pytest.approx((0.5, 0.5))
    # level 0 read region by region, never whole (its thumbnail is level 1)
    assert reads and max(h * w for h, w in reads) < 1024 * 1024 // 4
    # a token of the full-resolution run covers its own patch of layer pixels
    attention = record.outputs["attention"]
    assert np.asarray(attention.data_to_world((0, 0))) == pytest.approx(
        layer.data_to_world(((result.patch_size[0] - 1) / 2,) * 2))


@pytest.mark.gui
def test_each_channel_layer_of_a_fluorescence_pyramid_runs_on_its_channel(
        cyx_pyramid, make_napari_viewer, qtbot, monkeypatch, tmp_path):
    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py

    from napari_attnreg._napari.figure import analysed_pixels
    from napari_attnreg.core.run import lazy

    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", 1024 * 1024)
    viewer = make_napari_viewer()
    layers = viewer.open(str(cyx_pyramid), plugin="napari-attnreg")
    assert [lay.name for lay in layers] == ["cells · DAPI", "cells · GFP", "cells · RFP"]
    assert all(lay.multiscale and lay.data.shape == (SIZE, SIZE) for lay in layers)
    gfp = viewer.layers["cells · GFP"]
    widget = _dock(viewer)
    widget.set_layer(gfp)
    assert widget.current_layer() is gfp
    # the GFP channel of level 1, not the DAPI one nor all three
    pending = widget._build_job()
    level1 = _level(cyx_pyramid, 1)
    np.testing.assert_array_equal(np.asarray(pending.job.stack.data), level1[1])
    record = _dock_run(widget, qtbot)
    result = record.results[()]
    assert result.image_shape == (1024, 1024) and result.metadata["slide_level"] == 1
    # 500 nm per full-resolution pixel: the level read is 1000 nm a pixel, in the layer's nm
    assert result.spatial["scale"] == pytest.approx((1000.0, 1000.0))
    assert result.metadata["image_kind"] == "microscopy"
    _on_full_resolution(record, gfp, SIZE)
    # a figure draws the channel analysed
    np.testing.assert_array_equal(analysed_pixels(record.grid, gfp), level1[1])


@pytest.mark.gui
def test_a_concept_from_regions_on_a_channel_layer_reads_the_level_a_run_reads(
        cyx_pyramid, make_napari_viewer, monkeypatch):
    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py

    from napari_attnreg._napari.concept_roi import capture_request
    from napari_attnreg.core.run import lazy

    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", 1024 * 1024)
    viewer = make_napari_viewer()
    viewer.open(str(cyx_pyramid), plugin="napari-attnreg")
    rfp = viewer.layers["cells · RFP"]
    box = np.array([[400.0, 1000.0], [400.0, 1600.0], [800.0, 1600.0], [800.0, 1000.0]])
    viewer.add_shapes([box], shape_type="rectangle", name="nuclei", scale=rfp.scale)
    request = capture_request(viewer, rfp, None)
    np.testing.assert_array_equal(request.image, _level(cyx_pyramid, 1)[2])
    rows, cols = np.nonzero(request.labels)
    assert (rows.min(), rows.max()) == (200, 399) and (cols.min(), cols.max()) == (500, 799)


@pytest.mark.gui
def test_a_saved_folder_refers_to_the_pyramid_and_reopens_its_channel_layers_once(
        cyx_pyramid, make_napari_viewer, tmp_path):
    import json

    import timm  # noqa: F401

    from napari_attnreg._napari.io import write_outputs

    viewer = make_napari_viewer()
    layers = viewer.open(str(cyx_pyramid), plugin="napari-attnreg")
    assert len(layers) == 3
    folder = tmp_path / "saved"
    written = write_outputs(str(folder), [lay.as_layer_data_tuple() for lay in layers])
    entries = json.loads((folder / "provenance.json").read_text())["layers"]
    # no copy of the pyramid's pixels: each channel layer's record names the file
    assert [e["slide"]["channel"] for e in entries] == [0, 1, 2]
    assert all(e["file"] is None for e in entries) and len(written) == 1
    again = make_napari_viewer()
    reopened = again.open(str(folder), plugin="napari-attnreg")
    assert [lay.name for lay in reopened] == [lay.name for lay in layers]
    assert all(lay.multiscale for lay in reopened)

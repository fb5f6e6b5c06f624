"""An OME-TIFF of one 2D image and a plain tiled TIFF (no scanner metadata), each stored as
one level above the untiled budget: napari gets a lazy pyramid (the file's level, then
halved levels made as napari draws them) as a single-level slide does, and a run from the
dock reads the file's level, with the results and placement it had when the layer was that
level alone. Smaller files open as before."""

from __future__ import annotations

import numpy as np
import pytest

tifffile = pytest.importorskip("tifffile")
pytest.importorskip("dask")
pytest.importorskip("zarr")

H, W = 512, 384  # the file's one level
BUDGET = 128 * 128  # the untiled pixel budget in these tests: the level is above it
COARSEST = 128  # the coarsest level built: 128 x 96, after 256 x 192


def _pixels() -> np.ndarray:
    rng = np.random.default_rng(5)
    img = np.full((H, W, 3), 236, np.uint8)  # glass
    yy, xx = np.mgrid[0:H, 0:W]
    tissue = (yy - 220) ** 2 / 160 ** 2 + (xx - 170) ** 2 / 120 ** 2 < 1
    stain = rng.random((H, W, 3)) * 90 + np.array([130, 40, 120])
    img[tissue] = stain[tissue].clip(0, 255).astype(np.uint8)
    return img


def _channels() -> np.ndarray:
    """Three fluorescence channels (C, Y, X), 16 bits."""
    rng = np.random.default_rng(6)
    return (rng.random((3, H, W)) * np.array([4000, 900, 60000])[:, None, None]).astype(
        np.uint16)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{kind: path}: an RGB OME-TIFF (0.5 µm), a CYX OME-TIFF, a plain tiled TIFF, each one
    level of H x W tiled 128², and a plain TIFF of the same image in strips."""
    folder = tmp_path_factory.mktemp("single")
    paths = {"ome": folder / "one_level.ome.tif", "cyx": folder / "channels.ome.tif",
             "tiff": folder / "export.tif", "strips": folder / "strips.tif"}
    tifffile.imwrite(paths["ome"], _pixels(), tile=(128, 128), photometric="rgb",
                     metadata={"axes": "YXS", "PhysicalSizeX": 0.5, "PhysicalSizeY": 0.5})
    tifffile.imwrite(paths["cyx"], _channels(), tile=(128, 128), photometric="minisblack",
                     metadata={"axes": "CYX", "Channel": {"Name": ["DAPI", "GFP", "RFP"]}})
    tifffile.imwrite(paths["tiff"], _pixels(), tile=(128, 128), photometric="rgb")
    tifffile.imwrite(paths["strips"], _pixels(), photometric="rgb")
    return paths


@pytest.fixture
def small_budget(monkeypatch):
    from napari_attnreg._napari import slide_pyramid
    from napari_attnreg.core.run import lazy

    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", BUDGET)
    monkeypatch.setattr(slide_pyramid, "COARSEST_SIDE", COARSEST)


def _block_mean(img: np.ndarray, f: int) -> np.ndarray:
    """Means of f x f blocks of (H, W, C), edge blocks of what they hold."""
    h, w = -(-img.shape[0] // f), -(-img.shape[1] // f)
    out = np.empty((h, w, img.shape[2]))
    for i in range(h):
        for j in range(w):
            out[i, j] = img[i * f:(i + 1) * f, j * f:(j + 1) * f].reshape(
                -1, img.shape[2]).mean(0)
    return np.rint(out).astype(img.dtype)


@pytest.mark.parametrize("kind", ["ome", "tiff"])
def test_a_single_level_rgb_file_above_the_budget_opens_as_a_lazy_pyramid(files, small_budget,
                                                                          kind):
    from napari_attnreg._napari.io import get_reader
    from napari_attnreg._napari.slide_pyramid import BlockMeanLevel

    path = str(files[kind])
    reader = get_reader(path)
    assert reader is not None  # the plain TIFF was left to napari, which read it whole
    [(data, kwargs, layer_type)] = reader(path)
    assert layer_type == "image" and kwargs["multiscale"] and kwargs["rgb"]
    assert [level.shape for level in data] == [(H, W, 3), (H // 2, W // 2, 3),
                                               (H // 4, W // 4, 3)]
    # the finest level is the file's own, read as napari draws it
    assert not isinstance(data[0], np.ndarray | BlockMeanLevel)
    np.testing.assert_array_equal(np.asarray(data[0][100:140, 60:90]),
                                  _pixels()[100:140, 60:90])
    # the coarser ones are made from it, and nothing of them was read at open
    assert all(isinstance(level, BlockMeanLevel) for level in data[1:])
    assert [level.blocks_held for level in data[1:]] == [0, 0]
    slide = kwargs["metadata"]["slide"]
    assert slide["path"] == path and slide["level"] == 0 and slide["run_level"] == 0
    assert slide["levels"] == 1 and slide["display_levels"] == 3
    if kind == "ome":  # read by its OME axes, its pixel size from its OME-XML
        assert slide["kind"] == "ome" and slide["mpp"] == pytest.approx(0.5)
        assert kwargs["scale"] == (0.5, 0.5)
    np.testing.assert_array_equal(np.asarray(data[2]), _block_mean(_pixels(), 4))


def test_an_ome_tiff_of_channels_opens_one_lazy_pyramid_per_channel(files, small_budget,
                                                                    make_napari_viewer):
    """Channel-first (CYX) pixels: one layer per channel as napari makes them for an OME
    file, each a pyramid whose coarse levels take their channel without computing the
    rest; each layer's record names its channel."""
    from napari_attnreg._napari.slide_pyramid import ChannelLevel

    viewer = make_napari_viewer()
    layers = viewer.open(str(files["cyx"]), plugin="napari-attnreg")
    assert [layer.name for layer in layers] == [f"channels · {n}" for n in ("DAPI", "GFP",
                                                                            "RFP")]
    pixels = _channels()
    for c, layer in enumerate(layers):
        assert layer.multiscale and len(layer.data) == 3 and not layer.rgb
        assert [tuple(level.shape) for level in layer.data] == [(H, W), (H // 2, W // 2),
                                                                (H // 4, W // 4)]
        assert all(isinstance(level, ChannelLevel) for level in layer.data[1:])
        np.testing.assert_array_equal(np.asarray(layer.data[0][5:9, 7:20]), pixels[c, 5:9, 7:20])
        np.testing.assert_array_equal(np.asarray(layer.data[1]),
                                      _block_mean(pixels[c][..., None], 2)[..., 0])
        slide = layer.metadata["slide"]
        assert slide["kind"] == "ome" and slide["channel"] == c and slide["levels"] == 1


def test_smaller_or_untiled_files_open_as_before(files):
    """Within the real budget: the OME-TIFF is one array, the plain TIFFs napari's own."""
    from napari_attnreg._napari.io import get_reader

    assert get_reader(str(files["tiff"])) is None and get_reader(str(files["strips"])) is None
    [(data, kwargs, _)] = get_reader(str(files["ome"]))(str(files["ome"]))
    assert isinstance(data, np.ndarray) and data.shape == (H, W, 3)
    assert not kwargs.get("multiscale") and "slide" not in kwargs["metadata"]


def test_untiled_files_above_the_budget_are_left_to_napari(files, small_budget):
    """A TIFF in strips is no tiled export: a run reads it into memory, napari its own way."""
    from napari_attnreg._napari.io import get_reader

    assert get_reader(str(files["strips"])) is None


@pytest.mark.parametrize("kind", ["ome", "tiff"])
def test_a_tiled_run_reads_such_a_file_on_demand(files, kind):
    """The command line and ``regularize(path, tiled=True)`` (both ``open_for_run``) read
    either file tile by tile; given a level or resolution (napari's dock gives level 0) it
    is read as a slide of one level."""
    from napari_attnreg.core.run.lazy import LazyImage
    from napari_attnreg.io.readers import open_for_run

    path = files[kind]
    image, _ = open_for_run(path, {"tiled": True})
    assert isinstance(image, LazyImage) and image.analysed_shape == (H, W)
    at_level, _ = open_for_run(path, {"tiled": True, "level": 0})
    assert isinstance(at_level, LazyImage) and at_level.level == 0
    np.testing.assert_array_equal(np.asarray(at_level.array[10:30, 40:50]),
                                  _pixels()[10:30, 40:50])
    if kind == "ome":  # its pixel size says what a resolution is
        coarse, _ = open_for_run(path, {"tiled": True, "mpp": 1.0})
        assert coarse.analysed_shape == (H // 2, W // 2) and coarse.mpp == pytest.approx(1.0)
    untiled, _ = open_for_run(path, {"level": 0})  # read whole: within the real budget
    np.testing.assert_array_equal(np.asarray(untiled.data).reshape(H, W, 3), _pixels())


@pytest.mark.gui
@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("kind", ["ome", "tiff"])
def test_a_dock_run_of_the_pyramid_reads_the_files_level_as_before(
        files, small_budget, viewer_widget, run_and_wait, tiled, kind):
    """The same run on the layer napari used to get (the level alone, as the OME reader or
    napari's TIFF reader gave it) and on the pyramid: the file's level 0 is read, never a
    coarse level, and the results and their placement are the same."""
    from napari_attnreg._napari.slide_pyramid import BlockMeanLevel

    viewer, widget = viewer_widget
    widget.options.controls["tiled"].setChecked(tiled)
    widget.options.controls["tissue_mask"].setText("none")  # as the level alone had
    path = str(files[kind])
    if kind == "ome":  # the OME reader's layer before: the image of the file, its metadata
        from napari_attnreg.io.ometiff import read_ome_tiff_layers

        [(data, kwargs, _)] = read_ome_tiff_layers(path)
        old = viewer.add_image(data, **{**kwargs, "name": "before"})
    else:  # napari's own TIFF reader: the pixels, nothing else
        old = viewer.add_image(tifffile.imread(path), name="before", rgb=True)
    [layer] = viewer.open(path, plugin="napari-attnreg")
    assert layer.multiscale and len(layer.data) == 3

    results, outputs = [], []
    for source in (old, layer):
        widget.source.set_layer(source)
        pending = widget._build_job()
        stack = pending.job.stack
        if source is layer and tiled:  # the file read again, tile by tile, at level 0
            assert pending.job.config.extra["slide_level"] == 0 and pending.grid is None
            assert stack.analysed_shape == (H, W) and stack.level == 0
            assert not isinstance(stack.array, BlockMeanLevel)
        elif source is layer:  # the file's level 0 read whole (within the real budget)
            assert pending.job.config.extra["slide_level"] == 0 and pending.grid is None
            assert np.shape(stack.data)[-3:] == (H, W, 3)
        run_and_wait(widget, timeout=120_000)
        record = widget.current_record()
        results.append(record.results[()])
        outputs.append(record.outputs["attention"])
    a, b = results
    assert a.image_shape == b.image_shape == (H, W)
    np.testing.assert_array_equal(a.attention, b.attention)
    assert a.maps.keys() == b.maps.keys()
    for name in a.maps:
        np.testing.assert_array_equal(a.maps[name], b.maps[name])
    assert a.spatial == b.spatial
    last = np.array(outputs[0].data.shape[-2:]) - 1
    for point in ((0, 0), tuple(last)):
        assert np.asarray(outputs[1].data_to_world(point)) == pytest.approx(
            np.asarray(outputs[0].data_to_world(point)))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_a_coarse_level_of_channels_reads_as_the_array_with_its_channel_axis_there(axis):
    from napari_attnreg._napari.slide_pyramid import BlockMeanLevel, ChannelLevel, ChannelsAt

    pixels = np.arange(9 * 7 * 4, dtype=np.uint16).reshape(9, 7, 4)
    level = BlockMeanLevel(pixels, 2)
    view = ChannelsAt(level, axis)
    want = np.moveaxis(np.asarray(level), -1, axis)
    assert view.shape == want.shape and view.ndim == 3 and view.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(view), want)
    for key in [(slice(1, 3), slice(None), 2), (1, slice(0, 4, 2), slice(1, 3)), (Ellipsis, 1)]:
        np.testing.assert_array_equal(view[key], want[key])
    one = view[(slice(None),) * axis + (3,)]  # napari's channel split: a lazy channel
    assert isinstance(one, ChannelLevel) and one.shape == (5, 4)
    np.testing.assert_array_equal(one[1:4, ::2], np.take(want, 3, axis=axis)[1:4, ::2])


def test_a_channel_layer_of_an_ome_tiff_of_channels_runs_from_its_file(files):
    """What the dock asks for a channel layer (its record's ``channel``, level 0): that
    channel of the file's one level, read on demand; all three channels last without one."""
    from napari_attnreg.core.run.lazy import LazyImage
    from napari_attnreg.io.readers import open_for_run

    image, _ = open_for_run(files["cyx"], {"tiled": True, "level": 0, "channel": 1})
    assert isinstance(image, LazyImage) and image.analysed_shape == (H, W) and image.level == 0
    np.testing.assert_array_equal(np.asarray(image.array[30:60, 5:25]),
                                  _channels()[1, 30:60, 5:25])
    every, _ = open_for_run(files["cyx"], {"tiled": True, "level": 0})
    np.testing.assert_array_equal(np.asarray(every.array[0:4, 0:3]),
                                  np.moveaxis(_channels()[:, 0:4, 0:3], 0, -1))

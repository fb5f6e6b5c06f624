"""A slide stored as one level above the untiled budget: napari gets a lazy pyramid (the
file's level, then halved levels made as napari draws them), and a run from the dock still
reads the file's level, with the results and placement it had when the layer was that level
alone."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")

H, W = 512, 384  # the file's one level
BUDGET = 128 * 128  # the untiled pixel budget in these tests: the level is above it
COARSEST = 128  # the coarsest level built: 128 x 96, after 256 x 192


def _pixels() -> np.ndarray:
    rng = np.random.default_rng(3)
    img = np.full((H, W, 3), 236, np.uint8)  # glass
    yy, xx = np.mgrid[0:H, 0:W]
    tissue = (yy - 200) ** 2 / 150 ** 2 + (xx - 180) ** 2 / 110 ** 2 < 1
    stain = rng.random((H, W, 3)) * 90 + np.array([130, 40, 120])
    img[tissue] = stain[tissue].clip(0, 255).astype(np.uint8)
    return img


@pytest.fixture(scope="module")
def single_level(tmp_path_factory):
    """An Aperio SVS of one level (no pyramid, no thumbnail), 0.5 µm per pixel."""
    path = tmp_path_factory.mktemp("single") / "one_level.svs"
    tifffile.imwrite(path, _pixels(), tile=(128, 128), photometric="rgb", metadata=None,
                     description=f"Aperio Image Library v10.0.50\n{W}x{H} [0,0 {W}x{H}] "
                                 "(128x128) RAW/RGB|AppMag = 20|MPP = 0.5")
    return path


@pytest.fixture
def small_budget(monkeypatch):
    from napari_attnreg._napari import slide_pyramid
    from napari_attnreg.core.run import lazy

    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", BUDGET)
    monkeypatch.setattr(slide_pyramid, "COARSEST_SIDE", COARSEST)


def _block_mean(img: np.ndarray, f: int) -> np.ndarray:
    h, w = -(-img.shape[0] // f), -(-img.shape[1] // f)
    out = np.empty((h, w, img.shape[2]))
    for i in range(h):
        for j in range(w):
            out[i, j] = img[i * f:(i + 1) * f, j * f:(j + 1) * f].reshape(-1, 3).mean(0)
    return np.rint(out).astype(img.dtype)


def test_a_single_level_slide_above_the_budget_opens_as_a_lazy_pyramid(single_level,
                                                                       small_budget):
    from napari_attnreg._napari.io import get_reader
    from napari_attnreg._napari.slide_pyramid import BlockMeanLevel

    [(data, kwargs, kind)] = get_reader(str(single_level))(str(single_level))
    assert kind == "image" and kwargs["multiscale"] and kwargs["rgb"]
    assert [level.shape for level in data] == [(H, W, 3), (H // 2, W // 2, 3),
                                               (H // 4, W // 4, 3)]
    # the finest level is the file's own, read as napari draws it
    assert not isinstance(data[0], np.ndarray) and not isinstance(data[0], BlockMeanLevel)
    np.testing.assert_array_equal(data[0][100:140, 60:90], _pixels()[100:140, 60:90])
    # the coarser ones are made from it, and nothing of them was read at open
    assert all(isinstance(level, BlockMeanLevel) for level in data[1:])
    assert [level.blocks_held for level in data[1:]] == [0, 0]
    # the record counts the file's levels: a run has only level 0 to read
    slide = kwargs["metadata"]["slide"]
    assert slide["levels"] == 1 and slide["display_levels"] == 3 and slide["run_level"] == 0
    assert slide["level"] == 0 and slide["mpp"] == pytest.approx(0.5)
    # each coarse pixel is the mean of the file pixels it covers
    np.testing.assert_array_equal(np.asarray(data[2]), _block_mean(_pixels(), 4))
    np.testing.assert_array_equal(data[1][10:50:3, 7], _block_mean(_pixels(), 2)[10:50:3, 7])


def test_a_single_level_slide_within_the_budget_is_one_array_as_before(single_level):
    from napari_attnreg._napari.io import read_slide_layers

    [(data, kwargs, _)] = read_slide_layers(str(single_level))
    assert not kwargs["multiscale"] and data.shape == (H, W, 3)
    assert kwargs["metadata"]["slide"]["levels"] == 1


def test_halved_levels_stop_at_the_coarsest_side_and_average_uneven_edges():
    from napari_attnreg._napari.slide_pyramid import BlockMeanLevel, display_levels

    level = np.zeros((5000, 3001), np.uint8)
    assert [lv.shape for lv in display_levels(level, 1000)] == [(2500, 1501), (1250, 751),
                                                                 (625, 376)]
    img = np.arange(7 * 5, dtype=np.uint16).reshape(7, 5) * 100
    half = BlockMeanLevel(img, 2)
    # the last row and column hold one source row/column each: their mean, not a darkened one
    assert half.shape == (4, 3) and half[3, 2] == img[6, 4] and half[3, 0] == img[6, :2].mean()
    with pytest.raises(IndexError):
        half[4, 0]


@pytest.mark.gui
@pytest.mark.parametrize("tiled", [False, True])
def test_a_dock_run_of_the_pyramid_reads_the_files_level_as_before(
        single_level, small_budget, viewer_widget, run_and_wait, tiled):
    """The same run on the layer napari used to get (the level alone) and on the pyramid:
    the file's level 0 is read, never a coarse level, and the results and their placement
    are the same."""
    from napari_attnreg._napari.io import read_slide_layers
    from napari_attnreg._napari.slide_pyramid import BlockMeanLevel

    viewer, widget = viewer_widget
    widget.options.controls["tiled"].setChecked(tiled)
    [(data, kwargs, _)] = read_slide_layers(str(single_level))
    # the layer as the reader made it before: the file's level, one array
    before = {**kwargs, "multiscale": False, "name": "before",
              "metadata": {"slide": {k: v for k, v in kwargs["metadata"]["slide"].items()
                                     if k != "display_levels"}}}
    old = viewer.add_image(data[0] if kwargs["multiscale"] else data, **before)
    [layer] = viewer.open(str(single_level), plugin="napari-attnreg")
    assert layer.multiscale and len(layer.data) == 3

    results, outputs = [], []
    for source in (old, layer):
        widget.source.set_layer(source)
        pending = widget._build_job()
        stack = pending.job.stack
        if tiled:  # the slide read again from its file, tile by tile, at level 0
            assert pending.job.config.extra["slide_level"] == 0 and pending.grid is None
            assert stack.analysed_shape == (H, W) and stack.level == 0
            assert not isinstance(stack.array, BlockMeanLevel)
        elif source is layer:  # the file's level 0 read whole (within the real budget)
            assert pending.job.config.extra["slide_level"] == 0 and pending.grid is None
            assert np.shape(stack.data) == (H, W, 3)
            assert not isinstance(stack.data, BlockMeanLevel)
        run_and_wait(widget, timeout=120_000)
        record = widget.current_record()
        results.append(record.results[()])
        outputs.append(record.outputs["attention"])
    a, b = results
    assert a.image_shape == b.image_shape == (H, W)
    np.testing.assert_array_equal(a.attention, b.attention)
    assert a.maps.keys() == b.maps.keys()
    for kind in a.maps:
        np.testing.assert_array_equal(a.maps[kind], b.maps[kind])
    assert a.spatial == b.spatial
    last = np.array(outputs[0].data.shape[-2:]) - 1
    for point in ((0, 0), tuple(last)):
        assert np.asarray(outputs[1].data_to_world(point)) == pytest.approx(
            np.asarray(outputs[0].data_to_world(point)))

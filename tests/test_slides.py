"""Slides (SVS, pyramidal TIFF) read lazily, tissue masks, the tile reader thread, the guard."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")

from napari_attnreg.core.results.result import AttentionResult  # noqa: E402
from napari_attnreg.core.run.lazy import (  # noqa: E402
    MAX_UNTILED_PIXELS,
    LazyImage,
    TileReader,
    check_untiled_size,
)
from napari_attnreg.core.run.tiling import make_layout, run_tiles  # noqa: E402
from napari_attnreg.core.run.tissue import (  # noqa: E402
    auto_tissue_mask,
    tiles_in_tissue,
    tissue_for,
)
from napari_attnreg.io.slides import is_slide, open_slide  # noqa: E402

SIZE = 2048
TISSUE = (0.55, 0.55)  # the tissue block's share of each side: ~30 % tissue, 70 % glass


def _slide_pixels(size: int = SIZE) -> np.ndarray:
    rng = np.random.default_rng(0)
    img = np.full((size, size, 3), 236, np.uint8)  # white glass
    th, tw = int(size * TISSUE[0]), int(size * TISSUE[1])
    stain = rng.random((th, tw, 3)) * 90 + np.array([130, 40, 120])  # pink-purple H&E-ish
    img[:th, :tw] = stain.clip(0, 255).astype(np.uint8)
    return img


def _aperio(w: int, h: int) -> str:
    return (f"Aperio Image Library v10.0.50\n{w}x{h} [0,0 {w}x{h}] (256x256) RAW/RGB"
            "|AppMag = 40|MPP = 0.25")


@pytest.fixture(scope="module")
def slide(tmp_path_factory) -> Path:
    """An Aperio-style SVS of 2048² at 0.25 µm, levels 1/2 and 1/4, a thumbnail; 70 % glass."""
    path = tmp_path_factory.mktemp("slides") / "slide.svs"
    img = _slide_pixels()
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), description=_aperio(SIZE, SIZE), photometric="rgb",
                  metadata=None)
        tif.write(img[::16, ::16].copy(), description="Aperio Image Library v10.0.50\nthumb",
                  photometric="rgb", metadata=None)
        for k in (2, 4):
            tif.write(img[::k, ::k].copy(), tile=(256, 256),
                      description=_aperio(SIZE // k, SIZE // k), photometric="rgb",
                      metadata=None)
    return path


@pytest.fixture(scope="module")
def generic(tmp_path_factory) -> Path:
    """A generic pyramidal TIFF (sub-IFDs), its pixel size in the resolution tags."""
    path = tmp_path_factory.mktemp("slides") / "pyramid.tif"
    img = _slide_pixels(1024)
    with tifffile.TiffWriter(path) as tif:
        # 0.5 µm per pixel = 20000 pixels per cm
        tif.write(img, tile=(256, 256), subifds=1, photometric="rgb", metadata=None,
                  resolution=(20000, 20000), resolutionunit="CENTIMETER")
        tif.write(img[::2, ::2].copy(), tile=(256, 256), subfiletype=1, photometric="rgb",
                  metadata=None, resolution=(10000, 10000), resolutionunit="CENTIMETER")
    return path


# -- opening ---------------------------------------------------------------------------------

@pytest.mark.parametrize("level, mpp, shape", [(0, 0.25, 2048), (1, 0.5, 1024), (2, 1.0, 512)])
def test_a_slide_opens_lazily_at_each_level_with_its_pixel_size(slide, level, mpp, shape):
    image = open_slide(slide, level=level)
    assert is_slide(slide)
    assert not isinstance(image.array, np.ndarray)  # zarr: nothing read yet
    assert image.shape == (shape, shape) and image.mpp == pytest.approx(mpp)
    k = SIZE // shape
    block = image.read(slice(100, 140), slice(60, 90))
    np.testing.assert_array_equal(block, _slide_pixels()[::k, ::k][100:140, 60:90])


def test_a_generic_pyramidal_tiff_is_a_slide_too(generic):
    assert is_slide(generic)
    image = open_slide(generic, level=1)
    assert image.shape == (512, 512) and image.level == 1


def test_mpp_picks_the_coarsest_level_at_least_as_fine_and_resamples(slide):
    image = open_slide(slide, mpp=0.75)
    assert image.level == 1 and image.scale == pytest.approx(1.5)
    assert image.analysed_shape == (683, 683) and image.mpp == pytest.approx(0.75)
    assert open_slide(slide, mpp=1.0).level == 2 and open_slide(slide, mpp=1.0).scale == 1


@pytest.mark.parametrize("kwargs, match", [({"level": 3}, "levels 0–2"),
                                           ({"mpp": 0.1}, "finer"),
                                           ({"level": 1, "mpp": 1.0}, "not both"),
                                           ({"level": 1.5}, "whole number"),
                                           ({"level": "1"}, "whole number"),
                                           ({"mpp": float("nan")}, "positive number"),
                                           ({"mpp": "1"}, "positive number"),
                                           ({"mpp": 0}, "positive number"),
                                           ({"mpp": -2.0}, "positive number")])
def test_an_impossible_level_or_resolution_says_what_the_slide_has(slide, kwargs, match):
    with pytest.raises(ValueError, match=match):
        open_slide(slide, **kwargs)


# -- tissue masks ----------------------------------------------------------------------------

def test_the_automatic_mask_finds_the_stained_tissue_and_not_the_glass():
    img = _slide_pixels(512)
    mask = auto_tissue_mask(img)
    t = int(512 * TISSUE[0])
    assert mask[:t - 2, :t - 2].mean() > 0.99 and mask[t + 2:, :].mean() < 0.01
    # a crop inside the tissue has no glass: all of it is tissue, not half of it
    assert auto_tissue_mask(img[:200, :200]).all()


def _glass(shape: tuple[int, ...], dtype=np.uint8, level: float = 236.0) -> np.ndarray:
    """Blank glass: a near-white field with the grain of a scan, nothing on it."""
    rng = np.random.default_rng(1)
    return (level + rng.normal(0, 2.0, shape)).clip(0, np.iinfo(dtype).max).astype(dtype)


@pytest.mark.parametrize("thumb", [
    _glass((256, 256, 3)),                                  # RGB glass
    _glass((256, 256)),                                     # grey 8-bit glass
    _glass((256, 256), np.uint16, level=3800.0),            # grey 12-bit glass in 16 bits
], ids=["rgb", "grey8", "grey16"])
def test_the_automatic_mask_finds_no_tissue_on_blank_glass(thumb):
    # Otsu splits any field in two; the grain of glass is not tissue (it was half of it)
    assert not auto_tissue_mask(thumb).any()


def test_the_automatic_mask_finds_grey_tissue_in_any_bit_depth():
    rgb = _slide_pixels(512)
    grey8 = rgb.mean(-1).astype(np.uint8)
    grey16 = (grey8.astype(np.uint16) * 16)  # 12 bits used of 16
    t = int(512 * TISSUE[0])
    for grey in (grey8, grey16):
        mask = auto_tissue_mask(grey)
        assert mask[:t - 2, :t - 2].mean() > 0.99 and mask[t + 2:, :].mean() < 0.01


def test_an_all_glass_slide_is_a_clear_error_not_a_run_on_glass(tmp_path):
    from napari_attnreg.core.run.api import regularize

    path = tmp_path / "glass.svs"
    img = _glass((512, 512, 3))
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), description=_aperio(512, 512), photometric="rgb",
                  metadata=None)
        tif.write(img[::4, ::4].copy(), tile=(128, 128), description=_aperio(128, 128),
                  photometric="rgb", metadata=None)
    with pytest.raises(ValueError, match="No tile is at least"):
        regularize(open_slide(path), "demo", tiled=True, n_boot=4, device="cpu")


def test_only_tiles_at_least_a_tenth_tissue_are_kept():
    layout = make_layout((1024, 1024), tile=(256, 256), patch=(16, 16), overlap=0)
    mask = np.zeros((64, 64), bool)
    mask[:16, :16] = True  # tile 0 whole
    mask[16:18, 16:32] = True  # 1/8 of tile 5
    mask[32, 32] = True  # 1/256 of tile 10
    assert np.flatnonzero(tiles_in_tissue(mask, layout)).tolist() == [0, 5]
    with pytest.raises(ValueError, match="proportions"):
        tiles_in_tissue(np.ones((10, 40), bool), layout)


def test_run_tiles_of_every_tile_are_the_layouts_own_indices():
    layout = make_layout((304, 200), tile=(128, 128), patch=(8, 8), overlap=16)
    every = run_tiles(layout)
    np.testing.assert_array_equal(every.family, layout.tile_index().ravel())
    np.testing.assert_array_equal(every.local, layout.local_index().ravel())
    # with all tiles "kept" by the general path the owners are the same
    keep = np.ones(layout.n_tiles, bool)
    keep[-1] = False
    some = run_tiles(layout, keep)
    assert not some.complete and some.order.tolist() == list(range(layout.n_tiles - 1))
    tokens = layout.tile_tokens()
    for t, fam, loc in zip(some.tested, some.family, some.local, strict=True):
        assert tokens[some.order[fam], loc] == t  # the owner really holds the token
    np.testing.assert_array_equal(some.tested[some.family_tokens], tokens[:-1])


def test_no_tissue_is_a_clear_error():
    layout = make_layout((512, 512), tile=(128, 128), patch=(16, 16))
    with pytest.raises(ValueError, match="tissue_mask='none'"):
        tissue_for(np.zeros((64, 64)), None, layout)


# -- tiled runs of slides --------------------------------------------------------------------

def _run(image, progress=None, **options):
    from napari_attnreg import regularize

    return regularize(image, "demo", tiled=True, n_boot=8, seed=0, device="cpu",
                      progress=progress, **options)


def test_a_tiled_run_runs_and_tests_only_the_tissue_tiles(slide):
    image = open_slide(slide, level=1)
    events = []
    result = _run(image, progress=events.append)
    md = result.metadata
    n_tissue, n_all = md["n_tissue_tiles"], md["n_tiles_total"]
    assert md["tissue_mask"].startswith("auto") and 0 < n_tissue < 0.5 * n_all
    assert events[-1].total == n_tissue + 8  # forward passes: tissue tiles, then the nulls
    # the BH family of the step-down holds only the tissue tiles
    assert result.null_summary["stepdown_family_p"].shape == (n_tissue,)
    tiles = result.null_summary["tissue_tiles"]
    assert tiles.shape == (n_all,) and tiles.sum() == n_tissue
    # the glass corner was never run: not measured (NaN p), attention 0 (a fill), never
    # significant
    assert np.isnan(result.p[-8:, -8:]).all() and np.all(result.attention[-8:, -8:] == 0)
    assert not result.significant()[-8:, -8:].any()
    assert result.spatial["scale"] == (0.5, 0.5) and result.spatial["units"] == ("µm", "µm")
    assert md["slide_level"] == 1 and md["slide_resample"] == 1


def test_captions_and_figures_count_and_draw_only_the_tissue_tested(slide, tmp_path):
    from PIL import Image

    from napari_attnreg.core.results.display import (
        run_caption,
        significance_caption,
        tissue_tokens,
    )
    from napari_attnreg.core.results.figure import publication_figure

    image = open_slide(slide, level=2)  # 512² with its tissue in the top-left 55 %
    result = _run(image)
    md = result.metadata
    tested = tissue_tokens(result)
    gh, gw = result.grid_shape
    t = int(gh * TISSUE[0])
    assert tested[:t - 1, :t - 1].all() and not tested[-2:, :].any() and not tested[:, -2:].any()
    assert not result.significant()[~tested].any()
    assert f"{int(tested.sum())} tissue patches" in significance_caption(result).replace("/", " ")
    assert f"tiled: {md['n_tissue_tiles']} of {md['n_tiles_total']} tiles" in run_caption(result)
    assert tissue_tokens(_run(image, tissue_mask="none")) is None
    # the figure leaves the glass uncovered: its pixels are the image's own
    pixels = image.read(slice(None), slice(None))
    png = publication_figure(result, pixels, tmp_path / "f.png", scale=1)
    drawn = np.asarray(Image.open(png).convert("RGB"))
    corner = drawn[480:500, 480:500].reshape(-1, 3).astype(int)
    assert np.abs(corner - pixels[480:500, 480:500].reshape(-1, 3)).max() <= 2


def test_tissue_mask_none_runs_every_tile_and_a_users_mask_is_used(slide, tmp_path):
    image = open_slide(slide, level=2)
    every = _run(image, tissue_mask="none")
    assert every.metadata["tissue_mask"] == "none"
    assert every.null_summary["stepdown_family_p"].shape == (every.metadata["n_tiles"],)
    mask = np.zeros((64, 64), np.uint8)
    mask[:10, :10] = 1
    tifffile.imwrite(tmp_path / "mask.tif", mask)
    own = _run(image, tissue_mask=str(tmp_path / "mask.tif"))
    assert own.metadata["tissue_mask"] == "file mask.tif" and own.metadata["n_tissue_tiles"] == 1
    array = _run(image, tissue_mask=mask.astype(bool))
    assert array.metadata["tissue_mask"] == "array"
    np.testing.assert_array_equal(array.p, own.p)


def test_an_in_memory_tiled_run_without_a_mask_is_unchanged(slide):
    image = open_slide(slide, level=2)
    pixels = image.read(slice(None), slice(None))
    plain = _run(pixels)
    assert plain.metadata["tissue_mask"] == "none" and "tissue_tiles" not in plain.null_summary


def test_the_mask_is_saved_with_the_result(slide, tmp_path):
    result = _run(open_slide(slide, level=2))
    again = AttentionResult.load(result.save(tmp_path / "r.attnreg.npz"))
    assert again.metadata["n_tissue_tiles"] == result.metadata["n_tissue_tiles"]
    np.testing.assert_array_equal(again.null_summary["tissue_mask"],
                                  result.null_summary["tissue_mask"])


# -- the reading thread ----------------------------------------------------------------------

def _reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "attnreg-tile-reader" and t.is_alive()]


def test_the_tile_reader_reads_ahead_boundedly_and_stops_on_close():
    reads = []
    reader = TileReader(lambda i: reads.append(i) or np.full((2, 2), i), range(100), depth=4)
    assert [int(b[0, 0]) for b in reader.take(0, 3)] == [0, 1, 2]
    assert [int(b[0, 0]) for b in reader.take(0, 2)] == [0, 1]  # a retry after OOM
    assert len(reads) <= 3 + 4 + 1  # taken, queued, one in hand
    reader.close()
    assert not reader.alive


def test_a_reader_error_reaches_the_run():
    def read(i):
        if i == 2:
            raise ValueError("tile 2 is damaged")
        return np.zeros((2, 2))

    with TileReader(read, range(5), depth=2) as reader, pytest.raises(ValueError, match="2 is"):
        reader.take(0, 4)


def test_closing_or_cancelling_a_tiled_run_stops_its_reader_thread(slide):
    from napari_attnreg.core.models.backbones import load_backbone
    from napari_attnreg.core.run.config import RunConfig
    from napari_attnreg.core.run.passes import CancelToken, RunCancelled
    from napari_attnreg.core.run.tiled_engine import run_tiled

    backbone = load_backbone("demo", device="cpu")
    config = RunConfig(tiled=True, n_boot=4, device="cpu", chunk_size=2,
                       tissue_mask="none").validate()
    engine = run_tiled(open_slide(slide, level=1), backbone, config)
    next(engine)
    assert _reader_threads()
    engine.close()
    assert not _reader_threads()
    cancel = CancelToken()
    engine = run_tiled(open_slide(slide, level=1), backbone, config, cancel)
    next(engine)
    cancel.cancel()
    with pytest.raises(RunCancelled):
        for _ in engine:
            pass
    assert not _reader_threads()


# -- the untiled memory guard ----------------------------------------------------------------

def test_the_guard_names_tiled_and_comes_before_any_read():
    check_untiled_size((8192, 8192))
    with pytest.raises(ValueError, match="tiled=True"):
        check_untiled_size((30000, 30000))

    class Unreadable:  # a lazy array whose pixels must never be asked for
        shape, dtype, ndim = (30000, 30000), np.dtype(np.uint8), 2

        def __array__(self, *args, **kwargs):
            raise AssertionError("the guard read the pixels")

    from napari_attnreg.core.run.config import RunConfig
    from napari_attnreg.core.run.planes import PlaneStack
    from napari_attnreg.core.run.service import _read_plane

    stack = PlaneStack(Unreadable(), (), None)
    with pytest.raises(ValueError, match="--tiled"):
        _read_plane(stack, (), RunConfig())
    assert 30000 * 30000 > MAX_UNTILED_PIXELS


def test_a_batch_records_a_clear_error_for_a_huge_untiled_image(tmp_path):
    from napari_attnreg.cli import main

    big = tmp_path / "in" / "big.tif"
    big.parent.mkdir()
    # header and strips for 30000² without writing the pixels (a sparse file)
    tifffile.imwrite(big, shape=(30000, 30000), dtype=np.uint8)
    code = main(["run", str(big), "--out", str(tmp_path / "out"), "--n-boot", "4",
                 "--device", "cpu"])
    summary = (tmp_path / "out" / "summary.csv").read_text()
    assert code != 0 and "failed" in summary and "--tiled" in summary


# -- command line and napari -----------------------------------------------------------------

def test_cli_runs_a_slide_tiled_at_a_level_and_records_the_mask(slide, tmp_path):
    from napari_attnreg.cli import main

    out = tmp_path / "out"
    code = main(["run", str(slide), "--tiled", "--level", "1", "--out", str(out),
                 "--n-boot", "6", "--device", "cpu", "--quiet"])
    assert code == 0
    result = AttentionResult.load(next(out.glob("*.attnreg.npz")))
    md = result.metadata
    assert md["tissue_mask"].startswith("auto") and md["n_tissue_tiles"] < md["n_tiles_total"]
    assert "tissue_mask" in result.null_summary
    assert result.spatial["scale"] == (0.5, 0.5) and md["image_kind"] == "pathology"
    # which level was read and its frame (the command line lost them before)
    assert md["slide_level"] == 1 and md["slide_downsample"] == pytest.approx(2.0)


def test_an_ome_pyramid_is_read_at_the_level_asked_with_its_ome_pixel_size(tmp_path):
    # an OME-TIFF pyramid (sub-IFDs, 0.5 µm in its OME-XML): --level used to be ignored
    # while the result recorded it
    from napari_attnreg.cli import main

    path = tmp_path / "pyramid.ome.tif"
    img = _slide_pixels(1024)
    with tifffile.TiffWriter(path, ome=True) as tif:
        tif.write(img, tile=(256, 256), subifds=2, photometric="rgb",
                  metadata={"axes": "YXS", "PhysicalSizeX": 0.5, "PhysicalSizeY": 0.5})
        for k in (2, 4):
            tif.write(img[::k, ::k].copy(), tile=(128, 128), subfiletype=1, photometric="rgb")
    out = tmp_path / "out"
    assert main(["run", str(path), "--tiled", "--level", "2", "--out", str(out), "--n-boot", "4",
                 "--device", "cpu", "--quiet"]) == 0
    result = AttentionResult.load(next(out.glob("*.attnreg.npz")))
    md = result.metadata
    assert result.image_shape == (256, 256) and md["slide_level"] == 2
    assert result.spatial["scale"] == pytest.approx((2.0, 2.0))
    # a microscopy pyramid, not a stained slide: no automatic tissue mask
    assert md["image_kind"] == "microscopy" and md["tissue_mask"] == "none"


def test_napari_reader_opens_a_slide_in_micrometres(slide):
    from napari_attnreg._napari.io import get_reader

    reader = get_reader(str(slide))
    assert reader is not None
    [(data, kwargs, kind)] = reader(str(slide))
    # the whole pyramid, full resolution first, read as napari draws it
    assert kind == "image" and kwargs["multiscale"] and kwargs["rgb"]
    assert [level.shape for level in data] == [(SIZE >> k, SIZE >> k, 3) for k in range(3)]
    assert not any(isinstance(level, np.ndarray) for level in data)
    assert kwargs["scale"] == (0.25, 0.25) and kwargs["metadata"]["slide"]["level"] == 0
    # within the untiled pixel budget: an untiled run in the dock takes full resolution
    assert kwargs["metadata"]["slide"]["run_level"] == 0
    from napari_attnreg.io.readers import ImageInfo

    info = ImageInfo.from_layer_metadata(kwargs["metadata"])
    assert info.pixel_size == (0.25, 0.25) and info.kind == "pathology"


def test_a_saved_slide_result_reopens_with_its_tissue_mask_layer(slide, tmp_path):
    from napari_attnreg._napari.io import read_result_layers

    result = _run(open_slide(slide, level=2))
    path = result.save(tmp_path / "slide.attnreg.npz")
    layers = read_result_layers(str(path))
    masks = [(d, k) for d, k, kind in layers if kind == "labels" and k["name"].endswith("tissue")]
    [(mask, kwargs)] = masks
    # the thumbnail-sized mask spans the analysed image, in micrometres
    extent = [mask.shape[a] * kwargs["scale"][a] for a in range(2)]
    assert extent == pytest.approx([s * 1.0 for s in result.image_shape])
    assert kwargs["metadata"]["tissue"]["tiles"] == result.metadata["n_tissue_tiles"]


@pytest.mark.gui
def test_napari_opens_a_slide_through_the_plugin(slide, make_napari_viewer):
    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py

    viewer = make_napari_viewer()
    [layer] = viewer.open(str(slide), plugin="napari-attnreg")
    assert layer.rgb and layer.data.shape == (SIZE, SIZE, 3)
    assert layer.multiscale and len(layer.data) == 3
    assert tuple(layer.scale) == pytest.approx((0.25, 0.25))
    assert layer.metadata["slide"]["mpp"] == pytest.approx(0.25)


@pytest.mark.gui
def test_the_dock_shows_a_tiled_runs_tissue_mask_as_a_labels_layer(slide, make_napari_viewer,
                                                                    qtbot):
    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py

    from napari_attnreg._napari.widget import AttentionWidget

    image = open_slide(slide, level=2)
    viewer = make_napari_viewer()
    viewer.add_image(np.asarray(image.array), name="slide", rgb=True,
                     metadata={"slide": {"path": str(slide), "level": 2, "mpp": image.mpp}})
    widget = AttentionWidget(viewer)
    viewer.window.add_dock_widget(widget)
    controls = widget.options.controls
    controls["device"].setCurrentText("cpu")
    controls["n_boot"].setValue(8)
    controls["tiled"].setChecked(True)
    controls["tissue_mask"].setText("auto")
    with qtbot.waitSignal(widget.run_finished, timeout=120_000):
        assert widget.run() is not None
    mask = viewer.layers["slide tissue"]
    result = widget.current_record().results[()]
    assert mask.data.any() and not mask.data.all()
    assert result.metadata["n_tissue_tiles"] < result.metadata["n_tiles_total"]


def test_patch_nulls_of_a_masked_image_take_their_tiles_from_the_tissue():
    import torch

    from napari_attnreg.core.run.nulls import NullConfig
    from napari_attnreg.core.run.tiling import ImageNull

    source = torch.zeros((1, 256, 256))
    source[:, 128:] = 1.0  # "tissue" is the lower half
    config = NullConfig("patch", 1.0, True, 8)
    anywhere = ImageNull(source, config, (64, 64), 16).draw(range(20), seed=3)
    on_tissue = ImageNull(source, config, (64, 64), 16,
                          accept=lambda y, x: y + 32 >= 128).draw(range(20), seed=3)
    assert 0 < float(anywhere.mean()) < 1  # glass and tissue both drawn
    assert float(on_tissue.flatten(1).mean(1).min()) > 0.45  # every tile centred on tissue
    again = ImageNull(source, config, (64, 64), 16,
                      accept=lambda y, x: y + 32 >= 128).draw(range(20), seed=3)
    assert torch.equal(on_tissue, again)  # redraws come from the seeded stream


# -- a slide layer in the dock: the level asked, the slide's mask, a Labels layer as mask ----

@pytest.fixture
def slide_dock(slide, make_napari_viewer):
    """(viewer, dock, layer): the slide opened through the plugin (level 0, 0.25 µm), the
    dock on the CPU with a small B."""
    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py

    from napari_attnreg._napari.widget import AttentionWidget

    viewer = make_napari_viewer()
    [layer] = viewer.open(str(slide), plugin="napari-attnreg")
    widget = AttentionWidget(viewer)
    viewer.window.add_dock_widget(widget)
    controls = widget.options.controls
    controls["device"].setCurrentText("cpu")
    controls["n_boot"].setValue(8)
    return viewer, widget, layer


def _dock_run(widget, qtbot):
    with qtbot.waitSignal(widget.run_finished, timeout=120_000):
        assert widget.run() is not None, widget.run_panel.status_label.text()
    record = widget.current_record()
    assert record is not None, widget.run_panel.status_label.text()
    return record


@pytest.mark.gui
def test_the_dock_runs_a_slide_at_the_level_asked_with_its_mask_placed_on_the_layer(
        slide_dock, qtbot, tmp_path):
    from PIL import Image

    from napari_attnreg._napari.figure import export_figure
    from napari_attnreg.core.results.figure import pixel_size

    viewer, widget, layer = slide_dock
    controls = widget.options.controls
    controls["tiled"].setChecked(True)
    controls["level"].setValue(1)  # the layer shows level 0
    record = _dock_run(widget, qtbot)
    result = record.results[()]
    md = result.metadata
    # level 1 was read (1024², 0.5 µm), not the layer's 2048² pixels, and the record says so
    assert result.image_shape == (1024, 1024) and md["slide_level"] == 1
    assert record.params["level"] == 1 and result.spatial["scale"] == pytest.approx((0.5, 0.5))
    # a slide's default mask: the glass was not run
    assert md["tissue_mask"].startswith("auto") and md["n_tissue_tiles"] < md["n_tiles_total"]
    assert viewer.layers["slide tissue"].data.any()
    # token (i, j) of the 8-pixel patches of level 1 covers level-0 pixels 16·i .. 16·i + 15
    attention = record.outputs["attention"]
    first = np.asarray(attention.data_to_world((0, 0)))
    last = np.asarray(attention.data_to_world((127, 127)))
    assert first == pytest.approx(layer.data_to_world((7.5, 7.5)))
    assert last == pytest.approx(layer.data_to_world((2039.5, 2039.5)))
    # the figure draws the pixels analysed, with a scale bar (the layer's units are pint's)
    assert pixel_size(result) == pytest.approx((0.5, 0.5))
    png = export_figure(viewer, record, layer, tmp_path / "slide.png")
    assert Image.open(png).size[1] >= 1024


@pytest.mark.gui
def test_an_untiled_dock_run_of_a_slide_reads_the_level_asked(slide_dock, qtbot):
    viewer, widget, layer = slide_dock
    widget.options.controls["level"].setValue(2)
    record = _dock_run(widget, qtbot)
    result = record.results[()]
    assert result.image_shape == (512, 512) and result.metadata["slide_level"] == 2
    assert result.spatial["scale"] == pytest.approx((1.0, 1.0))


@pytest.mark.gui
def test_a_pyramid_above_the_budget_runs_untiled_at_the_finest_level_it_holds(
        slide, make_napari_viewer, qtbot, monkeypatch, tmp_path):
    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py

    from napari_attnreg._napari.figure import export_figure
    from napari_attnreg._napari.widget import AttentionWidget
    from napari_attnreg.core.run import lazy

    # a budget of level 1's pixels: level 0 (2048²) is too large to hold, level 1 is not
    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", 1024 * 1024)
    viewer = make_napari_viewer()
    [layer] = viewer.open(str(slide), plugin="napari-attnreg")
    assert layer.multiscale and layer.metadata["slide"]["run_level"] == 1
    widget = AttentionWidget(viewer)
    viewer.window.add_dock_widget(widget)
    widget.options.controls["device"].setCurrentText("cpu")
    widget.options.controls["n_boot"].setValue(8)
    record = _dock_run(widget, qtbot)
    result = record.results[()]
    assert result.image_shape == (1024, 1024) and result.metadata["slide_level"] == 1
    assert record.params["level"] == 1
    # the outputs lie on the full-resolution pixels the layer is made of: an untiled run
    # resizes level 1 to the model's input, so a token spans SIZE / n level-0 pixels
    attention = record.outputs["attention"]
    n = attention.data.shape[0]
    span = SIZE / n
    assert np.asarray(attention.data_to_world((0, 0))) == pytest.approx(
        layer.data_to_world(((span - 1) / 2,) * 2))
    assert np.asarray(attention.data_to_world((n - 1, n - 1))) == pytest.approx(
        layer.data_to_world((SIZE - (span + 1) / 2,) * 2))
    assert export_figure(viewer, record, layer, tmp_path / "pyramid.png").is_file()

    # a tiled run of the pyramid reads full resolution tile by tile, as `attnreg run --tiled`
    widget.options.controls["tiled"].setChecked(True)
    pending = widget._build_job()
    assert pending.job.config.extra["slide_level"] == 0 and pending.grid is None
    assert pending.job.stack.analysed_shape == (SIZE, SIZE)


@pytest.mark.gui
def test_a_concept_from_regions_on_a_slide_pyramid_reads_the_level_a_run_reads(
        slide, make_napari_viewer, monkeypatch):
    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py

    from napari_attnreg._napari.concept_roi import capture_request
    from napari_attnreg.core.run import lazy

    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", 1024 * 1024)
    viewer = make_napari_viewer()
    [layer] = viewer.open(str(slide), plugin="napari-attnreg")
    # drawn in full-resolution pixels: rows 400–800, columns 1000–1600 of level 0
    box = np.array([[400.0, 1000.0], [400.0, 1600.0], [800.0, 1600.0], [800.0, 1000.0]])
    viewer.add_shapes([box], shape_type="rectangle", name="glands", scale=layer.scale)
    request = capture_request(viewer, layer, None)
    assert request.image.shape == (1024, 1024, 3)  # level 1, as an untiled run reads it
    np.testing.assert_array_equal(request.image, np.asarray(layer.data[1]))
    rows, cols = np.nonzero(request.labels)
    assert (rows.min(), rows.max()) == (200, 399) and (cols.min(), cols.max()) == (500, 799)


@pytest.mark.gui
def test_a_saved_slide_session_refers_to_the_slide_and_reopens_as_a_result_the_dock_knows(
        slide_dock, qtbot, tmp_path, make_napari_viewer, monkeypatch):
    import json
    import shutil

    from napari_attnreg._napari.io import write_outputs
    from napari_attnreg._napari.widget import AttentionWidget

    viewer, widget, layer = slide_dock
    controls = widget.options.controls
    controls["tiled"].setChecked(True)
    controls["level"].setValue(1)
    record = _dock_run(widget, qtbot)
    saved = [layer, *record.outputs.values()]
    folder = tmp_path / "session"
    written = write_outputs(str(folder), [lay.as_layer_data_tuple() for lay in saved])
    # the slide's pixels are not copied: the record names its file
    entries = json.loads((folder / "provenance.json").read_text())["layers"]
    [entry] = [e for e in entries if e.get("slide")]
    assert entry["file"] is None and entry["slide"] == layer.metadata["slide"]
    assert not any("slide.ome" in Path(p).name for p in written)
    # one OME-TIFF of a slide above the pixel budget is refused, saying what to do instead
    from napari_attnreg.core.run import lazy

    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", 1024 * 1024)
    with pytest.raises(ValueError, match="whole-slide image.*folder"):
        write_outputs(str(tmp_path / "slide.ome.tif"), [layer.as_layer_data_tuple()])
    assert not (tmp_path / "slide.ome.tif").exists()

    again = make_napari_viewer()
    dock = AttentionWidget(again)
    again.window.add_dock_widget(dock)
    opened = again.open(str(folder), plugin="napari-attnreg")
    reopened = again.layers[layer.name]
    assert reopened in opened and reopened.multiscale and reopened.metadata["slide"]
    assert tuple(reopened.scale) == pytest.approx(tuple(layer.scale))
    # the level-1 result is the dock's again, lying over the level-0 pixels as it did
    qtbot.waitUntil(lambda: dock.current_record() is not None, timeout=10_000)
    known = dock.current_record()
    assert known.run_id == record.run_id and known.grid.factor == pytest.approx((2.0, 2.0))
    attention = known.outputs["attention"]
    assert np.asarray(attention.data_to_world((0, 0))) == pytest.approx(
        reopened.data_to_world((7.5, 7.5)))

    # a folder whose slide file is gone still opens its result layers, with a warning
    moved = tmp_path / "moved"
    shutil.copytree(folder, moved)
    record_file = moved / "provenance.json"
    data = json.loads(record_file.read_text())
    for e in data["layers"]:
        if e.get("slide"):
            e["slide"]["path"] = str(tmp_path / "gone.svs")
    record_file.write_text(json.dumps(data))
    third = make_napari_viewer()
    with pytest.warns(UserWarning, match="gone.svs"):
        layers = third.open(str(moved), plugin="napari-attnreg")
    assert layers and all(not lay.multiscale for lay in layers)


@pytest.mark.gui
def test_a_command_line_result_of_a_level_opens_over_the_slide_pyramid_as_the_docks(
        slide, tmp_path, make_napari_viewer, qtbot):
    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py

    from napari_attnreg._napari.widget import AttentionWidget
    from napari_attnreg.cli import main

    out = tmp_path / "out"
    assert main(["run", str(slide), "--tiled", "--level", "2", "--out", str(out),
                 "--n-boot", "4", "--device", "cpu", "--quiet"]) == 0
    viewer = make_napari_viewer()
    dock = AttentionWidget(viewer)
    viewer.window.add_dock_widget(dock)
    [layer] = viewer.open(str(slide), plugin="napari-attnreg")
    viewer.open(str(next(out.glob("*.attnreg.npz"))), plugin="napari-attnreg")
    qtbot.waitUntil(lambda: dock.current_record() is not None, timeout=10_000)
    record = dock.current_record()
    assert record.grid.factor == pytest.approx((4.0, 4.0))
    assert record.grid.slide == {"path": str(slide), "level": 2}
    # token (0, 0) of the 8-pixel patches of level 2 covers level-0 pixels 0 .. 31
    attention = record.outputs["attention"]
    assert np.asarray(attention.data_to_world((0, 0))) == pytest.approx(
        layer.data_to_world((15.5, 15.5)))


@pytest.mark.gui
def test_a_figure_of_a_full_resolution_run_of_a_large_pyramid_is_refused_before_reading(
        slide, make_napari_viewer, monkeypatch):
    from types import SimpleNamespace

    import timm  # noqa: F401  # before the viewer: see tests/napari/conftest.py

    from napari_attnreg._napari.figure import plane_image
    from napari_attnreg._napari.geometry import SourceGeometry
    from napari_attnreg.core.run import lazy

    viewer = make_napari_viewer()
    [layer] = viewer.open(str(slide), plugin="napari-attnreg")
    # a tiled run at level 0 lies on the layer's own pixels (no grid): its figure would read
    # level 0 whole, gigabytes for a real slide
    record = SimpleNamespace(geometry=SourceGeometry.from_layer(layer), grid=None)
    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", 1024 * 1024)
    with pytest.raises(ValueError, match="2048x2048 pixels.*coarser Slide level"):
        plane_image(layer, record, ())
    monkeypatch.undo()
    assert plane_image(layer, record, ()).shape == (SIZE, SIZE, 3)


@pytest.mark.gui
def test_a_multiscale_layer_that_is_no_slide_is_still_refused(make_napari_viewer):
    import timm  # noqa: F401

    from napari_attnreg._napari.widget import AttentionWidget

    viewer = make_napari_viewer()
    pixels = _slide_pixels(512)
    viewer.add_image([pixels, pixels[::2, ::2]], name="pyr", rgb=True, multiscale=True)
    widget = AttentionWidget(viewer)
    assert widget.run() is None
    assert "layer.data[1]" in widget.run_panel.status_label.text()


@pytest.mark.gui
def test_a_shapes_outline_or_a_qupath_geojson_is_the_docks_tissue_mask(slide_dock, qtbot,
                                                                       tmp_path):
    import json

    viewer, widget, layer = slide_dock
    controls = widget.options.controls
    controls["tiled"].setChecked(True)
    controls["level"].setValue(2)
    # the top-left quarter of the 2048² slide (512 µm at 0.25 µm), outlined in µm
    viewer.add_shapes([np.array([[0.0, 0.0], [0.0, 128.0], [128.0, 128.0], [128.0, 0.0]])],
                      shape_type="polygon", name="outline")
    controls["tissue_mask"].setText("outline")
    outlined = _dock_run(widget, qtbot).results[()]
    assert outlined.metadata["tissue_mask"] == "Shapes layer 'outline'"
    tiles = np.asarray(outlined.null_summary["tissue_tiles"], bool)
    assert 0 < tiles.sum() < 9

    # the same outline as QuPath exports it: full-resolution pixels, whatever level is read
    ring = [[0, 0], [512, 0], [512, 512], [0, 512], [0, 0]]
    path = tmp_path / "tissue.geojson"
    path.write_text(json.dumps({"type": "FeatureCollection", "features": [
        {"type": "Feature", "properties": {"objectType": "annotation"},
         "geometry": {"type": "Polygon", "coordinates": [ring]}}]}))
    controls["tissue_mask"].setText(str(path))
    from_file = _dock_run(widget, qtbot).results[()]
    assert np.array_equal(np.asarray(from_file.null_summary["tissue_tiles"], bool), tiles)

    viewer.add_shapes(name="empty outline")
    controls["tissue_mask"].setText("empty outline")
    assert widget.run() is None
    assert "marks no tissue" in widget.run_panel.status_label.text()


@pytest.mark.gui
def test_a_labels_layer_is_the_tissue_mask_and_a_painted_mask_layer_is_kept(slide_dock, qtbot):
    viewer, widget, layer = slide_dock
    controls = widget.options.controls
    controls["tiled"].setChecked(True)
    controls["level"].setValue(2)
    # painted at a quarter of the layer's resolution: placed by its scale, not its shape
    painted = np.zeros((512, 512), np.uint8)
    painted[:128, :128] = 1
    viewer.add_labels(painted, name="my tissue", scale=(1.0, 1.0), translate=(0.375, 0.375))
    controls["tissue_mask"].setText("my tissue")
    record = _dock_run(widget, qtbot)
    md = record.results[()].metadata
    assert md["tissue_mask"] == "Labels layer 'my tissue'"
    used = np.asarray(record.results[()].null_summary["tissue_mask"])
    rows, cols = np.nonzero(used)
    assert used.any() and rows.max() < used.shape[0] // 4 + 2 and cols.max() < used.shape[1] // 4 + 2
    assert 0 < md["n_tissue_tiles"] < 9  # the top-left quarter of 512² in 128² tiles

    controls["tissue_mask"].setText("no such layer")
    assert widget.run() is None
    assert "'my tissue'" in widget.run_panel.status_label.text()

    # the automatic mask's layer, painted on by the analyst, survives a rerun
    controls["tissue_mask"].setText("auto")
    _dock_run(widget, qtbot)
    auto = viewer.layers["slide tissue"]
    edited = np.asarray(auto.data).copy()
    edited[:4, :4] = 1 - edited[:4, :4]
    auto.data = edited
    _dock_run(widget, qtbot)
    tissue = [lay for lay in viewer.layers if lay.name.startswith("slide tissue")]
    assert auto in viewer.layers and len(tissue) == 2
    # a run without a mask removes the one it would otherwise leave on screen, not the edited one
    controls["tissue_mask"].setText("none")
    _dock_run(widget, qtbot)
    assert [lay for lay in viewer.layers if lay.name.startswith("slide tissue")] == [auto]


@pytest.mark.gui
def test_a_layer_that_is_no_slide_does_not_record_a_slide_level(make_napari_viewer, qtbot):
    import timm  # noqa: F401

    from napari_attnreg._napari.option_controls import value_of
    from napari_attnreg._napari.widget import AttentionWidget
    from napari_attnreg.core.run.options import option

    viewer = make_napari_viewer()
    viewer.add_image(_slide_pixels(256), name="plain", rgb=True)
    widget = AttentionWidget(viewer)
    viewer.window.add_dock_widget(widget)
    controls = widget.options.controls
    controls["device"].setCurrentText("cpu")
    controls["n_boot"].setValue(8)
    controls["level"].setValue(1)
    record = _dock_run(widget, qtbot)
    assert record.params["level"] is None and "slide_level" not in record.results[()].metadata
    # an empty resolution reads "auto"; its least value is a value, not "empty"
    mpp = controls["mpp"]
    assert mpp.text() == "auto" and value_of(mpp, option("mpp")) is None
    mpp.setValue(0.01)
    assert value_of(mpp, option("mpp")) == pytest.approx(0.01)


def test_a_slide_read_far_coarser_than_its_level_holds_few_regions_at_once(slide, monkeypatch):
    # at mpp 1.5 from level 0 (0.25 µm) each 128² tile reads a 768² region: the chunk and
    # the read-ahead are bounded by the regions' bytes, and the values are the stacked ones
    import torch

    from napari_attnreg.core.models.backbones import load_backbone
    from napari_attnreg.core.run import lazy as lazy_module
    from napari_attnreg.core.run import tiled_engine
    from napari_attnreg.core.run.config import RunConfig
    from napari_attnreg.core.run.engine import drain, run_engine

    image = open_slide(slide, level=0)
    image = LazyImage(image.array, image.channel_axis, image.path, scale=6.0, mpp=1.5, level=0,
                      overview_array=image.overview_array)
    backbone = load_backbone("demo")
    tiled = tiled_engine.prepare_tiled(image, backbone,
                                       RunConfig(tiled=True, n_boot=4, device="cpu").validate())
    assert tiled.raw_tile_bytes == 768 * 768 * 3
    blocks = [tiled.read_raw(i) for i in range(3)]
    stacked = lazy_module.to_unit(blocks, 0.0, 255.0, (128, 128))
    one_by_one = torch.cat([lazy_module.to_unit([b], 0.0, 255.0, (128, 128)) for b in blocks])
    assert torch.equal(stacked, one_by_one)

    depths = []
    real = tiled_engine.TileReader

    def spy(read, order, depth):
        depths.append(depth)
        return real(read, order, depth)

    monkeypatch.setattr(tiled_engine, "TileReader", spy)
    monkeypatch.setattr(tiled_engine, "RAW_CHUNK_BYTES", 3 * 768 * 768 * 3)
    result = drain(run_engine(image, backbone, RunConfig(tiled=True, n_boot=4, device="cpu",
                                                         tissue_mask="none")))
    assert depths == [3] and result.metadata["chunk_size"] <= 3


@pytest.mark.gui
def test_the_tissue_mask_field_offers_the_labels_layers(slide_dock):
    viewer, widget, _layer = slide_dock
    completer = widget.options.controls["tissue_mask"].completer()
    offered = completer.model().stringList()
    assert offered == ["auto", "none"]
    viewer.add_labels(np.zeros((64, 64), np.uint8), name="painted")
    assert completer.model().stringList() == ["auto", "none", "painted"]
    viewer.layers.remove("painted")
    assert completer.model().stringList() == ["auto", "none"]


@pytest.mark.gui
def test_qupath_annotations_lie_over_a_slide_shown_at_a_coarser_level(slide, make_napari_viewer,
                                                                     tmp_path):
    import json

    import timm  # noqa: F401

    from napari_attnreg._napari.widget import AttentionWidget

    image = open_slide(slide, level=2)  # downsample 4, 1 µm
    viewer = make_napari_viewer()
    layer = viewer.add_image(np.asarray(image.array), name="slide", rgb=True, scale=(1.0, 1.0),
                             metadata={"slide": {"path": str(slide), "level": 2, "mpp": 1.0,
                                                 "downsample": 4.0}})
    widget = AttentionWidget(viewer)
    viewer.window.add_dock_widget(widget)
    # QuPath's frame: full-resolution pixels, (x, y) from the top-left corner
    square = [[400, 200], [600, 200], [600, 320], [400, 320], [400, 200]]
    path = tmp_path / "qupath.geojson"
    path.write_text(json.dumps({"type": "FeatureCollection", "features": [{
        "type": "Feature", "properties": {"objectType": "annotation"},
        "geometry": {"type": "Polygon", "coordinates": [square]}}]}))
    [shapes] = viewer.open(str(path), plugin="napari-attnreg")
    corner = shapes.data_to_world(shapes.data[0][0])
    # the corner of level-0 pixel (200, 400) is the corner of level-2 pixel (50, 100)
    assert np.asarray(corner) == pytest.approx(layer.data_to_world((49.5, 99.5)))
    assert shapes.metadata["geojson"]["placed"] == "slide"

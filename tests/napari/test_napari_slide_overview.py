"""A slide stored as one large level, opened in napari: the window answers at once (napari's
main thread reads nothing of the file for the coarse levels), a line on the canvas says what
is read, the overview fills in as its blocks are computed off the main thread, and closing
the layer or the viewer stops that work. A failed read is said in a notification."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("tiffslide")
tifffile = pytest.importorskip("tifffile")

pytestmark = pytest.mark.gui

H, W = 512, 384  # the file's one level


def _pixels() -> np.ndarray:
    rng = np.random.default_rng(3)
    img = np.full((H, W, 3), 236, np.uint8)  # glass
    yy, xx = np.mgrid[0:H, 0:W]
    tissue = (yy - 256) ** 2 / 200 ** 2 + (xx - 192) ** 2 / 150 ** 2 < 1
    stain = rng.random((H, W, 3)) * 60 + np.array([150, 60, 140])
    img[tissue] = stain[tissue].clip(0, 255).astype(np.uint8)
    return img


@pytest.fixture(scope="module")
def single_level(tmp_path_factory):
    """An Aperio SVS of one level (no pyramid, no thumbnail), 0.5 µm per pixel."""
    path = tmp_path_factory.mktemp("overview") / "one_level.svs"
    tifffile.imwrite(path, _pixels(), tile=(128, 128), photometric="rgb", metadata=None,
                     description=f"Aperio Image Library v10.0.50\n{W}x{H} [0,0 {W}x{H}] "
                                 "(128x128) RAW/RGB|AppMag = 20|MPP = 0.5")
    return path


@pytest.fixture
def computes(monkeypatch):
    """Blocks of 128 file pixels, the levels built down to 128 pixels a side (256 x 192 and
    128 x 96, 12 blocks each), every block computation recorded (on the main thread or
    not) and held off the main thread until ``gate`` is set."""
    from napari_attnreg._napari import slide_pyramid
    from napari_attnreg.core.run import lazy

    monkeypatch.setattr(lazy, "MAX_UNTILED_PIXELS", 128 * 128)
    monkeypatch.setattr(slide_pyramid, "COARSEST_SIDE", 128)
    monkeypatch.setattr(slide_pyramid, "BLOCK_SIDE", 128)
    gate, seen, broken = threading.Event(), [], set()
    compute = slide_pyramid.BlockMeanLevel._compute

    def held(level, by, bx):
        main = threading.current_thread() is threading.main_thread()
        seen.append(main)
        if not main:
            assert gate.wait(20), "napari waited for a block the test holds back"
        if (level.factor, by, bx) in broken:
            raise ValueError("JPEG data is corrupt")
        return compute(level, by, bx)

    monkeypatch.setattr(slide_pyramid.BlockMeanLevel, "_compute", held)
    return gate, seen, broken


def _whole_view(viewer) -> None:
    """The whole slide, small on the canvas: napari draws it from the coarsest level (a
    file this small would otherwise be drawn from its own level)."""
    viewer.reset_view()
    camera = getattr(getattr(viewer, "scene", None), "camera", None) or viewer.camera
    camera.zoom /= 5


def _canvas_centre(viewer) -> np.ndarray:
    shot = viewer.screenshot(canvas_only=True, flash=False)
    h, w = shot.shape[:2]
    return shot[h // 2 - 20:h // 2 + 20, w // 2 - 20:w // 2 + 20, :3].reshape(-1, 3).mean(0)


def _fill(layer):
    from napari_attnreg._napari.slide_pyramid import levels_of

    [fill] = {id(level.fill): level.fill for level in levels_of(layer.data)}.values()
    return fill


def test_the_window_answers_at_once_and_the_overview_fills_in(single_level, computes,
                                                               make_napari_viewer, qtbot):
    from napari_attnreg._napari.slice_cue import text_overlay

    gate, seen, _ = computes
    viewer = make_napari_viewer(show=True)
    [layer] = viewer.open(str(single_level), plugin="napari-attnreg")
    _whole_view(viewer)
    qtbot.wait(400)  # the event loop runs: the viewer answers while nothing is computed
    assert layer.multiscale and len(layer.data) == 3 and layer.data_level == 2
    assert not any(seen), "napari's main thread read the file for a coarse level"
    overlay = text_overlay(viewer)
    assert overlay.visible and overlay.text == "Reading one_level.svs for this view: 0 of 12 blocks"
    assert _canvas_centre(viewer).max() < 5  # black until the blocks are there

    gate.set()
    fill = _fill(layer)
    qtbot.waitUntil(lambda: not fill.busy and not overlay.visible, timeout=20_000)
    qtbot.wait(300)  # the last redraw
    assert not any(seen) and len(seen) == 12  # the coarsest level's blocks, each once
    from napari_attnreg._napari.slide_pyramid import levels_of

    coarsest = levels_of(layer.data)[-1]
    assert coarsest.blocks_held == 12
    expected = _pixels()[H // 2 - 40:H // 2 + 40, W // 2 - 40:W // 2 + 40].reshape(-1, 3)
    # the canvas shows the slide's middle now (its stain), where it was black
    np.testing.assert_allclose(_canvas_centre(viewer), expected.mean(0), atol=12)
    np.testing.assert_array_equal(layer.thumbnail[..., :3].max(axis=(0, 1)) > 100, True)


@pytest.mark.parametrize("close", ["layer", "viewer"])
def test_closing_the_layer_or_viewer_stops_the_fill(single_level, computes,
                                                    make_napari_viewer, qtbot, close):
    gate, seen, _ = computes
    viewer = make_napari_viewer(show=True)
    [layer] = viewer.open(str(single_level), plugin="napari-attnreg")
    _whole_view(viewer)
    qtbot.wait(300)
    fill = _fill(layer)
    assert fill.busy and fill.threads
    if close == "layer":
        viewer.layers.remove(layer)
        qtbot.waitUntil(lambda: fill.stopped, timeout=5_000)
    else:
        viewer.close()
        qtbot.waitUntil(lambda: fill.stopped, timeout=5_000)
    gate.set()
    qtbot.waitUntil(lambda: not fill.threads, timeout=10_000)
    assert not fill.busy and not any(seen)
    assert len(seen) <= fill.workers  # those computing when it stopped, no more


def test_a_block_that_cannot_be_read_is_said_in_a_notification(single_level, computes,
                                                              make_napari_viewer, qtbot,
                                                              notifications):
    gate, seen, broken = computes
    broken.add((4, 1, 1))  # the coarsest level's block over file rows 128-255, columns 128-255
    gate.set()
    viewer = make_napari_viewer(show=True)
    [layer] = viewer.open(str(single_level), plugin="napari-attnreg")
    _whole_view(viewer)
    fill = _fill(layer)
    qtbot.waitUntil(lambda: any("Could not read" in str(n.message) for n in notifications),
                    timeout=20_000)
    [said] = [str(n.message) for n in notifications if "Could not read" in str(n.message)]
    assert "one_level.svs at rows 128–256, columns 128–256" in said
    assert "JPEG data is corrupt" in said and "left black" in said
    qtbot.waitUntil(lambda: not fill.busy, timeout=20_000)
    qtbot.wait(300)
    assert not any(seen) and fill.asked == 12  # the broken block is not asked again

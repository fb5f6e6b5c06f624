"""The coarse display levels of a single-level slide computed off napari's main thread: a
draw asks for them and gets what is computed (stand-ins for the rest) without reading the
file; a :class:`BackgroundFill` computes the blocks, which then equal the block means.
Reads are counted on the source, never timed."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from napari_attnreg._napari import slide_pyramid
from napari_attnreg._napari.slide_pyramid import BackgroundFill, BlockMeanLevel, display_levels

H, W = 300, 260


class Source:
    """An (H, W, 3) array that counts its reads, per thread, and can hold them at a gate or
    fail in a region (a corrupt tile)."""

    def __init__(self, pixels: np.ndarray, gate: threading.Event | None = None,
                 broken_row: int | None = None) -> None:
        self.pixels, self.gate, self.broken_row = pixels, gate, broken_row
        self.shape, self.dtype = pixels.shape, pixels.dtype
        self.reads: list[bool] = []  # True: read on the main thread
        self._lock = threading.Lock()

    @property
    def main_reads(self) -> int:
        return sum(self.reads)

    def __getitem__(self, key):
        with self._lock:
            self.reads.append(threading.current_thread() is threading.main_thread())
        if self.gate is not None and threading.current_thread() is not threading.main_thread():
            assert self.gate.wait(10)
        rows = key[0]
        if self.broken_row is not None and rows.start <= self.broken_row < rows.stop:
            raise ValueError("JPEG data is corrupt")
        return self.pixels[key]


def _pixels() -> np.ndarray:
    return np.random.default_rng(7).integers(0, 256, (H, W, 3), dtype=np.uint8)


def _block_mean(img: np.ndarray, f: int) -> np.ndarray:
    """Means of f x f blocks of (H, W, C), edge blocks of what they hold."""
    rows, cols = np.arange(0, img.shape[0], f), np.arange(0, img.shape[1], f)
    sums = np.add.reduceat(np.add.reduceat(img.astype(float), rows, axis=0), cols, axis=1)
    counts = np.outer(np.diff([*rows, img.shape[0]]), np.diff([*cols, img.shape[1]]))
    return np.rint(sums / counts[..., None]).astype(img.dtype)


def _wait(fill: BackgroundFill, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while fill.busy:
        assert time.monotonic() < end, "the fill did not finish"
        time.sleep(0.01)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 64 source pixels a side: levels of several blocks from a small array."""
    monkeypatch.setattr(slide_pyramid, "BLOCK_SIDE", 64)


def _levels(source: Source, fill: BackgroundFill) -> list[BlockMeanLevel]:
    levels = display_levels(source, 40)  # factors 2, 4, 8: 38 x 33 at the coarsest
    for level in levels:
        level.fill = fill
    return levels


def test_the_first_whole_view_reads_nothing_and_its_blocks_arrive_later(small_blocks):
    gate = threading.Event()
    source = Source(_pixels(), gate=gate)
    fill = BackgroundFill("slide.svs", workers=2)
    coarsest = _levels(source, fill)[-1]
    n_blocks = len(coarsest._keys(0, coarsest.shape[0], 0, coarsest.shape[1]))
    assert n_blocks == 25  # 5 x 5 blocks of 8 pixels (64 source pixels)

    first = coarsest.read(..., defer=True)  # as napari's draw asks for the whole view
    assert first.shape == coarsest.shape and not first.any()  # zeros: nothing computed yet
    assert source.main_reads == 0 and fill.busy and fill.asked == n_blocks
    again = coarsest.read(..., defer=True)  # a redraw before any block is there
    assert not again.any() and fill.asked == n_blocks  # queued once

    gate.set()
    _wait(fill)
    assert coarsest.blocks_held == n_blocks and fill.done == n_blocks
    assert source.main_reads == 0 and len(source.reads) == n_blocks  # each block read once
    np.testing.assert_array_equal(coarsest.read(..., defer=True), _block_mean(source.pixels, 8))
    assert len(source.reads) == n_blocks and fill.news() == (n_blocks, n_blocks, [])


def test_a_finer_level_stands_in_from_the_coarser_blocks_until_its_own_arrive(small_blocks):
    source = Source(_pixels())
    fill = BackgroundFill("slide.svs", workers=2)
    fine, _, coarsest = _levels(source, fill)
    coarsest.read(..., defer=True)
    _wait(fill)
    gate = source.gate = threading.Event()
    reads = len(source.reads)

    shown = fine.read((slice(10, 70), slice(3, 50)), defer=True)  # factor 2 of the 8
    coarse = _block_mean(source.pixels, 8).repeat(4, axis=0).repeat(4, axis=1)
    np.testing.assert_array_equal(shown, coarse[10:70, 3:50])
    assert source.main_reads == 0
    gate.set()
    _wait(fill)
    assert len(source.reads) > reads
    np.testing.assert_array_equal(fine.read((slice(10, 70), slice(3, 50)), defer=True),
                                  _block_mean(source.pixels, 2)[10:70, 3:50])


def test_reads_by_anyone_but_napari_get_the_pixels(small_blocks):
    """A script, the console or a test reading a level gets its pixels, fill or not, on
    any thread: only napari's draws are stood in for."""
    source = Source(_pixels())
    fill = BackgroundFill("slide.svs", workers=2)
    fine, _, coarsest = _levels(source, fill)
    np.testing.assert_array_equal(np.asarray(coarsest), _block_mean(source.pixels, 8))
    np.testing.assert_array_equal(fine[5:60:3, 7], _block_mean(source.pixels, 2)[5:60:3, 7])
    assert source.reads and fill.asked == 0  # read here, nothing queued


def _as_napari(code: str, **names):
    """Run ``code`` as if a module of napari's ran it (its draws read the levels so)."""
    scope = {"__name__": "napari.layers._scalar_field._slice", "np": np, **names}
    exec(code, scope)  # a caller whose module is napari's, as _napari_draws looks for
    return scope["out"]


def test_only_napari_drawing_on_the_main_thread_is_stood_in_for(small_blocks):
    gate = threading.Event()
    source = Source(_pixels(), gate=gate)
    fill = BackgroundFill("slide.svs", workers=2)
    fine, _, coarsest = _levels(source, fill)
    drawn = _as_napari("out = np.asarray(level)", level=coarsest)
    assert not drawn.any() and fill.asked == 25 and source.main_reads == 0
    gate.set()
    _wait(fill)
    # napari's slicing on another thread (its async mode) may wait: it gets the pixels
    seen = []
    worker = threading.Thread(target=lambda: seen.append(
        _as_napari("out = level[100:150]", level=fine)))
    worker.start()
    worker.join()
    np.testing.assert_array_equal(seen[0], _block_mean(source.pixels, 2)[100:150])
    assert fill.asked == 25
    np.testing.assert_array_equal(_as_napari("out = np.asarray(level)", level=coarsest),
                                  _block_mean(source.pixels, 8))


def test_a_block_that_fails_is_said_once_and_left_black_not_asked_again(small_blocks):
    source = Source(_pixels(), broken_row=200)  # rows 192-255 of the source: block row 3
    fill = BackgroundFill("slide.svs", workers=2)
    coarsest = _levels(source, fill)[-1]
    coarsest.read(..., defer=True)
    _wait(fill)
    done, asked, errors = fill.news()
    assert done == asked == 25 and len(errors) == 5  # the five blocks of that row
    assert "Could not read slide.svs at rows 192–256, columns 0–64" in errors[0]
    assert "JPEG data is corrupt" in errors[0] and "damaged" in errors[0]
    shown = coarsest.read(..., defer=True)
    assert fill.asked == 25 and fill.news()[2] == []  # not asked again, said once
    assert not shown[24:32].any()
    expected = _block_mean(source.pixels, 8)
    np.testing.assert_array_equal(shown[:24], expected[:24])
    np.testing.assert_array_equal(shown[32:], expected[32:])
    with pytest.raises(ValueError, match="corrupt"):  # a read not deferred says it too
        np.asarray(coarsest)


def test_stop_drops_the_queue_and_ends_the_threads(small_blocks):
    gate = threading.Event()
    source = Source(_pixels(), gate=gate)
    fill = BackgroundFill("slide.svs", workers=2)
    levels = _levels(source, fill)
    levels[-1].read(..., defer=True)
    assert fill.busy and len(fill.threads) == 2
    fill.stop()
    gate.set()
    fill.stop(timeout=10)
    assert fill.threads == [] and not fill.busy
    assert len(source.reads) <= 2  # the blocks being computed when it stopped, no more
    # a stopped fill leaves the levels computing what they are asked, as without one
    np.testing.assert_array_equal(levels[-1].read(..., defer=True),
                                  _block_mean(source.pixels, 8))
    assert fill.asked == 25


def test_idle_threads_end_and_start_again_when_asked(small_blocks, monkeypatch):
    monkeypatch.setattr(slide_pyramid, "IDLE_S", 0.05)
    source = Source(_pixels())
    fill = BackgroundFill("slide.svs", workers=2)
    fine, _, coarsest = _levels(source, fill)
    coarsest.read(..., defer=True)
    _wait(fill)
    end = time.monotonic() + 5
    while fill.threads and time.monotonic() < end:
        time.sleep(0.01)
    assert fill.threads == []
    fine.read((slice(0, 40), slice(0, 40)), defer=True)
    _wait(fill)
    np.testing.assert_array_equal(fine.read((slice(0, 40), slice(0, 40)), defer=True),
                                  _block_mean(source.pixels, 2)[:40, :40])


def test_draws_and_fills_from_several_threads_agree(small_blocks):
    """The block cache shared by the fill, napari's draws and other readers at once."""
    source = Source(_pixels())
    fill = BackgroundFill("slide.svs", workers=2)
    levels = _levels(source, fill)
    for level in levels:
        level.cache_bytes = 3 * level._block_bytes()  # blocks pushed out as others come
    out: list[tuple[int, np.ndarray]] = []

    def reader(k: int) -> None:
        for _ in range(3):
            out.append((k, levels[k][...]))

    threads = [threading.Thread(target=reader, args=(k,)) for k in (0, 1, 2, 2)]
    for thread in threads:
        thread.start()
    for _ in range(5):
        levels[2].read((slice(0, 16), slice(0, 16)), defer=True)
    for thread in threads:
        thread.join()
    _wait(fill)
    for k, pixels in out:
        np.testing.assert_array_equal(pixels, _block_mean(source.pixels, 2 ** (k + 1)))

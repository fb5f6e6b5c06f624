"""Coarser levels, for napari's eyes only, of a slide stored as one large level.

napari draws a layer of one array by reading all of it (2.7 GB for a 30000² RGB level, then
its texture work), where a multiscale layer reads only what the canvas shows, from the level
nearest the screen's resolution. A slide stored as one level (some scanners and converters
write single-level SVS or tiled TIFF) gets halved levels here: each pixel of level ``k`` is
the mean of the ``2^k × 2^k`` file pixels it covers, computed block by block from the file's
level when napari asks for it, so no read holds more than a block of the file. Blocks are
kept in a small cache per level; the coarsest level (at most :data:`COARSEST_SIDE` a side)
fits in it whole, which matters because napari reads all of it for the layer's thumbnail
at every redraw.

Reading a coarse level's blocks decodes the file under them (all of it for the whole view:
seconds to minutes). Where the level is one tiled TIFF page (an SVS, a plain tiled TIFF, an
OME-TIFF's image) its tiles are read and decoded here, several at once (:class:`TiffTiles`):
through the zarr store they were decoded one at a time, whatever the threads asking.

When a :class:`BackgroundFill` is attached (napari's reader does, for a
slide opened in a viewer: :mod:`~napari_attnreg._napari.slide_fill`), a read on the main
thread by napari (it draws there) never decodes: it returns the blocks computed so far, the
missing ones drawn from a coarser level's computed blocks (or zeros), and queues them for
the fill's worker threads; the front end redraws the layer as they arrive. Any other read
(another thread, another caller, no fill attached) computes what it asks for, as before.
No Qt in here.

These levels are never analysed: a run reads the file's own level
(:mod:`napari_attnreg._napari.slide_run`), and ``metadata["slide"]["levels"]`` counts the
file's levels only.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from napari_attnreg.core.run.tiff_tiles import TiffTiles

#: Longest side of the coarsest level built: napari shows the whole slide from it.
COARSEST_SIDE = 2048
#: File pixels a side of the region one block of a coarse level is computed from: bounds
#: what one read holds (12 MB of RGB) whatever the level's factor.
BLOCK_SIDE = 2048
#: Bytes of computed blocks each coarse level keeps (least recently used dropped first).
CACHE_BYTES = 64 << 20
#: Blocks computed at once when a read needs several (JPEG decoding releases the GIL).
WORKERS = 4
#: Seconds a :class:`BackgroundFill` worker waits for work before its thread ends.
IDLE_S = 2.0


def display_levels(level: Any, coarsest: int | None = None) -> list[BlockMeanLevel]:
    """The halved levels of ``level`` (``(H, W)`` or ``(H, W, C)``, read on demand) down to
    the first whose longest side is at most ``coarsest`` (default :data:`COARSEST_SIDE`):
    factors 2, 4, 8, ... of it, each knowing the next coarser one (its placeholder while a
    fill computes it). Nothing is read here."""
    coarsest = COARSEST_SIDE if coarsest is None else int(coarsest)
    if coarsest < 1:
        raise ValueError(f"coarsest must be at least 1 pixel, got {coarsest}.")
    side, factor, levels = max(int(n) for n in level.shape[:2]), 1, []
    while -(-side // factor) > coarsest:
        factor *= 2
        levels.append(BlockMeanLevel(level, factor))
    for fine, coarse in zip(levels, levels[1:], strict=False):
        fine.coarser = coarse
    return levels


def levels_of(data: Any) -> list[BlockMeanLevel]:
    """The block-mean levels in a layer's data (a multiscale list; a level of channels
    counts as the level it wraps); none for any other data."""
    if not isinstance(data, Sequence):  # napari's layers hold a MultiScaleData sequence
        return []
    found = []
    for level in data:
        while isinstance(level, (ChannelsAt, ChannelLevel)):
            level = level.level
        if isinstance(level, BlockMeanLevel):
            found.append(level)
    return found


class BackgroundFill:
    """Worker threads computing the blocks of a slide's coarse levels that napari's main
    thread asked for, so that it never decodes the file itself (see the module's notes).

    Threads start when blocks are queued and end after :data:`IDLE_S` seconds without work,
    or at :meth:`stop`. The newest request is computed first (the view the analyst is
    looking at now). Progress and failures are read by the front end with :meth:`news`;
    a block that failed is not asked again (its region stays a placeholder).

    Parameters
    ----------
    name : str
        What is read (the file's name), for messages.
    workers : int, optional
        Threads computing blocks at once (JPEG decoding releases the GIL); default
        :data:`WORKERS`, at most one per CPU.
    """

    def __init__(self, name: str, workers: int | None = None) -> None:
        self.name = str(name)
        self.workers = max(1, int(workers) if workers is not None
                           else min(WORKERS, os.cpu_count() or 1))
        self._cond = threading.Condition()
        self._stack: list[tuple[BlockMeanLevel, tuple[int, int]]] = []  # newest last
        self._pending: set[tuple[int, tuple[int, int]]] = set()  # queued or computing
        self._failed: set[tuple[int, tuple[int, int]]] = set()
        self._errors: list[str] = []
        self._threads: list[threading.Thread] = []
        self._stopped = False
        #: blocks queued and blocks finished (computed or failed) since the fill was made
        self.asked = 0
        self.done = 0

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def busy(self) -> bool:
        """Whether blocks are queued or being computed."""
        with self._cond:
            return bool(self._pending)

    @property
    def threads(self) -> list[threading.Thread]:
        """The worker threads alive now."""
        with self._cond:
            return [t for t in self._threads if t.is_alive()]

    def request(self, level: BlockMeanLevel, keys: list[tuple[int, int]]) -> None:
        """Queue blocks ``keys`` of ``level`` (those queued, computing or failed are not
        queued again); the first key is computed first."""
        with self._cond:
            if self._stopped:
                return
            new = [k for k in keys if (id(level), k) not in self._pending
                   and (id(level), k) not in self._failed]
            self._stack.extend((level, k) for k in reversed(new))
            self._pending.update((id(level), k) for k in new)
            self.asked += len(new)
            self._threads = [t for t in self._threads if t.is_alive()]
            for _ in range(min(self.workers - len(self._threads), len(self._stack))):
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"attnreg overview of {self.name}")
                self._threads.append(thread)
                thread.start()
            self._cond.notify_all()

    def news(self) -> tuple[int, int, list[str]]:
        """``(done, asked, errors)``: blocks finished and queued so far, and the messages
        of failures since the last call (each said once)."""
        with self._cond:
            errors, self._errors = self._errors, []
            return self.done, self.asked, errors

    def stop(self, timeout: float | None = None) -> None:
        """Drop the queued blocks and end the threads (a block being computed is finished
        first); waits up to ``timeout`` seconds for them when given."""
        with self._cond:
            self._stopped = True
            for level, key in self._stack:
                self._pending.discard((id(level), key))
            self._stack.clear()
            self._cond.notify_all()
            threads = list(self._threads)
        if timeout is not None:
            end = time.monotonic() + timeout
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join(max(0.0, end - time.monotonic()))

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._stack and not self._stopped:
                    if not self._cond.wait(IDLE_S) and not self._stack:
                        self._threads.remove(threading.current_thread())
                        return
                if self._stopped:
                    self._threads.remove(threading.current_thread())
                    return
                level, key = self._stack.pop()
            error = None
            try:
                level.compute_block(key)
            except Exception as err:  # noqa: BLE001 - said to the analyst, the view goes on
                error = err
            with self._cond:
                self._pending.discard((id(level), key))
                self.done += 1
                if error is not None:
                    self._failed.add((id(level), key))
                    y0, y1, x0, x1 = level.source_region(key)
                    self._errors.append(
                        f"Could not read {self.name} at rows {y0}–{y1}, columns {x0}–{x1} "
                        f"for its overview ({type(error).__name__}: {error}); that part "
                        f"is left black. The file may be damaged there: copy it again (a "
                        f"run that reads that part fails too).")


class BlockMeanLevel:
    """``source`` reduced ``factor`` times along rows and columns by block means, read on
    demand and indexed like the source's array (whole numbers and slices with positive
    steps). Edge blocks that the source's size leaves short are the mean of the pixels they
    hold. Safe to share between threads (napari may slice off the main thread).

    Parameters
    ----------
    source : array-like
        ``(H, W)`` or ``(H, W, C)``, indexable with slices (a zarr array of a slide level).
    factor : int
        Source pixels per pixel of this level along each axis (a power of two here).
    """

    def __init__(self, source: Any, factor: int, cache_bytes: int = CACHE_BYTES) -> None:
        if len(source.shape) not in (2, 3) or int(factor) < 1:
            raise ValueError(f"a block-mean level takes (H, W[, C]) and a factor ≥ 1, got "
                             f"shape {tuple(source.shape)} and factor {factor}.")
        self.source, self.factor = source, int(factor)
        #: the file's tiles read directly, where the source is a plain tiled TIFF page
        self.tiles = TiffTiles.of(source)
        h, w = (int(n) for n in source.shape[:2])
        self.shape = (-(-h // self.factor), -(-w // self.factor),
                      *(int(n) for n in source.shape[2:]))
        self.dtype = np.dtype(source.dtype)
        self.block = max(1, BLOCK_SIDE // self.factor)  # this level's pixels a block side
        self.chunks = (self.block, self.block, *self.shape[2:])
        self.cache_bytes = int(cache_bytes)
        self._blocks: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        #: the next coarser level (its computed blocks stand in for missing ones here)
        self.coarser: BlockMeanLevel | None = None
        #: computes blocks off the main thread when attached (else reads compute them)
        self.fill: BackgroundFill | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:  # napari's layer data protocol asks for it
        return math.prod(self.shape)

    @property
    def blocks_held(self) -> int:
        """Blocks computed and kept (0 until napari first reads the level)."""
        return len(self._blocks)

    def holds(self, key: tuple[int, int]) -> bool:
        """Whether block ``key`` is computed and kept."""
        with self._lock:
            return key in self._blocks

    def compute_block(self, key: tuple[int, int]) -> None:
        """Compute block ``key`` and keep it, unless it is kept already."""
        if not self.holds(key):
            self._keep(key, self._compute(*key))

    def source_region(self, key: tuple[int, int]) -> tuple[int, int, int, int]:
        """``(y0, y1, x0, x1)``: the source pixels block ``key`` is computed from."""
        (by, bx), f, b = key, self.factor, self.block
        h, w = (int(n) for n in self.source.shape[:2])
        return by * b * f, min(h, (by + 1) * b * f), bx * b * f, min(w, (bx + 1) * b * f)

    def _compute(self, by: int, bx: int) -> np.ndarray:
        """Block ``(by, bx)``: the mean of each ``factor²`` source pixels it covers."""
        f = self.factor
        pixels = self._source_pixels(*self.source_region((by, bx)))
        rows, cols = -(-pixels.shape[0] // f), -(-pixels.shape[1] // f)
        counts = np.outer(np.minimum(f, pixels.shape[0] - f * np.arange(rows)),
                          np.minimum(f, pixels.shape[1] - f * np.arange(cols)))
        if pixels.shape[:2] != (rows * f, cols * f):  # an edge block: zeros add nothing
            padded = np.zeros((rows * f, cols * f, *pixels.shape[2:]), pixels.dtype)
            padded[:pixels.shape[0], :pixels.shape[1]] = pixels
            pixels = padded
        # exact sums over the blocks (8- and 16-bit pixels in 32 bits), rows then columns,
        # divided by the pixels each block holds (fewer at an edge)
        small = self.dtype.kind in "ub" and self.dtype.itemsize <= 2 and f <= 256
        acc = np.uint32 if small else np.int64 if self.dtype.kind in "iub" else np.float64
        rest = pixels.shape[2:]
        if self.dtype.kind in "iub" and self.dtype.itemsize <= 4:
            # whole numbers: a block's rows, then its columns, added one at a time, the
            # rows of 8-bit pixels in 16 bits: 2.5 to 4 times faster than numpy's sums
            # over those axes (113 ms a 2048² RGB block at factor 2, more than decoding it)
            first = np.uint16 if self.dtype.itemsize == 1 and self.dtype.kind != "i" \
                and f <= 256 else acc
            total = _add_along(pixels.reshape(rows, f, cols * f, *rest), 1, first)
            total = _add_along(total.reshape(rows, cols, f, *rest), 2, acc)
        else:  # reshaped sums, ten times faster than np.add.reduceat here
            total = pixels.reshape(rows, f, cols * f, *rest).sum(axis=1, dtype=acc)
            total = total.reshape(rows, cols, f, *rest).sum(axis=2, dtype=acc)
        mean = total / counts.reshape(counts.shape + (1,) * (pixels.ndim - 2))
        if self.dtype.kind in "iub":
            info = np.iinfo(self.dtype) if self.dtype.kind != "b" else None
            np.rint(mean, out=mean)  # in place: a level of factor 2 has 3 M of them a block
            if info is not None:
                np.clip(mean, info.min, info.max, out=mean)
        return mean.astype(self.dtype)

    def _source_pixels(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
        """The source's rows ``y0:y1``, columns ``x0:x1``: decoded from the file's tiles in
        parallel where it is a plain tiled TIFF page, else read through the source."""
        if self.tiles is not None and not self.tiles.closed:
            return self.tiles.read(y0, y1, x0, x1)
        return np.asarray(self.source[y0:y1, x0:x1])

    def _keep(self, key: tuple[int, int], block: np.ndarray) -> None:
        with self._lock:
            if key in self._blocks:
                return
            self._blocks[key] = block
            self._held += block.nbytes
            while self._held > self.cache_bytes and len(self._blocks) > 1:
                _, dropped = self._blocks.popitem(last=False)
                self._held -= dropped.nbytes

    def _blocks_for(self, keys: list[tuple[int, int]],
                    defer: bool = False) -> dict[tuple[int, int], np.ndarray]:
        """Blocks ``keys``: all of them, computed where missing, except when ``defer`` (napari
        draws) and a fill is attached: then the missing ones are queued and left out."""
        with self._lock:
            found = {k: self._blocks[k] for k in keys if k in self._blocks}
            for k in found:
                self._blocks.move_to_end(k)
        missing = [k for k in keys if k not in found]
        fill = self.fill
        if missing and defer and fill is not None and not fill.stopped \
                and len(keys) * self._block_bytes() <= self.cache_bytes:
            # napari draws on the main thread: decoding here froze the viewer (a whole
            # 20000² JPEG slide for the first whole view); the fill computes them and the
            # front end redraws. Only when the cache holds all the blocks asked, else
            # they would push each other out before the redraw reads them.
            fill.request(self, missing)
            return found
        if len(missing) > 1:
            with ThreadPoolExecutor(max_workers=min(WORKERS, os.cpu_count() or 1,
                                                    len(missing))) as pool:
                computed = dict(zip(missing, pool.map(lambda k: self._compute(*k), missing)))
        else:
            computed = {k: self._compute(*k) for k in missing}
        for k, block in computed.items():
            self._keep(k, block)
        return {**found, **computed}

    def _block_bytes(self) -> int:
        return self.block * self.block * math.prod(self.shape[2:]) * self.dtype.itemsize

    def _keys(self, y0: int, y1: int, x0: int, x1: int) -> list[tuple[int, int]]:
        b = self.block
        return [(by, bx) for by in range(y0 // b, (y1 - 1) // b + 1)
                for bx in range(x0 // b, (x1 - 1) // b + 1)]

    def _paste(self, out: np.ndarray, y0: int, x0: int,
               blocks: dict[tuple[int, int], np.ndarray]) -> None:
        """Copy the parts of ``blocks`` inside ``out`` (whose corner is ``(y0, x0)``)."""
        b, (y1, x1) = self.block, (y0 + out.shape[0], x0 + out.shape[1])
        for (by, bx), block in blocks.items():
            ty, tx = max(y0, by * b), max(x0, bx * b)
            ey, ex = min(y1, by * b + block.shape[0]), min(x1, bx * b + block.shape[1])
            out[ty - y0:ey - y0, tx - x0:ex - x0] = block[ty - by * b:ey - by * b,
                                                          tx - bx * b:ex - bx * b]

    def _computed_region(self, y0: int, y1: int, x0: int, x1: int) -> np.ndarray | None:
        """Rows ``y0:y1``, columns ``x0:x1`` from blocks computed already, here or at a
        coarser level (each of its pixels repeated over those it covers here); None when
        neither holds all of it. Reads nothing from the file."""
        keys = self._keys(y0, y1, x0, x1)
        with self._lock:
            found = {k: self._blocks[k] for k in keys if k in self._blocks}
        if len(found) == len(keys):
            out = np.empty((y1 - y0, x1 - x0, *self.shape[2:]), self.dtype)
            self._paste(out, y0, x0, found)
            return out
        coarse = self.coarser
        if coarse is None:
            return None
        r = coarse.factor // self.factor
        cy0, cx0 = y0 // r, x0 // r
        region = coarse._computed_region(cy0, -(-y1 // r), cx0, -(-x1 // r))
        if region is None:
            return None
        region = region.repeat(r, axis=0).repeat(r, axis=1)
        return region[y0 - cy0 * r:y1 - cy0 * r, x0 - cx0 * r:x1 - cx0 * r]

    def __getitem__(self, key: Any) -> np.ndarray:
        return self.read(key, defer=_napari_draws())

    def read(self, key: Any, defer: bool = False) -> np.ndarray:
        """The pixels at ``key`` (as ``self[key]``). With ``defer`` and a fill attached,
        blocks not computed yet are queued for it and stood in for by a coarser level's
        computed blocks, or zeros: nothing is read from the file here."""
        key = _full_key(key, self.ndim)
        spans, inner = [], []
        for k, n in zip(key[:2], self.shape[:2], strict=True):
            if isinstance(k, numbers.Integral):
                i = range(n)[k]  # IndexError when out of range, as numpy
                spans.append(range(i, i + 1))
                inner.append(0)
            elif isinstance(k, slice):
                span = range(n)[k]
                if span.step < 0:
                    raise IndexError("a block-mean level is read with positive steps only")
                spans.append(span)
                inner.append(slice(None, None, span.step))
            else:
                raise IndexError(f"a block-mean level takes whole numbers and slices, not {k!r}")
        ys, xs = spans
        if not (len(ys) and len(xs)):
            return np.zeros((len(ys), len(xs), *self.shape[2:]), self.dtype)[(*inner, *key[2:])]
        y0, y1, x0, x1, b = ys[0], ys[-1] + 1, xs[0], xs[-1] + 1, self.block
        keys = self._keys(y0, y1, x0, x1)
        blocks = self._blocks_for(keys, defer)
        out = np.zeros((y1 - y0, x1 - x0, *self.shape[2:]), self.dtype)
        self._paste(out, y0, x0, blocks)
        for by, bx in (k for k in keys if k not in blocks):  # being computed by the fill
            ty, tx = max(y0, by * b), max(x0, bx * b)
            ey, ex = min(y1, (by + 1) * b, self.shape[0]), min(x1, (bx + 1) * b, self.shape[1])
            stand_in = self._computed_region(ty, ey, tx, ex)
            if stand_in is not None:
                out[ty - y0:ey - y0, tx - x0:ex - x0] = stand_in
        return out[(*inner, *key[2:])]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self.read(..., defer=_napari_draws())
        return whole if dtype is None else whole.astype(dtype)

    def __repr__(self) -> str:
        return f"BlockMeanLevel(shape={self.shape}, dtype={self.dtype}, factor={self.factor})"


def _add_along(values: np.ndarray, axis: int, dtype: Any) -> np.ndarray:
    """The sum of ``values`` along ``axis`` in ``dtype``, its slices added in order (whole
    numbers: exact in a wide enough ``dtype``)."""
    at = (slice(None),) * axis
    total = values[(*at, 0)].astype(dtype)
    for k in range(1, values.shape[axis]):
        np.add(total, values[(*at, k)], out=total)
    return total


def _napari_draws() -> bool:
    """Whether napari asks, on the main thread (where it draws): the first caller outside
    this module is napari's. Its reads of a coarse level may be stood in for while a fill
    computes it; anyone else's (a script, the console, a test) gets the level's pixels."""
    if threading.current_thread() is not threading.main_thread():
        return False
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    caller = str(frame.f_globals.get("__name__", "")) if frame is not None else ""
    return caller == "napari" or caller.startswith("napari.")


def _full_key(key: Any, ndim: int) -> tuple[Any, ...]:
    """``key`` as one index per axis (an Ellipsis and missing trailing axes as full slices)."""
    key = key if isinstance(key, tuple) else (key,)
    if any(k is Ellipsis for k in key):
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = (*key[:at], *(slice(None),) * (ndim - len(key) + 1), *key[at + 1:])
    key = (*key, *(slice(None),) * (ndim - len(key)))
    if len(key) != ndim:
        raise IndexError(f"too many indices for an array of {ndim} dimensions")
    return key


class ChannelsAt:
    """A coarse level of channels (``(H, W, C)``, a :class:`BlockMeanLevel`) with its
    channel axis at ``axis`` (0 for an OME-TIFF's ``CYX``), as napari's ``channel_axis``
    has it. napari splits such a layer into one layer per channel by taking one index of
    that axis: here that is a :class:`ChannelLevel`, read on demand, where an index into the
    block-mean level would compute all of it."""

    def __init__(self, level: Any, axis: int) -> None:
        if len(level.shape) != 3 or axis not in (0, 1, 2):
            raise ValueError(f"a level of channels is (H, W, C) with its channel axis at 0, "
                             f"1 or 2; got shape {tuple(level.shape)} and axis {axis}.")
        self.level, self.axis = level, int(axis)
        shape = [int(n) for n in level.shape[:2]]
        shape.insert(self.axis, int(level.shape[2]))
        self.shape = tuple(shape)
        self.dtype = np.dtype(level.dtype)

    @property
    def ndim(self) -> int:
        return 3

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __getitem__(self, key: Any) -> Any:
        key = _full_key(key, 3)
        c = key[self.axis]
        yx = [k for i, k in enumerate(key) if i != self.axis]
        if isinstance(c, numbers.Integral) and all(k == slice(None) for k in yx):
            return ChannelLevel(self.level, int(range(self.shape[self.axis])[c]))
        out = np.asarray(self.level[(yx[0], yx[1], c)])
        # the level's axes (rows, columns, channels) that are left, back in this view's order
        where = [i for i in range(3) if i != self.axis] + [self.axis]
        left = [w for w, k in zip(where, (*yx, c)) if not isinstance(k, numbers.Integral)]
        return out.transpose(np.argsort(left)) if len(left) > 1 else out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = np.moveaxis(np.asarray(self.level[...]), -1, self.axis)
        return whole if dtype is None else whole.astype(dtype)

    def __repr__(self) -> str:
        return f"ChannelsAt({self.level!r}, axis={self.axis})"


class ChannelLevel:
    """One channel ``(H, W)`` of a coarse level of channels, read on demand (its blocks are
    the level's, computed once for all channels)."""

    def __init__(self, level: Any, channel: int) -> None:
        self.level, self.channel = level, int(channel)
        self.shape = tuple(int(n) for n in level.shape[:2])
        self.dtype = np.dtype(level.dtype)

    @property
    def ndim(self) -> int:
        return 2

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __getitem__(self, key: Any) -> np.ndarray:
        ky, kx = _full_key(key, 2)
        return np.asarray(self.level[(ky, kx, self.channel)])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self[...]
        return whole if dtype is None else whole.astype(dtype)

    def __repr__(self) -> str:
        return f"ChannelLevel({self.level!r}, channel={self.channel})"

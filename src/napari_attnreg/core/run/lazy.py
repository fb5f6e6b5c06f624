"""Large images read on demand: (OME-/Big)TIFF through tifffile's zarr view, OME-Zarr.

A tiled run (:mod:`.tiled_engine`) of a :class:`LazyImage` never holds the whole image: the
intensity percentiles and the image-level null statistics come from a strided read of at
most ~16 M pixels, and every tile is read (and scaled) when its chunk is processed.
Requires ``zarr`` (the ``scale`` extra).

Example
-------
>>> image = open_lazy("slide.ome.tif")                          # doctest: +SKIP
>>> regularize(image, "demo", tiled=True, n_boot=200)            # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from napari_attnreg.core.files import UnreadableFileError, decoding

if TYPE_CHECKING:  # torch is imported where tiles become tensors: napari's reader probe and
    # the slide readers import this module for LazyImage and the pixel budget, and must not
    # pay for torch (seconds, some 500 MB) to say whether they read a file
    import torch

SAMPLE_PIXELS = 1 << 24  # the strided read for percentiles and null statistics


def _zarr() -> Any:
    try:
        import zarr
    except ImportError as err:
        raise ValueError("Reading large images lazily needs zarr: pip install "
                         "'napari-attnreg[scale]'.") from err
    return zarr


def full_resolution_array(node: Any) -> Any:
    """The full-resolution array of a zarr array, an OME-Zarr group or a tifffile pyramid."""
    if hasattr(node, "shape") and hasattr(node, "dtype"):
        return node
    attrs = dict(node.attrs)
    multiscales = attrs.get("multiscales") or attrs.get("ome", {}).get("multiscales")
    if multiscales:
        return node[multiscales[0]["datasets"][0]["path"]]
    if "0" in node:  # tifffile's view of a pyramidal TIFF: level 0 first
        return node["0"]
    raise ValueError("This zarr group has no multiscales metadata and no array '0'; open the "
                     "image array itself.")


@dataclass
class LazyImage:
    """A 2D image (grey, RGB(A), or channels first) whose pixels stay on disk.

    Attributes
    ----------
    array : zarr-like
        Indexable ``(H, W)``, ``(H, W, C)`` or ``(C, H, W)``.
    channel_axis : int or None
        0 for channels first, -1 for channels last, None for grey.
    path : str
    """

    array: Any
    channel_axis: int | None
    path: str = ""
    #: Stored pixels per analysed pixel: above 1 when a slide is read at a coarser physical
    #: resolution than its nearest pyramid level (:func:`napari_attnreg.io.slides.open_slide`).
    scale: float = 1.0
    #: Micrometres per analysed pixel, when the file says.
    mpp: float | None = None
    #: Pyramid level read (slides), None for a single-resolution file.
    level: int | None = None
    #: A coarser level of the same image, ``(h, w[, C])`` zarr-like, for thumbnails.
    overview_array: Any = None
    #: Full-resolution (level 0) pixels per stored pixel of the level read (slides).
    downsample: float = 1.0

    @property
    def shape(self) -> tuple[int, int]:
        """``(H, W)`` as stored."""
        s = self.array.shape
        return (int(s[1]), int(s[2])) if self.channel_axis == 0 else (int(s[0]), int(s[1]))

    @property
    def has_alpha(self) -> bool:
        """RGBA: a fourth channel last, which :meth:`read` leaves out."""
        return self.channel_axis == -1 and int(self.array.shape[-1]) == 4

    def transparency(self) -> float:
        """The share of pixels not fully opaque in a strided sample of the alpha channel (0
        for an image without alpha, or whose fourth channel marks no pixel opaque)."""
        if not self.has_alpha:
            return 0.0
        h, w = self.shape
        step = sample_step((h, w))
        with decoding(self.path):
            alpha = np.asarray(self.array[0:h:step, 0:w:step, 3])
        opaque = np.iinfo(alpha.dtype).max if alpha.dtype.kind in "iu" else (
            True if alpha.dtype == bool else 1.0)
        if not alpha.size or not (alpha >= opaque).any():  # nothing opaque: no alpha (as
            return 0.0                                      # images.flatten_alpha reads it)
        return float(np.mean(alpha < opaque))

    @property
    def analysed_shape(self) -> tuple[int, int]:
        """``(H, W)`` of the image a run analyses: the stored size divided by ``scale``."""
        h, w = self.shape
        return (max(1, round(h / self.scale)), max(1, round(w / self.scale)))

    @property
    def pixel_origin(self) -> float:
        """Where the centre of analysed pixel 0 lies, in µm, when full-resolution pixel 0's
        centre is at 0 (a slide viewer's frame: napari's slide layer, QuPath): an analysed
        pixel of a level downsampled ``d`` times spans ``d`` full-resolution pixels, so its
        centre is ``(d − 1)/2`` of them further on. 0 for images that are no slide level."""
        if self.mpp is None or self.level is None:
            return 0.0
        d = float(self.downsample) * float(self.scale)
        return (d - 1) / 2 * float(self.mpp) / d

    def run_extra(self) -> dict[str, Any]:
        """What a run of this image records when the caller gave nothing else
        (``RunConfig.extra``): the pixel size in µm as ``spatial``; of a slide, that it is a
        pathology image, the level read and its resampling."""
        extra: dict[str, Any] = {}
        if self.mpp is not None:
            extra["spatial"] = {"scale": [float(self.mpp)] * 2,
                                "translate": [self.pixel_origin] * 2, "units": ["µm", "µm"]}
        if self.level is not None:  # the level read, whichever option chose it
            extra.update(image_kind="pathology", image_kind_source="slide file",
                         slide_level=self.level, slide_resample=self.scale,
                         # full-resolution pixels per analysed pixel: QuPath's frame
                         slide_downsample=float(self.downsample) * float(self.scale))
        return extra

    def overview(self, max_pixels: int = SAMPLE_PIXELS) -> np.ndarray:
        """The whole image at about ``max_pixels`` pixels or fewer (a strided read, from the
        coarser level when there is one), for intensity ranges and tissue masks."""
        source = self if self.overview_array is None else LazyImage(
            self.overview_array, -1 if len(self.overview_array.shape) == 3 else None, self.path)
        h, w = source.shape
        step = max(1, int(np.ceil(np.sqrt(h * w / max_pixels))))
        return source.read(slice(0, h, step), slice(0, w, step))

    def level_shown(self, max_pixels: int) -> bool:
        """Whether :meth:`picture` reads the level itself rather than its coarser level.

        A slide's coarser level (:attr:`overview_array`) can be 4 or 16 times coarser a side
        than the level analysed: shown from it, a small slide's figure is a blur of the
        pixels the model saw. The level is read when its strided read of at most
        ``max_pixels`` holds more pixels than the coarser level, and it has at most
        :data:`SAMPLE_PIXELS` (the read then costs no more than the statistics' sample).
        """
        if self.overview_array is None:
            return True
        h, w = self.shape
        if h * w > SAMPLE_PIXELS:
            return False
        step = max(1, int(np.ceil(np.sqrt(h * w / max_pixels))))
        oh, ow = (int(v) for v in self.overview_array.shape[:2])
        return -(-h // step) * -(-w // step) > oh * ow

    def picture(self, max_pixels: int, extent: tuple[int, int] | None = None) -> np.ndarray:
        """The image for showing it, at about ``max_pixels`` pixels or fewer: a strided read
        of the level itself where it shows more than its coarser level
        (:meth:`level_shown`), else of the coarser level (:meth:`overview`, the whole image).

        ``extent``: the level's first rows and columns to show when the level is read (a
        tiled run's whole patches); default, all of them.
        """
        if not self.level_shown(max_pixels):
            return self.overview(max_pixels)
        h, w = self.shape if extent is None else extent
        step = max(1, int(np.ceil(np.sqrt(h * w / max_pixels))))
        return self.read(slice(0, h, step), slice(0, w, step))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.array.dtype)

    def read_whole(self) -> np.ndarray:
        """The whole image at the size it is analysed (:attr:`analysed_shape`), in memory:
        the level's pixels, resampled (anti-aliased) when it was opened at a coarser
        resolution. For an untiled run; check the pixel budget first
        (:func:`check_untiled_size`)."""
        pixels = self.read(slice(None), slice(None))
        if self.scale == 1:
            return pixels
        from skimage.transform import resize

        shape = (*self.analysed_shape, *pixels.shape[2:])
        return resize(pixels, shape, preserve_range=True, anti_aliasing=True).astype(pixels.dtype)

    def read(self, ys: slice, xs: slice) -> np.ndarray:
        """Pixels ``[ys, xs]`` as ``(h, w)`` or ``(h, w, C≤3)`` (alpha dropped)."""
        try:
            with decoding(self.path):  # tiles are decoded here, long after the file was opened
                if self.channel_axis == 0:
                    block = np.moveaxis(np.asarray(self.array[:, ys, xs]), 0, -1)
                elif (tiles := _strided_tiles(self.array, ys, xs)) is not None:
                    block = tiles.strided(ys, xs)  # a thumbnail: the tiles decoded at once
                else:
                    block = np.asarray(self.array[ys, xs])
        except UnreadableFileError:
            settle_zarr_reads()  # the damage is said once, here, not once per lost tile
            raise
        if block.ndim == 3:
            block = block[..., :3] if block.shape[-1] == 4 else block
            if block.shape[-1] == 1:
                block = block[..., 0]
        return block


def settle_zarr_reads(timeout: float = 30.0) -> None:
    """Wait for the chunk reads zarr still runs, and take their errors.

    zarr reads a region's chunks as concurrent tasks on its own event loop; when a chunk of
    a damaged file fails, the region's read raises at once and leaves its other chunks'
    tasks behind. Their errors (the same damage, already reported) were printed by asyncio
    as dozens of "Task exception was never retrieved" tracebacks, and more at exit ("Task
    was destroyed but it is pending", "Event loop is closed"), after the one clear line.
    Nothing happens without zarr's loop (zarr not used, or another version of it).
    """
    try:
        from zarr.core import sync
        loop = sync.loop[0]
    except (ImportError, AttributeError, IndexError):
        return
    if loop is None or not loop.is_running() or loop.is_closed():
        return

    async def settle() -> None:
        current = asyncio.current_task()
        left = [task for task in asyncio.all_tasks() if task is not current]
        await asyncio.gather(*left, return_exceptions=True)  # their errors taken, not logged

    with contextlib.suppress(Exception):  # never hide the file's own error behind this
        asyncio.run_coroutine_threadsafe(settle(), loop).result(timeout)


def _strided_tiles(array: Any, ys: slice, xs: slice) -> Any:
    """The :class:`~napari_attnreg.core.run.tiff_tiles.TiffTiles` of ``array`` for a strided
    read (a thumbnail of a large one-level TIFF decoded every tile one at a time through
    zarr's store: 5.4 s for 20000²); None for a region (read through the store, which the
    run's chunk cache keeps) or an array that is no tiled TIFF page."""
    if (ys.step or 1) == 1 and (xs.step or 1) == 1:
        return None
    from napari_attnreg.core.run.tiff_tiles import TiffTiles

    tiles = TiffTiles.of(array)
    return None if tiles is None or tiles.closed else tiles


class ChunkCache:
    """Regions of a chunked image (a slide level) read through its decoded chunks, kept a while.

    A slide's JPEG tiles are larger than a model's tiles and the model's tiles overlap: read
    region by region, each stored tile was decoded once per model tile touching it (some 30
    times for 512² JPEG tiles and 128² model tiles with a quarter overlap). Here each stored
    chunk is decoded once and kept, the least recently used first dropped, up to ``capacity``
    chunks (by default two rows of chunks across the image: the tiles come row by row). The
    pixels are those of :meth:`LazyImage.read`. Safe to share between threads.
    """

    def __init__(self, image: LazyImage, capacity: int | None = None) -> None:
        chunks = getattr(image.array, "chunks", None)
        if image.channel_axis == 0 or chunks is None or len(chunks) < 2:
            raise ValueError("ChunkCache reads chunked images with channels last (or grey).")
        self.image = image
        self.chunk = (int(chunks[0]), int(chunks[1]))
        across = -(-image.shape[1] // self.chunk[1])
        self.capacity = int(capacity) if capacity is not None else 2 * across + 8
        self._blocks: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def _block(self, cy: int, cx: int) -> np.ndarray:
        key = (cy, cx)
        if key in self._blocks:
            self._blocks.move_to_end(key)
            return self._blocks[key]
        (ch, cw), (h, w) = self.chunk, self.image.shape
        block = self.image.read(slice(cy * ch, min((cy + 1) * ch, h)),
                                slice(cx * cw, min((cx + 1) * cw, w)))
        self._blocks[key] = block
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
        return block

    def read(self, ys: slice, xs: slice) -> np.ndarray:
        """Pixels ``[ys, xs]`` (steps of 1, inside the image) as :meth:`LazyImage.read`."""
        (ch, cw), (h, w) = self.chunk, self.image.shape
        y0, y1 = max(0, ys.start or 0), min(h, h if ys.stop is None else ys.stop)
        x0, x1 = max(0, xs.start or 0), min(w, w if xs.stop is None else xs.stop)
        out = None
        with self._lock:
            for cy in range(y0 // ch, (y1 - 1) // ch + 1):
                for cx in range(x0 // cw, (x1 - 1) // cw + 1):
                    block = self._block(cy, cx)
                    if out is None:
                        out = np.empty((y1 - y0, x1 - x0, *block.shape[2:]), dtype=block.dtype)
                    by, bx = max(y0, cy * ch), max(x0, cx * cw)
                    ey, ex = min(y1, (cy + 1) * ch), min(x1, (cx + 1) * cw)
                    out[by - y0:ey - y0, bx - x0:ex - x0] = \
                        block[by - cy * ch:ey - cy * ch, bx - cx * cw:ex - cx * cw]
        if out is None:
            raise ValueError(f"empty region {ys}, {xs} of an image of {h}x{w} pixels.")
        return out

    def clear(self) -> None:
        """Drop the kept chunks."""
        with self._lock:
            self._blocks.clear()


def open_lazy(path: str | Path, *, channel_axis: int | None = None) -> LazyImage:
    """Open a TIFF/OME-TIFF/BigTIFF or an OME-Zarr without reading its pixels.

    The layout follows :class:`~.planes.PlaneStack` (with the file's own axis names where it
    has them); singleton stack axes (OME's t, z of length 1) are dropped, a stack with more
    than one plane must be split first.

    Raises
    ------
    ValueError
        The file is not a readable TIFF/OME-Zarr (the message names it), holds more than one
        plane, or its layout is ambiguous (give ``channel_axis``).
    """
    from napari_attnreg.core.run.planes import PlaneStack

    zarr = _zarr()
    path = Path(path)
    if path.suffix.lower() not in (".tif", ".tiff") and not path.is_dir():
        raise ValueError(f"{path}: lazy reading supports .tif/.tiff files and .zarr folders.")
    with decoding(path):
        array, axes = _open_tiff(path, zarr) if not path.is_dir() else _open_zarr(path, zarr)
    hints = {"channel_axis": channel_axis} if channel_axis is not None else layout_hints(axes)
    try:
        stack = PlaneStack.from_array(array, **hints)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    if stack.n_planes > 1:
        raise ValueError(f"{path} holds {stack.n_planes} planes (stack shape {stack.stack_shape}): "
                         "lazy tiling reads one 2D plane; split the stack into planes first.")
    rows = stack.image_axes[0]
    squeeze = tuple(0 if a in stack.stack_axes else slice(None) for a in range(rows))
    if any(s == 0 for s in squeeze):
        array = _Squeezed(array, squeeze)
    inner = stack.plane_channel_axis()
    if stack.n_channels > (4 if stack.rgb else 3):
        raise ValueError(f"{path} has {stack.n_channels} channels: lazy tiling reads up to 3; "
                         "choose channels (channels=[...]) on an in-memory image instead.")
    if stack.rgb or inner == 2:
        return LazyImage(array, -1, str(path))
    if inner in (None, 0):
        return LazyImage(array, inner, str(path))
    raise ValueError(f"{path}: channels between the image axes (shape {stack.shape}) cannot be "
                     "read lazily; save the image with channels first or last.")


def layout_hints(axes: str) -> dict[str, Any]:
    """``PlaneStack.from_array`` keywords from axis letters ('' when the file names none)."""
    from napari_attnreg.core.run.planes import layout_from_axes

    return layout_from_axes(axes) if axes else {}


def _open_tiff(path: Path, zarr: Any) -> tuple[Any, str]:
    import tifffile

    with tifffile.TiffFile(path) as tif:
        if not tif.series:
            raise ValueError("the TIFF holds no image")
        axes = tif.series[0].axes
    return full_resolution_array(zarr.open(tiff_store(path), mode="r")), axes


def tiff_store(path: str | Path, **aszarr: Any) -> Any:
    """tifffile's zarr store of a TIFF (``aszarr``: ``TiffFile.aszarr``'s keywords, e.g.
    ``series=0``) whose file is closed once nothing reads through it.

    ``tifffile.imread(path, aszarr=True)`` closes its file and the store opens it again on
    the first tile read, into a cache that only ``store.close()`` empties, which no array over
    the store calls: every image opened so left an unclosed file to the garbage collector
    (a ResourceWarning). Here the store reads through an open ``TiffFile`` that the store's
    pages hold, closed when the last of them is gone.
    """
    import weakref

    import tifffile

    tif = tifffile.TiffFile(path)
    try:
        store = tif.aszarr(**aszarr)
    except BaseException:
        tif.close()
        raise
    weakref.finalize(tif, tif.filehandle.close)  # holds the file handle, not the TiffFile
    return store


def _open_zarr(path: Path, zarr: Any) -> tuple[Any, str]:
    node = zarr.open(str(path), mode="r")
    axes = ""
    if not (hasattr(node, "shape") and hasattr(node, "dtype")):
        attrs = dict(node.attrs)
        multiscales = attrs.get("multiscales") or attrs.get("ome", {}).get("multiscales") or [{}]
        names = [a.get("name", "") if isinstance(a, dict) else str(a)
                 for a in multiscales[0].get("axes", [])]
        axes = "".join(n[:1].upper() for n in names) if all(names) else ""
    array = full_resolution_array(node)
    return array, axes if len(axes) == len(array.shape) else ""


class _Squeezed:
    """Index view of an array with some leading singleton axes fixed at 0."""

    def __init__(self, array: Any, lead: tuple) -> None:
        self.array, self.lead = array, lead
        kept = [n for n, s in zip(array.shape, lead, strict=False) if s != 0]
        self.shape = (*kept, *array.shape[len(lead):])
        self.dtype = array.dtype

    def __getitem__(self, key: Any) -> Any:
        key = key if isinstance(key, tuple) else (key,)
        full, it = [], iter(key)
        for s in self.lead:
            full.append(0 if s == 0 else next(it, slice(None)))
        return self.array[(*full, *it)]


#: Pixels above which an untiled run refuses an image before reading it: 8192² (67 M).
#: An untiled run holds the image, its float32 copy and the scaled copy at once (12 bytes a
#: pixel for grey, 36 for RGB: 2.4 GB for an RGB image of this size) before resizing it to
#: the model input, where a tiled run reads it tile by tile. Above this the analysis at the
#: model's input size also throws away more than 99.9 % of the pixels.
MAX_UNTILED_PIXELS = 8192 * 8192


def check_untiled_size(shape: tuple[int, ...], name: str = "The image",
                       limit: int = MAX_UNTILED_PIXELS) -> None:
    """Refuse an untiled run of an image whose plane has more than ``limit`` pixels.

    Called with the shape a file's header (or a lazy array) states, before its pixels are
    read; ``shape`` is ``(H, W)`` of one plane.

    Raises
    ------
    ValueError
        Naming ``--tiled`` / ``tiled=True``.
    """
    h, w = int(shape[0]), int(shape[1])
    if h * w > limit:
        raise ValueError(
            f"{name} is {h}x{w} pixels ({h * w / 1e6:.0f} M), more than an untiled run reads "
            f"into memory ({limit / 1e6:.0f} M pixels); run it tiled (--tiled on the command "
            "line, tiled=True in Python, 'Tiled' in napari), or choose a coarser slide level "
            "(--level / --mpp).")


def sample_step(shape: tuple[int, int]) -> int:
    """Stride of a read of at most about :data:`SAMPLE_PIXELS` pixels."""
    return max(1, int(np.ceil(np.sqrt(shape[0] * shape[1] / SAMPLE_PIXELS))))


def intensity_range(sample: np.ndarray,
                    percentiles: tuple[float, float] = (0.5, 99.8)) -> tuple[float, float]:
    """``(lo, hi)``: the scaling of ``scale_intensity`` taken from a strided sample of the
    image (uint8 → 0..255, bool → 0..1, as for in-memory images)."""
    if sample.dtype == np.uint8:
        return 0.0, 255.0
    if sample.dtype == np.bool_:
        return 0.0, 1.0
    from napari_attnreg.core.run.images import check_finite

    check_finite(sample)  # NaN/inf are named as such, not reported as a constant image
    sample = sample.astype(np.float64 if sample.dtype.itemsize > 4 else np.float32)
    lo, hi = (float(v) for v in np.percentile(sample, percentiles))
    if hi <= lo:
        lo, hi = float(sample.min()), float(sample.max())
    if hi <= lo:
        raise ValueError("The image is constant (every pixel has the same value), so attention on "
                         "it has nothing to find; check that the right file was chosen.")
    return lo, hi


def scaled(block: np.ndarray, lo: float, hi: float) -> torch.Tensor:
    """``(h, w[, c])`` raw pixels → ``(c, h, w)`` float32 in [0, 1]."""
    import torch

    if block.dtype.kind == "f" and block.dtype.itemsize > 4:  # float64 beyond float32's range
        block = np.clip((block - lo) / (hi - lo), 0.0, 1.0)
        lo, hi = 0.0, 1.0
    out = torch.from_numpy(np.ascontiguousarray(block, dtype=np.float32))
    out = ((out - lo) / (hi - lo)).clamp_(0.0, 1.0)
    return out[None] if out.ndim == 2 else out.permute(2, 0, 1).contiguous()


def to_unit(blocks: Sequence[np.ndarray], lo: float, hi: float, size: tuple[int, int],
            device: torch.device | str = "cpu") -> torch.Tensor:
    """Raw tiles → ``(n, c, th, tw)`` float32 in [0, 1] on ``device``, resampled to ``size``.

    The scaling and the resampling run on ``device``: 8-bit tiles travel as bytes (a quarter
    of their float size) and a GPU does the arithmetic. On the CPU the values equal
    :func:`scaled`'s.
    """
    import torch
    import torch.nn.functional as F

    stack = np.stack(blocks)
    if stack.dtype.kind == "f" and stack.dtype.itemsize > 4:  # as scaled(): float64 first
        stack = np.clip((stack - lo) / (hi - lo), 0.0, 1.0)
        lo, hi = 0.0, 1.0
    if stack.dtype not in (np.uint8, np.float32):  # torch lacks most unsigned types
        stack = stack.astype(np.float32)
    out = torch.from_numpy(np.ascontiguousarray(stack)).to(device, non_blocking=True).float()
    out = ((out - lo) / (hi - lo)).clamp_(0.0, 1.0)
    out = out[:, None] if out.ndim == 3 else out.permute(0, 3, 1, 2)
    if tuple(out.shape[-2:]) != tuple(size):
        out = F.interpolate(out, size=tuple(size), mode="bilinear", align_corners=False,
                            antialias=out.shape[-2] > size[0] or out.shape[-1] > size[1])
    return out.contiguous()


class TileReader:
    """Tiles read in a thread, in run order, at most ``depth`` ahead of the compute.

    The queue is bounded so a fast disk never fills memory with tiles the model has not
    reached; :meth:`close` (on completion, error, cancel or a generator closed early) stops
    the thread within one read.

    Parameters
    ----------
    read : callable
        ``read(index)`` → one raw tile (runs in the thread).
    order : sequence of int
        The tiles, in the order :meth:`take` asks for them.
    depth : int
        Tiles read ahead at most.
    """

    def __init__(self, read: Callable[[int], Any], order: Sequence[int], depth: int) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, int(depth)))
        self._stop = threading.Event()
        self._held: dict[int, Any] = {}
        self._thread = threading.Thread(target=self._fill, args=(read, list(order)),
                                        name="attnreg-tile-reader", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """The reading thread is still running."""
        return self._thread.is_alive()

    def _fill(self, read: Callable[[int], Any], order: list[int]) -> None:
        for position, index in enumerate(order):
            if self._stop.is_set():
                return
            try:
                item = (position, read(index), None)
            except BaseException as err:  # noqa: BLE001 - handed to the consumer, raised there
                item = (position, None, err)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.05)
                    break
                except queue.Full:
                    continue
            if item[2] is not None:
                return

    def take(self, start: int, size: int) -> list[Any]:
        """Tiles at positions ``start .. start + size`` of ``order`` (again after a retry)."""
        for position in [p for p in self._held if p < start]:
            del self._held[position]  # consumed: a retry after out-of-memory restarts at start
        wanted = range(start, start + size)
        while any(p not in self._held for p in wanted):
            try:
                position, block, err = self._queue.get(timeout=0.1)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("The tile reader stopped before the last tile.") from None
                continue
            if err is not None:
                self.close()
                raise err
            self._held[position] = block
        return [self._held[p] for p in wanted]

    def close(self) -> None:
        """Stop the thread and drop what it read."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=10)
        self._held.clear()

    def __enter__(self) -> TileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

SAMPLE_PIXELS = 1 << 24  # the strided read for percentiles and null statistics


def _zarr() -> Any:
    try:
        import zarr
    except ImportError as err:
        raise ValueError("Reading large images lazily needs zarr: pip install "
                         "'napari-attnreg[scale]'.") from err
    return zarr


def _level0(node: Any) -> Any:
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

    @property
    def shape(self) -> tuple[int, int]:
        """``(H, W)``."""
        s = self.array.shape
        return (int(s[1]), int(s[2])) if self.channel_axis == 0 else (int(s[0]), int(s[1]))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.array.dtype)

    def read(self, ys: slice, xs: slice) -> np.ndarray:
        """Pixels ``[ys, xs]`` as ``(h, w)`` or ``(h, w, C≤3)`` (alpha dropped)."""
        if self.channel_axis == 0:
            block = np.moveaxis(np.asarray(self.array[:, ys, xs]), 0, -1)
        else:
            block = np.asarray(self.array[ys, xs])
        if block.ndim == 3:
            block = block[..., :3] if block.shape[-1] == 4 else block
            if block.shape[-1] == 1:
                block = block[..., 0]
        return block


def open_lazy(path: str | Path) -> LazyImage:
    """Open a TIFF/OME-TIFF/BigTIFF or an OME-Zarr without reading its pixels.

    Singleton leading axes (OME's t, c, z of length 1) are dropped; a stack with more than
    one plane must be split first.
    """
    zarr = _zarr()
    path = Path(path)
    if path.suffix.lower() in (".tif", ".tiff"):
        import tifffile

        node = zarr.open(tifffile.imread(path, aszarr=True), mode="r")
    elif path.is_dir():
        node = zarr.open(str(path), mode="r")
    else:
        raise ValueError(f"{path}: lazy reading supports .tif/.tiff and .zarr folders.")
    array = _level0(node)
    shape = tuple(int(v) for v in array.shape)
    lead = [i for i, n in enumerate(shape[:-2]) if n != 1]
    squeeze = tuple(0 if i not in lead else slice(None) for i in range(len(shape) - 2))
    if len(shape) > 2 and squeeze:
        array = _Squeezed(array, squeeze) if any(s == 0 for s in squeeze) else array
        shape = tuple(int(v) for v in array.shape)
    if len(shape) == 2:
        return LazyImage(array, None, str(path))
    if len(shape) == 3 and shape[-1] in (3, 4):
        return LazyImage(array, -1, str(path))
    if len(shape) == 3 and shape[0] <= 3:
        return LazyImage(array, 0, str(path))
    raise ValueError(f"{path} has shape {shape}: lazy tiling reads one 2D plane (grey, RGB or up "
                     "to 3 channels first); split stacks into planes first.")


class _Squeezed:
    """Index view of an array with some leading singleton axes fixed at 0."""

    def __init__(self, array: Any, lead: tuple) -> None:
        self.array, self.lead = array, lead
        kept = [n for n, s in zip(array.shape, lead) if s != 0]
        self.shape = (*kept, *array.shape[len(lead):])
        self.dtype = array.dtype

    def __getitem__(self, key: Any) -> Any:
        key = key if isinstance(key, tuple) else (key,)
        full, it = [], iter(key)
        for s in self.lead:
            full.append(0 if s == 0 else next(it, slice(None)))
        return self.array[(*full, *it)]


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
    sample = sample.astype(np.float32)
    lo, hi = (float(v) for v in np.percentile(sample, percentiles))
    if hi <= lo:
        lo, hi = float(sample.min()), float(sample.max())
    if hi <= lo:
        raise ValueError("The image is constant (every pixel has the same value), so attention on "
                         "it has nothing to find; check that the right file was chosen.")
    return lo, hi


def scaled(block: np.ndarray, lo: float, hi: float) -> torch.Tensor:
    """``(h, w[, c])`` raw pixels → ``(c, h, w)`` float32 in [0, 1]."""
    out = torch.from_numpy(np.ascontiguousarray(block, dtype=np.float32))
    out = ((out - lo) / (hi - lo)).clamp_(0.0, 1.0)
    return out[None] if out.ndim == 2 else out.permute(2, 0, 1).contiguous()

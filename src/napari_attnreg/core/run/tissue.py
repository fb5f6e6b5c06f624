"""Which tiles of a slide hold tissue: a mask from a thumbnail, or the user's own.

A whole-slide image is mostly glass. A tiled run with a tissue mask runs only the tiles whose
area is at least :data:`TISSUE_FRACTION` tissue, and only those tiles are families of the
step-down's Benjamini–Hochberg step, so glass neither costs forward passes nor dilutes the
family's level. The automatic mask is Otsu's threshold on the HSV saturation of a thumbnail
(stained tissue is coloured, glass is grey-white); on a grey image, on its brightness, the
background being the class nearer its extreme: bright glass (brightfield: tissue is darker)
or a black field (dark-field, fluorescence: tissue is brighter).

Example
-------
>>> thumb = np.zeros((64, 64, 3), np.uint8) + 235; thumb[:20, :20] = (150, 60, 120)
>>> auto_tissue_mask(thumb)[:20, :20].all(), auto_tissue_mask(thumb)[40:, 40:].any()
(True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.core.files import decoding
from napari_attnreg.core.run.tiling import TileLayout

#: A tile is run when at least this share of its area is tissue. Low, so that the edge of a
#: section is analysed; a tile of a few stray pixels (dust, a pen mark's halo) is not.
TISSUE_FRACTION = 0.10
#: Below this mean saturation the darker/greyer Otsu class is glass; above it the thumbnail has
#: no glass (a crop inside the tissue) and every pixel is tissue, instead of half the tissue
#: being cut away by a threshold between two stains.
#: On a grey thumbnail, the least difference in brightness (as a share of white) between
#: the two Otsu classes for one of them to be tissue; below it the thumbnail is one tone
#: (blank glass, an empty black field) and holds no tissue.
GLASS_SATURATION = 0.08
#: Thumbnail pixels the saturation is averaged over before the threshold (Gaussian sigma).
SMOOTHING_SIGMA = 2.0
#: Values of the ``tissue_mask`` option that are not a file.
TISSUE_MODES = ("auto", "none")


@dataclass(frozen=True)
class TissueMask:
    """A mask over the whole image and the tiles it keeps.

    Attributes
    ----------
    mask : np.ndarray of bool
        ``(h, w)`` at any resolution covering the whole image (a thumbnail's).
    source : str
        How it was made: ``"auto (Otsu on saturation)"`` (colour),
        ``"auto (Otsu on darkness, bright background)"`` or
        ``"auto (Otsu on brightness, dark background)"`` (grey), ``"file <name>"``,
        ``"array"``.
    tiles : np.ndarray of bool
        ``(n_tiles,)``: the tiles that are run.
    fraction : float
        The least tissue share of a tile that is run.
    """

    mask: np.ndarray
    source: str
    tiles: np.ndarray
    fraction: float = TISSUE_FRACTION

    @property
    def n_tissue(self) -> int:
        return int(self.tiles.sum())

    def record(self) -> dict[str, Any]:
        """What a result's metadata says about the mask."""
        return {"tissue_mask": self.source, "tissue_fraction_min": self.fraction,
                "n_tissue_tiles": self.n_tissue, "n_tiles_total": int(self.tiles.size)}


#: How :func:`auto_tissue` names what it thresholded.
AUTO_COLOUR = "auto (Otsu on saturation)"
AUTO_BRIGHT_BACKGROUND = "auto (Otsu on darkness, bright background)"
AUTO_DARK_BACKGROUND = "auto (Otsu on brightness, dark background)"
AUTO_ONE_TONE = "auto (Otsu on brightness, one tone: no tissue)"


def auto_tissue_mask(thumbnail: np.ndarray) -> np.ndarray:
    """Tissue pixels of a thumbnail: Otsu on saturation (colour) or brightness (grey).

    Otsu's threshold always splits an image in two, even one of glass alone (its grain), so
    each class is also judged on its own level: in colour the tissue class must be more
    saturated than glass (:data:`GLASS_SATURATION`) and the glass class less; in grey the two
    must differ in brightness by that much of the top value (255 for 8 bits, else the top of
    the bits used), and the background is the class nearer its extreme: the bright class
    when its mean is nearer white than the dark class's is to black (glass of a brightfield
    slide), else the dark class (the black field of a dark-field or fluorescence slide).

    Parameters
    ----------
    thumbnail : np.ndarray
        ``(h, w)`` grey or ``(h, w, 3[+])`` RGB, any numeric type.

    Returns
    -------
    np.ndarray of bool
        ``(h, w)``; all True when the thumbnail holds no glass, all False when it holds no
        tissue.
    """
    return auto_tissue(thumbnail)[0]


def auto_tissue(thumbnail: np.ndarray) -> tuple[np.ndarray, str]:
    """:func:`auto_tissue_mask` and how it was made (``"auto (Otsu on saturation)"``,
    ``"auto (Otsu on darkness, bright background)"``, ...), which the result records."""
    from skimage.color import rgb2hsv
    from skimage.filters import gaussian, threshold_otsu

    image = np.asarray(thumbnail, dtype=np.float64)
    colour = image.ndim == 3 and image.shape[-1] >= 3
    if colour:
        top = 255.0 if np.asarray(thumbnail).dtype == np.uint8 else max(float(image.max()), 1e-12)
        signal = rgb2hsv(np.clip(image[..., :3] / top, 0.0, 1.0))[..., 1]
    else:
        grey = image[..., 0] if image.ndim == 3 else image
        black, white = _grey_range(np.asarray(thumbnail).dtype, grey)
        signal = (grey - black) / (white - black)  # brightness: 0 black, 1 white
    # pixel noise (a stain's grain, JPEG blocks) would speckle the mask: threshold the local mean
    signal = gaussian(signal, sigma=SMOOTHING_SIGMA, preserve_range=True)
    if float(signal.max()) - float(signal.min()) < 1e-6:
        if colour:
            return np.full(signal.shape, float(signal.mean()) > GLASS_SATURATION), AUTO_COLOUR
        return np.zeros(signal.shape, dtype=bool), AUTO_ONE_TONE
    low = signal <= threshold_otsu(signal)
    lower, upper = float(signal[low].mean()), float(signal[~low].mean())
    if not colour:
        if upper - lower <= GLASS_SATURATION:  # one tone: glass, or an empty black field
            return np.zeros(signal.shape, dtype=bool), AUTO_ONE_TONE
        if 1.0 - upper < lower:  # the bright class is nearer white: glass, tissue is darker
            return low, AUTO_BRIGHT_BACKGROUND
        return ~low, AUTO_DARK_BACKGROUND  # a black field, tissue is brighter
    if upper <= GLASS_SATURATION:  # both classes are glass: the split is its grain
        return np.zeros(signal.shape, dtype=bool), AUTO_COLOUR
    if lower > GLASS_SATURATION:  # both classes are tissue
        return np.ones(signal.shape, dtype=bool), AUTO_COLOUR
    return ~low, AUTO_COLOUR


def _grey_range(dtype: np.dtype, grey: np.ndarray) -> tuple[float, float]:
    """``(black, white)`` of a grey thumbnail: 0 and 255 for 8 bits; otherwise 0 (or the
    least value, when negative) and the top of the bits used (4095 for 12 bits stored in
    16; 1 for floats in 0..1), so that bright tissue on a black field is not taken for
    white glass because it is the brightest thing on the slide."""
    if dtype == np.uint8:
        return 0.0, 255.0
    black = min(0.0, float(grey.min()))
    top = float(grey.max())
    if top <= 1.0:
        white = 1.0
    else:
        white = float(2.0 ** np.ceil(np.log2(top + 1.0)) - 1.0)
    return black, max(white, black + 1e-12)


@dataclass(frozen=True)
class NamedMask:
    """A mask array and where it came from (e.g. ``"Labels layer 'tissue'"``), which the
    result records instead of ``"array"``."""

    array: np.ndarray
    source: str

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.array, dtype=dtype)


def read_mask(value: Any) -> tuple[np.ndarray, str]:
    """A user's mask (a file name or an array) as a boolean image and how to name it.

    Files are TIFFs, ``.npy`` arrays (read without unpickling) or any image imageio reads;
    singleton axes are dropped and an RGB(A) mask is merged (its alpha, when the colour is
    black throughout). Labels > 0 are tissue; a float map in [0, 1] with values between is a
    probability, and tissue is ≥ 0.5.

    Raises
    ------
    ValueError
        The file cannot be read, or the mask is not 2D.
    """
    if isinstance(value, (str, Path)):
        path = Path(value)
        if not path.is_file():
            raise ValueError(f"tissue_mask: no such mask file {path}; give 'auto', 'none' or "
                             "the path of a mask image.")
        with decoding(path, "mask image"):
            if path.suffix.lower() == ".npy":  # numpy's own format: never unpickle objects
                array = np.load(path, allow_pickle=False)
            elif path.suffix.lower() in (".tif", ".tiff"):
                import tifffile

                array = tifffile.imread(path)
            else:
                import imageio.v3 as iio

                array = iio.imread(path)
        source = f"file {path.name}"
    else:
        array, source = np.asarray(value), str(getattr(value, "source", "array"))
    given = np.shape(array)  # as the file or the caller had it, for the message
    array = np.squeeze(array)
    if array.ndim == 3 and array.shape[-1] in (3, 4):  # a mask saved as RGB(A)
        colour = array[..., :3].max(axis=-1)
        # painted in the alpha channel alone (black, opaque where tissue): the alpha is it
        array = array[..., 3] if array.shape[-1] == 4 and not colour.any() else colour
    if array.ndim != 2 or min(array.shape) < 1:
        raise ValueError(f"tissue_mask must be a 2D mask (labels > 0 = tissue) with more than "
                         f"one row and one column, got shape {given}"
                         + (f" ({source})." if source != "array" else "."))
    if _is_probability_map(array):  # a classifier's tissue probability: > 0 would be all
        return array >= 0.5, f"{source} (probability ≥ 0.5)"
    return array > 0, source


def _is_probability_map(array: np.ndarray) -> bool:
    """Floats in [0, 1] with values between 0 and 1: a probability, not labels."""
    if array.dtype.kind != "f" or not array.size:
        return False
    finite = array[np.isfinite(array)]
    return bool(finite.size and finite.min() >= 0.0 and finite.max() <= 1.0
                and np.any((finite > 0.0) & (finite < 1.0)))


def tiles_in_tissue(mask: np.ndarray, layout: TileLayout,
                    fraction: float = TISSUE_FRACTION) -> np.ndarray:
    """``(n_tiles,)`` bool: the tiles of ``layout`` whose area is at least ``fraction`` tissue.

    The mask may have any resolution covering the same image; its aspect ratio must match.
    """
    mh, mw = mask.shape
    h, w = layout.shape
    if abs(mh / mw - h / w) > 0.05 * (h / w) + 2.0 / min(mh, mw):
        raise ValueError(f"The tissue mask ({mh}x{mw}) does not have the image's proportions "
                         f"({h}x{w}); give a mask of the whole image.")
    # summed-area table: any tile's tissue count in four look-ups
    table = np.zeros((mh + 1, mw + 1))
    table[1:, 1:] = np.cumsum(np.cumsum(mask, axis=0, dtype=np.float64), axis=1)
    th, tw = layout.tile
    y0, y1 = _spans(layout.starts[0], th, h, mh)
    x0, x1 = _spans(layout.starts[1], tw, w, mw)
    inside = (table[y1[:, None], x1[None, :]] - table[y0[:, None], x1[None, :]]
              - table[y1[:, None], x0[None, :]] + table[y0[:, None], x0[None, :]])
    # (fraction · height) · width, in the order the per-tile formula multiplied
    least = fraction * (y1 - y0)[:, None] * (x1 - x0)[None, :]
    return (inside >= least).ravel()  # C order over the starts, as the tiles


def _spans(starts: tuple[int, ...], size: int, length: int,
           mask_length: int) -> tuple[np.ndarray, np.ndarray]:
    """The extents of tiles starting at ``starts`` along one axis in mask pixels."""
    lo, hi = np.array([_span(s, size, length, mask_length) for s in starts]).T
    return lo, hi


def _span(start: int, size: int, length: int, mask_length: int) -> tuple[int, int]:
    """A tile's extent along one axis in mask pixels (at least one pixel)."""
    lo = int(np.floor(start * mask_length / length))
    hi = int(np.ceil((start + size) * mask_length / length))
    return min(lo, mask_length - 1), max(min(hi, mask_length), min(lo, mask_length - 1) + 1)


def tissue_for(spec: Any, thumbnail: np.ndarray | None, layout: TileLayout,
               fraction: float = TISSUE_FRACTION) -> TissueMask | None:
    """The :class:`TissueMask` of a run's ``tissue_mask`` option, None for ``"none"``.

    Raises
    ------
    ValueError
        No tile holds tissue (the message says how to run anyway), or the user's mask is
        unusable.
    """
    if spec is None or (isinstance(spec, str) and spec == "none"):
        return None
    if isinstance(spec, str) and spec == "auto":
        if thumbnail is None:
            raise ValueError("tissue_mask='auto' needs the image's thumbnail.")
        mask, source = auto_tissue(thumbnail)
    else:
        mask, source = read_mask(spec)
    tiles = tiles_in_tissue(mask, layout, fraction)
    if not tiles.any():
        raise ValueError(f"No tile is at least {fraction:.0%} tissue by the tissue mask "
                         f"({source}); check the mask, or run every tile with the "
                         "mask 'none' (Tissue mask in napari, tissue_mask='none' in Python, "
                         "--tissue-mask none on the command line).")
    return TissueMask(mask=mask, source=source, tiles=tiles, fraction=fraction)

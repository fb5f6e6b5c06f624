"""Pure-numpy rendering of the explorer's view: base image, colour overlay, outlines.

Everything the widget shows is composited here into one ``uint8`` RGB array, so what a
user sees can be tested without a browser and looks the same in every front end
(JupyterLab, Notebook 7, VS Code, a static HTML export). Token maps are placed on the
image with :meth:`AttentionResult.to_pixels` (the same geometry as the napari layers).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from napari_attnreg.core.results.display import SIGNIFICANT_RGB
from napari_attnreg.core.results.result import AttentionResult

#: Colour of the significant-region outline (RGB, 0–255): the one napari and the CLI use.
SIGNIFICANT_COLOR: tuple[int, int, int] = SIGNIFICANT_RGB  # type: ignore[assignment]
#: Colour of ROI outlines.
ROI_COLOR = (255, 215, 0)
#: Colour of the edge of a tiled run's tissue mask (QuPath's green for tissue annotations).
TISSUE_COLOR = (46, 204, 64)
#: A signed map is fully opaque from this share of its half-range on (napari's alpha ramp).
CENTRE_FADE = 2.5


def hex_color(rgb: tuple[int, int, int]) -> str:
    """``"#00e5ff"`` from ``(0, 229, 255)`` (for HTML and matplotlib)."""
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def colormap_lut(name: str) -> np.ndarray:
    """``(256, 3)`` uint8 lookup table of a matplotlib colormap.

    Raises
    ------
    ValueError
        For an unknown colormap name.
    """
    from matplotlib import colormaps

    if name not in colormaps:
        raise ValueError(f"Unknown colormap {name!r}; use a matplotlib name such as 'magma'.")
    cmap = colormaps[name].resampled(256)
    return (cmap(np.linspace(0.0, 1.0, 256))[:, :3] * 255).round().astype(np.uint8)


@dataclass(frozen=True)
class DisplayGrid:
    """Which original pixels are shown: every image is drawn at most ``max_size`` per side.

    Attributes
    ----------
    rows, cols : np.ndarray
        Original-pixel row / column shown at each display row / column (nearest).
    image_shape : tuple of int
        ``(H0, W0)`` of the original plane.
    """

    rows: np.ndarray
    cols: np.ndarray
    image_shape: tuple[int, int]

    @classmethod
    def for_shape(cls, image_shape: tuple[int, int], max_size: int = 768) -> DisplayGrid:
        h0, w0 = (int(v) for v in image_shape)
        # large images are subsampled so that moving a threshold slider stays interactive
        factor = max(1.0, max(h0, w0) / float(max_size))
        hd, wd = max(1, round(h0 / factor)), max(1, round(w0 / factor))
        rows = np.minimum(((np.arange(hd) + 0.5) * h0 / hd).astype(np.int64), h0 - 1)
        cols = np.minimum(((np.arange(wd) + 0.5) * w0 / wd).astype(np.int64), w0 - 1)
        return cls(rows=rows, cols=cols, image_shape=(h0, w0))

    def over(self, image_shape: tuple[int, int],
             scale: tuple[float, float] | None = None) -> DisplayGrid:
        """The same display pixels over another pixel grid of the picture: a slide's overview,
        or a result of another slide level.

        Parameters
        ----------
        image_shape : (int, int)
            ``(H, W)`` of the other grid.
        scale : (float, float), optional
            Its pixels per pixel of :attr:`image_shape`'s grid (a level-1 result over a level-0
            picture: 0.5); default, the same extent (``H / H0``). Display pixels beyond the
            other grid (a tiled run leaves out the last pixels short of a whole patch) take
            its last row or column.
        """
        hd, wd = self.shape
        h0, w0 = self.image_shape
        h, w = (int(v) for v in image_shape)
        sy, sx = scale if scale is not None else (h / h0, w / w0)
        # display pixel centres, in this grid's pixels, then in the other grid's
        rows = np.clip(((np.arange(hd) + 0.5) * h0 / hd * sy).astype(np.int64), 0, h - 1)
        cols = np.clip(((np.arange(wd) + 0.5) * w0 / wd * sx).astype(np.int64), 0, w - 1)
        return DisplayGrid(rows=rows, cols=cols, image_shape=(h, w))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows.size, self.cols.size)

    def sample(self, pixel_map: np.ndarray) -> np.ndarray:
        """An ``(H0, W0, ...)`` array on the display grid."""
        return np.asarray(pixel_map)[self.rows[:, None], self.cols[None, :]]

    def sample_tokens(self, result: AttentionResult, token_map: np.ndarray) -> np.ndarray:
        """``sample(result.to_pixels(token_map))`` without the full-size map in between
        (a tiled run's image can be far larger than what is shown)."""
        rows, cols = result._pixel_token_index()
        return np.asarray(token_map)[rows[self.rows][:, None], cols[self.cols][None, :]]


def base_rgb(display: np.ndarray) -> np.ndarray:
    """``(h, w, 3)`` float32 in [0, 1] from a grayscale or RGB display image."""
    arr = np.asarray(display, dtype=np.float32)
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=-1)
    if arr.ndim != 3 or arr.shape[-1] != 3:
        raise ValueError(f"Expected a (H, W) or (H, W, 3) display image, got shape {arr.shape}.")
    return np.clip(arr, 0.0, 1.0)


def boundary(mask: np.ndarray, width: int = 1, *, frame: bool = True) -> np.ndarray:
    """Pixels on the edge of a boolean mask, ``width`` pixels to each side of it; with
    ``frame=False`` the image's own border is no edge (tissue cut by the slide's edge)."""
    m = np.asarray(mask, dtype=bool)
    if not m.any():
        return m
    structure = ndimage.generate_binary_structure(2, 1)
    outer = ndimage.binary_dilation(m, structure, iterations=width)
    inner = ndimage.binary_erosion(m, structure, iterations=width, border_value=int(not frame))
    return outer & ~inner


def label_boundaries(labels: np.ndarray, width: int = 1) -> np.ndarray:
    """Edges of every region of an integer label image (touching regions stay separate)."""
    lab = np.asarray(labels)
    edges = np.zeros(lab.shape, dtype=bool)
    for value in np.unique(lab[lab > 0]):
        edges |= boundary(lab == value, width)
    return edges


def composite(
    base: np.ndarray,
    values: np.ndarray | None = None,
    *,
    lut: np.ndarray | None = None,
    vmin: float = 0.0,
    vmax: float = 1.0,
    opacity: float = 0.6,
    outline: np.ndarray | None = None,
    outline_color: tuple[int, int, int] = SIGNIFICANT_COLOR,
    roi_edges: np.ndarray | None = None,
    roi_color: tuple[int, int, int] = ROI_COLOR,
    centre: float | None = None,
    tissue_edges: np.ndarray | None = None,
) -> np.ndarray:
    """Blend a colour-mapped map over an image and draw outlines on top.

    Parameters
    ----------
    base : (h, w) or (h, w, 3) float array in [0, 1]
    values : (h, w) float array, optional
        The overlay; NaN pixels stay transparent (the image shows through).
    lut : (256, 3) uint8
        Colormap lookup table (:func:`colormap_lut`).
    vmin, vmax : float
        Values mapped to the first / last colour.
    opacity : float in [0, 1]
    outline, roi_edges : (h, w) bool, optional
        Pixels painted in ``outline_color`` / ``roi_color``.
    tissue_edges : (h, w) bool, optional
        The tissue mask's edge, painted in :data:`TISSUE_COLOR` under the other outlines.
    centre : float, optional
        A signed map's centre (0): values near it fade out, as napari's diverging overlay
        does, so "neither for nor against" leaves the image visible.

    Returns
    -------
    (h, w, 3) uint8
    """
    rgb = base_rgb(base)
    if values is not None:
        if lut is None:
            raise ValueError("composite() needs a colormap lookup table (lut) with values.")
        vals = np.asarray(values, dtype=np.float64)
        if vals.shape != rgb.shape[:2]:
            raise ValueError(f"overlay shape {vals.shape} does not match the image {rgb.shape[:2]}")
        span = vmax - vmin if vmax > vmin else 1.0
        visible = np.isfinite(vals)
        index = np.clip(((np.nan_to_num(vals, nan=vmin) - vmin) / span * 255).round(), 0, 255)
        colour = lut[index.astype(np.intp)].astype(np.float32) / 255.0
        alpha = float(np.clip(opacity, 0.0, 1.0)) * visible[..., None]
        if centre is not None:
            half = max(abs(vmax - centre), abs(centre - vmin)) or 1.0
            far = np.abs(np.nan_to_num(vals, nan=centre) - centre) / half
            alpha = alpha * np.clip(far * CENTRE_FADE, 0.0, 1.0)[..., None]
        rgb = rgb * (1 - alpha) + colour * alpha
    out = (rgb * 255).round().astype(np.uint8)
    if tissue_edges is not None:
        out[np.asarray(tissue_edges, dtype=bool)] = TISSUE_COLOR
    if outline is not None:
        out[np.asarray(outline, dtype=bool)] = outline_color
    if roi_edges is not None:
        out[np.asarray(roi_edges, dtype=bool)] = roi_color
    return out


def colorbar(lut: np.ndarray, width: int = 256, height: int = 12) -> np.ndarray:
    """A horizontal ``(height, width, 3)`` uint8 strip of a colormap, low values on the left."""
    index = np.linspace(0, 255, width).round().astype(np.intp)
    return np.repeat(lut[index][None], height, axis=0)


def to_png(rgb: np.ndarray) -> bytes:
    """PNG bytes of an ``(h, w, 3)`` uint8 image (what an ``ipywidgets.Image`` shows)."""
    from PIL import Image

    with io.BytesIO() as buffer:
        Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8)).save(buffer, format="png")
        return buffer.getvalue()

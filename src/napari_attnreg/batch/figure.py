"""The PNG figure of a batch result.

By default it is the publication figure (:func:`save_publication_figure`), the one napari's
Export figure and the notebook's ``export_figure`` write; ``attnreg run --figure overview``
writes the overview instead (:func:`save_figure`): the image, then every continuous map of
its preset, with the run's diagnostics above them.

Figures are for looking at: :func:`figure_view` brings a result and its display image down
to at most :data:`FIGURE_MAX_SIDE` pixels (the result file keeps full resolution), and
:func:`save_figure` draws them with matplotlib and writes the PNG atomically. Every panel
has the same size (a colour-bar row sits under all of them), each colour bar is titled with
what it measures, a significant region of one or two patches gets a ring as well as its
outline (a lone patch is otherwise a few pixels of outline), and a scale bar is drawn where
the result records its pixel size (DICOM spacing, OME physical size).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.core.results.figure import (  # scale_bar: shared with the front ends
    draw_scale_bar,
    pixel_size,
    pixel_unit,
    publication_figure,
    scale_bar,  # noqa: F401  (re-exported: the figure tests and older callers import it here)
)

FIGURE_MAX_SIDE = 1024  # figures are for looking at; the result files keep full resolution
#: Regions of at most this many patches get a ring around them besides their outline.
SMALL_REGION_PATCHES = 2


def figure_view(result: Any, display: np.ndarray,
                max_side: int = FIGURE_MAX_SIDE) -> tuple[Any, np.ndarray]:
    """A result and display image at figure resolution (long side ≤ ``max_side``).

    The result keeps its token maps; only ``image_shape`` becomes the display's, so
    ``to_pixels`` gives maps at the display's size, aligned with it exactly, and a recorded
    pixel size becomes that of a display pixel. A 10000² input then never needs
    full-size float64 maps for a PNG.
    """
    h0, w0 = display.shape[:2]
    factor = max(h0, w0) / max_side
    if factor > 1:
        from skimage.transform import resize

        h, w = max(1, round(h0 / factor)), max(1, round(w0 / factor))
        # averaged, not sampled: a line or a nucleus of a pixel or two would fall between
        # the samples and vanish from the figure; the whole extent maps onto the smaller
        # grid, so the geometry stays exact
        shrunk = resize(display, (h, w, *display.shape[2:]), order=1, anti_aliasing=True,
                        preserve_range=True)
        if display.dtype.kind in "iub":
            shrunk = np.rint(shrunk)
        display = shrunk.astype(display.dtype, copy=False)
    shape = tuple(display.shape[:2])
    if shape == tuple(result.image_shape):
        return result, display
    metadata = dict(result.metadata)
    size = pixel_size(result)
    if size is not None:  # the same extent in fewer pixels: each pixel covers more
        ih, iw = result.image_shape
        metadata["spatial"] = {**result.spatial,  # AttentionResult.spatial's record
                                 "scale": [size[0] * ih / shape[0], size[1] * iw / shape[1]]}
    return replace(result, image_shape=shape, metadata=metadata), display


def save_publication_figure(result: Any, display: np.ndarray, path: Path, title: str) -> Path:
    """The publication figure (:func:`~napari_attnreg.core.results.figure.publication_figure`:
    the regularized map over the image at native resolution, its colour bar, the outline's key,
    what "significant" means, a scale bar) of a batch result, as the front ends write it.

    Same signature as :func:`save_figure`; ``title`` is not drawn (the figure states its rule
    and meaning beside the image; the summary line is in ``summary.csv``).
    """
    return publication_figure(result, display, path)


def _colorbar_title(view: Any, preset: str) -> str:
    """What a colour bar measures (the panel title says which map it is)."""
    key, info = view.key, view.info
    if key in ("pvalue", "posterior"):
        from napari_attnreg.core.stats.procedures import get_procedure

        return get_procedure(preset).map_text(key).colorbar
    if not info.is_default:  # a map's own values: CDAM signed, Grad-CAM raw
        kind = "signed" if info.signed else "raw"
        return {"attention": f"{info.label} ({kind})",
                "regularized": f"{info.label} kept"}.get(key, key)
    return {"attention": "share of CLS attention", "regularized": "attention kept"}.get(key, key)


def save_figure(result: Any, display: np.ndarray, path: Path, title: str) -> Path:
    """PNG: the image, then every continuous map of the result's preset, each with a legend.

    Parameters
    ----------
    result : AttentionResult
        At figure resolution (:func:`figure_view`); the pixel size it records
        (:attr:`~napari_attnreg.core.results.result.AttentionResult.spatial`) gives the scale bar.
    display : np.ndarray
        The scaled image the maps lie on, at ``result.image_shape``.
    path : Path
        Written atomically: a kill or a full disk never leaves half a PNG.
    title : str
        The first line above the panels; the result's diagnostics follow it, each once (so
        ``title`` should not repeat them: use ``result.summary(diagnostics=False)``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from napari_attnreg.core.files import atomic_write
    from napari_attnreg.core.results.display import (
        CONTINUOUS_MAPS,
        diagnostics_lines,
        with_thresholds,
    )

    thresholds = with_thresholds(result, None).thresholds  # the preset's, where not set
    cmap = "gray" if display.ndim == 2 else None
    size = pixel_size(result)
    aspect = size[0] / size[1] if size else 1.0  # square on the sample, not on the screen
    n = 1 + len(CONTINUOUS_MAPS)
    fig = plt.figure(figsize=(20, 6.2), layout="constrained")
    # one colour-bar row under every panel (empty under the image): equal panels
    grid = fig.add_gridspec(2, n, height_ratios=(1, 0.04))
    axes = [fig.add_subplot(grid[0, i]) for i in range(n)]
    axes[0].imshow(display, cmap=cmap, aspect=aspect)
    axes[0].set_title("image")
    fig.add_subplot(grid[1, 0]).set_axis_off()
    for i, (ax, view) in enumerate(zip(axes[1:], CONTINUOUS_MAPS), start=1):
        view = view.for_result(result)  # the tested map named; a signed one centred at 0
        ax.imshow(display, cmap=cmap, aspect=aspect)
        vmin, vmax = view.limits(result)
        im = ax.imshow(result.to_pixels(view.values(result, thresholds)), cmap=view.colormap,
                       alpha=0.6, vmin=vmin, vmax=vmax, aspect=aspect)
        # wrapped: a class map's long title ran off the right edge of the figure
        ax.set_title(_panel_title(view.title(result.preset, thresholds)), fontsize=10)
        bar = fig.colorbar(im, cax=fig.add_subplot(grid[1, i]), orientation="horizontal")
        # at most five ticks: Grad-CAM's raw values (about 1e-4) got ten, printed edge to
        # edge as one unreadable string ("0.00000.00010.0002...")
        bar.ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        bar.ax.set_title(_colorbar_title(view, result.preset), fontsize=8)
        # wrapped by hand: matplotlib's wrap=True ignores the neighbouring panels
        bar.set_label(textwrap.fill(view.legend(result.preset), 48), fontsize=7)
    _outline_significant(axes[-1], result)
    if size is not None:
        draw_scale_bar(axes[0], display.shape, size[1], pixel_unit(result), fontsize=9)
    h, w = display.shape[:2]
    for ax in axes:
        # the image's extent on every panel: a ring or outline reaching past the edge widened
        # one panel's limits, which drew its image smaller than the others (issue 28.16)
        ax.set_xlim(-0.5, w - 0.5)
        ax.set_ylim(h - 0.5, -0.5)
        ax.set_axis_off()
    fig.suptitle("\n".join(dict.fromkeys([title, *diagnostics_lines(result)])), fontsize=9)
    try:
        with atomic_write(path) as tmp:
            fig.savefig(tmp, dpi=90, format="png")
    finally:
        plt.close(fig)
    return path


def _panel_title(text: str, width: int = 44) -> str:
    """A panel title on two lines when long, broken before its parenthesis ("Grad-CAM for
    concept: regularized" / "(ForwardStop, α = 0.1)"), never inside it."""
    if len(text) <= width:
        return text
    cut = text.rfind(" (")
    if cut > 0:
        return f"{text[:cut]}\n{text[cut + 1:]}"
    return textwrap.fill(text, width, break_on_hyphens=False)


def _outline_significant(ax: Any, result: Any) -> None:
    """The significant regions' outline, drawn thick over a dark edge so it shows on any
    colour; regions of one or two patches also get a ring, which a lone patch needs."""
    import matplotlib.patheffects as effects
    from scipy import ndimage

    from napari_attnreg.core.results.display import SIGNIFICANT_COLOR

    sig = result.to_pixels(result.significant().astype(float))
    if not sig.any():
        return
    halo = [effects.withStroke(linewidth=4.0, foreground="black")]
    h, w = sig.shape
    # padded with "not significant" so a region that reaches the border is closed there too
    ax.contour(np.arange(-1, w + 1), np.arange(-1, h + 1), np.pad(sig, 1), levels=[0.5],
               colors=SIGNIFICANT_COLOR, linewidths=2.0).set(path_effects=halo)
    labels, n = ndimage.label(sig > 0.5)
    areas = ndimage.sum_labels(np.ones_like(sig), labels, index=np.arange(1, n + 1))
    patch_area = sig.size / max(result.significant().size, 1)
    small = [i + 1 for i, area in enumerate(areas) if area <= SMALL_REGION_PATCHES * patch_area]
    if not small:
        return
    centres = np.asarray(ndimage.center_of_mass(sig, labels, small)).reshape(-1, 2)
    # a ring a little wider than a patch, and never smaller than ~3 % of the panel
    radius = max(1.2 * math.sqrt(patch_area), 0.03 * max(sig.shape))
    for y, x in centres:
        ax.add_patch(_ring((x, y), radius, SIGNIFICANT_COLOR, halo))


def _ring(centre: tuple[float, float], radius: float, color: str, halo: list) -> Any:
    from matplotlib.patches import Circle

    return Circle(centre, radius, fill=False, edgecolor=color, linewidth=2.0,
                  path_effects=halo, label="small significant region")


#: ``attnreg run --figure`` choices: what each writes as the ``.png`` beside a result.
FIGURES = {"publication": save_publication_figure, "overview": save_figure}

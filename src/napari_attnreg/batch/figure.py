"""The PNG figure of a batch result: the image, then every continuous map of its preset.

Figures are for looking at: :func:`figure_view` brings a result and its display image down
to at most :data:`FIGURE_MAX_SIDE` pixels (the result file keeps full resolution), and
:func:`save_figure` draws them with matplotlib and writes the PNG atomically.
"""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

FIGURE_MAX_SIDE = 1024  # figures are for looking at; the result files keep full resolution


def figure_view(result: Any, display: np.ndarray,
                max_side: int = FIGURE_MAX_SIDE) -> tuple[Any, np.ndarray]:
    """A result and display image at figure resolution (long side ≤ ``max_side``).

    The result keeps its token maps; only ``image_shape`` shrinks, so ``to_pixels`` gives
    maps at the display's size, aligned with it exactly. A 10000² input then never needs
    full-size float64 maps for a PNG.
    """
    h0, w0 = display.shape[:2]
    factor = max(h0, w0) / max_side
    if factor <= 1:
        return result, display
    h, w = max(1, round(h0 / factor)), max(1, round(w0 / factor))
    # pixel-centre sampling over the whole extent, so the geometry stays exact
    rows = ((np.arange(h) + 0.5) * h0 / h).astype(np.int64)
    cols = ((np.arange(w) + 0.5) * w0 / w).astype(np.int64)
    return replace(result, image_shape=(h, w)), display[rows][:, cols]


def save_figure(result: Any, display: np.ndarray, path: Path, title: str) -> Path:
    """PNG: the image, then every continuous map of the result's preset, each with a legend.

    Parameters
    ----------
    result : AttentionResult
    display : np.ndarray
        The scaled image the maps lie on, at ``result.image_shape``.
    path : Path
        Written atomically: a kill or a full disk never leaves half a PNG.
    title : str
        The first line above the panels; the result's diagnostics follow it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from napari_attnreg.core.files import atomic_write
    from napari_attnreg.core.results.display import (
        CONTINUOUS_MAPS,
        SIGNIFICANT_COLOR,
        diagnostics_lines,
        with_thresholds,
    )

    thresholds = with_thresholds(result, None).thresholds  # the preset's, where not set
    cmap = "gray" if display.ndim == 2 else None
    fig, axes = plt.subplots(1, 1 + len(CONTINUOUS_MAPS), figsize=(20, 5.6),
                             constrained_layout=True)
    axes[0].imshow(display, cmap=cmap)
    axes[0].set_title("image")
    sig = result.to_pixels(result.significant().astype(float))
    for ax, view in zip(axes[1:], CONTINUOUS_MAPS):
        ax.imshow(display, cmap=cmap)
        vmin, vmax = view.limits(result)
        im = ax.imshow(result.to_pixels(view.values(result, thresholds)), cmap=view.colormap,
                       alpha=0.6, vmin=vmin, vmax=vmax)
        ax.set_title(view.title(result.preset, thresholds), fontsize=10)
        bar = fig.colorbar(im, ax=ax, fraction=0.046, orientation="horizontal", pad=0.02)
        # wrapped by hand: matplotlib's wrap=True ignores the neighbouring panels
        bar.set_label(textwrap.fill(view.legend(result.preset), 48), fontsize=7)
    axes[-1].contour(sig, levels=[0.5], colors=SIGNIFICANT_COLOR, linewidths=0.9)
    for ax in axes:
        ax.set_axis_off()
    fig.suptitle("\n".join([title, *diagnostics_lines(result)]), fontsize=9)
    try:
        with atomic_write(path) as tmp:
            fig.savefig(tmp, dpi=90, format="png")
    finally:
        plt.close(fig)
    return path

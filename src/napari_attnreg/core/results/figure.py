"""The publication figure of one result, drawn with matplotlib from the result (no screenshot).

One panel: the image cropped to its extent, at its own resolution or an integer multiple
(never below), with one chosen map over it, the significant regions' thin outline, and, in a
strip beside the image, the map's colour bar, the outline's key with what "significant"
means for the run's procedure, and the rule in force. A scale bar in physical units is drawn
where the result records its pixel size. The napari dock, the notebook and the command line
all write this figure (the command line beside its overview PNG).
"""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

#: Length units a scale bar may be labelled in, with their size in metres.
METRES = {"nm": 1e-9, "µm": 1e-6, "mm": 1e-3, "cm": 1e-2, "m": 1.0}
#: Other names of those units: napari stores a layer's units by pint's long names, so a
#: layer given "µm" reports "micrometer", and that is what a run from napari records.
UNIT_NAMES = {"nanometer": "nm", "micrometer": "µm", "micron": "µm", "um": "µm",
              "\u03bcm": "µm", "millimeter": "mm", "centimeter": "cm", "meter": "m",
              "metre": "m", "nanometre": "nm", "micrometre": "µm", "millimetre": "mm",
              "centimetre": "cm"}


def length_unit(name: Any) -> str | None:
    """The symbol of a length unit (``"micrometer"`` → ``"µm"``), None if not a length."""
    text = str(name).strip()
    text = UNIT_NAMES.get(text.lower(), text)
    return text if text in METRES else None
#: The figure's resolution (dots per inch written into the PNG).
FIGURE_DPI = 200
#: Images smaller than this (long side, pixels) are drawn at an integer multiple, so the
#: text beside them stays readable; larger ones at their own resolution.
MIN_DRAWN_SIDE = 800
#: Width of the strip beside the image (colour bar, key, rule), in inches.
SIDE_INCHES = 2.4
#: Width of the outline, in figure pixels.
OUTLINE_PX = 2.0
#: How opaque the map is over the image.
MAP_ALPHA = 0.6
#: Font size of the colour bar's label, in points.
BAR_LABEL_POINTS = 7


def pixel_size(result: Any) -> tuple[float, float] | None:
    """The (row, column) physical size of a pixel a result records (its ``spatial``), when
    it is in one known length unit; None for pixels or anything unusable."""
    spatial = result.spatial
    units = {length_unit(u) for u in spatial["units"]}
    dy, dx = spatial["scale"]
    ok = len(units) == 1 and None not in units and all(
        math.isfinite(v) and v > 0 for v in (dy, dx))
    return (dy, dx) if ok else None


def pixel_unit(result: Any) -> str:
    """The length unit of :func:`pixel_size`, as its symbol."""
    return length_unit(result.spatial["units"][0]) or str(result.spatial["units"][0])


def scale_bar(width_px: int, pixel_size: float, unit: str,
              fraction: float = 0.2) -> tuple[float, str]:
    """A round scale-bar length near ``fraction`` of the image width: (pixels, label).

    The label is in the unit that keeps its number between 1 and 1000 (``500 µm``, not
    ``0.5 mm``).

    Examples
    --------
    >>> length, label = scale_bar(512, 0.7, "mm")
    >>> round(length, 1), label
    (71.4, '50 mm')
    >>> [scale_bar(1000, 0.25, "µm")[1], scale_bar(2000, 0.0005, "mm")[1]]
    ['50 µm', '200 µm']
    """
    target = fraction * width_px * pixel_size * METRES[unit]  # metres
    step = 10 ** math.floor(math.log10(target))
    length = max(m * step for m in (1, 2, 5) if m * step <= target * (1 + 1e-9))
    label_unit = next(u for u in ("m", "mm", "µm", "nm") if length >= METRES[u] * 0.999
                      ) if length >= 1e-9 else "nm"
    value = length / METRES[label_unit]
    return length / (pixel_size * METRES[unit]), f"{value:.3g} {label_unit}"


def drawn_scale(image_shape: tuple[int, ...], scale: int | None = None) -> int:
    """Figure pixels per image pixel: ``scale`` when given (≥ 1), else the smallest integer
    that draws the image's long side at :data:`MIN_DRAWN_SIDE` or more."""
    if scale is not None:
        if int(scale) < 1:
            raise ValueError(f"scale must be a whole number ≥ 1 (figure pixels per image "
                             f"pixel), got {scale}.")
        return int(scale)
    return max(1, math.ceil(MIN_DRAWN_SIDE / max(image_shape[:2])))


def publication_figure(result: Any, image: np.ndarray, path: str | Path, *,
                       map_key: str = "regularized", thresholds: dict[str, Any] | None = None,
                       scale: int | None = None, dpi: int = FIGURE_DPI) -> Path:
    """Write the publication figure of ``result`` over ``image`` to ``path`` (PNG).

    Parameters
    ----------
    result : AttentionResult
        One plane's result; its thresholds apply unless ``thresholds`` are given.
    image : np.ndarray
        The image the result was computed on, ``(H, W)`` or ``(H, W, 3|4)`` at
        ``result.image_shape``.
    map_key : str
        The map drawn over the image: ``attention``, ``pvalue``, ``posterior`` or
        ``regularized`` (the default).
    scale : int, optional
        Figure pixels per image pixel (default: native resolution, or an integer multiple
        for small images, see :func:`drawn_scale`).
    dpi : int
        Resolution recorded in the PNG; with ``scale`` it sets the printed size.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from napari_attnreg.core.files import atomic_write
    from napari_attnreg.core.results.display import (
        MAPS_BY_KEY,
        tissue_tokens,
        with_thresholds,
    )

    if map_key not in MAPS_BY_KEY:
        raise ValueError(f"unknown map {map_key!r}; choose one of {', '.join(MAPS_BY_KEY)}.")
    image = np.asarray(image)
    if tuple(image.shape[:2]) != tuple(result.image_shape):
        raise ValueError(f"the image is {image.shape[:2]}, the result was computed on "
                         f"{tuple(result.image_shape)}: pass the image the result belongs to.")
    shown = with_thresholds(result, thresholds)
    h, w = image.shape[:2]
    k = drawn_scale(image.shape, scale)
    img_w, img_h = w * k / dpi, h * k / dpi  # inches: one image pixel = k figure pixels
    fig = Figure(figsize=(img_w + SIDE_INCHES, max(img_h, 2.6)), dpi=dpi)
    fig_w, fig_h = fig.get_size_inches()
    ax = fig.add_axes((0, 1 - img_h / fig_h, img_w / fig_w, img_h / fig_h))
    ax.set_axis_off()
    extent = (0, w, h, 0)  # pixel (r, c) covers [c, c + 1) x [r, r + 1)
    drawn = _display(image, result.metadata.get("intensity_scaling"))
    # [0, 1] as it is: matplotlib's own stretch from the darkest to the brightest pixel
    # redrew a windowed CT's air (0.23 through a lung window) black
    ax.imshow(drawn, cmap="gray" if drawn.ndim == 2 else None, extent=extent, vmin=0, vmax=1,
              interpolation="nearest")
    view = MAPS_BY_KEY[map_key].for_result(shown)  # the tested map named; signed: centred at 0
    vmin, vmax = view.limits(shown)
    values = np.asarray(view.values(shown, shown.thresholds), dtype=float)
    tested = tissue_tokens(shown)
    if tested is not None:  # glass was never run: the image shows through, not a map of 0
        values = np.where(tested, values, np.nan)
    mapped = ax.imshow(shown.to_pixels(values), cmap=view.colormap,
                       alpha=MAP_ALPHA, vmin=vmin, vmax=vmax, extent=extent,
                       interpolation="nearest")
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    outline = _draw_outline(ax, shown, OUTLINE_PX * 72 / dpi)
    size = pixel_size(shown)
    if size is not None:
        draw_scale_bar(ax, (h, w), size[1], pixel_unit(shown))
    _draw_side(fig, (img_w / fig_w, fig_h), mapped, view, shown, outline, tested)
    path = Path(path)
    with atomic_write(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    return path


def _display(image: np.ndarray, scaling: Any = None) -> np.ndarray:
    """Grey images stretched between their 0.5th and 99.5th percentiles; colour as it is;
    one or two fluorescence channels (a tiled run's image keeps them) each stretched so,
    two drawn red and green as a microscope shows them. A run through an intensity window
    (``scaling``, the result's ``intensity_scaling``) is drawn through it, as the model saw
    it: a stored image through the window, the run's own scaled image (in [0, 1]) as it is;
    stretched again, a lung window's air and lung came out black."""
    if image.ndim == 2 and isinstance(scaling, dict) and scaling.get("method") == "window":
        values = image.astype(np.float64)
        if image.dtype.kind == "f" and values.min() >= 0 and values.max() <= 1:
            return np.clip(values, 0, 1)  # already windowed (the batch's prepared image)
        low, high = float(scaling["low"]), float(scaling["high"])
        return np.clip((values - low) / (high - low), 0, 1)
    if image.ndim == 3 and image.shape[-1] in (3, 4):
        return image if image.dtype == np.uint8 else np.clip(image, 0, 1)
    if image.ndim == 3:
        channels = [_display(image[..., c]) for c in range(min(image.shape[-1], 3))]
        if len(channels) == 1:
            return channels[0]
        channels += [np.zeros_like(channels[0])] * (3 - len(channels))
        return np.stack(channels, axis=-1)
    lo, hi = np.nanpercentile(image.astype(float), (0.5, 99.5))
    return np.clip((image - lo) / (hi - lo if hi > lo else 1.0), 0, 1)


def _draw_outline(ax: Any, result: Any, linewidth: float) -> Any:
    """The significant regions' boundaries (shapely), thin: the patches stay visible."""
    from napari_attnreg.core.results.display import SIGNIFICANT_COLOR
    from napari_attnreg.core.results.outline import mask_regions, to_pixels

    line = None
    for region in mask_regions(result.significant()):
        placed = to_pixels(region, result.token_scale)
        for ring in (placed.exterior, *placed.interiors):
            x, y = np.asarray(ring.coords).T
            (line,) = ax.plot(x, y, color=SIGNIFICANT_COLOR, linewidth=linewidth,
                              solid_joinstyle="miter", label="significant")
    return line


def draw_scale_bar(ax: Any, shape: tuple[int, ...], pixel_size: float, unit: str,
                   fontsize: float = 8) -> None:
    """A labelled white bar over a dark edge in the lower left corner of the image."""
    import matplotlib.patheffects as effects
    from matplotlib.patches import Rectangle

    h, w = shape[:2]
    length, label = scale_bar(w, pixel_size, unit)
    thick = max(1.5, h / 100)
    x0, y0 = 0.04 * w, 0.95 * h - thick
    halo = [effects.withStroke(linewidth=3.0, foreground="black")]
    ax.add_patch(Rectangle((x0, y0), length, thick, facecolor="white", edgecolor="black",
                           linewidth=0.8, label="scale bar"))
    # starts where the bar starts: centred over a short bar in a narrow image ("100 mm" over
    # a whole-body scan 256 px wide), the label ran off the image's left edge
    ax.text(x0, y0 - 0.01 * h, label, color="white", fontsize=fontsize, ha="left",
            va="bottom", path_effects=halo, clip_on=True)


def bar_label(title: str, bar_inches: float) -> str:
    """A colour bar's label in lines that fit along the bar: the tested map's name on a line
    of its own when the whole does not fit (``"Grad-CAM for class 1:"``, then the map)."""
    width = max(16, int(bar_inches * 72 / (0.55 * BAR_LABEL_POINTS)))
    if len(title) <= width:
        return title
    head, sep, rest = title.partition(": ")
    parts = [head + sep.rstrip(), rest] if sep else [title]
    # a rule ("α = 0.1", "q ≤ 0.1") stays on one line: no-break spaces around its sign
    parts = [re.sub(r" ([=≤≥<>]) ", "\u00a0\\1\u00a0", part) for part in parts]
    return "\n".join(textwrap.fill(part, width, break_on_hyphens=False) for part in parts)


def _draw_side(fig: Any, left_height: tuple[float, float], mapped: Any, view: Any,
               result: Any, outline: Any, tested: np.ndarray | None = None) -> None:
    """The strip beside the image: the map's colour bar, then the outline's key and rule,
    and, for a run with a tissue mask (``tested``: the tokens it tested), what the uncoloured
    glass means."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from napari_attnreg.core.results.display import SIGNIFICANT_COLOR, rule_text
    from napari_attnreg.core.results.meaning import result_meaning

    left, fig_h = left_height
    x0 = left + 0.25 / fig.get_size_inches()[0]
    bar_ax = fig.add_axes((x0, 0.45, 0.12 / fig.get_size_inches()[0] * 2, 0.45))
    bar = fig.colorbar(mapped, cax=bar_ax)
    # the label runs along the bar: wrapped to its length, it neither leaves the figure at
    # the top nor runs into the key below (a class map's title is twice a bar's length)
    bar.set_label(bar_label(view.title(result.preset, result.thresholds), 0.45 * fig_h),
                  fontsize=BAR_LABEL_POINTS)
    bar.ax.tick_params(labelsize=6)
    key = Line2D([], [], color=SIGNIFICANT_COLOR, linewidth=1.5)
    count = int(result.significant().sum())
    rule = result.thresholds_used
    # the soft rule tests nothing: its outline is where the evidence reaches one half
    kept = "evidence ≥ 0.5" if rule.get("rule") == "soft" else "significant"
    label = f"{kept} ({count} patch{'' if count == 1 else 'es'}; {rule_text(rule)})"
    keys, labels = [key], [textwrap.fill(label, 34)]
    if tested is not None:  # glass shows the image through: say it was never run
        md = result.metadata
        run = (f"{md['n_tissue_tiles']} of {md['n_tiles_total']} tiles run"
               if "n_tissue_tiles" in md and "n_tiles_total" in md else "its tiles run")
        keys.append(Patch(facecolor="none", edgecolor="0.5", linestyle=":"))
        labels.append(textwrap.fill(f"no colour: outside the tissue mask ({run}), not "
                                    "measured", 34))
    legend = fig.legend(keys, labels, loc="upper left", fontsize=6,
                        bbox_to_anchor=(x0 - 0.08 / fig.get_size_inches()[0], 0.38),
                        frameon=False)
    # the meaning goes under the legend, however many lines its entries took (a masked
    # run's second entry ran into it)
    box = legend.get_window_extent()
    bottom = box.transformed(fig.transFigure.inverted()).y0
    meaning = textwrap.fill(result_meaning(result.preset, result.metadata), 44)
    fig.text(x0 - 0.05 / fig.get_size_inches()[0], min(0.24, bottom - 0.02), meaning,
             fontsize=5, va="top", ha="left")

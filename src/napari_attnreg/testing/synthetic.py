"""Synthetic fluorescence-microscopy images with planted, known ground truth.

The generator draws nuclei (a DNA stain such as DAPI/Hoechst) of varied size, shape,
texture, brightness and density on an uneven background, blurs them with a Gaussian PSF
and adds Poisson (shot) and Gaussian (read) noise, like a widefield camera image.

The classification task behind the bundled demo model is *"does the field contain a
dividing (mitotic) cell?"*. Abnormal images hold one or more mitotic figures: a
metaphase plate (a thin, bright, ragged bar of condensed chromatin) or an anaphase
(two such bars moving apart). Normal images never do, but both classes contain hard
negatives of similar brightness: pyknotic (small, round, bright) nuclei, pairs of
freshly divided daughter nuclei, bright chromocenters and autofluorescent debris. So
brightness alone does not give the answer; a model has to find the figure, i.e. the
answer is carried by a few *localized* objects whose masks are returned.

Everything is deterministic given the seed. Lengths are in pixels at ``scale=1``
(reference magnification: nuclei ~26-36 px across, like a 20x objective on a
512x512 field) and are multiplied by ``scale``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import ndimage

ABNORMAL_KINDS = ("metaphase", "anaphase")
CHANNEL_NAMES = ("nuclei", "cytoplasm", "tubulin")
DEMO_SEED = 20260401
DEMO_SIZE = (512, 512)
TRAINING_SCALE = 0.5  # magnification of the demo model's 128 px training fields

SeedLike = int | Sequence[int] | np.random.SeedSequence | np.random.Generator


@dataclass(frozen=True)
class SyntheticSample:
    """One generated image and its ground truth.

    Attributes
    ----------
    image : np.ndarray
        ``(H, W)`` for one channel, ``(H, W, C)`` (channels last) for several;
        uint16 camera counts (or float32 with ``dtype="float32"``).
    label : int
        1 if the field contains a mitotic cell ("abnormal"), else 0.
    decisive_mask : np.ndarray
        ``(H, W)`` bool: the mitotic cells that decide the label. Empty iff ``label == 0``.
    nuclei_labels : np.ndarray
        ``(H, W)`` int32 instance labels of every nucleus and chromatin figure (0 = none).
    params : dict
        Every parameter drawn for this image, JSON-serialisable (objects, noise, optics).
    """

    image: np.ndarray
    label: int
    decisive_mask: np.ndarray
    nuclei_labels: np.ndarray
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SyntheticDataset:
    """A stack of samples (see :func:`make_dataset`).

    Attributes
    ----------
    images : np.ndarray
        ``(N, H, W)`` or ``(N, H, W, C)``.
    labels : np.ndarray
        ``(N,)`` int64, 0 normal / 1 abnormal.
    decisive_masks : np.ndarray
        ``(N, H, W)`` bool.
    seeds : list
        The seed of each sample: ``make_cell_image(seeds[i], ...)`` reproduces sample ``i``.
    """

    images: np.ndarray
    labels: np.ndarray
    decisive_masks: np.ndarray
    seeds: list[list[int]]


def _as_size(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)):
        h = w = int(size)
    else:
        if len(size) != 2:
            raise ValueError(f"size must be an int or (H, W), got {size!r}")
        h, w = (int(v) for v in size)
    if h < 32 or w < 32:
        raise ValueError(f"size {h}x{w} is too small to hold cells; use at least 32x32 pixels.")
    return h, w


def _smooth_field(rng: np.random.Generator, shape: tuple[int, int], cells: int) -> np.ndarray:
    """Low-frequency random field, mean 0 and std 1 (uneven illumination, background).

    Random values on a coarse ``cells x cells`` lattice are spread by separable Gaussian
    kernels (two small matrix products), far cheaper than interpolating a full image.
    """
    coarse = rng.normal(size=(cells + 2, cells + 2))

    def kernel(n: int) -> np.ndarray:
        knots = np.linspace(-0.5, cells + 0.5, cells + 2) * n / cells
        pos = np.arange(n)[:, None] + 0.5
        weights = np.exp(-((pos - knots[None]) ** 2) / (2 * (0.6 * n / cells) ** 2))
        return weights / weights.sum(1, keepdims=True)

    fine = kernel(shape[0]) @ coarse @ kernel(shape[1]).T
    return ((fine - fine.mean()) / (fine.std() + 1e-9)).astype(np.float32)


def _box(center: tuple[float, float], radius: float, shape: tuple[int, int]):
    """Slices of the bounding box of a disk, clipped to the image, and its local grid."""
    cy, cx = center
    r = int(np.ceil(radius)) + 2
    y0, y1 = max(0, int(cy) - r), min(shape[0], int(cy) + r + 1)
    x0, x1 = max(0, int(cx) - r), min(shape[1], int(cx) + r + 1)
    if y0 >= y1 or x0 >= x1:
        return None
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    return (slice(y0, y1), slice(x0, x1)), yy - cy, xx - cx


def _rotate(dy: np.ndarray, dx: np.ndarray, theta: float) -> tuple[np.ndarray, np.ndarray]:
    c, s = np.cos(theta), np.sin(theta)
    return dx * c + dy * s, -dx * s + dy * c


def _blob_occupancy(dy, dx, a, b, theta, harmonics) -> np.ndarray:
    """Soft (1 px antialiased) occupancy of a rotated ellipse with a wavy boundary."""
    u, v = _rotate(dy, dx, theta)
    rho = np.sqrt((u / a) ** 2 + (v / b) ** 2)
    ang = np.arctan2(v / b, u / a)
    bound = np.ones_like(rho)
    for k, amp, phase in harmonics:
        bound += amp * np.cos(k * ang + phase)
    signed = (rho - bound) * min(a, b)  # ~ signed distance to the boundary in px
    return np.clip(0.5 - signed, 0.0, 1.0)


def _spots(dy, dx, rng, n, spread, sigma, weight) -> np.ndarray:
    out = np.zeros_like(dy)
    for _ in range(n):
        py, px = rng.uniform(-spread, spread, size=2)
        out += weight * rng.uniform(0.6, 1.0) * np.exp(-((dy - py) ** 2 + (dx - px) ** 2) / (2 * sigma**2))
    return out


def _plate_occupancy(dy, dx, rng, length, width, theta, bend, offset) -> np.ndarray:
    """A ragged bar of condensed chromosomes: metaphase plate (or one anaphase half)."""
    u, v = _rotate(dy, dx, theta)
    v = v - (offset + bend * (u / max(length / 2, 1.0)) ** 2)
    # chromosome arms make the plate edge ragged: a random low-order profile along the bar
    ks = np.arange(1, 6)
    amps = rng.uniform(0.0, 0.35, size=5) / ks**0.5
    phases = rng.uniform(0, 2 * np.pi, size=5)
    t = u / max(length / 2, 1.0)
    prof = 1.0 + np.sum(amps[:, None, None] * np.cos(np.pi * ks[:, None, None] * t + phases[:, None, None]), axis=0)
    half_w = 0.5 * width * prof
    # rounded (elliptic) ends
    along = np.clip(1.0 - t**2, 0.0, None) ** 0.35
    signed_v = np.abs(v) - half_w * along
    signed_u = np.abs(u) - length / 2
    return np.clip(0.5 - np.maximum(signed_v, signed_u), 0.0, 1.0)


def _place(rng, shape, objects, taken, margin_of, tries) -> list[tuple[str, float, float, float]]:
    """Centres for discs that overlap neither each other nor ``taken`` (largest first).

    ``margin_of(r)`` is the minimum distance of a centre from the border (may be negative,
    letting a cell be cut by the border); objects that find no room after ``tries`` are dropped.
    """
    out: list[tuple[str, float, float, float]] = []
    for kind, r in sorted(objects, key=lambda o: -o[1]):
        m = margin_of(r)
        for _ in range(tries):
            cy = rng.uniform(m, shape[0] - m)
            cx = rng.uniform(m, shape[1] - m)
            if all((cy - py) ** 2 + (cx - px) ** 2 > (1.08 * (r + pr)) ** 2 for py, px, pr in taken):
                taken.append((cy, cx, r))
                out.append((kind, cy, cx, r))
                break
    return out


def make_cell_image(
    seed: SeedLike,
    *,
    size: int | Sequence[int] = DEMO_SIZE,
    abnormal: bool | None = None,
    channels: int = 1,
    scale: float = 1.0,
    density: float | None = None,
    n_abnormal: int | None = None,
    abnormal_kinds: Sequence[str] = ABNORMAL_KINDS,
    hard_negatives: bool = True,
    debris: bool = True,
    psf_sigma: float | None = None,
    photons: float | None = None,
    read_noise: float = 3.0,
    offset: float = 100.0,
    dtype: str = "uint16",
) -> SyntheticSample:
    """Draw one fluorescence-microscopy-like image with known decisive objects.

    Parameters
    ----------
    seed : int, sequence of int, SeedSequence or Generator
        Everything is drawn from ``np.random.default_rng(seed)``; the same seed and
        parameters give the same sample.
    size : int or (H, W)
        Image size in pixels (any, ≥ 32).
    abnormal : bool, optional
        Whether the field contains mitotic figures; ``None`` draws it with probability 1/2.
    channels : {1, 3}
        1: nuclear stain only, ``(H, W)``. 3: nuclei, cytoplasm and tubulin (mitotic
        spindle) channels, ``(H, W, 3)``.
    scale : float
        Magnification: all lengths (cell size, PSF) are multiplied by it. ``scale=0.5``
        draws the same field of view at half the pixels per cell.
    density : float, optional
        Fraction of the area covered by nuclei; default drawn from U(0.05, 0.22).
    n_abnormal : int, optional
        Number of mitotic figures in an abnormal image; default 1 (60 %), 2 (30 %) or 3.
    abnormal_kinds : sequence of {"metaphase", "anaphase"}
        Figure types to draw from.
    hard_negatives : bool
        Add pyknotic nuclei and daughter-nucleus pairs (both classes), so that bright or
        paired objects are not by themselves evidence of mitosis.
    debris : bool
        Add small autofluorescent debris particles (all channels).
    psf_sigma : float, optional
        Gaussian PSF sigma in px at ``scale=1``; default drawn from U(0.8, 1.8).
    photons : float, optional
        Expected photons at a typical nucleus' brightness; default drawn log-uniformly
        from [60, 800] (lower = noisier).
    read_noise : float
        Gaussian camera read noise (counts, std).
    offset : float
        Camera baseline added to every pixel (counts).
    dtype : {"uint16", "float32"}
        Output type; uint16 is clipped to [0, 65535] like a camera.

    Returns
    -------
    SyntheticSample

    Examples
    --------
    >>> s = make_cell_image(0, size=256, abnormal=True)
    >>> s.image.dtype, s.image.shape, s.label, bool(s.decisive_mask.any())
    (dtype('uint16'), (256, 256), 1, True)
    """
    shape = _as_size(size)
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 (nuclei) or 3 (nuclei, cytoplasm, tubulin), got {channels}")
    if not (np.isfinite(scale) and 0.1 <= scale <= 10):
        raise ValueError(f"scale must be in [0.1, 10], got {scale}")
    bad = [k for k in abnormal_kinds if k not in ABNORMAL_KINDS]
    if bad or not abnormal_kinds:
        raise ValueError(f"abnormal_kinds must be a non-empty subset of {ABNORMAL_KINDS}, got {list(abnormal_kinds)}")
    if dtype not in ("uint16", "float32"):
        raise ValueError(f"dtype must be 'uint16' or 'float32', got {dtype!r}")
    if density is not None and not 0 < density <= 0.5:
        raise ValueError(f"density must be in (0, 0.5], got {density}")
    if n_abnormal is not None and n_abnormal < 1:
        raise ValueError("n_abnormal must be ≥ 1 (use abnormal=False for a field without mitoses)")

    rng = np.random.default_rng(seed)
    h, w = shape
    label = int(rng.random() < 0.5) if abnormal is None else int(bool(abnormal))
    r_mean = rng.uniform(13.0, 18.0) * scale
    density = float(rng.uniform(0.05, 0.22) if density is None else density)
    psf = float(rng.uniform(0.8, 1.8) if psf_sigma is None else psf_sigma) * scale
    photons = float(np.exp(rng.uniform(np.log(60), np.log(800))) if photons is None else photons)

    n_cells = max(1, round(density * h * w / (np.pi * r_mean**2)))
    if label:
        n_fig = int(n_abnormal or rng.choice([1, 2, 3], p=[0.6, 0.3, 0.1]))
    else:
        n_fig = 0
    n_pyk = int(rng.poisson(1.5 * h * w / 512**2 / scale**2)) if hard_negatives else 0
    n_pairs = int(rng.poisson(1.0 * h * w / 512**2 / scale**2)) if hard_negatives else 0

    # Objects: (kind, radius of the disc it occupies). Figures first so they are never crowded out.
    objects: list[tuple[str, float]] = []
    for _ in range(n_fig):
        objects.append((str(rng.choice(list(abnormal_kinds))), r_mean * rng.uniform(1.0, 1.25)))
    for _ in range(n_pairs):
        objects.append(("pair", r_mean * rng.uniform(1.1, 1.4)))
    for _ in range(n_pyk):
        objects.append(("pyknotic", r_mean * rng.uniform(0.4, 0.6)))
    for _ in range(max(0, n_cells - n_fig - n_pairs)):
        objects.append(("nucleus", r_mean * float(np.clip(rng.normal(1.0, 0.18), 0.6, 1.6))))

    # Figures must lie entirely inside the field, so the label never hinges on a cut-off figure;
    # other cells may be cut by the border, as in a real field of view.
    taken: list[tuple[float, float, float]] = []
    figures = _place(rng, shape, [o for o in objects if o[0] in ABNORMAL_KINDS], taken,
                     margin_of=lambda r: 1.3 * r + 3, tries=200)
    if len(figures) < n_fig:
        raise ValueError(f"Could not fit {n_fig} mitotic figures into a {h}x{w} image at scale "
                         f"{scale}; use a larger size or a smaller scale.")
    placed = figures + _place(rng, shape, [o for o in objects if o[0] not in ABNORMAL_KINDS], taken,
                              margin_of=lambda r: -0.3 * r, tries=30)

    nuc = np.zeros(shape, np.float32)          # chromatin density (nuclear channel)
    labels = np.zeros(shape, np.int32)
    decisive = np.zeros(shape, bool)
    cyto = np.zeros(shape, np.float32) if channels == 3 else None
    tub = np.zeros(shape, np.float32) if channels == 3 else None
    texture = ndimage.gaussian_filter(rng.normal(size=shape).astype(np.float32), 1.5 * scale)
    texture /= texture.std() + 1e-9
    records: list[dict[str, Any]] = []
    next_id = 1

    def paint(sl, occ, level, lab=True):
        nonlocal next_id
        nuc[sl] += occ * level
        if lab:
            region = labels[sl]
            region[(occ > 0.5) & (region == 0)] = next_id
            next_id += 1

    for kind, cy, cx, r in placed:
        rec: dict[str, Any] = {"kind": kind, "center": [round(cy, 2), round(cx, 2)], "radius": round(r, 2)}
        brightness = float(np.exp(rng.normal(0.0, 0.25)))
        theta = float(rng.uniform(0, np.pi))
        if kind == "nucleus":
            box = _box((cy, cx), 1.35 * r, shape)
            if box is None:
                continue
            sl, dy, dx = box
            aspect = rng.uniform(1.0, 1.45)
            harm = [(k, rng.uniform(0, 0.06), rng.uniform(0, 2 * np.pi)) for k in (2, 3, 4)]
            occ = _blob_occupancy(dy, dx, r * aspect**0.5, r / aspect**0.5, theta, harm)
            body = 1.0 + 0.18 * texture[sl]
            body += _spots(dy, dx, rng, rng.integers(0, 5), 0.6 * r, 0.09 * r + 0.5, 0.55)
            body -= _spots(dy, dx, rng, rng.integers(0, 3), 0.45 * r, 0.14 * r + 0.5, 0.35)
            paint(sl, occ, brightness * np.clip(body, 0.2, None))
            _cell_body(cyto, tub, rng, (cy, cx), r * rng.uniform(1.6, 2.1), theta, shape, 0.35, texture)
        elif kind == "pyknotic":
            box = _box((cy, cx), 1.3 * r, shape)
            if box is None:
                continue
            sl, dy, dx = box
            occ = _blob_occupancy(dy, dx, r, r * rng.uniform(0.85, 1.0), theta, [])
            paint(sl, occ, brightness * rng.uniform(1.3, 2.2) * (1 + 0.08 * texture[sl]))
            _cell_body(cyto, tub, rng, (cy, cx), r * 1.6, theta, shape, 0.6, texture)
        elif kind == "pair":
            box = _box((cy, cx), 1.3 * r, shape)
            if box is None:
                continue
            sl, dy, dx = box
            rd = r * rng.uniform(0.42, 0.5)
            sep = r - rd
            for sgn in (-1.0, 1.0):
                ddy, ddx = dy - sgn * sep * np.sin(theta), dx - sgn * sep * np.cos(theta)
                harm = [(2, rng.uniform(0, 0.08), rng.uniform(0, 2 * np.pi))]
                occ = _blob_occupancy(ddy, ddx, rd * rng.uniform(1.0, 1.25), rd, theta + np.pi / 2, harm)
                paint(sl, occ, brightness * rng.uniform(0.95, 1.3) * (1 + 0.15 * texture[sl]))
            _cell_body(cyto, tub, rng, (cy, cx), r * 1.4, theta, shape, 0.4, texture)
        else:  # a mitotic figure
            box = _box((cy, cx), 1.3 * r, shape)
            if box is None:
                continue
            sl, dy, dx = box
            length = r * rng.uniform(1.4, 1.8)
            bright = brightness * rng.uniform(1.15, 1.8)
            if kind == "metaphase":
                width = r * rng.uniform(0.36, 0.52)
                occ = _plate_occupancy(dy, dx, rng, length, width, theta, rng.uniform(-0.1, 0.1) * r, 0.0)
                paint(sl, occ, bright * (1 + 0.12 * texture[sl]))
                extent = np.hypot(length / 2, width / 2)
            else:
                width = r * rng.uniform(0.28, 0.38)
                sep = r * rng.uniform(0.35, 0.6)
                bend = r * rng.uniform(0.1, 0.3)
                length *= rng.uniform(0.8, 0.95)
                for sgn in (-1.0, 1.0):
                    occ = _plate_occupancy(dy, dx, rng, length, width, theta, sgn * bend, sgn * sep)
                    paint(sl, occ, bright * (1 + 0.12 * texture[sl]))
                extent = np.hypot(length / 2, sep + bend + width / 2)
            mask_r = max(extent, 0.8 * r) + 2.0 * scale
            decisive[sl] |= dy**2 + dx**2 <= mask_r**2
            rec.update(length=round(float(length), 2), mask_radius=round(float(mask_r), 2))
            _cell_body(cyto, tub, rng, (cy, cx), 1.25 * r, theta, shape, 0.8, texture,
                       spindle=(length, r))
        records.append(rec)

    n_debris = int(rng.poisson(4.0 * h * w / 512**2 / scale**2)) if debris else 0
    debris_map = np.zeros(shape, np.float32)
    for _ in range(n_debris):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        rad = rng.uniform(1.5, 5.0) * scale
        box = _box((cy, cx), 3 * rad, shape)
        if box is None:
            continue
        sl, dy, dx = box
        level = rng.uniform(0.6, 2.5)
        for _ in range(rng.integers(1, 4)):
            oy, ox = rng.normal(0, rad * 0.6, size=2)
            s = rad * rng.uniform(0.4, 0.8)
            debris_map[sl] += level * np.exp(-((dy - oy) ** 2 + (dx - ox) ** 2) / (2 * s**2))

    illum = 1.0 + rng.uniform(0.05, 0.3) * _smooth_field(rng, shape, 3)
    yy, xx = np.mgrid[0:h, 0:w]
    vignette = 1.0 - rng.uniform(0.0, 0.35) * (((yy - h / 2) / h) ** 2 + ((xx - w / 2) / w) ** 2) * 2
    illum = np.clip(illum * vignette, 0.3, None).astype(np.float32)
    bg_level = rng.uniform(0.03, 0.25)
    background = bg_level * (1.0 + 0.3 * _smooth_field(rng, shape, 4)).clip(0.2, None)
    haze_w = rng.uniform(0.0, 0.15)

    def render(signal: np.ndarray, extra_bg: float) -> np.ndarray:
        sharp = ndimage.gaussian_filter(signal + debris_map, psf)
        # out-of-focus light: a wide, low blur of the same signal
        haze = ndimage.gaussian_filter(sharp, 6 * scale, truncate=2.0)
        expected = photons * illum * (sharp + haze_w * haze + background + extra_bg)
        counts = rng.poisson(np.clip(expected, 0, None)).astype(np.float32)
        counts += rng.normal(0.0, read_noise, size=shape).astype(np.float32) + offset
        return counts

    planes = [render(nuc, 0.0)]
    if channels == 3:
        planes.append(render(cyto, 0.02))
        planes.append(render(tub, 0.02))
    image = planes[0] if channels == 1 else np.stack(planes, axis=-1)
    if dtype == "uint16":
        image = np.clip(np.rint(image), 0, 65535).astype(np.uint16)
    else:
        image = image.astype(np.float32)
    if label and not decisive.any():  # cannot happen: figures are placed inside the field
        raise RuntimeError("internal error: abnormal image without a decisive mask")

    params = {
        "seed": _seed_repr(seed), "size": [h, w], "channels": channels, "scale": scale,
        "label": label, "density": density, "mean_radius": round(float(r_mean), 3),
        "n_nuclei": sum(1 for r in records if r["kind"] == "nucleus"), "n_figures": n_fig,
        "n_pyknotic": n_pyk, "n_pairs": n_pairs, "n_debris": n_debris,
        "psf_sigma": round(psf, 3), "photons": round(photons, 2), "read_noise": read_noise,
        "offset": offset, "background": round(float(bg_level), 4), "haze": round(float(haze_w), 4),
        "objects": records,
    }
    return SyntheticSample(image=image, label=label, decisive_mask=decisive,
                           nuclei_labels=labels, params=params)


def _cell_body(cyto, tub, rng, center, radius, theta, shape, level, texture, spindle=None) -> None:
    """Cytoplasm and tubulin of one cell (3-channel images only); a spindle for mitoses."""
    if cyto is None:
        return
    box = _box(center, 1.3 * radius, shape)
    if box is None:
        return
    sl, dy, dx = box
    harm = [] if spindle is not None else [(k, rng.uniform(0, 0.15), rng.uniform(0, 2 * np.pi)) for k in (2, 3, 5)]
    occ = _blob_occupancy(dy, dx, radius * rng.uniform(1.0, 1.2), radius, theta, harm)
    cyto[sl] = np.maximum(cyto[sl], occ * level * (1 + 0.2 * texture[sl]))
    tub[sl] = np.maximum(tub[sl], occ * 0.25 * (1 + 0.5 * texture[sl]).clip(0, None))
    if spindle is not None:
        length, r = spindle
        u, v = _rotate(dy, dx, theta)
        pole = 0.95 * r
        # spindle: a rhombus between the two poles (perpendicular to the plate) plus bright poles
        rhomb = np.clip(1.0 - np.abs(v) / pole - np.abs(u) / (0.5 * length), 0.0, 1.0)
        poles = sum(np.exp(-(u**2 + (v - s * pole) ** 2) / (2 * (0.12 * r) ** 2)) for s in (-1, 1))
        tub[sl] += 0.9 * rhomb + 1.2 * poles


def _seed_repr(seed: SeedLike) -> Any:
    if isinstance(seed, (int, np.integer)):
        return int(seed)
    if isinstance(seed, np.random.SeedSequence):
        return {"entropy": str(seed.entropy), "spawn_key": list(seed.spawn_key)}
    if isinstance(seed, np.random.Generator):
        return "Generator"
    return [int(s) for s in seed]


def make_dataset(
    n: int,
    seed: int,
    *,
    balanced: bool = True,
    stream: int = 0,
    **kwargs: Any,
) -> SyntheticDataset:
    """Draw ``n`` independent samples.

    Parameters
    ----------
    n : int
        Number of images (≥ 1).
    seed : int
        Root seed; sample ``i`` uses the seed ``[seed, stream, i]``, so different streams
        (e.g. 0 = training, 1 = held-out) never share an image.
    balanced : bool
        Alternate abnormal / normal (``i`` even → abnormal) instead of drawing each label.
    stream : int
        Independent sub-stream of the root seed.
    **kwargs
        Passed to :func:`make_cell_image` (``size``, ``channels``, ``scale``, ...).

    Returns
    -------
    SyntheticDataset

    Examples
    --------
    >>> ds = make_dataset(4, seed=1, size=128, scale=0.5)
    >>> ds.images.shape, ds.labels.tolist()
    ((4, 128, 128), [1, 0, 1, 0])
    """
    if n < 1:
        raise ValueError(f"n must be ≥ 1, got {n}")
    if "abnormal" in kwargs and balanced:
        raise ValueError("Give either abnormal=... or balanced=True, not both.")
    seeds = [[int(seed), int(stream), i] for i in range(n)]
    samples = [
        make_cell_image(s, **({"abnormal": i % 2 == 0} if balanced else {}), **kwargs)
        for i, s in enumerate(seeds)
    ]
    return SyntheticDataset(
        images=np.stack([s.image for s in samples]),
        labels=np.array([s.label for s in samples], dtype=np.int64),
        decisive_masks=np.stack([s.decisive_mask for s in samples]),
        seeds=seeds,
    )


def demo_sample() -> SyntheticSample:
    """The bundled sample image: a held-out 512x512 uint16 field with mitotic figures.

    Its seed (:data:`DEMO_SEED`) lies outside the seed streams used to train the demo
    model, so the model has never seen it.
    """
    # 4x the training magnification: after the model's 512 -> 128 resize it looks like training data
    return make_cell_image(DEMO_SEED, size=DEMO_SIZE, scale=4 * TRAINING_SCALE, abnormal=True,
                           n_abnormal=2, photons=250.0, psf_sigma=1.2, density=0.14,
                           hard_negatives=False)


def write_demo_files(directory: str | Path) -> tuple[Path, Path]:
    """Write ``demo_cells.tif`` and ``demo_cells_mask.tif`` (uint8, 1 = decisive) into a folder.

    Returns
    -------
    (Path, Path)
        The image and mask paths.
    """
    import tifffile

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sample = demo_sample()
    img_path = directory / "demo_cells.tif"
    mask_path = directory / "demo_cells_mask.tif"
    meta = {"source": "napari_attnreg.testing.synthetic.demo_sample()", "seed": DEMO_SEED, "label": sample.label}
    tifffile.imwrite(img_path, sample.image, metadata=meta, compression="zlib")
    tifffile.imwrite(mask_path, sample.decisive_mask.astype(np.uint8), compression="zlib")
    return img_path, mask_path

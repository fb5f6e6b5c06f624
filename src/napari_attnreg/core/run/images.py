"""Any analyst's array → model-ready tensor, and the exact map back to the original pixels.

Microscopy data is rarely 8-bit RGB: 16-bit and float data get percentile scaling,
single-channel data is repeated to the model's channels, multichannel data is chosen or
merged, and the image is resized (keeping its aspect ratio) to multiples of the patch size.
The per-axis scale factors are kept so every map lands exactly on the original image.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from napari_attnreg.core.run.notes import ImageNoteWarning, TransparencyWarning
from napari_attnreg.core.run.options import WINDOW_PRESETS
from napari_attnreg.core.run.planes import PlaneStack, as_plain_array

TargetSize = int | tuple[int, int] | Literal["model", "native"] | None
#: Enlarging an image more than this per side is slow and adds no detail: warn.
UPSCALE_WARNING = 4.0
#: Transparent pixels become black, not white, when the median visible pixel lies in this
#: lowest share of the value range (a dark-field picture such as fluorescence).
DARK_FIELD_SHARE = 0.25


class ImageSizeWarning(ImageNoteWarning):
    """The model input is much larger than the image (slow, and no finer attention)."""


@dataclass(frozen=True)
class ChannelMap:
    """How the image's own channels become the model's normalised input channels.

    The bootstrap nulls are drawn in the image's own channels and then pass through the same
    map as the observed image, so a grey image gets grey nulls (one noise channel, repeated),
    never independent noise in each model channel.

    Attributes
    ----------
    source_channels, model_channels : int
    mean, std : tuple of float
        The model's normalisation, one value per model channel.
    """

    source_channels: int
    model_channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def kind(self) -> str:
        """``identity``, ``repeat`` (grey → every channel), ``average`` or ``zero-fill``."""
        if self.source_channels == self.model_channels:
            return "identity"
        if self.source_channels == 1:
            return "repeat"
        if self.model_channels == 1:
            return "average"
        return "zero-fill"

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """``(N, source_channels, H, W)`` intensities in [0, 1] → normalised model input."""
        if images.ndim != 4 or images.shape[1] != self.source_channels:
            raise ValueError(f"expected (N, {self.source_channels}, H, W) images, got "
                             f"{tuple(images.shape)}")
        kind = self.kind
        if kind == "repeat":
            images = images.expand(-1, self.model_channels, -1, -1)
        elif kind == "average":
            images = images.mean(1, keepdim=True)
        elif kind == "zero-fill":
            # like a microscope's RGB view: missing model channels stay black, extra ones go
            pad = images.new_zeros(images.shape[0], max(0, self.model_channels - images.shape[1]),
                                   *images.shape[2:])
            images = torch.cat([images, pad], 1)[:, : self.model_channels]
        m, s = _normalisation(self.mean, self.std, images.device)
        # the subtraction makes a new contiguous tensor (never the caller's); dividing it in
        # place, not into another one, is the same arithmetic with half the memory traffic
        # (0.83 → 0.31 s for 992 grey tiles of 224² on a 2-core CPU)
        return (images.float() - m).div_(s).contiguous()


@functools.lru_cache(maxsize=64)
def _normalisation(mean: tuple[float, ...], std: tuple[float, ...],
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's mean and std as ``(C, 1, 1)`` tensors on ``device``, made once.

    Copying them up for every chunk of nulls made the host wait for the chunk before: a
    copy from the host waits for the device's queued work.
    """
    with torch.inference_mode(False):  # plain tensors: a gradient map may save them
        m = torch.tensor(mean, dtype=torch.float32, device=device)[:, None, None]
        s = torch.tensor(std, dtype=torch.float32, device=device)[:, None, None]
    return m, s


@dataclass(frozen=True)
class PreparedImage:
    """A model-ready image and its geometry relative to the original array.

    Attributes
    ----------
    tensor : torch.Tensor
        ``(C, H, W)`` float32, normalised with the model's mean/std.
    source : torch.Tensor
        ``(c, H, W)`` float32 in [0, 1]: the image in its *own* ``c`` channels at the model's
        size, before the channel map; bootstrap nulls are drawn from it.
    channel_map : ChannelMap
        ``channel_map(source[None])[0]`` is ``tensor``; nulls go through it too.
    original : torch.Tensor, optional
        ``(c, H0, W0)`` float32 in [0, 1]: the image in its own channels before the resize
        to the model's size (None when no resize was needed). Nulls drawn at the image's
        own size start from it and go through :func:`resize_to` as the image did.
    display : np.ndarray
        ``(H0, W0)`` or ``(H0, W0, 3)`` float32 in [0, 1]: the scaled original, for figures.
    image_shape : tuple of int
        ``(H0, W0)`` of the original image.
    model_shape : tuple of int
        ``(H, W)`` fed to the model.
    patch_size : tuple of int
    notes : tuple of str
        Warnings about the image given while it was prepared (its size, its transparent
        pixels: :class:`ImageNoteWarning`); a result made from it lists them among its
        diagnostics, whoever prepared it.
    """

    tensor: torch.Tensor
    display: np.ndarray
    image_shape: tuple[int, int]
    model_shape: tuple[int, int]
    patch_size: tuple[int, int]
    source: torch.Tensor
    channel_map: ChannelMap
    original: torch.Tensor | None = None
    notes: tuple[str, ...] = ()

    @property
    def grid_shape(self) -> tuple[int, int]:
        (ph, pw), (h, w) = self.patch_size, self.model_shape
        return (h // ph, w // pw)

    @property
    def token_scale(self) -> tuple[float, float]:
        """Size of one token in original-image pixels, per axis."""
        return (
            self.patch_size[0] * self.image_shape[0] / self.model_shape[0],
            self.patch_size[1] * self.image_shape[1] / self.model_shape[1],
        )


def check_values(arr: np.ndarray) -> None:
    if arr.size == 0:
        raise ValueError("The image is empty (it has a zero-length axis); load a non-empty image.")
    if arr.dtype.kind == "c":
        raise ValueError("Complex images are not supported; pass the magnitude (np.abs) instead.")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"Image dtype {arr.dtype} is not numeric; pass a numeric array.")
    check_finite(arr)


def check_finite(arr: np.ndarray) -> None:
    """Refuse NaN/inf values with a message that says where and what to do (they are not a
    constant image, and percentiles of them are meaningless)."""
    if arr.dtype.kind != "f":
        return
    bad = ~np.isfinite(arr)
    if bad.any():
        pixels = int(np.count_nonzero(bad.any(-1) if bad.ndim == 3 else bad))
        raise ValueError(f"The image contains NaN/inf values at {pixels} pixels; replace them "
                         "(e.g. np.nan_to_num(image, nan=np.nanmedian(image))) or crop them away.")


def to_channels_last(
    image: np.ndarray,
    *,
    channel_axis: int | None = None,
    channels: Sequence[int] | None = None,
    merge: Literal["mean", "max"] | None = None,
    max_channels: int = 3,
) -> np.ndarray:
    """Bring a 2D image to ``(H, W)`` or ``(H, W, C ≤ max_channels)``.

    Parameters
    ----------
    image : np.ndarray
        ``(H, W)``, ``(H, W, 3|4)`` RGB(A), or multichannel with ``channel_axis`` given.
    channel_axis : int, optional
        Axis holding channels for multichannel data (e.g. 0 for ``(C, H, W)``).
    channels : sequence of int, optional
        Up to three channels to use (mapped to R, G, B).
    merge : "mean" or "max", optional
        Merge all (or the chosen) channels into one grayscale image instead.
    max_channels : int
        Most channels the model takes (3 for RGB models, 4 for a 4-channel model, ...).
    """
    arr = _channels_last_axis(as_plain_array(image), channel_axis)
    if arr.ndim not in (2, 3):
        raise ValueError(
            "Expected a 2D image (H, W), RGB(A) (H, W, 3|4) or multichannel with channel_axis; got "
            f"{arr.ndim}D shape {arr.shape}. For stacks use regularize_stack()."
        )
    if arr.ndim == 3:
        arr = _choose_channels(arr, channels, merge, max_channels)
    return arr


def _channels_last_axis(arr: np.ndarray, channel_axis: int | None) -> np.ndarray:
    """Move ``channel_axis`` last; without it flatten RGBA over a background
    (:func:`flatten_alpha`) and refuse an ambiguous 3D."""
    if channel_axis is not None:
        if arr.ndim != 3:
            raise ValueError(f"channel_axis needs a 3D (channels + 2D) image, got {arr.ndim}D.")
        if isinstance(channel_axis, bool) or not isinstance(channel_axis, (int, np.integer)) \
                or not -3 <= channel_axis < 3:
            raise ValueError(f"channel_axis={channel_axis!r} does not exist for an image of shape "
                             f"{arr.shape}; give 0, 1 or 2 (or -1 for the last axis).")
        return np.moveaxis(arr, int(channel_axis), -1)
    if arr.ndim == 3 and arr.shape[-1] == 4:
        colour, note = flatten_alpha(arr)
        if note is not None:
            warnings.warn(note, TransparencyWarning, stacklevel=4)
        return colour
    if arr.ndim == 3 and arr.shape[-1] not in (1, 2, 3):  # (H, W, 1|2) are channels, as in
        raise ValueError(                                  # PlaneStack, never H planes
            f"A 3D image of shape {arr.shape} is ambiguous: give channel_axis= for multichannel "
            f"data (e.g. channel_axis=0 for {arr.shape[0]} channels first), or use "
            "regularize_stack() for a z/t stack."
        )
    return arr


def flatten_alpha(image: np.ndarray) -> tuple[np.ndarray, str | None]:
    """``(H, W, C + 1)`` colours and a last alpha channel → ``(H, W, C)`` seen over a plain
    background, in the image's dtype, and a note saying so (None when every pixel is opaque).

    The colours stored under transparent pixels are not the picture (often black, sometimes
    whatever the last edit left there), so dropping the alpha analysed them as image. A
    transparent pixel is the background instead: white (brightfield, slides, documents)
    unless the visible pixels are mostly near black (fluorescence: the median visible pixel
    in the lowest :data:`DARK_FIELD_SHARE` of the range), then black; the lightest or
    darkest visible value for images that are not 8-bit; partly
    transparent pixels are blended into it. An alpha of 0 everywhere marks nothing (a writer
    that left it unset), and a fourth channel with no pixel opaque is no alpha (4-channel
    microscopy): the colours are analysed as stored, with a note saying so.
    """
    colour, alpha = image[..., :-1], image[..., -1]
    opacity = _opacity(alpha)
    if float(opacity.min()) >= 1.0:
        return colour, None
    if float(opacity.max()) <= 0.0:
        return colour, ("The image's alpha channel is 0 (fully transparent) at every pixel, "
                        "so it marks no background; the colours were analysed as stored. If "
                        "the image is meant to be transparent, this result is not meaningful.")
    values = colour.astype(np.float64)
    visible = opacity > 0
    lo, hi = (0.0, 255.0) if colour.dtype == np.uint8 else \
        (float(values[visible].min()), float(values[visible].max()))
    # black only for a dark-field picture (fluorescence: most visible pixels near black); a
    # brightfield cut-out of densely stained tissue is dark on average but lies on glass,
    # and a black surround would draw edges the slide never had
    typical = float(np.median(values[visible].mean(axis=-1)))
    bright = typical - lo > DARK_FIELD_SHARE * (hi - lo)
    background = hi if bright else lo
    blended = values * opacity[..., None] + background * (1.0 - opacity[..., None])
    if colour.dtype == bool:
        flat = blended >= 0.5
    elif colour.dtype.kind in "iu":
        info = np.iinfo(colour.dtype)
        flat = np.clip(np.rint(blended), info.min, info.max).astype(colour.dtype)
    else:
        flat = blended.astype(colour.dtype)
    if float(opacity.max()) < 1.0:  # nothing opaque: a fourth channel, not transparency
        return colour, _NOT_ALPHA
    clear, partial = int(np.count_nonzero(~visible)), int(np.count_nonzero(visible & (opacity < 1)))
    share = 100.0 * (clear + partial) / opacity.size
    return flat, (
        f"The image's alpha channel makes {share:.3g}% of its pixels transparent ({clear} fully, "
        f"{partial} partly): they were analysed as a {'white' if bright else 'black'} "
        f"background ({_WHY_WHITE if bright else _WHY_BLACK}), partly "
        "transparent ones blended into it, not with the colours stored under them. For another "
        "background, flatten the image onto it first (ImageMagick: magick IN -background "
        "white -flatten OUT; Python: PIL.Image.alpha_composite) and give that image.")


_WHY_WHITE = "as glass looks in brightfield"
_WHY_BLACK = "its visible pixels are mostly near black, as in fluorescence"
#: A fourth channel that marks no pixel opaque is no alpha channel (4-channel microscopy).
_NOT_ALPHA = ("The image's fourth channel, read as alpha (RGBA), makes no pixel opaque, so it is "
              "not taken for transparency: it was left out and the first three analysed as RGB. "
              "If it is a fourth channel, choose three with channel_axis=-1 and channels=[...] "
              "(command line: --channel-axis -1 --channels ...).")


def _opacity(alpha: np.ndarray) -> np.ndarray:
    """An alpha channel as opacity in [0, 1]: integers over their type's full range, floats
    as stored (over 255 or 65535 when they hold those ranges), booleans as 0/1."""
    if alpha.dtype == bool:
        return alpha.astype(np.float32)
    if alpha.dtype.kind in "iu":
        return np.clip(alpha.astype(np.float64) / np.iinfo(alpha.dtype).max, 0.0, 1.0)
    peak = float(np.nanmax(alpha)) if alpha.size else 1.0
    scale = 1.0 if peak <= 1.0 else 255.0 if peak <= 255.0 else 65535.0 if peak <= 65535.0 \
        else peak
    return np.clip(np.nan_to_num(alpha.astype(np.float64) / scale), 0.0, 1.0)


def _choose_channels(arr: np.ndarray, channels: Sequence[int] | None,
                     merge: Literal["mean", "max"] | None, max_channels: int) -> np.ndarray:
    """``(H, W, C)`` → the chosen channels, merged to grey, or a single channel's ``(H, W)``."""
    n_ch = arr.shape[-1]
    if channels is not None:
        channels = list(channels)
        if not channels or any(not 0 <= c < n_ch for c in channels):
            raise ValueError(f"channels={channels} invalid for an image with {n_ch} channels.")
        arr = arr[..., channels]
    if merge is not None:
        if merge not in ("mean", "max"):
            raise ValueError(f"merge must be 'mean' or 'max', got {merge!r}")
        return arr.astype(np.float32).mean(-1) if merge == "mean" else arr.max(-1)
    if arr.shape[-1] == 1:
        return arr[..., 0]
    if arr.shape[-1] > max_channels:
        raise ValueError(
            f"The image has {arr.shape[-1]} channels; choose up to "
            f"{'three' if max_channels == 3 else max_channels} with channels=[...] "
            "or merge them with merge='mean' / 'max'."
        )
    return arr


#: The percentiles an image is scaled between when no window is given.
PERCENTILES = (0.5, 99.8)
#: Share of pixels outside a window above which the run says the window may be wrong.
CLIPPED_SHARE = 0.95


@dataclass(frozen=True)
class IntensityScaling:
    """How a run maps pixel values to the model's [0, 1]: a window, or percentiles.

    Attributes
    ----------
    window : (float, float) or None
        ``(low, high)`` in the image's own units (e.g. Hounsfield units); values outside
        clip. None: each image (plane) between its own :data:`PERCENTILES`.
    source : str
        Where the window came from: ``"percentiles"``, ``"stored"`` (the file's display
        window), a preset's name, or ``"given"``.
    note : str, optional
        Why a window asked for was not used (the file states none), for the diagnostics.
    """

    window: tuple[float, float] | None = None
    source: str = "percentiles"
    note: str | None = None
    #: A stored window's explanation in the file (``"LUNG"``), "" when it states none.
    explanation: str = ""

    @classmethod
    def of(cls, choice: Any, extra: dict[str, Any] | None = None) -> IntensityScaling:
        """The scaling a run's ``intensity_window`` option asks for, given what the file
        says (``extra["stored_window"]``: ``[low, high]``, None for a DICOM file that
        states no window; absent for files that cannot state one).

        Examples
        --------
        >>> IntensityScaling.of((-600, 1500)).window
        (-1350.0, 150.0)
        >>> IntensityScaling.of("auto", {"stored_window": [-160, 240]}).source
        'stored'
        """
        extra = extra or {}
        stored = extra.get("stored_window")
        if isinstance(choice, str) and choice.startswith("stored "):  # the n-th stated
            return cls._numbered(int(choice.split()[1]), extra)
        if choice in (None, "auto", "stored"):
            if stored is not None:
                low, high = (float(v) for v in stored)
                named = [w for w in extra.get("stored_windows") or () if len(w) > 2]
                return cls((low, high), "stored", explanation=str(named[0][2]) if named else "")
            if choice == "stored" or "stored_window" in extra:
                what = "This DICOM file" if "stored_window" in extra else "This image"
                return cls(note=(
                    f"{what} states no display window (WindowCenter/WindowWidth), so its "
                    "intensities were scaled between the 0.5th and 99.8th percentiles of "
                    "each image (plane), not as a viewer windows them; give a window "
                    "(intensity_window='centre,width', e.g. '-600,1500', or a preset: "
                    f"{', '.join(WINDOW_PRESETS)}) to analyse what you see at that window."))
            return cls()
        if choice == "percentiles":
            return cls()
        name = choice if isinstance(choice, str) else "given"
        centre, width = WINDOW_PRESETS[choice] if isinstance(choice, str) else choice
        return cls((centre - width / 2, centre + width / 2), name)

    @classmethod
    def _numbered(cls, number: int, extra: dict[str, Any]) -> IntensityScaling:
        """The file's ``number``-th stored window (1 = the first), or a ValueError listing
        the ones it states."""
        windows = list(extra.get("stored_windows") or ())
        if number <= len(windows):
            low, high, *name = windows[number - 1]
            return cls((float(low), float(high)), f"stored {number}",
                       explanation=str(name[0]) if name else "")
        stated = "; ".join(
            f"stored {k}: centre {(w[0] + w[1]) / 2:g}, width {w[1] - w[0]:g}"
            + (f" ({w[2]})" if len(w) > 2 and w[2] else "") for k, w in enumerate(windows, 1))
        raise ValueError(
            f"intensity_window='stored {number}': the image states "
            f"{len(windows) or 'no'} display window{'' if len(windows) == 1 else 's'}"
            f"{' (' + stated + ')' if stated else ''}; choose one of them, a preset "
            f"({', '.join(WINDOW_PRESETS)}) or a centre and width (e.g. '-600,1500').")

    def record(self) -> dict[str, Any]:
        """What a result's metadata says of it (``intensity_scaling``)."""
        if self.window is None:
            return {"method": "percentiles", "percentiles": list(PERCENTILES)}
        low, high = self.window
        return {"method": "window", "source": self.source, "centre": (low + high) / 2,
                "width": high - low, "low": low, "high": high,
                "explanation": self.explanation}


def scale_intensity(arr: np.ndarray, percentiles: tuple[float, float] = PERCENTILES,
                    window: tuple[float, float] | None = None) -> np.ndarray:
    """Map intensities to float32 [0, 1]: uint8 by /255, bool as 0/1, else by percentiles;
    with ``window`` (low, high), every dtype linearly between them, values outside clipped.

    16-bit and float microscopy data use a fraction of their range; percentile scaling (per
    image, all channels together, so colour balance is kept) is what viewers show by default.
    A CT or radiograph is seen through a display window instead (lung, soft tissue), which
    the same values in and out of it give every plane of a volume alike.
    """
    check_finite(arr)
    if window is not None:
        return _windowed(arr, window)
    if arr.dtype == bool:
        out = arr.astype(np.float32)
    elif arr.dtype == np.uint8:
        out = arr.astype(np.float32) / 255.0
    elif arr.dtype.kind in "iu" and arr.dtype.itemsize > 2:
        # 32/64-bit integers: float32 (24 bits) would merge nearby large values (2**62 and
        # 2**62 + 1 became "constant"); scaling ignores an offset, so the minimum is taken
        # away first, exactly, modulo 2**64 (the difference always fits in uint64)
        low = arr.min()
        out = _scaled((arr.astype(np.uint64) - np.uint64(int(low) % 2**64))
                      .astype(np.float64), percentiles)
    else:
        # float64 beyond float32's range (1e300, 1e-300) is scaled in float64, never overflowed
        wide = arr.dtype.kind == "f" and arr.dtype.itemsize > 4
        data = arr.astype(np.float64 if wide else np.float32)
        if wide:
            peak = float(np.abs(data).max())
            if peak > 1e30:
                data = data / peak
        out = _scaled(data, percentiles)
    if float(out.max()) - float(out.min()) <= 0:
        raise ValueError("The image is constant (every pixel has the same value), so attention "
                         "on it has nothing to find; check that the right layer/channel was "
                         "chosen.")
    return out


def _windowed(arr: np.ndarray, window: tuple[float, float]) -> np.ndarray:
    """``arr`` between ``window``'s low and high (clipped); a window the image's values lie
    wholly outside of is refused, one that clips nearly all of them noted."""
    low, high = (float(v) for v in window)
    data = arr.astype(np.float64)
    out = np.clip((data - low) / (high - low), 0.0, 1.0).astype(np.float32)
    shown = f"the window {low:g} to {high:g} (centre {(low + high) / 2:g}, width {high - low:g})"
    values = f"its values range from {data.min():g} to {data.max():g}"
    if float(data.max()) <= float(data.min()):  # constant before any window: not its fault
        raise ValueError("The image is constant (every pixel has the same value), so attention "
                         "on it has nothing to find; check that the right layer/channel was "
                         "chosen.")
    if float(out.max()) - float(out.min()) <= 0:
        raise ValueError(f"The image is constant through {shown}: {values}, so every pixel "
                         "clips to one value; give a window in the image's units that holds "
                         "its values (a CT preset is in Hounsfield units), or "
                         "intensity_window='percentiles'.")
    outside = float(np.mean((data < low) | (data > high)))
    if outside >= CLIPPED_SHARE:
        warnings.warn(f"{100 * outside:.3g}% of the image's pixels lie outside {shown} and "
                      f"were clipped ({values}): check that the window is in the image's "
                      "units (a CT preset is in Hounsfield units).", ImageNoteWarning,
                      stacklevel=4)
    return out


def _scaled(data: np.ndarray, percentiles: tuple[float, float]) -> np.ndarray:
    """Float values to [0, 1] between two percentiles (the full range for spiky data)."""
    lo, hi = np.percentile(data, percentiles)
    if hi <= lo:  # spiky data: fall back to the full range
        lo, hi = data.min(), data.max()
    return np.clip((data - lo) / (hi - lo), 0.0, 1.0).astype(np.float32, copy=False) if hi > lo \
        else np.zeros(data.shape, np.float32)


def check_target_size(target_size: Any, patch_size: tuple[int, int]) -> TargetSize:
    """``target_size`` as :func:`model_input_shape` takes it, or a ValueError naming the forms.

    A size below one patch (``0``, ``(-16, -16)``, ``4``, ``True``) would give a one-token
    model input and a meaningless "1/1 tokens significant"; it is refused.
    """
    ph, pw = patch_size
    if target_size is None or (isinstance(target_size, str) and target_size in ("model", "native")):
        return target_size
    if isinstance(target_size, (tuple, list)) and len(target_size) == 2:
        sizes, minimum = tuple(target_size), (ph, pw)
    else:
        sizes, minimum = (target_size,), (max(ph, pw),)
    if all(_is_int(s) and s >= m for s, m in zip(sizes, minimum, strict=True)):
        return tuple(int(s) for s in sizes) if len(sizes) == 2 else int(sizes[0])
    raise ValueError(
        f"target_size={target_size!r} is not a model input size: use 'model' (the model's own "
        f"size), 'native' (the image's size), a long side in pixels ≥ the patch size "
        f"({max(ph, pw)}), or (height, width) each ≥ the patch size ({ph}, {pw}).")


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def as_rgb(display: np.ndarray) -> np.ndarray:
    """A grey or RGB image as it is; 2 channels as red/green (like a microscope's view),
    more than 3 as their first three — so every figure gets ``(H, W)`` or ``(H, W, 3)``."""
    if display.ndim != 3 or display.shape[-1] == 3:
        return display
    if display.shape[-1] < 3:
        pad = np.zeros((*display.shape[:2], 3 - display.shape[-1]), display.dtype)
        return np.concatenate([display, pad], axis=-1)
    return display[..., :3]


def model_input_shape(image_shape: tuple[int, int], patch_size: tuple[int, int],
                      target_size: TargetSize, default_size: tuple[int, int]) -> tuple[int, int]:
    """H, W fed to the model: aspect ratio kept, each a multiple of the patch size.

    Raises
    ------
    ValueError
        ``target_size`` is not one of the allowed forms (see :func:`check_target_size`).
    """
    h0, w0 = image_shape
    ph, pw = patch_size
    target_size = check_target_size(target_size, patch_size)
    if target_size in (None, "native"):
        scale = 1.0
    else:
        if target_size == "model":
            long_side = max(default_size)
        elif isinstance(target_size, tuple):
            th, tw = target_size
            return (max(ph, round(th / ph) * ph), max(pw, round(tw / pw) * pw))
        else:
            long_side = int(target_size)
        scale = long_side / max(h0, w0)
    return (max(ph, round(h0 * scale / ph) * ph), max(pw, round(w0 * scale / pw) * pw))


def warn_if_upscaled(image_shape: tuple[int, int], model_shape: tuple[int, int],
                     target_size: TargetSize,
                     patch_size: tuple[int, int] | None = None) -> float:
    """Warn (:class:`ImageSizeWarning`) when the model input enlarges the image more than
    :data:`UPSCALE_WARNING` times per side, or (with ``patch_size``, at any target size) so
    much that a patch covers less than one image pixel; return the factor.

    A 96x80 image run at 2048 px takes minutes and its attention is no finer than at the
    model's own size; a 12x9 crop at the model's size fills a 16x12 patch grid with
    interpolated pixels, and its patch-level map says nothing the pixels do not.
    """
    factor = max(model_shape[0] / image_shape[0], model_shape[1] / image_shape[1])
    if patch_size is not None:
        gh, gw = model_shape[0] // patch_size[0], model_shape[1] // patch_size[1]
        if image_shape[0] < gh or image_shape[1] < gw:
            warnings.warn(
                f"This {image_shape[0]}x{image_shape[1]} image has fewer pixels than the "
                f"model's {gh}x{gw} patch grid (enlarged {factor:.1f}x per side): a patch "
                "covers less than one image pixel, so the map is no finer than the pixels "
                "and neighbouring patches repeat them. Use a larger field of view, or a "
                "model with larger patches.", ImageSizeWarning, stacklevel=3)
            return factor
    if factor > UPSCALE_WARNING and target_size != "model":
        warnings.warn(
            f"target_size={target_size!r} enlarges this {image_shape[0]}x{image_shape[1]} image "
            f"{factor:.1f}x per side to {model_shape[0]}x{model_shape[1]} px: the run is about "
            f"{factor ** 2:.0f}x slower and the attention no finer. Use target_size='model' "
            "(or 'native') unless you need it.", ImageSizeWarning, stacklevel=3)
    return factor


def prepare_image(
    image: Any,
    *,
    patch_size: tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    default_size: tuple[int, int] = (224, 224),
    target_size: TargetSize = "model",
    channel_axis: int | None = None,
    channels: Sequence[int] | None = None,
    merge: Literal["mean", "max"] | None = None,
    percentiles: tuple[float, float] = PERCENTILES,
    window: tuple[float, float] | None = None,
) -> PreparedImage:
    """Turn a 2D image of any dtype and channel layout into a model-ready tensor.

    Parameters
    ----------
    image : array-like
        2D grayscale, RGB/RGBA, or multichannel (with ``channel_axis``); uint8/uint16/float/bool.
    patch_size, mean, std, default_size
        From the backbone (see :class:`Backbone`).
    target_size : "model", "native", int or (H, W)
        ``"model"``: long side = the model's default input size; ``"native"``: keep the image
        resolution (rounded to the patch size); int: that long side; (H, W): exactly that.
    channel_axis, channels, merge
        Multichannel handling, see :func:`to_channels_last`.
    percentiles : (float, float)
        Intensity scaling for non-uint8 data.
    window : (float, float), optional
        ``(low, high)`` in the image's units: intensities scaled between them instead,
        values outside clipped (:attr:`IntensityScaling.window`).

    Returns
    -------
    PreparedImage

    Raises
    ------
    ValueError
        Empty, NaN/Inf, constant, smaller than one patch, or wrong number of dimensions.
    """
    target_size = check_target_size(target_size, patch_size)  # before any work on the pixels
    arr = as_plain_array(image)
    check_values(arr)
    arr = to_channels_last(arr, channel_axis=channel_axis, channels=channels, merge=merge,
                           max_channels=max(3, len(mean)))
    h0, w0 = arr.shape[:2]
    ph, pw = patch_size
    if h0 < ph or w0 < pw:
        raise ValueError(f"The image ({h0}x{w0} px) is smaller than one {ph}x{pw} patch of this "
                         "model; use a larger image or a model with smaller patches.")
    display = scale_intensity(arr, percentiles, window)
    chw = torch.from_numpy(np.ascontiguousarray(display))
    chw = chw[None] if chw.ndim == 2 else chw.permute(2, 0, 1)
    h, w = model_input_shape((h0, w0), patch_size, target_size, default_size)
    warn_if_upscaled((h0, w0), (h, w), target_size, patch_size)
    original = None
    if (h, w) != (h0, w0):
        original = chw.float()
        chw = resize_to(original[None], (h, w))[0]
    source = chw.float().contiguous()
    channel_map = ChannelMap(int(source.shape[0]), len(mean), tuple(float(v) for v in mean),
                             tuple(float(v) for v in std))
    if len(mean) not in (1, 3) and channel_map.kind != "identity":
        # grey-to-RGB repetition and RGB zero-fill are conventions of RGB models; a model
        # trained on N specific channels (e.g. cell painting) must get exactly those N
        raise ValueError(
            f"This model takes {len(mean)} channels but the image gives "
            f"{channel_map.source_channels}; "
            f"pass an image with {len(mean)} channels (channel_axis=..., channels=[...] to pick "
            "them in the model's order).")
    return PreparedImage(tensor=channel_map(source[None])[0], display=as_rgb(display),
                         image_shape=(h0, w0), model_shape=(h, w), patch_size=(ph, pw),
                         source=source, channel_map=channel_map, original=original)


def resize_to(images: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """``(N, c, H0, W0)`` → ``(N, c, *shape)``: the one resize to the model's input size.

    Bilinear, antialiased when shrinking; nulls drawn at the image's own size take the
    same path, so they are smoothed exactly as the image was.
    """
    h0, w0 = images.shape[-2:]
    h, w = shape
    return F.interpolate(images.float(), size=(h, w), mode="bilinear",
                         antialias=h < h0 or w < w0, align_corners=False)


def map_over_stack(func: Callable[[np.ndarray], Any], stack: Any, *, spatial_ndim: int = 2,
                   channel_last: bool = False) -> list[Any]:
    """Apply ``func`` to every 2D plane of an nD stack, in C order of the leading axes.

    The stack is split by :class:`~napari_attnreg.core.run.planes.PlaneStack` (with ``stack=True``),
    the same rule the command line and the front ends use; a dask or zarr stack is read one
    plane at a time.

    Parameters
    ----------
    func : callable
        Called with each ``(H, W)`` plane, or ``(H, W, C)`` for colour/multichannel planes.
    stack : array-like
        ``(..., H, W)`` or ``(..., H, W, C)``.
    spatial_ndim : int
        Number of trailing image axes (2).
    channel_last : bool
        Whether a trailing channel axis follows the image axes. ``(H, W, 3|4)`` and
        ``(H, W, 1|2)`` are taken as one image with channels even without it.

    Returns
    -------
    list
        Results in the order of ``np.ndindex(leading_shape)``.

    Raises
    ------
    ValueError
        An empty stack, or ``(N, H, W, 3)`` without ``channel_last`` (say what the last axis is).
    """
    if spatial_ndim != 2:  # generic splitting for other callers, no channel rules
        arr = np.asarray(stack)
        tail = spatial_ndim + (1 if channel_last else 0)
        if arr.ndim < tail or arr.size == 0:
            raise ValueError(f"Expected a non-empty array of at least {tail} dimensions, "
                             f"got shape {arr.shape}.")
        lead = arr.shape[: arr.ndim - tail]
        return [func(arr[idx]) for idx in np.ndindex(lead)] if lead else [func(arr)]

    planes = PlaneStack.from_array(stack, channel_last=channel_last, stack=True)
    results = []
    for index in planes.planes():
        plane, _ = planes.read(index)  # channels are last in a plane whenever there are any
        results.append(func(plane))
    return results

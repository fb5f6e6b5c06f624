"""Bootstrap null images (the paper's four generators), generated on the compute device.

Every random value of null image ``b`` is a counter-based draw keyed by ``(seed, b)`` and its
position, so a whole chunk of null images is drawn in a few launches and the null
*images* do not depend on the chunking (the engine halves chunks on out-of-memory):
the same seed on the same device gives bit-identical images for any chunk size. Their
attention scores are another matter: the backbone's matrix products round differently for
different batch sizes, so the scores agree only to float32 rounding across chunk sizes (see
:mod:`.engine`, "Reproducibility").
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from napari_attnreg.core.run.options import NULL_METHODS

#: Largest image (pixels × channels) whose nulls are drawn at its own size; bigger images
#: are better analysed tiled, and their nulls are drawn at the model's size.
MAX_SOURCE_NULL_VALUES = 1 << 24
#: Null values drawn at once at the image's own size (bounds the work memory).
SOURCE_NULL_BATCH_VALUES = 1 << 25


@dataclass(frozen=True)
class NullConfig:
    """Parameters of a null generator.

    Attributes
    ----------
    method : {"normal", "uniform", "pixel", "patch"}
    std_factor : float
        ``normal`` only: scale of the noise relative to the image's std.
    per_channel : bool
        ``normal``/``uniform``: moments or bounds per channel (True) or over the whole image.
    block_size : int, optional
        ``patch`` only: block side in model pixels (default: the patch size).
    """

    method: str = "normal"
    std_factor: float = 1.0
    per_channel: bool = True
    block_size: int | None = None

    def __post_init__(self) -> None:
        if self.method not in NULL_METHODS:
            raise ValueError(f"Unknown bootstrap method {self.method!r}; choose one of "
                             f"{NULL_METHODS}.")
        if not (math.isfinite(self.std_factor) and self.std_factor > 0):
            raise ValueError(f"std_factor must be a positive number, got {self.std_factor}.")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {self.block_size}.")


_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _splitmix64(value: int) -> int:
    value = (value + _GAMMA) & _MASK64
    value = ((value ^ (value >> 30)) * _MIX1) & _MASK64
    value = ((value ^ (value >> 27)) * _MIX2) & _MASK64
    return value ^ (value >> 31)


def image_seed(seed: int, index: int) -> int:
    """Independent 63-bit key of null image ``index`` of a run seeded with ``seed``.

    SplitMix64 of the pair: well-mixed streams for neighbouring indices and seeds.
    """
    return _splitmix64(_splitmix64(int(seed) & _MASK64) ^ int(index)) >> 1


# ---------------------------------------------------------------- counter-based draws
#
# Value ``i`` of null image ``b`` is SplitMix64's output number ``i + 1`` for the image's key:
# ``mix(key_b + (i + 1)·γ)``. It depends on ``(seed, b, i)`` only, so a chunk of null
# images is drawn in a few elementwise integer launches on the device, and null ``b`` is the
# same for any chunking. Tensors hold the 64-bit words as int64: products wrap modulo 2⁶⁴
# as the unsigned ones do, and right shifts are masked to be logical.

#: Draws made at once: int64 work arrays of this many values bound the extra memory on a GPU;
#: on a CPU a block that stays in the cache is several times faster.
DRAW_BLOCK_VALUES = {"cuda": 1 << 24, "cpu": 1 << 16}


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x >> bits).bitwise_and_((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser, in place on ``x``."""
    x.bitwise_xor_(_shift_right(x, 30)).mul_(_signed(_MIX1))
    x.bitwise_xor_(_shift_right(x, 27)).mul_(_signed(_MIX2))
    return x.bitwise_xor_(_shift_right(x, 31))


def _words(seed: int, indices: Sequence[int], count: int, device: torch.device | str,
           stream: int = 0, whole_rows: bool = False) -> Iterator[tuple[tuple, torch.Tensor]]:
    """Random 64-bit words for null images ``indices``: ``(where, words)`` blocks of the
    ``(len(indices), count)`` array (``out[where] = f(words)`` fills it)."""
    keys = _image_keys(seed, indices, device, stream)
    steps = torch.arange(1, count + 1, dtype=torch.int64, device=device) * _signed(_GAMMA)
    block = DRAW_BLOCK_VALUES.get(torch.device(device).type, DRAW_BLOCK_VALUES["cuda"])
    if count > block and not whole_rows:  # a large image: its values in column blocks, one image at a time
        for row in range(len(keys)):
            for start in range(0, count, block):
                cols = slice(start, min(count, start + block))
                yield (slice(row, row + 1), cols), _mix(keys[row] + steps[cols])[None]
        return
    rows = max(1, block // count)
    for start in range(0, len(keys), rows):
        part = slice(start, min(len(keys), start + rows))
        yield (part, slice(None)), _mix(keys[part, None] + steps)


def _image_keys(seed: int, indices: Sequence[int], device: torch.device | str,
                stream: int) -> torch.Tensor:
    """``image_seed(seed, i) ^ stream`` for every ``i`` of ``indices``, as int64 on ``device``.

    A ``range`` (what the engines pass) is keyed on the device itself: building the keys on
    the host and copying them would wait for the device's queued work at every chunk, so the
    host could not queue the next chunk (or the map checks) while a chunk runs.
    """
    if isinstance(indices, range) and len(indices) and indices.start >= 0:
        index = torch.arange(indices.start, indices.stop, indices.step, dtype=torch.int64,
                             device=device)
        keys = _mix(index.bitwise_xor_(_signed(_splitmix64(int(seed) & _MASK64)))
                    .add_(_signed(_GAMMA)))
        return _shift_right(keys, 1).bitwise_xor_(_signed(stream))
    return torch.tensor([_signed(image_seed(seed, i) ^ stream) for i in indices],
                        dtype=torch.int64, device=device)


def _unit(words: torch.Tensor, low_bits: bool = False) -> torch.Tensor:
    """24 bits of each word as a float32 in [0, 1)."""
    bits = (words >> 8 if low_bits else _shift_right(words, 40)) & 0xFFFFFF
    return bits.to(torch.float32).mul_(2.0 ** -24)


def uniform_draws(seed: int, indices: Sequence[int], shape: tuple[int, ...],
                  device: torch.device | str) -> torch.Tensor:
    """Uniform [0, 1) float32 values ``(len(indices), *shape)``, null image by null image."""
    count = math.prod(shape)
    out = torch.empty((len(indices), count), dtype=torch.float32, device=device)
    for part, words in _words(seed, indices, count, device):
        out[part] = _unit(words)
    return out.view(len(indices), *shape)


def normal_draws(seed: int, indices: Sequence[int], shape: tuple[int, ...],
                 device: torch.device | str) -> torch.Tensor:
    """Standard normal float32 values ``(len(indices), *shape)`` (Box–Muller on one word)."""
    count = math.prod(shape)
    out = torch.empty((len(indices), count), dtype=torch.float32, device=device)
    for part, words in _words(seed, indices, count, device):
        radius = _unit(words).add_(2.0 ** -25).log_().mul_(-2.0).sqrt_()  # u in (0, 1)
        out[part] = radius.mul_(torch.cos(_unit(words, low_bits=True).mul_(2 * math.pi)))
    return out.view(len(indices), *shape)


def integer_draws(seed: int, indices: Sequence[int], count: int, high: int,
                  device: torch.device | str) -> torch.Tensor:
    """``count`` integers in ``[0, high)`` per null image: int64 ``(len(indices), count)``.

    32 random bits times ``high``, shifted down: a bias of at most ``high / 2³²``.
    """
    if not 0 < high < 1 << 31:
        raise ValueError(f"high must be in [1, 2**31), got {high}.")
    out = torch.empty((len(indices), count), dtype=torch.int64, device=device)
    for part, words in _words(seed, indices, count, device, stream=0x243F6A8885A308D3):
        out[part] = _shift_right(_shift_right(words, 32) * high, 32)
    return out


def permutation_draws(seed: int, indices: Sequence[int], count: int,
                      device: torch.device | str) -> torch.Tensor:
    """A random permutation of ``range(count)`` per null image (argsort of random keys)."""
    out = torch.empty((len(indices), count), dtype=torch.int64, device=device)
    for part, words in _words(seed, indices, count, device, stream=0x13198A2E03707344,
                              whole_rows=True):
        # 63 random bits and the position as a tie-break: distinct keys, a stable order
        out[part] = torch.argsort(_shift_right(words, 1), dim=1, stable=True)
    return out


def null_images(
    image: torch.Tensor,
    indices: Sequence[int],
    config: NullConfig,
    *,
    seed: int,
    patch_size: int | None = None,
) -> torch.Tensor:
    """Null images number ``indices`` for a model-ready image.

    Parameters
    ----------
    image : torch.Tensor
        ``(C, H, W)`` normalised image on the compute device.
    indices : sequence of int
        Which null images of the run to make (their draws derive from ``seed`` and the index).
    config : NullConfig
    seed : int
    patch_size : int, optional
        Default block size for ``patch``.

    Returns
    -------
    torch.Tensor
        ``(len(indices), C, H, W)``, same dtype and device as ``image``.
    """
    if image.ndim != 3:
        raise ValueError(f"image must be (C, H, W), got {tuple(image.shape)}")
    x = image.float()
    indices = indices if isinstance(indices, range) else list(indices)
    if config.method == "normal":
        mean, std = normal_moments(x, config)
        out = normal_draws(seed, indices, tuple(x.shape), x.device).mul_(std).add_(mean)
    elif config.method == "uniform":
        low, span = uniform_bounds(x, config)
        out = uniform_draws(seed, indices, tuple(x.shape), x.device).mul_(span).add_(low)
    elif config.method == "pixel":
        out = resampled_pixels(x, seed, indices, tuple(x.shape[1:]))
    else:
        out = shuffled_blocks(x, seed, indices,
                              config.block_size or patch_size)
    return out.to(image.dtype)


def normal_moments(x: torch.Tensor, config: NullConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and ``std_factor``·std of ``(C, H, W)``, per channel or global, shaped ``(c, 1, 1)``."""
    dims = (1, 2) if config.per_channel else (0, 1, 2)
    return (x.mean(dim=dims, keepdim=True),
            x.std(dim=dims, keepdim=True, unbiased=False) * config.std_factor)


def uniform_bounds(x: torch.Tensor, config: NullConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Minimum and range of ``(C, H, W)``, per channel or global, shaped ``(c, 1, 1)``."""
    flat = x.reshape(x.shape[0], -1) if config.per_channel else x.reshape(1, -1)
    low = flat.min(dim=1).values.view(-1, 1, 1)
    return low, flat.max(dim=1).values.view(-1, 1, 1) - low


def resampled_pixels(x: torch.Tensor, seed: int, indices: Sequence[int],
                     size: tuple[int, int]) -> torch.Tensor:
    """Null images of ``size`` whose pixel vectors are drawn with replacement from ``x``."""
    c = x.shape[0]
    pixels = x.reshape(c, -1)
    pick = integer_draws(seed, indices, size[0] * size[1], pixels.shape[1], x.device)
    # (c, n·h·w) in one gather, then images first
    return pixels[:, pick.reshape(-1)].view(c, len(pick), *size).transpose(0, 1).contiguous()


def shuffled_blocks(images: torch.Tensor, seed: int, indices: Sequence[int],
                    block: int | None) -> torch.Tensor:
    """Null images made of the blocks of ``block`` pixels of ``images`` in a random order.

    ``images`` is one ``(C, H, W)`` image for every null, or ``(len(indices), C, H, W)``:
    image ``k`` shuffled by null ``indices[k]``'s permutation.
    """
    c, h, w = images.shape[-3:]
    n = len(indices)
    if block is None:
        raise ValueError("The patch bootstrap needs a block size (or the model's patch size).")
    if h % block or w % block:
        raise ValueError(f"The patch bootstrap needs H, W ({h}, {w}) to be multiples of the "
                         f"block size {block}; choose a block size that divides both.")
    nby, nbx = h // block, w // block
    # one row per block, so a permutation moves whole blocks
    blocks = (images.reshape(-1, c, nby, block, nbx, block).permute(0, 1, 2, 4, 3, 5)
              .reshape(-1, c, nby * nbx, block * block))
    perm = permutation_draws(seed, indices, nby * nbx, images.device)
    if blocks.shape[0] == 1:  # one image for every null: a single gather, no copies of it
        shuffled = blocks[0][:, perm.reshape(-1)].view(c, n, nby * nbx, -1).transpose(0, 1)
    else:
        shuffled = torch.gather(blocks, 2, perm[:, None, :, None].expand(n, c, -1, block**2))
    return (shuffled.reshape(n, c, nby, nbx, block, block).permute(0, 1, 2, 4, 3, 5)
            .reshape(n, c, h, w))


def half_patch_block(patch: int) -> int:
    """The largest divisor of ``patch`` that is at most half of it (8 → 4, 14 → 7, 16 → 8)."""
    patch = int(patch)
    return max([d for d in range(1, patch // 2 + 1) if patch % d == 0], default=1)


def prepared_nulls(prepared, source: torch.Tensor, indices: Sequence[int], config: NullConfig, *,
                   seed: int, clamp: bool, resolution: str = "model") -> torch.Tensor:
    """Null images of a prepared image, in its own channels at the model's size.

    Parameters
    ----------
    prepared : PreparedImage
    source : torch.Tensor
        ``prepared.source`` on the compute device.
    indices, config, seed
        See :func:`null_images`.
    clamp : bool
        Clip the nulls to [0, 1] as the observed image's intensities were (before any resize).
    resolution : {"model", "source"}
        ``"source"``: ``normal``, ``uniform`` and ``pixel`` nulls are drawn at the image's own
        size from its own statistics and resized exactly as the image was, so that a noise
        image the preprocessing shrinks (and smooths) is a true null. ``patch`` nulls, and
        images that were not resized, are drawn at the model's size either way.

    Returns
    -------
    torch.Tensor ``(len(indices), c, H, W)``
    """
    patch = prepared.patch_size[0]
    original = prepared.original
    if (resolution != "source" or config.method == "patch" or original is None
            or original.numel() > MAX_SOURCE_NULL_VALUES):
        own = null_images(source, indices, config, seed=seed, patch_size=patch)
        return own.clamp_(0.0, 1.0) if clamp else own
    from napari_attnreg.core.run.images import (
        resize_to,  # images is the heavier module; nulls stays importable alone
    )

    original = original.to(source.device)
    per_batch = max(1, SOURCE_NULL_BATCH_VALUES // original.numel())
    indices = indices if isinstance(indices, range) else list(indices)
    parts = []
    for start in range(0, len(indices), per_batch):
        big = null_images(original, indices[start:start + per_batch], config, seed=seed,
                          patch_size=patch)
        if clamp:
            big.clamp_(0.0, 1.0)
        parts.append(resize_to(big, prepared.model_shape))
    return torch.cat(parts)

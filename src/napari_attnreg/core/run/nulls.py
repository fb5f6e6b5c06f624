"""Bootstrap null images (the paper's four generators), generated on the compute device.

Each null image ``b`` draws from its own generator, seeded from ``(seed, b)``. The null
*images* therefore do not depend on the chunking (the engine halves chunks on out-of-memory):
the same seed on the same device gives bit-identical images for any chunk size. Their
attention scores are another matter: the backbone's matrix products round differently for
different batch sizes, so the scores agree only to float32 rounding across chunk sizes (see
:mod:`.engine`, "Reproducibility").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def image_seed(seed: int, index: int) -> int:
    """Independent 63-bit seed for null image ``index`` of a run seeded with ``seed``.

    SplitMix64 of the pair: well-mixed streams for neighbouring indices and seeds, and about
    a microsecond per image (a thousand GPU nulls must not wait on seeding).
    """
    return _splitmix64(_splitmix64(int(seed) & _MASK64) ^ int(index)) >> 1


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
        Which null images of the run to make (their seeds derive from ``seed`` and the index).
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
    sampler = _SAMPLERS[config.method](image.float(), config, len(indices), patch_size)
    gen = torch.Generator(device=image.device)
    for row, index in enumerate(indices):
        gen.manual_seed(image_seed(seed, index))
        sampler.draw(row, gen)
    return sampler.finish().to(image.dtype)


class _Sampler:
    """One null method: the image's statistics once, then one draw per null image.

    ``draw(row, gen)`` fills null ``row`` from its own generator; ``finish()`` returns the
    chunk, with what can be done for the whole chunk at once done there (one scale, one
    copy), since a per-image step would cost a kernel launch per null on a GPU.
    """

    def __init__(self, x: torch.Tensor, config: NullConfig, n: int,
                 patch_size: int | None) -> None:
        self.x = x
        self.out = torch.empty((n, *x.shape), dtype=x.dtype, device=x.device)

    def draw(self, row: int, gen: torch.Generator) -> None:
        raise NotImplementedError

    def finish(self) -> torch.Tensor:
        return self.out


class _NormalSampler(_Sampler):
    """Gaussian noise with the image's mean and ``std_factor`` times its std."""

    def __init__(self, x: torch.Tensor, config: NullConfig, n: int,
                 patch_size: int | None) -> None:
        super().__init__(x, config, n, patch_size)
        dims = (1, 2) if config.per_channel else (0, 1, 2)
        self.mean = x.mean(dim=dims, keepdim=True)
        self.std = x.std(dim=dims, keepdim=True, unbiased=False) * config.std_factor

    def draw(self, row: int, gen: torch.Generator) -> None:
        # straight into the output; the whole chunk is scaled once in finish()
        torch.randn(tuple(self.x.shape), generator=gen, dtype=self.x.dtype, out=self.out[row])

    def finish(self) -> torch.Tensor:
        return self.out.mul_(self.std).add_(self.mean)


class _UniformSampler(_Sampler):
    """Uniform noise between the image's minimum and maximum."""

    def __init__(self, x: torch.Tensor, config: NullConfig, n: int,
                 patch_size: int | None) -> None:
        super().__init__(x, config, n, patch_size)
        c = x.shape[0]
        flat = x.reshape(c, -1) if config.per_channel else x.reshape(1, -1)
        self.low = flat.min(dim=1).values.view(-1, 1, 1)
        self.span = (flat.max(dim=1).values.view(-1, 1, 1) - self.low)

    def draw(self, row: int, gen: torch.Generator) -> None:
        torch.rand(tuple(self.x.shape), generator=gen, dtype=self.x.dtype, out=self.out[row])

    def finish(self) -> torch.Tensor:
        return self.out.mul_(self.span).add_(self.low)


class _PixelSampler(_Sampler):
    """The image's pixel vectors drawn with replacement (all channels of a pixel together)."""

    def __init__(self, x: torch.Tensor, config: NullConfig, n: int,
                 patch_size: int | None) -> None:
        super().__init__(x, config, n, patch_size)
        c, h, w = x.shape
        self.pixels = x.reshape(c, h * w)

    def draw(self, row: int, gen: torch.Generator) -> None:
        c, hw = self.pixels.shape
        pick = torch.randint(0, hw, (hw,), generator=gen, device=self.x.device)
        torch.index_select(self.pixels, 1, pick, out=self.out[row].view(c, hw))


class _PatchSampler(_Sampler):
    """The image's blocks of ``block_size`` (default the patch size) in a random order."""

    def __init__(self, x: torch.Tensor, config: NullConfig, n: int,
                 patch_size: int | None) -> None:
        c, h, w = x.shape
        block = config.block_size or patch_size
        if block is None:
            raise ValueError("The patch bootstrap needs a block size (or the model's patch size).")
        if h % block or w % block:
            raise ValueError(f"The patch bootstrap needs H, W ({h}, {w}) to be multiples of the "
                             "block "
                             f"size {block}; choose a block size that divides both.")
        self.x, self.block, self.grid = x, block, (h // block, w // block)
        nby, nbx = self.grid
        # (C, nby, nbx, block, block): one row per block, so a permutation shuffles whole blocks
        self.blocks = (x.reshape(c, nby, block, nbx, block).permute(0, 1, 3, 2, 4)
                       .reshape(c, nby * nbx, block, block))
        self.shuffled = torch.empty((n, c, nby * nbx, block, block), dtype=x.dtype,
                                    device=x.device)

    def draw(self, row: int, gen: torch.Generator) -> None:
        perm = torch.randperm(self.blocks.shape[1], generator=gen, device=self.x.device)
        torch.index_select(self.blocks, 1, perm, out=self.shuffled[row])

    def finish(self) -> torch.Tensor:
        # blocks back to image layout, one copy for the whole chunk
        (c, h, w), (nby, nbx), block = self.x.shape, self.grid, self.block
        n = self.shuffled.shape[0]
        return (self.shuffled.view(n, c, nby, nbx, block, block).permute(0, 1, 2, 4, 3, 5)
                .reshape(n, c, h, w))


_SAMPLERS: dict[str, type[_Sampler]] = {
    "normal": _NormalSampler, "uniform": _UniformSampler, "pixel": _PixelSampler,
    "patch": _PatchSampler,
}


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
    indices = list(indices)
    parts = []
    for start in range(0, len(indices), per_batch):
        big = null_images(original, indices[start:start + per_batch], config, seed=seed,
                          patch_size=patch)
        if clamp:
            big.clamp_(0.0, 1.0)
        parts.append(resize_to(big, prepared.model_shape))
    return torch.cat(parts)

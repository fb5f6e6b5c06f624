"""The options of a run: :class:`RunConfig`, its one validator, and what it asks of a device.

Both engines (:mod:`.engine`, :mod:`.tiled_engine`) and their shared chunk loop
(:mod:`.passes`) read their options from here, so none of them imports another engine to
learn what a run is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch

from napari_attnreg.core.models.backbones import Backbone
from napari_attnreg.core.run.images import TargetSize
from napari_attnreg.core.run.nulls import NullConfig, half_patch_block
from napari_attnreg.core.run.options import NULL_SCOPES, OPTIONS, validate_options
from napari_attnreg.core.run.tiling import work_shape
from napari_attnreg.core.stats.presets import DEFAULT_PRESET, THRESHOLD_KEYS, resolve_options

Precision = Literal["auto", "float32", "bfloat16", "float16"]
CPU_MAX_CHUNK = 32  # beyond this CPU throughput no longer improves and memory keeps growing


@dataclass
class RunConfig:
    """Every option of a run (all keyword arguments of :func:`regularize`).

    ``preset`` ("stepdown", the default, "directional" or "paper") fills every statistics
    option left at ``None``; :meth:`resolved` returns the config with those filled in.
    ``tiled=True`` cuts
    a large image into model-sized tiles at its native pixel size divided by ``tile_scale``
    (``tile_overlap`` pixels shared by neighbours) with one null for the whole image
    (``null_scope="image"``) or one per tile (``"tile"``); see :mod:`.tiled_engine`.
    """

    preset: str = DEFAULT_PRESET
    method: str | None = None
    null_resolution: str | None = None
    n_boot: int = 200
    seed: int = 0
    device: str = "auto"
    chunk_size: int | None = None
    memory_fraction: float = 0.5
    precision: Precision = "auto"
    layer: int = -1
    head: str | int = "mean"
    p_method: str | None = None
    alternative: str | None = None
    pi0_method: str | float | None = None
    null: str | None = None
    null_pool: str | None = None
    tail: str | None = None
    rule: str | None = None
    z_th: float | None = None
    p_th: float | None = None
    l_th: float | None = None
    q_th: float | None = None
    std_factor: float = 1.0
    per_channel: bool = True
    block_size: int | None = None
    keep_nulls: bool = False
    target_size: TargetSize = "model"
    channel_axis: int | None = None
    channels: Sequence[int] | None = None
    merge: str | None = None
    image_kind: str | None = None
    tiled: bool = False
    tile_scale: float = 1.0
    tile_overlap: int | None = None
    null_scope: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def resolved(self) -> RunConfig:
        """A copy with every preset-dependent option filled in (and checked against it)."""
        keys = ("p_method", "alternative", "pi0_method", "null", "null_pool", "method",
                "null_resolution", *THRESHOLD_KEYS)
        resolved = resolve_options(self.preset, {k: getattr(self, k) for k in keys})
        tail = self.tail
        if tail is None:  # the tail matters where tiles need p below 1/(B + 1)
            tail = "gpd" if self.preset == "stepdown" and self.tiled else "none"
        elif tail != "none" and self.preset != "stepdown":
            raise ValueError(f"tail={tail!r} belongs to the step-down preset; pass "
                             "preset='stepdown' or leave tail unset.")
        return replace(self, tail=tail, **resolved)

    def thresholds(self) -> dict[str, Any]:
        """The rule and thresholds of a resolved config."""
        return {k: getattr(self, k) for k in THRESHOLD_KEYS}

    def validate(self) -> RunConfig:
        """Check every option (the one validator of API, CLI, napari and notebook).

        Returns
        -------
        RunConfig
            The resolved config with normalised values (e.g. ``head="3"`` → ``3``).

        Raises
        ------
        ValueError
            That says which option to change and how.
        """
        values = {name: getattr(self, name) for name in OPTIONS}
        checked = replace(self, **validate_options(values)).resolved()
        null_config(checked, None)
        validate_tiling(checked)
        return checked


def validate_tiling(config: RunConfig) -> None:
    """Raise a ValueError that says what to change for an invalid tiling option."""
    if not isinstance(config.tiled, (bool, np.bool_)):
        raise ValueError(f"tiled must be True or False, got {config.tiled!r}.")
    if config.null_scope is not None and config.null_scope not in NULL_SCOPES:
        raise ValueError(f"null_scope must be one of {NULL_SCOPES}, got {config.null_scope!r}.")
    if config.null_scope is not None and not config.tiled:
        raise ValueError("null_scope applies to tiled runs only; pass tiled=True or leave it "
                         "unset.")
    work_shape((1, 1), (1, 1), config.tile_scale)  # checks tile_scale
    if config.tile_overlap is not None and (
            not isinstance(config.tile_overlap, (int, np.integer)) or config.tile_overlap < 0):
        raise ValueError(f"tile_overlap must be a non-negative number of pixels (or None: a "
                         f"quarter of the tile), got {config.tile_overlap!r}.")


def null_config(config: RunConfig, patch: int | None) -> NullConfig:
    """The null generator of a resolved config for a model with this patch size.

    Under the step-down preset the ``patch`` null's default blocks are half a patch (the
    largest divisor of the patch size up to half of it): "no structure coarser than half a
    patch" is its null hypothesis. The other presets shuffle whole patches.
    """
    block = config.block_size
    if block is None and config.preset == "stepdown" and patch is not None:
        block = half_patch_block(patch)
    return NullConfig(config.method, config.std_factor, config.per_channel, block)


def tested_head(config: RunConfig) -> str | int:
    """The head whose map is tested: ``"mean"`` (of all heads) or a head number."""
    return config.head if config.head == "mean" else int(config.head)  # numpy ints too


def autocast_dtype(device: torch.device, precision: Precision) -> torch.dtype | None:
    """Low-precision type for the backbone, or None for float32."""
    if precision == "float32":
        return None
    if precision == "bfloat16":
        return torch.bfloat16
    if precision == "float16":
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return None  # CPU bf16 is slower than float32 on most CPUs; MPS autocast is still partial


def auto_chunk_size(backbone: Backbone, model_shape: tuple[int, int], device: torch.device,
                    dtype: torch.dtype | None, memory_fraction: float = 0.5,
                    largest: int | None = None) -> int:
    """Null images per chunk from a memory budget.

    Under inference mode only one block's activations live at a time; the widest is the MLP
    (4·D per token) next to the residual stream and q/k/v, about 16·D values per token.
    ``largest`` replaces the usual caps (512 on a GPU, :data:`CPU_MAX_CHUNK` elsewhere): tiles
    of a small model are cheap images, and a GPU then runs far more of them per launch.
    """
    ph, pw = backbone.patch_size
    tokens = (model_shape[0] // ph) * (model_shape[1] // pw) + backbone.num_prefix_tokens
    width = backbone.embed_dim
    elem = 2 if dtype in (torch.bfloat16, torch.float16) else 4
    pixels = model_shape[0] * model_shape[1]
    per_image = tokens * width * 16 * elem + backbone.in_chans * pixels * 4 * 3
    if device.type != "cuda":
        # CPU/MPS SDPA may fall back to the math kernel, which holds a heads×L×L matrix
        per_image += backbone.num_heads * tokens * tokens * 4
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        budget = free * memory_fraction
        return int(max(1, min(largest or 512, budget // per_image)))
    budget = 2 * 1024**3  # CPU/MPS: stay far from the analyst's RAM limits
    return int(max(1, min(largest or CPU_MAX_CHUNK, budget // per_image)))

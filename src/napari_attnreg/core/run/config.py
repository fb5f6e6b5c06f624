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
from napari_attnreg.core.models.scorers import Scorer, as_target, make_scorer
from napari_attnreg.core.models.scorers.target import PREDICTED
from napari_attnreg.core.run.images import TargetSize
from napari_attnreg.core.run.nulls import NullConfig, half_patch_block
from napari_attnreg.core.run.options import NULL_SCOPES, OPTIONS, validate_options
from napari_attnreg.core.run.tiling import work_shape
from napari_attnreg.core.stats.procedures import (
    STATISTICS_KEYS,
    THRESHOLD_KEYS,
    Procedure,
    get_procedure,
    procedure_names,
)

Precision = Literal["auto", "float32", "bfloat16", "float16"]


def _default(name: str) -> Any:
    """A field's default, from the option metadata (each default is written there only):
    ``None`` for an option the preset fills."""
    return OPTIONS[name].unset

#: Most images per CPU chunk: beyond it throughput no longer improves and memory keeps growing.
CPU_MAX_CHUNK = 32
#: A modest CPU's sustained float32 rate (FLOP/s): chunks are sized for about a second each.
CPU_FLOPS = 2e10
#: Fewest images per CPU chunk (the memory budget allowing). A model of a foundation model's
#: size costs more than a second per image by :data:`CPU_FLOPS`, so the latency bound alone
#: gave tiled runs chunks of one or two tiles, and a CPU runs a ViT one image at a time well
#: below its batched rate (2 cores, images per second at 1 / 4 per batch: ViT-S/16 17.9 /
#: 21.0, DINOv2 ViT-S/14 15.3 / 17.4, ViT-B/16 4.4 / 7.3; ``benchmarks/bench_cpu_batch.py``).
#: Past a few images larger chunks were no faster and 16 or 32 slower (caches): an untiled
#: run of B = 96 took 6.8 s (DINOv2) and 5.7 s (ViT-S/16) in chunks of 32, 5.6 s and 4.7 s
#: in chunks of 4.
CPU_EFFICIENT_CHUNK = 4


def latency_chunk(backbone: Backbone, tile: tuple[int, int], seconds: float = 1.0) -> int:
    """Images per chunk so that a CPU chunk takes about ``seconds`` (the cancel latency).

    From the model's arithmetic, not from a clock: a timed size would differ from run to
    run, and the chunk size changes the last bits of the attention.
    """
    tokens = (tile[0] // backbone.patch_size[0]) * (tile[1] // backbone.patch_size[1])
    tokens += backbone.num_prefix_tokens
    width = int(backbone.embed_dim)  # timm and Hugging Face models alike
    # per block: qkv, projection and the 4x MLP (12·T·D² MACs) plus the T² attention
    macs = backbone.depth * (12 * tokens * width**2 + 2 * tokens**2 * width)
    return max(1, int(seconds * CPU_FLOPS / (2 * macs)))


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

    preset: str = _default("preset")
    method: str | None = _default("method")
    null_resolution: str | None = _default("null_resolution")
    n_boot: int = _default("n_boot")
    seed: int = _default("seed")
    device: str = _default("device")
    chunk_size: int | None = _default("chunk_size")
    memory_fraction: float = _default("memory_fraction")
    precision: Precision = _default("precision")
    layer: int = _default("layer")
    head: str | int = _default("head")
    map: str = _default("map")
    target: Any = _default("target")
    sign: str = _default("sign")
    exclude_sinks: bool = _default("exclude_sinks")
    p_method: str | None = _default("p_method")
    alternative: str | None = _default("alternative")
    pi0_method: str | float | None = _default("pi0_method")
    null: str | None = _default("null")
    null_pool: str | None = _default("null_pool")
    tail: str | None = _default("tail")
    rule: str | None = _default("rule")
    z_th: float | None = _default("z_th")
    p_th: float | None = _default("p_th")
    l_th: float | None = _default("l_th")
    q_th: float | None = _default("q_th")
    std_factor: float = _default("std_factor")
    per_channel: bool = _default("per_channel")
    block_size: int | None = _default("block_size")
    keep_nulls: bool = _default("keep_nulls")
    target_size: TargetSize = _default("target_size")
    channel_axis: int | None = _default("channel_axis")
    channels: Sequence[int] | None = _default("channels")
    merge: str | None = _default("merge")
    image_kind: str | None = _default("image_kind")
    intensity_window: str | tuple[float, float] = _default("intensity_window")
    tiled: bool = _default("tiled")
    tile_scale: float = _default("tile_scale")
    tile_overlap: int | None = _default("tile_overlap")
    null_scope: str | None = _default("null_scope")
    level: int | None = _default("level")
    mpp: float | None = _default("mpp")
    tissue_mask: Any = _default("tissue_mask")
    extra: dict[str, Any] = field(default_factory=dict)

    def resolved(self) -> RunConfig:
        """A copy with every preset-dependent option filled in (and checked against it)."""
        procedure = self.procedure
        resolved = procedure.resolve({k: getattr(self, k) for k in STATISTICS_KEYS})
        tail = self.tail
        if tail is None:  # the tail matters where tiles need p below 1/(B + 1)
            tail = "gpd" if procedure.offers_tail and self.tiled else "none"
        elif tail != "none" and not procedure.offers_tail:
            offering = [get_procedure(n) for n in procedure_names()
                        if get_procedure(n).offers_tail]
            raise ValueError(f"tail={tail!r} belongs to the {offering[0].title} preset; pass "
                             f"preset={offering[0].name!r} or leave tail unset.")
        return replace(self, tail=tail, **resolved)

    @property
    def procedure(self) -> Procedure:
        """The statistical procedure ``preset`` names (a ValueError for an unknown one)."""
        return get_procedure(self.preset)

    def statistics_options(self) -> dict[str, Any]:
        """The resolved options a procedure's statistics read, as plain keywords."""
        return {k: getattr(self, k) for k in (*STATISTICS_KEYS, "tail")}

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
        validate_map(checked)
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
    if config.tissue_mask is not None and not config.tiled and not (
            isinstance(config.tissue_mask, str) and config.tissue_mask == "none"):
        # an untiled run reads no mask: recording one would claim tiles were left out
        raise ValueError("A tissue mask applies to tiled runs only: run tiled ('Tiled' in "
                         "napari, tiled=True in Python, --tiled on the command line) or leave "
                         "the mask unset.")
    if config.level is not None and config.mpp is not None:
        # the wording of io.slides (SlideLevels.choose), said once here before any slide is
        # read (mpp itself is checked finite and in range by validate_options)
        raise ValueError("Give a slide level or a resolution (mpp), not both: leave one "
                         "empty ('Slide level' / 'Slide resolution' in napari, level= / mpp= "
                         "in Python, --level / --mpp on the command line).")
    work_shape((1, 1), (1, 1), config.tile_scale)  # checks tile_scale
    if config.tile_overlap is not None and (
            not isinstance(config.tile_overlap, (int, np.integer)) or config.tile_overlap < 0):
        raise ValueError(f"tile_overlap must be a non-negative number of pixels (or None: a "
                         f"quarter of the tile), got {config.tile_overlap!r}.")


def scorer_of(config: RunConfig) -> Scorer:
    """The configured map (scorer) of a run."""
    return make_scorer(config.map, layer=config.layer, head=tested_head(config),
                       target=config.target)


def tests_shares(config: RunConfig) -> bool:
    """The run's procedure tests re-normalised shares step by step (families, signed parts)."""
    return bool(config.procedure.uses_step_p)


def validate_map(config: RunConfig) -> None:
    """Raise a ValueError for a map option that does not fit the run."""
    needs = scorer_of(config).needs  # an unknown map or target is named here
    if config.sign != "for" and not needs.signed:
        raise ValueError(f"sign={config.sign!r} applies to signed maps (cdam); map="
                         f"{config.map!r} is never negative. Leave sign='for'.")
    if config.tiled and (needs.family is not None or config.exclude_sinks):
        what = f"map={config.map!r}" if needs.family is not None else "exclude_sinks=True"
        raise ValueError(f"{what} is for untiled runs (the tiles are the families of a tiled "
                         "run); pass tiled=False, or map='attention' without exclude_sinks.")
    if config.tiled and needs.target and as_target(config.target).kind == PREDICTED:
        raise ValueError(f"map={config.map!r} on a tiled image needs its target stated (a "
                         "class index or a concept): no one class is predicted for all tiles.")
    # map="heads" and exclude_sinks=True suit every preset of an untiled run: the step-down
    # runs one step-down per head (BH over the heads); the pooled-null presets test each head
    # alone against its own nulls and take q over all heads' tokens (core/stats/pooled_families)


def null_config(config: RunConfig, patch: int | None) -> NullConfig:
    """The null generator of a resolved config for a model with this patch size.

    Under the step-down preset the ``patch`` null's default blocks are half a patch (the
    largest divisor of the patch size up to half of it): "no structure coarser than half a
    patch" is its null hypothesis. The other presets shuffle whole patches.
    """
    block = config.block_size
    if block is None and config.procedure.half_patch_blocks and patch is not None:
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
    Without it a CPU chunk also holds about a second's work (:func:`latency_chunk`), at
    least :data:`CPU_EFFICIENT_CHUNK` images: a large ViT ran slower in chunks of 32.
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
    most = largest or CPU_MAX_CHUNK
    if device.type == "cpu" and largest is None:
        # a large model's images in small chunks: about a second each, a few at least
        most = min(most, max(CPU_EFFICIENT_CHUNK, latency_chunk(backbone, model_shape)))
    return int(max(1, min(most, budget // per_image)))

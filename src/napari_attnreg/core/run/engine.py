"""The pipeline as a generator: observed attention, null chunks, statistics.

:func:`run_engine` yields a :class:`Progress` after the observed map and after every chunk
of null images, and returns the :class:`AttentionResult` (``StopIteration.value``). Each
yield is a cancellation point: a :class:`CancelToken` or ``generator.close()`` stops it
before the next chunk. The napari worker runs this generator; :func:`regularize` drains it.

Reproducibility. The same image, options, seed, model, device and ``chunk_size`` give a
bit-identical result. Across chunk sizes (another ``chunk_size``, an out-of-memory halving,
or the automatic size, which on a GPU follows the free memory) what is and is not invariant:

* the null images are bit-identical (each has its own random stream, see :mod:`.nulls`);
* the observed attention and per-head attention are bit-identical (computed alone);
* the null images' attention scores agree to float32 rounding (relative ~1e-6): the
  backbone's matrix products round differently for different batch sizes;
* hence z, lfdr and the posterior agree to ~1e-5, and an empirical p-value can move by one
  rank step of its null pool at a patch whose observed score ties a null score within that
  rounding; a mask can differ only at such a patch.

For bit-identical reruns give ``chunk_size`` explicitly (on a CPU the automatic size
depends only on the model and the image size).
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Callable, Generator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch

from napari_attnreg.core.models.attention import cls_attention
from napari_attnreg.core.models.backbones import Backbone, resolve_device
from napari_attnreg.core.models.weights_hash import weights_sha256
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.images import (
    ImageSizeWarning,
    PreparedImage,
    TargetSize,
    prepare_image,
)
from napari_attnreg.core.run.nulls import NullConfig, half_patch_block, prepared_nulls
from napari_attnreg.core.run.options import OPTIONS, validate_options
from napari_attnreg.core.stats.diagnostics import diagnose
from napari_attnreg.core.stats.directional import directional_statistics
from napari_attnreg.core.stats.paper import (
    StatisticsWarning,
    compute_statistics,
)
from napari_attnreg.core.stats.presets import DEFAULT_PRESET, THRESHOLD_KEYS, resolve_options
from napari_attnreg.core.stats.stepdown_maps import stepdown_statistics

Precision = Literal["auto", "float32", "bfloat16", "float16"]
CPU_MAX_CHUNK = 32  # beyond this CPU throughput no longer improves and memory keeps growing


class RunCancelled(Exception):
    """Raised by :func:`run_engine` when its :class:`CancelToken` was cancelled."""


class CancelToken:
    """Thread-safe flag a GUI sets to stop a run at the next chunk boundary."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise RunCancelled("The run was cancelled.")


@dataclass(frozen=True)
class Progress:
    """One progress event.

    Attributes
    ----------
    stage : {"observed", "nulls", "statistics"}
    done, total : int
        Null images processed so far and requested.
    chunk_size : int
        Current chunk size (it halves after an out-of-memory error).
    elapsed_s : float
    message : str
    """

    stage: str
    done: int
    total: int
    chunk_size: int
    elapsed_s: float
    message: str = ""

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


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
        from napari_attnreg.core.run.tiled_engine import (
            validate_tiling,  # tiling imports this module
        )

        validate_tiling(checked)
        return checked


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
                    dtype: torch.dtype | None, memory_fraction: float = 0.5) -> int:
    """Null images per chunk from a memory budget.

    Under inference mode only one block's activations live at a time; the widest is the MLP
    (4·D per token) next to the residual stream and q/k/v, about 16·D values per token.
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
        return int(max(1, min(512, budget // per_image)))
    budget = 2 * 1024**3  # CPU/MPS: stay far from the analyst's RAM limits
    return int(max(1, min(CPU_MAX_CHUNK, budget // per_image)))


def _is_oom(err: BaseException) -> bool:
    if isinstance(err, (getattr(torch, "OutOfMemoryError", ()), torch.cuda.OutOfMemoryError)):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()


def _amp(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("napari-attnreg")
    except ImportError:  # PackageNotFoundError: a source tree that was never installed
        return "unknown"


def run_engine(
    image: Any,
    backbone: Backbone,
    config: RunConfig,
    cancel: CancelToken | None = None,
) -> Generator[Progress, None, AttentionResult]:
    """Run the bootstrap pipeline, yielding progress once per chunk.

    Parameters
    ----------
    image : array-like or PreparedImage
        The 2D image (see :func:`prepare_image`), or one already prepared.
    backbone : Backbone
    config : RunConfig
    cancel : CancelToken, optional

    Yields
    ------
    Progress

    Returns
    -------
    AttentionResult
        As ``StopIteration.value``; :func:`drain` collects it.

    Raises
    ------
    RunCancelled
        When ``cancel`` was set; nothing partial is returned.
    ValueError
        For a device that is not a compute device, a ``head`` or ``layer`` the model does not
        have, or an image that cannot be analysed; raised before any null image is drawn.

    Notes
    -----
    The backbone is never moved: on another device the run uses :meth:`Backbone.on`'s copy.
    Results are bit-identical for a fixed ``chunk_size``; across chunk sizes see the module's
    "Reproducibility" paragraph.
    """
    config = config.validate()
    device = resolve_device(config.device)  # before any work: a bad device fails at once
    check_model_options(config, backbone)
    if config.tiled:
        from napari_attnreg.core.run.tiled_engine import run_tiled

        return (yield from run_tiled(image, backbone, config, cancel))
    t_start = time.perf_counter()
    dtype = autocast_dtype(device, config.precision)
    input_warnings: list[str] = []
    if isinstance(image, PreparedImage):
        prepared = image
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ImageSizeWarning)
            prepared = prepare_image(
                image, patch_size=backbone.patch_size, mean=backbone.mean, std=backbone.std,
                default_size=backbone.input_size[1:], target_size=config.target_size,
                channel_axis=config.channel_axis, channels=config.channels, merge=config.merge,
            )
        for w in caught:  # shown again to Python users; kept as a diagnostic for the GUIs
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            if issubclass(w.category, ImageSizeWarning):
                input_warnings.append(str(w.message))
    # the shared backbone is never moved; another device gets its own copy, kept for reuse
    backbone = backbone.on(device)
    x = prepared.tensor.to(device)
    source = prepared.source.to(device)  # nulls are drawn in the image's own channels
    null_cfg = null_config(config, backbone.patch_size[0])
    head = config.head if config.head == "mean" else int(config.head)  # numpy ints too
    chunk = config.chunk_size or auto_chunk_size(backbone, prepared.model_shape, device, dtype,
                                                 config.memory_fraction)
    n_boot = int(config.n_boot)
    chunk = min(chunk, n_boot)
    timings: dict[str, float] = {"prepare_s": time.perf_counter() - t_start}
    if cancel is not None:
        cancel.raise_if_cancelled()

    with torch.inference_mode():
        t0 = time.perf_counter()
        with _amp(device, dtype):
            heads_obs = cls_attention(backbone, x[None], layer=config.layer, head="all")[0].float()
        observed = heads_obs.mean(0) if head == "mean" else heads_obs[int(head)]
        timings["observed_s"] = time.perf_counter() - t0
        yield Progress("observed", 0, n_boot, chunk, time.perf_counter() - t_start,
                       "observed attention")

        grid = observed.shape
        null_scores = torch.empty((n_boot, grid[0] * grid[1]), dtype=torch.float32, device=device)
        done = 0
        t_gen = t_fwd = 0.0
        t_nulls = time.perf_counter()
        while done < n_boot:
            if cancel is not None:
                cancel.raise_if_cancelled()
            size = min(chunk, n_boot - done)
            try:
                ta = time.perf_counter()
                own = prepared_nulls(prepared, source, range(done, done + size), null_cfg,
                                     seed=config.seed, clamp=config.preset != "paper",
                                     resolution=config.null_resolution)
                batch = prepared.channel_map(own)
                tb = time.perf_counter()
                with _amp(device, dtype):
                    maps = cls_attention(backbone, batch, layer=config.layer, head=head)
                null_scores[done:done + size] = maps.reshape(size, -1).float()
                t_gen += tb - ta
                t_fwd += time.perf_counter() - tb
            except Exception as err:
                if not _is_oom(err):
                    raise
                oom = True
            else:
                oom = False
            if oom:
                # outside the except block, so the failed batch and its traceback are freed
                batch = maps = None
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                if size <= 1:
                    raise MemoryError(
                        "Out of memory with a single null image per chunk; use a smaller "
                        "target_size, a smaller model, or device='cpu'.")
                chunk = max(1, size // 2)
                yield Progress("nulls", done, n_boot, chunk, time.perf_counter() - t_start,
                               f"out of memory: chunk size halved to {chunk}")
                continue
            done += size
            yield Progress("nulls", done, n_boot, chunk, time.perf_counter() - t_start,
                           f"{done}/{n_boot} null images")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timings["nulls_s"] = time.perf_counter() - t_nulls
        timings["null_generation_s"] = t_gen
        timings["null_forward_s"] = t_fwd

        if cancel is not None:
            cancel.raise_if_cancelled()
        t0 = time.perf_counter()
        stats, warnings_seen = _statistics(observed.reshape(-1), null_scores, config)
        warnings_seen = input_warnings + warnings_seen
        timings["statistics_s"] = time.perf_counter() - t0
        kept = null_scores.reshape(n_boot, *grid).cpu().numpy() if config.keep_nulls else None
    timings["total_s"] = time.perf_counter() - t_start

    def grid_map(v: np.ndarray) -> np.ndarray:
        return np.asarray(v, dtype=np.float64).reshape(grid)

    summary = dict(stats.null_summary)
    summary.update(mu0=float(stats.mu0), sigma0=float(stats.sigma0))
    metadata = _run_metadata(config, backbone, device, dtype, chunk, timings,
                             prepared.channel_map.kind, stats, warnings_seen,
                             observed.cpu().numpy())
    yield Progress("statistics", n_boot, n_boot, chunk, time.perf_counter() - t_start,
                   "statistics done")
    return AttentionResult(
        attention=observed.cpu().numpy().astype(np.float64),
        z=grid_map(stats.z), p=grid_map(stats.p), lfdr=grid_map(stats.lfdr),
        posterior=grid_map(stats.posterior), q=grid_map(stats.q), pi0=float(stats.pi0),
        thresholds=config.thresholds(),
        image_shape=prepared.image_shape, model_shape=prepared.model_shape,
        patch_size=prepared.patch_size, head_attention=heads_obs.cpu().numpy().astype(np.float64),
        null_summary=summary, null_scores=kept, metadata=metadata,
    )


def check_model_options(config: RunConfig, backbone: Backbone) -> None:
    """Raise a ValueError for a ``head`` or ``layer`` the model does not have.

    Checked before the image is prepared or any null drawn, so a typo costs nothing.
    """
    heads, depth = backbone.num_heads, backbone.depth
    head = config.head
    is_mean = isinstance(head, str) and head == "mean"
    if not is_mean and (isinstance(head, (bool, np.bool_)) or not isinstance(
            head, (int, np.integer)) or not 0 <= int(head) < heads):
        raise ValueError(f"head={head!r}: {backbone.name} has {heads} attention heads; use "
                         f"head='mean' (average of all) or a head number 0..{heads - 1}.")
    layer = config.layer
    if isinstance(layer, (bool, np.bool_)) or not isinstance(layer, (int, np.integer)) or not (
            -depth <= int(layer) < depth):
        raise ValueError(f"layer={layer!r}: {backbone.name} has {depth} blocks; use -1 for the "
                         f"last block or a block number 0..{depth - 1} (or -{depth}..-1).")


def _run_metadata(config: RunConfig, backbone: Backbone, device: torch.device,
                  dtype: torch.dtype | None, chunk: int, timings: dict[str, float],
                  channel_map_kind: str, stats: Any, warnings_seen: list[str],
                  observed: np.ndarray) -> dict[str, Any]:
    """The metadata of a result: every option, the model, timings, diagnostics."""
    cfg = asdict(config)
    cfg.pop("extra")
    cfg["chunk_size_requested"] = cfg.pop("chunk_size")
    metadata = {
        **{k: v for k, v in cfg.items() if k != "device"},
        "model": backbone.name,
        "model_domain": getattr(backbone, "domain", None),
        "weights": backbone.weights,
        "weights_sha256": weights_sha256(backbone.weights, backbone.name),
        "random_init": backbone.is_random_init,
        "num_prefix_tokens": backbone.num_prefix_tokens,
        "device": str(device),
        "precision": str(dtype).replace("torch.", "") if dtype else "float32",
        "chunk_size": chunk,  # after any out-of-memory halving
        "timings": timings,
        "package_version": _package_version(),
        "torch_version": torch.__version__,
        "channel_map": channel_map_kind,
        # the patch null's block side in model pixels (the preset's default if unset)
        "patch_block_size": (null_config(config, backbone.patch_size[0]).block_size
                             or backbone.patch_size[0]) if config.method == "patch" else None,
        "lfdr_fit": stats.null_summary.get("lfdr_fit"),
        **config.extra,
    }
    stepdown = config.preset == "stepdown"
    if stepdown:
        summary = stats.null_summary
        metadata.update(p_map=summary["p_map"], tail_fit=summary["tail"],
                        concentration_ratio=summary["concentration_ratio"])
    metadata["diagnostics"] = [d.as_dict() for d in diagnose(
        observed, pi0=float(stats.pi0), lfdr_fit=str(stats.null_summary["lfdr_fit"]),
        pi0_estimated=isinstance(config.pi0_method, str) and config.pi0_method != "bh",
        z_sd=float(np.std(stats.z)), posterior=None if stepdown else stats.posterior,
        smallest_p=_smallest_p(config, stats), q_th=config.q_th if config.rule == "q" else None,
        concentration=stats.null_summary.get("concentration_ratio"),
        step_level=_step_level(config, stats) if stepdown else None,
        random_init=backbone.is_random_init, model_name=backbone.name,
        domain=getattr(backbone, "domain", None),
        domain_note=getattr(backbone, "description", None),
        warnings_seen=warnings_seen)]
    return metadata


def _statistics(observed: torch.Tensor, null_scores: torch.Tensor, config: RunConfig,
                positions: np.ndarray | None = None, *, families: torch.Tensor | None = None,
                owner: tuple[np.ndarray, np.ndarray] | None = None,
                family_tokens: np.ndarray | None = None) -> tuple[Any, list[str]]:
    """The preset's statistics, and the messages of the statistics warnings they raised.

    The warnings are re-raised for Python users and also kept, so every front end can show
    them as sentences (a GUI user never sees a Python warning).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StatisticsWarning)
        if config.preset == "stepdown":
            stats = stepdown_statistics(observed, null_scores, tail=config.tail,
                                        families=families, owner=owner,
                                        family_tokens=family_tokens)
        elif config.preset == "directional":
            stats = directional_statistics(observed, null_scores, null_pool=config.null_pool,
                                           pi0_method=config.pi0_method, positions=positions)
        else:
            stats = compute_statistics(observed, null_scores, p_method=config.p_method,
                                       alternative=config.alternative,
                                       pi0_method=config.pi0_method, null=config.null,
                                       positions=positions)
    seen = []
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if issubclass(w.category, StatisticsWarning):
            seen.append(str(w.message))
    return stats, seen


def _step_level(config: RunConfig, stats: Any) -> tuple[float, float, int] | None:
    """(smallest step p, the largest first-step p the default rule can reject, families)."""
    summary = stats.null_summary
    n_fam = int(summary.get("n_families", 1))
    tail_on = config.tail == "gpd"
    smallest = summary["p_resolution"] / (100.0 if tail_on else 1.0)
    alpha = config.q_th if config.rule == "forwardstop" else config.p_th
    if alpha is None or config.rule not in ("forwardstop", "fwer"):
        return None
    # BH over the families needs the best one at α/n; ForwardStop's first step −log(1 − p) ≤ α
    needed = alpha / n_fam
    if config.rule == "forwardstop":
        needed = -np.expm1(-needed)
    return smallest, float(needed), n_fam


def _smallest_p(config: RunConfig, stats: Any) -> float | None:
    """The smallest p the directional pooled test can give: ``1 / (1 + B·T_null)``."""
    if config.preset != "directional" or config.null_pool != "pooled":
        return None
    pool = int(stats.null_summary.get("B", 0)) * int(stats.null_summary.get("T", 0))
    return 1.0 / (1 + pool) if pool else None


def drain(gen: Generator[Progress, None, AttentionResult],
          progress: Callable[[Progress], Any] | None = None) -> AttentionResult:
    """Run a generator from :func:`run_engine` to the end, passing events to ``progress``."""
    while True:
        try:
            event = next(gen)
        except StopIteration as stop:
            return stop.value
        if progress is not None:
            progress(event)

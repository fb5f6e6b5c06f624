"""The one chunk loop of both engines: chunks, AMP, out-of-memory halving, statistics, result.

The untiled engine (:mod:`.engine`) and the tiled one (:mod:`.tiled_engine`) differ only in
what one forward pass is (a null image at the model's size; a tile or a tile-sized null)
and in how their token grid is put together. The rest is here, once:

* :class:`Run`: a run's device, autocast type, cancel token, clock, timings and the
  warnings it collected;
* :meth:`Run.chunks`: a step over ``total`` images in chunks, a :class:`Progress` after each
  (each yield a cancellation point); a CUDA/MPS out-of-memory error halves the chunk and
  retries it;
* :meth:`Run.statistics`: the preset's statistics (paper, directional, step-down), timed,
  with their warnings kept as sentences;
* :meth:`Run.result`: the :class:`AttentionResult` and its metadata.

The engines keep their forward passes (each calls ``cls_attention`` of its own module), so a
test or a benchmark can wrap one engine's forward without reaching into this loop.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from napari_attnreg.core.models.backbones import Backbone, resolve_device
from napari_attnreg.core.models.scorers import as_target
from napari_attnreg.core.models.weights_hash import weights_sha256
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.config import RunConfig, autocast_dtype, null_config
from napari_attnreg.core.run.images import IntensityScaling
from napari_attnreg.core.stats.diagnostics import diagnose
from napari_attnreg.core.stats.paper import StatisticsWarning


class RunCancelled(Exception):
    """Raised by a run when its :class:`CancelToken` was cancelled."""


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
        Null images (tiled: forward passes) processed so far and requested.
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


@dataclass(frozen=True)
class TokenMaps:
    """A run's observed attention on its token grid, and how that grid lies on the image.

    Attributes
    ----------
    observed : torch.Tensor
        ``(gh, gw)`` float32: the map the statistics test (mean of heads or one head).
    heads : torch.Tensor or None
        ``(n_heads, gh, gw)`` float32; None where the run does not keep per-head maps
        (a tiled run whose grid is too large, :data:`~.tiled_engine.TILED_HEADS_MAX_VALUES`).
    image_shape, model_shape, patch_size : (int, int)
        As in :class:`AttentionResult`.
    channel_map : str
        The :attr:`ChannelMap.kind` the image went through.
    """

    observed: torch.Tensor
    heads: torch.Tensor | None
    image_shape: tuple[int, int]
    model_shape: tuple[int, int]
    patch_size: tuple[int, int]
    channel_map: str


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` is a device out-of-memory error (CUDA, MPS, or a backend's RuntimeError)."""
    if isinstance(err, (getattr(torch, "OutOfMemoryError", ()), torch.cuda.OutOfMemoryError)):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()


def amp(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager[Any]:
    """Autocast to ``dtype`` on ``device``, or nothing for float32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@dataclass
class Run:
    """What both engines share while a run is under way.

    Attributes
    ----------
    device : torch.device
    dtype : torch.dtype or None
        Autocast type of the backbone (None: float32).
    cancel : CancelToken, optional
    t_start : float
        ``time.perf_counter()`` at the start; progress and timings count from it.
    timings : dict
        Seconds per stage, in the order the stages ran (saved in the metadata).
    warnings_seen : list of str
        Input and statistics warnings, kept as sentences for the front ends.
    map_diagnostics : list of dict
        Findings of the map checks (sanity check, attention sinks), as diagnostics.
    """

    device: torch.device
    dtype: torch.dtype | None
    cancel: CancelToken | None = None
    t_start: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)
    warnings_seen: list[str] = field(default_factory=list)
    map_diagnostics: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def start(cls, config: RunConfig, cancel: CancelToken | None = None) -> Run:
        """A run on ``config``'s device, its clock started now."""
        device = resolve_device(config.device)
        return cls(device, autocast_dtype(device, config.precision), cancel)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def lap(self, key: str, since: float) -> None:
        """Record the seconds from ``since`` to now as ``timings[key]``."""
        self.timings[key] = time.perf_counter() - since

    def amp(self) -> AbstractContextManager[Any]:
        return amp(self.device, self.dtype)

    def check_cancel(self) -> None:
        if self.cancel is not None:
            self.cancel.raise_if_cancelled()

    def progress(self, stage: str, done: int, total: int, chunk: int, message: str) -> Progress:
        return Progress(stage, done, total, chunk, self.elapsed(), message)

    def synchronize(self) -> None:
        """Wait for the device, so that a stage's timing holds its queued kernels."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def chunks(self, step: Callable[[int, int], None], total: int, chunk: int, *, stage: str,
               label: str, oom_message: str, offset: int = 0,
               grand_total: int | None = None, start: int = 0) -> Generator[Progress, None, int]:
        """Run ``step(start, size)`` over ``total`` images in chunks of at most ``chunk``.

        Parameters
        ----------
        step : callable
            Does images ``start .. start + size`` (one forward pass of a chunk).
        total, chunk : int
        stage, label : str
            The progress stage, and what is counted ("null images", "tiles").
        oom_message : str
            The MemoryError's text when even one image per chunk does not fit.
        offset, grand_total : int
            Where this pass starts in the run's count, and the run's total (default
            ``total``): a tiled run counts tiles and nulls together.
        start : int
            Images ``0 .. start`` were done (queued) before the loop; their progress comes
            first.

        Yields
        ------
        Progress
            After every chunk, and after every halving; the loop checks the cancel token
            before each chunk.

        Returns
        -------
        int
            The chunk size for what follows: ``chunk`` as given, or the halved size.
        """
        grand_total = total if grand_total is None else grand_total
        first = size_now = min(chunk, total)
        done = start
        if start:
            yield self.progress(stage, offset + done, grand_total, size_now,
                                f"{done}/{total} {label}")
        queued = _QueuedChunks(self.device)
        while done < total:
            self.check_cancel()
            size = min(size_now, total - done)
            try:
                queued.wait_for_room()
                step(done, size)
                queued.add()
            except Exception as err:
                if not is_oom(err):
                    raise
                oom = True
            else:
                oom = False
            if oom:  # outside the except block, so the failed batch and its traceback are freed
                size_now = self._halved(size, oom_message)
                yield self.progress(stage, offset + done, grand_total, size_now,
                                    f"out of memory: chunk size halved to {size_now}")
                continue
            done += size
            yield self.progress(stage, offset + done, grand_total, size_now,
                                f"{done}/{total} {label}")
        # a pass shorter than the chunk leaves the chunk for the next pass as it was
        return size_now if size_now < first else chunk

    def _halved(self, size: int, oom_message: str) -> int:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        if size <= 1:
            raise MemoryError(oom_message)
        return max(1, size // 2)

    def statistics(self, config: RunConfig, observed: torch.Tensor, null_scores: torch.Tensor,
                   positions: np.ndarray | None = None, *, families: torch.Tensor | None = None,
                   owner: tuple[np.ndarray, np.ndarray] | None = None,
                   family_tokens: np.ndarray | None = None) -> Any:
        """:func:`statistics` after a last cancellation point; timed, its warnings kept."""
        self.check_cancel()
        t0 = time.perf_counter()
        stats, seen = statistics(observed, null_scores, config, positions, families=families,
                                 owner=owner, family_tokens=family_tokens)
        self.warnings_seen.extend(seen)
        self.lap("statistics_s", t0)
        return stats

    def result(self, config: RunConfig, backbone: Backbone, stats: Any, maps: TokenMaps, *,
               chunk: int, kept: np.ndarray | None,
               extra: dict[str, Any] | None = None,
               tested: np.ndarray | None = None) -> AttentionResult:
        """The run's :class:`AttentionResult`; ``extra`` adds to (or overrides) its metadata.

        ``tested``: the flat indices of the tokens that were run (a tiled run's tissue
        tiles); its diagnostics read those alone (None: every token).
        """
        self.timings["total_s"] = self.elapsed()
        observed = maps.observed.cpu().numpy()
        grid = tuple(maps.observed.shape)

        def grid_map(v: np.ndarray) -> np.ndarray:
            return np.asarray(v, dtype=np.float64).reshape(grid)

        summary = dict(stats.null_summary)
        summary.update(mu0=float(stats.mu0), sigma0=float(stats.sigma0))
        metadata = run_metadata(config, backbone, self, chunk, maps.channel_map, stats, observed,
                                tested)
        metadata.update(extra or {})
        return AttentionResult(
            attention=observed.astype(np.float64),
            maps={name: grid_map(values)
                  for name, values in config.procedure.store(stats).items()},
            pi0=float(stats.pi0),
            thresholds=config.thresholds(), image_shape=maps.image_shape,
            model_shape=maps.model_shape, patch_size=maps.patch_size,
            head_attention=None if maps.heads is None
            else maps.heads.cpu().numpy().astype(np.float64), null_summary=summary,
            null_scores=kept, metadata=metadata,
        )


class _QueuedChunks:
    """At most :attr:`AHEAD` chunks queued on a GPU that has not finished them.

    A GPU runs a chunk while the host queues the next (and, after the last, the map checks),
    so the device never waits for the host; bounding the queue keeps the progress and a
    cancel at most one chunk behind what the device has done.
    """

    AHEAD = 2

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.events: list[Any] | None = [] if device.type == "cuda" else None

    def wait_for_room(self) -> None:
        if self.events is not None and len(self.events) >= self.AHEAD:
            self.events.pop(0).synchronize()

    def add(self) -> None:
        if self.events is not None:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self.events.append(event)


def statistics(observed: torch.Tensor, null_scores: torch.Tensor, config: RunConfig,
               positions: np.ndarray | None = None, *, families: torch.Tensor | None = None,
               owner: tuple[np.ndarray, np.ndarray] | None = None,
               family_tokens: np.ndarray | None = None) -> tuple[Any, list[str]]:
    """The preset's statistics, and the messages of the statistics warnings they raised.

    The warnings are re-raised for Python users and also kept, so every front end can show
    them as sentences (a GUI user never sees a Python warning).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StatisticsWarning)
        stats = config.procedure.statistics(observed, null_scores, config.statistics_options(),
                                            positions=positions, families=families,
                                            owner=owner, family_tokens=family_tokens)
    return stats, rewarn(caught, StatisticsWarning)


def rewarn(caught: list[warnings.WarningMessage], kept: type[Warning]) -> list[str]:
    """Show recorded warnings again; return the messages of those of category ``kept``."""
    seen = []
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if issubclass(w.category, kept):
            seen.append(str(w.message))
    return seen


def run_metadata(config: RunConfig, backbone: Backbone, run: Run, chunk: int,
                 channel_map_kind: str, stats: Any, observed: np.ndarray,
                 tested: np.ndarray | None = None) -> dict[str, Any]:
    """The metadata of a result: every option, the model, timings, diagnostics.

    ``tested`` (flat token indices) limits the diagnostics to the tokens that were run:
    glass a tissue mask left out holds attention and z 0 as a fill, which counted as
    patches made the attention look less uniform, the z less spread and the patches more
    numerous (the smallest reachable q larger) than they are.
    """
    z = np.asarray(stats.z)
    if tested is not None:
        observed, z = observed.reshape(-1)[tested], z.reshape(-1)[tested]
    cfg = asdict(config)
    cfg.pop("extra")
    target = as_target(cfg.pop("target"))
    cfg["target"] = target.describe()  # a concept is kept as a list of numbers
    cfg["concept"] = None if target.concept is None else target.concept.tolist()
    cfg["chunk_size_requested"] = cfg.pop("chunk_size")
    metadata = {
        **{k: v for k, v in cfg.items() if k != "device"},
        "model": backbone.name,
        "model_domain": getattr(backbone, "domain", None),
        "weights": backbone.weights,
        "weights_sha256": weights_sha256(backbone.weights, backbone.name),
        "random_init": backbone.is_random_init,
        "num_prefix_tokens": backbone.num_prefix_tokens,
        "device": str(run.device),
        "precision": str(run.dtype).replace("torch.", "") if run.dtype else "float32",
        "chunk_size": chunk,  # after any out-of-memory halving
        "timings": run.timings,
        "package_version": _package_version(),
        "torch_version": torch.__version__,
        "channel_map": channel_map_kind,
        # the values the model saw: a window (the file's, a preset, given) or percentiles
        "intensity_scaling": IntensityScaling.of(config.intensity_window, config.extra).record(),
        # the patch null's block side in model pixels (the preset's default if unset)
        "patch_block_size": (null_config(config, backbone.patch_size[0]).block_size
                             or backbone.patch_size[0]) if config.method == "patch" else None,
        "lfdr_fit": stats.null_summary.get("lfdr_fit"),
        **config.extra,
    }
    if config.image_kind is not None:  # the analyst's word wins over what the file says
        metadata.update(image_kind=config.image_kind, image_kind_source="stated")
    stepdown = config.procedure.uses_step_p
    if stepdown:
        summary = stats.null_summary
        metadata.update(p_map=summary["p_map"], tail_fit=summary["tail"],
                        concentration_ratio=summary["concentration_ratio"])
    metadata["diagnostics"] = [d.as_dict() for d in diagnose(
        observed, pi0=float(stats.pi0), lfdr_fit=str(stats.null_summary["lfdr_fit"]),
        pi0_estimated=isinstance(config.pi0_method, str) and config.pi0_method != "bh",
        z_sd=float(np.std(z)), posterior=None if stepdown else stats.posterior,
        smallest_p=_smallest_p(config, stats), q_th=config.q_th if config.rule == "q" else None,
        concentration=stats.null_summary.get("concentration_ratio"),
        step_level=_step_level(config, stats) if stepdown else None,
        tail_fit=stats.null_summary.get("tail") if stepdown else None,
        family="head" if config.map == "heads" else "tile",
        random_init=backbone.is_random_init, model_name=backbone.name,
        domain=getattr(backbone, "domain", None),
        domain_note=getattr(backbone, "description", None),
        warnings_seen=run.warnings_seen)] + run.map_diagnostics
    return metadata


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("napari-attnreg")
    except ImportError:  # PackageNotFoundError: a source tree that was never installed
        return "unknown"


def _step_level(config: RunConfig, stats: Any) -> tuple[float, float, int, bool, bool] | None:
    """(smallest step p, the largest first-step p the default rule can reject, families,
    whether the tail fit is on, whether it was rejected for every first step that wanted it).

    Where the goodness-of-fit test rejected every first-step fit (tiles sharing one null
    have one), the families' p-values are counts: the smallest is ``1/(B + 1)``.
    """
    summary = stats.null_summary
    n_fam = int(summary.get("n_families", 1))
    tail_on = config.tail == "gpd"
    fit = summary.get("tail") or {}
    rejected = bool(tail_on and fit.get("first_wanted", 0)
                    and fit.get("first_rejected", 0) == fit.get("first_wanted", 0))
    smallest = summary["p_resolution"] / (100.0 if tail_on and not rejected else 1.0)
    alpha = config.q_th if config.rule == "forwardstop" else config.p_th
    if alpha is None or config.rule not in ("forwardstop", "fwer"):
        return None
    # BH over the families needs the best one at α/n; ForwardStop's first step −log(1 − p) ≤ α
    needed = alpha / n_fam
    if config.rule == "forwardstop":
        needed = -np.expm1(-needed)
    return smallest, float(needed), n_fam, tail_on, rejected


def _smallest_p(config: RunConfig, stats: Any) -> float | None:
    """The smallest p the procedure's test can give, where a diagnostic needs it."""
    return config.procedure.smallest_p(stats.null_summary, config.statistics_options())

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


Where things live. The chunk loop both engines share (chunks, AMP, out-of-memory halving,
statistics dispatch, result assembly) is :mod:`.passes`; the options are :mod:`.config`;
a tiled run is :mod:`.tiled_engine`. Their public names (:class:`RunConfig`,
:class:`Progress`, :class:`CancelToken`, ...) are importable from here as well.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from napari_attnreg.core.models.attention import cls_attention, cls_attention_entering
from napari_attnreg.core.models.backbones import Backbone, resolve_device
from napari_attnreg.core.models.entering import Entering
from napari_attnreg.core.models.scorers import Scorer
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.config import (
    CPU_MAX_CHUNK,
    Precision,
    RunConfig,
    auto_chunk_size,
    autocast_dtype,
    null_config,
    scorer_of,
    tests_shares,
)
from napari_attnreg.core.run.images import (
    ImageNoteWarning,
    IntensityScaling,
    PreparedImage,
    prepare_image,
)
from napari_attnreg.core.run.maps import (
    families,
    family_evidence,
    map_checks,
    mark_untested,
    values_for_procedure,
)
from napari_attnreg.core.run.nulls import prepared_nulls
from napari_attnreg.core.run.passes import (
    CancelToken,
    Progress,
    Run,
    RunCancelled,
    TokenMaps,
    is_oom,
    rewarn,
)
from napari_attnreg.core.run.tiled_engine import prepare_tiled, run_tiled

__all__ = [
    "CPU_MAX_CHUNK", "CancelToken", "Precision", "Progress", "RunCancelled", "RunConfig",
    "auto_chunk_size", "autocast_dtype", "check_model_options", "drain", "null_config", "prepare_for",
    "resolve_device", "run_engine",
]

NULL_OOM = ("Out of memory with a single null image per chunk; use a smaller target_size, "
            "a smaller model, or device='cpu'.")


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
    resolve_device(config.device)  # before any work: a bad device fails at once
    check_model_options(config, backbone)
    if config.tiled:
        return (yield from run_tiled(image, backbone, config, cancel))
    run = Run.start(config, cancel)
    prepared = _prepare(image, backbone, config, run)
    # the shared backbone is never moved; another device gets its own copy, kept for reuse
    backbone = backbone.on(run.device)
    n_boot = int(config.n_boot)
    chunk = min(config.chunk_size or auto_chunk_size(
        backbone, prepared.model_shape, run.device, run.dtype, config.memory_fraction), n_boot)
    run.lap("prepare_s", run.t_start)
    run.check_cancel()

    with torch.inference_mode():
        t0 = time.perf_counter()
        # on the device before anything is queued: a copy up waits for the queued work
        x = prepared.tensor.to(run.device)
        nulls = _NullChunks(prepared, backbone, config, run, scorer_of(config))
        early = _queue_first_chunk(nulls, run, chunk)
        t1 = time.perf_counter()
        view = _observed(backbone, x, config, run)
        nulls.scorer = view.scorer  # bound to the observed image's target
        run.lap("observed_s", t1)
        yield run.progress("observed", 0, n_boot, chunk, "observed attention")

        chunk = yield from run.chunks(nulls, n_boot, chunk, stage="nulls", label="null images",
                                      oom_message=NULL_OOM, start=early)
        # On a GPU the null chunks are only queued by now: the checks' host work (a re-drawn
        # block) runs while the device finishes them, and their passes queue behind them.
        t1 = time.perf_counter()
        _check_map(view, backbone, config, run)
        run.lap("map_checks_s", t1)
        run.synchronize()
        run.lap("nulls_s", t0)
        run.timings.update(nulls.timings)

        stats = _statistics(view, nulls.scores, config, run)
        kept = (nulls.scores.reshape(n_boot, *view.scores.shape).cpu().numpy()
                if config.keep_nulls else None)
    maps = TokenMaps(view.display, view.heads, prepared.image_shape, prepared.model_shape,
                     prepared.patch_size, prepared.channel_map.kind)
    result = run.result(config, backbone, stats, maps, chunk=chunk, kept=kept,
                        extra=view.metadata)
    yield run.progress("statistics", n_boot, n_boot, chunk, "statistics done")
    return result


def prepare_for(image: Any, backbone: Backbone, config: RunConfig) -> Any:
    """The image as :func:`run_engine` analyses it: laid out in tiles, or model-ready.

    Callers that need the display image before the run (the batch's figure) prepare with
    this and hand the result to :func:`run_engine`, which then does not prepare again. Size
    and transparency warnings are shown to the caller and kept on the image (``PreparedImage.notes``), so the
    result lists them among its diagnostics either way.
    """
    if config.tiled:
        return prepare_tiled(image, backbone, config)
    if isinstance(image, PreparedImage):
        return image
    scaling = IntensityScaling.of(config.intensity_window, config.extra)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ImageNoteWarning)
        if scaling.note is not None:
            warnings.warn(scaling.note, ImageNoteWarning, stacklevel=2)
        prepared = prepare_image(
            image, patch_size=backbone.patch_size, mean=backbone.mean, std=backbone.std,
            default_size=backbone.input_size[1:], target_size=config.target_size,
            channel_axis=config.channel_axis, channels=config.channels, merge=config.merge,
            window=scaling.window,
        )
    return replace(prepared, notes=tuple(rewarn(caught, ImageNoteWarning)))


def _prepare(image: Any, backbone: Backbone, config: RunConfig, run: Run) -> PreparedImage:
    """The model-ready image; its size warnings become diagnostics of the run."""
    prepared = prepare_for(image, backbone, config)
    run.warnings_seen.extend([*config.extra.get("reading_notes", ()), *prepared.notes])
    return prepared


@dataclass
class _ObservedMap:
    """The observed image's map and what the run learned from it.

    ``scores`` is the tested map on the grid (``(gh, gw)``; ``(H, gh, gw)`` for a head
    family), ``display`` the map a result shows (the head mean for a head family), ``heads``
    every head's CLS attention, ``scorer`` the map bound to the image's target,
    ``metadata`` the map's entries of the result's metadata, ``image`` the model-ready
    image on the device, ``entering`` what entered the chosen block in the image's pass
    (the checks run the last block again from it) and ``sinks`` the attention sinks found
    (by :func:`_check_map`).
    """

    scores: torch.Tensor
    display: torch.Tensor
    heads: torch.Tensor
    scorer: Scorer
    metadata: dict[str, Any]
    image: torch.Tensor
    entering: Entering | None = None
    sinks: tuple[int, ...] = ()


def _observed(backbone: Backbone, x: torch.Tensor, config: RunConfig,
              run: Run) -> _ObservedMap:
    """Every head's CLS attention on the model-ready image ``x`` (on the device) and the
    tested map (checked later, :func:`_check_map`).

    The image goes through the backbone alone, so its maps do not depend on the chunk size.
    """
    with run.amp():
        heads, entering = cls_attention_entering(backbone, x[None], layer=config.layer, head="all")
        heads = heads[0].float()
        scorer = scorer_of(config).bind(backbone, x[None])
        scores = (scorer.from_heads(heads[None].flatten(2)) if scorer.needs.cls_heads
                  else scorer.score(backbone, x[None]))[0].reshape(-1, *heads.shape[1:])
    if scorer.needs.family is None:
        scores = scores[0]
    display = scores.mean(0) if scorer.needs.family is not None else scores
    return _ObservedMap(scores, display, heads, scorer, scorer.describe(), x, entering)


def _check_map(view: _ObservedMap, backbone: Backbone, config: RunConfig, run: Run) -> None:
    """The sanity and sink checks of the observed map: diagnostics, metadata, sinks.

    The checks read the observed map and, for the last block, its CLS attention and what
    entered that block instead of computing them again (they run one block each where they
    would run the whole model twice, and no forward pass for what they read), and run their
    own passes in the run's precision, so both maps a check compares come from the same
    arithmetic. In float32 (every CPU run by default) the numbers are those of the checks
    made alone.
    """
    # the image already on the device: copying it up again would wait for the queued nulls
    found, numbers, sinks = map_checks(
        view.scorer, backbone, view.image, seed=config.seed, original=view.scores,
        share=view.heads.mean(0) if _is_last(config.layer, backbone) else None, amp=run.amp,
        entering=view.entering)
    run.map_diagnostics.extend(found)
    view.metadata.update(numbers)
    view.sinks = sinks.tokens


def _is_last(layer: int, backbone: Backbone) -> bool:
    return int(layer) in (-1, backbone.depth - 1)


def _statistics(view: _ObservedMap, null_scores: torch.Tensor, config: RunConfig,
                run: Run) -> Any:
    """The procedure's statistics of the map: values it tests, families, sinks left out.

    Every preset takes the families (heads, sinks left out): the step-down runs a step-down
    per family, the pooled-null presets test each family alone and combine them (see
    :mod:`~napari_attnreg.core.stats.pooled_families`). One plain map is no family at all.
    """
    per_family = view.scorer.needs.family is not None
    tokens = view.scores.reshape(view.scores.shape[0], -1) if per_family else view.scores.reshape(-1)
    observed, null = values_for_procedure(tokens, null_scores,
                                          signed=view.scorer.needs.signed, sign=config.sign,
                                          shares=tests_shares(config),
                                          log_scale=view.scorer.needs.shares)
    fam = families(observed, null, per_family=per_family,
                   excluded=view.sinks if config.exclude_sinks else ())
    stats = mark_untested(run.statistics(config, fam.observed, fam.null, **fam.keywords),
                          fam.excluded)
    if per_family:
        view.metadata["family_evidence"] = family_evidence(
            stats.null_summary, fam.observed.numel()).reshape(view.scores.shape).tolist()
    view.metadata["excluded_tokens"] = [int(t) for t in fam.excluded]
    return stats


def _queue_first_chunk(nulls: _NullChunks, run: Run, chunk: int) -> int:
    """Queue the first chunk of nulls on a GPU before the observed pass; the nulls queued.

    The observed image alone is a pass of tiny kernels whose launching keeps the host busy
    while the device idles; queued behind a chunk of nulls, that launching overlaps the
    chunk. Only for maps without a target: a target ("predicted") is read from the observed
    image and every null is scored for it. Out of memory here leaves the chunk to the loop,
    which halves it.
    """
    if not _queues_ahead(run) or nulls.scorer.needs.target:
        return 0
    run.check_cancel()
    try:
        nulls(0, chunk)
    except Exception as err:
        if not is_oom(err):
            raise
        return 0
    return chunk


def _queues_ahead(run: Run) -> bool:
    """Whether the host queues work ahead of the device (a GPU; a CPU runs it as asked)."""
    return run.device.type == "cuda"


class _NullChunks:
    """The step of the null pass: draw null images ``start .. start + size``, score them.

    The nulls are drawn in the image's own channels and go through its channel map, as the
    image did; each chunk is scored by ``scorer``, the run's map (bound to the observed
    image's target once that is known). ``scores`` is ``(B, tokens)`` on the device, made
    with the first chunk; ``timings`` splits the pass into drawing and forward time (chunks
    that ran out of memory are not counted).
    """

    def __init__(self, prepared: PreparedImage, backbone: Backbone, config: RunConfig,
                 run: Run, scorer: Scorer) -> None:
        self.prepared, self.backbone, self.config, self.run = prepared, backbone, config, run
        self.source = prepared.source.to(run.device)
        self.null_config = null_config(config, backbone.patch_size[0])
        self.scorer = scorer
        self.scores: torch.Tensor | None = None
        self.timings = {"null_generation_s": 0.0, "null_forward_s": 0.0}

    def __call__(self, start: int, size: int) -> None:
        config = self.config
        ta = time.perf_counter()
        own = prepared_nulls(self.prepared, self.source, range(start, start + size),
                             self.null_config, seed=config.seed, clamp=config.procedure.clamps_nulls,
                             resolution=config.null_resolution)
        batch = self.prepared.channel_map(own)
        tb = time.perf_counter()
        with self.run.amp():  # a gradient map leaves inference mode itself, chunk by chunk
            maps = score_chunk(self.scorer, self.backbone, batch, config.layer)
        maps = maps.reshape(size, -1)
        if self.scores is None:
            self.scores = torch.empty((int(config.n_boot), maps.shape[1]), dtype=torch.float32,
                                      device=self.run.device)
        self.scores[start:start + size] = maps
        self.timings["null_generation_s"] += tb - ta
        self.timings["null_forward_s"] += time.perf_counter() - tb


def score_chunk(scorer: Scorer, backbone: Backbone, batch: torch.Tensor,
                layer: int) -> torch.Tensor:
    """The map of a chunk: one :func:`cls_attention` call for maps made of the CLS attention
    (as the engine always made), else the scorer."""
    if scorer.needs.cls_heads:
        maps = cls_attention(backbone, batch, layer=layer, head=scorer.cls_head)
        return maps.reshape(*maps.shape[:-2], -1)
    return scorer.score(backbone, batch)


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
    scorer_of(config).check(backbone)  # a class map on a model without head or concept
    layer = config.layer
    if isinstance(layer, (bool, np.bool_)) or not isinstance(layer, (int, np.integer)) or not (
            -depth <= int(layer) < depth):
        raise ValueError(f"layer={layer!r}: {backbone.name} has {depth} blocks; use -1 for the "
                         f"last block or a block number 0..{depth - 1} (or -{depth}..-1).")


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

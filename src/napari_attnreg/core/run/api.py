"""The Python entry points: :func:`regularize` for one image, :func:`regularize_stack` for a stack.

Both are thin adapters over the pipeline service (:func:`.service.run_job_sync`), the one
run path that napari, the notebook and the batch take too: they check keyword options once
(unknown names are a TypeError), load the model and check it can take them before any
work, run a :class:`~.service.Job`, and turn its :class:`~.service.Outcome` into what a
script expects: a result, a :class:`StackResults`, or the error itself.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from napari_attnreg.core.models.backbones import Backbone
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.engine import (
    CancelToken,
    Progress,
    RunCancelled,
    RunConfig,
    check_model_options,
    resolve_device,
)
from napari_attnreg.core.run.lazy import LazyImage, check_untiled_size
from napari_attnreg.core.run.planes import PlaneIndex, PlaneStack, as_plain_array
from napari_attnreg.core.run.service import (
    Job,
    JobProgress,
    ModelSpec,
    Outcome,
    load_model,
    run_job_sync,
)


def regularize(
    image: Any,
    model: str | Backbone | torch.nn.Module = "demo",
    *,
    progress: Callable[[Progress], Any] | None = None,
    cancel: CancelToken | None = None,
    arch: str | None = None,
    provenance: dict[str, Any] | None = None,
    **options: Any,
) -> AttentionResult:
    """Bootstrap significance and regularized attention maps for one 2D image.

    Parameters
    ----------
    image : array-like or LazyImage
        2D grayscale, RGB(A) or multichannel (``channel_axis=``), any numeric dtype; or an
        image read on demand (:func:`~napari_attnreg.io.slides.open_slide`,
        :func:`~.lazy.open_lazy`), read whole for an untiled run after the pixel-budget
        check. ``napari_attnreg.regularize`` also takes a file's path.
    model : str, Backbone or nn.Module
        ``"demo"`` (bundled), a timm name, a weights file (with ``arch=``) or a module.
    progress : callable, optional
        Called with each :class:`Progress` event.
    cancel : CancelToken, optional
    arch : str, optional
        timm architecture of a weights file.
    provenance : dict, optional
        What the image's file says (pixel size as ``spatial``, kind of image), recorded in
        the result's metadata as the command line records it.
    **options
        Any :class:`RunConfig` field: ``method`` ("normal", "uniform", "pixel", "patch"),
        ``n_boot`` (200), ``seed`` (0), ``device`` ("auto"), ``chunk_size``, ``precision``,
        ``layer``, ``head``, ``p_method``, ``alternative``, ``pi0_method``, ``null``, ``rule``
        ("lfdr"), ``z_th``, ``p_th``, ``l_th``, ``keep_nulls``, ``target_size``, ...

    Returns
    -------
    AttentionResult

    Raises
    ------
    ValueError
        An option, or an image that cannot be analysed (the message says why): an untiled
        run of an image above the pixel budget, or ``level=`` / ``mpp=`` with an image
        already opened (give them to ``open_slide``, or pass the path to
        ``napari_attnreg.regularize``).
    RunCancelled
        ``cancel`` was set before the result was complete.

    Notes
    -----
    Runs through the pipeline service, like napari and the batch; the model stays in its
    one-model cache for the next call.

    Examples
    --------
    >>> from napari_attnreg import regularize
    >>> from skimage.data import cell
    >>> result = regularize(cell(), n_boot=100, seed=1)          # doctest: +SKIP
    >>> result.posterior.shape, result.regularized("p", p_th=0.05).max()  # doctest: +SKIP
    """
    config = _config_from(options, "regularize")
    if provenance:  # what the image's file said (napari_attnreg.regularize opened it)
        config = replace(config, extra={**provenance, **config.extra})
    spec = _checked_model(model, arch, config)
    if isinstance(image, (str, os.PathLike)):
        raise ValueError(f"{image!s}: this regularize() takes pixels, not a file; use "
                         "napari_attnreg.regularize(path, ...), which opens files as the "
                         "command line does.")
    if isinstance(image, LazyImage):
        image, config = lazy_for_run(image, config)
    elif provenance is None and (config.level is not None or config.mpp is not None):
        # pixels given as they are: a level would be recorded without having chosen them
        raise ValueError("level=/mpp= choose which pixels of a slide are read; these pixels "
                         "are given already. Leave them unset, open the slide at them "
                         "(open_slide(path, level=..., mpp=...)), or pass the file's path "
                         "to napari_attnreg.regularize with them.")
    job = Job(spec, _single_image(image, config.channel_axis), [()], config)

    def events(step: JobProgress) -> None:
        if progress is not None and step.event is not None:  # not the model-loading step
            progress(step.event)

    outcome = run_job_sync(job, cancel=cancel, on_progress=events)
    if () in outcome.results:
        return outcome.results[()]
    if outcome.status == "cancelled":
        raise RunCancelled("The run was cancelled.")
    raise outcome.exceptions.get(()) or outcome.error or ValueError(outcome.message)


def _config_from(options: dict[str, Any], caller: str) -> RunConfig:
    """A checked :class:`RunConfig` from keyword options (unknown names are a TypeError)."""
    known = set(RunConfig.__dataclass_fields__) - {"extra"}
    unknown = set(options) - known
    if unknown:
        raise TypeError(f"{caller}() got unknown options {sorted(unknown)}; valid: {sorted(known)}")
    return RunConfig(**options).validate()


def _checked_model(model: Any, arch: str | None, config: RunConfig) -> ModelSpec:
    """The service's spec of ``model``, loaded (into the service's model cache) and checked
    now: a missing model, or a head, layer or device it cannot take, fails before any work."""
    spec = ModelSpec.from_model(model, arch)
    check_model_options(config, load_model(spec))
    resolve_device(config.device)
    return spec


def lazy_for_run(image: LazyImage, config: RunConfig) -> tuple[Any, RunConfig]:
    """An image read on demand, as a run takes it: refused with a slide level or resolution
    it was not opened at; read whole, after the pixel-budget check, for an untiled run."""
    check_opened_at(image, config)
    if config.tiled:
        return image, config  # read tile by tile; the service records its run_extra()
    check_untiled_size(image.analysed_shape, image.path or "The image")
    pixels = image.read_whole()  # resampled to the resolution it was opened at
    extra = {**image.run_extra(), **config.extra}  # pixel size, slide level: as a tiled run's
    return PlaneStack.from_array(pixels), replace(config, extra=extra)


def check_opened_at(image: LazyImage, config: RunConfig) -> None:
    """Refuse ``level`` / ``mpp`` other than those ``image`` was opened at: they would be
    recorded in the result without having chosen the pixels."""
    level_differs = config.level is not None and (image.level is None
                                                  or int(config.level) != image.level)
    mpp_differs = config.mpp is not None and (
        image.mpp is None or abs(float(config.mpp) / image.mpp - 1.0) > 0.02)
    if not (level_differs or mpp_differs):
        return
    asked = ", ".join(f"{k}={getattr(config, k)!r}" for k in ("level", "mpp")
                      if getattr(config, k) is not None)
    opened = ("a single-resolution image" if image.level is None
              else f"level {image.level}" + (f" ({image.mpp:.3g} µm per pixel)"
                                             if image.mpp else ""))
    raise ValueError(f"{asked} cannot choose the pixels of an image already opened: "
                     f"{image.path or 'it'} was opened at {opened}. Give level=/mpp= to "
                     "open_slide(path, level=..., mpp=...), or pass the file's path to "
                     "regularize() with them.")


def _single_image(image: Any, channel_axis: int | None) -> Any:
    """One image as the service reads it: an array as a one-plane stack whose layout is left
    to the engine (as for any 2D image), a lazy or prepared image as it is."""
    if isinstance(image, (list, tuple)) or any(
            hasattr(image, name) for name in ("__array__", "__array_interface__")):
        return PlaneStack(as_plain_array(image), (), channel_axis)
    return image


class PartialStackWarning(UserWarning):
    """Some planes of a stack have no result (failed, or not reached before a cancel)."""


class StackResults(list):
    """What :func:`regularize_stack` returns: one entry per plane, and what did not finish.

    A plain list for indexing and iteration: an :class:`AttentionResult` for every finished
    plane and ``None`` for a plane that failed or was not reached.

    Attributes
    ----------
    errors : dict of int to str
        Plane number (position in the list) → why that plane has no result.
    cancelled : bool
        The run was cancelled; the planes after the cancel point are ``None``.
    """

    def __init__(self, items: Sequence[AttentionResult | None] = (), *,
                 errors: dict[int, str] | None = None, cancelled: bool = False) -> None:
        super().__init__(items)
        self.errors: dict[int, str] = dict(errors or {})
        self.cancelled = cancelled

    @property
    def complete(self) -> bool:
        """Every plane has a result."""
        return all(r is not None for r in self)

    @property
    def finished(self) -> list[int]:
        """Numbers of the planes that have a result."""
        return [i for i, r in enumerate(self) if r is not None]

    def summary(self) -> str:
        """One sentence: how many planes finished, which failed and why, whether cancelled."""
        text = f"{len(self.finished)} of {len(self)} planes finished"
        if self.errors:
            text += "; " + "; ".join(f"plane {i} failed: {msg}" for i, msg in self.errors.items())
        if self.cancelled:
            text += "; cancelled before the remaining planes"
        return text + "."


def regularize_stack(
    stack: Any,
    model: str | Backbone | torch.nn.Module = "demo",
    *,
    channel_last: bool = False,
    progress: Callable[[int, int, Progress], Any] | None = None,
    cancel: CancelToken | None = None,
    provenance: dict[str, Any] | None = None,
    **options: Any,
) -> StackResults:
    """:func:`regularize` on every 2D plane of an nD stack (leading axes in C order).

    Finished planes are never thrown away. A plane that cannot be analysed (constant, NaN,
    too small) gets ``None`` and its reason in ``.errors`` while the other planes go on; a
    cancel stops after the plane in progress and returns the finished planes with
    ``.cancelled`` set (it does not raise :class:`RunCancelled`). Both emit a
    :class:`PartialStackWarning`. Options are checked once, before the first plane; when no
    plane at all can be analysed the ValueError is raised. Any other error is raised with
    the finished planes attached as its ``partial`` attribute.

    Parameters
    ----------
    stack : array-like or PlaneStack
        ``(..., H, W)`` or, with ``channel_last``, ``(..., H, W, C)``; with ``channel_axis=``
        the stack's axis of channels. Planes and channels are told apart by
        :class:`~napari_attnreg.core.run.planes.PlaneStack` (an ``(N, H, W, 3)`` stack needs
        ``channel_last=True``), or given as one (a file read with
        ``napari_attnreg.io.readers.read_stack``, its layout as the file states it).
        ``napari_attnreg.regularize_stack`` also takes a file's path.
    progress : callable, optional
        Called with ``(plane_index, n_planes, Progress)``.
    provenance : dict, optional
        What the stack's file says, recorded in each result as :func:`regularize` does.

    Returns
    -------
    StackResults
        A list with one :class:`AttentionResult` (or ``None``) per plane, in C order of the
        plane axes (``PlaneStack.planes()``). ``.errors``,
        ``.cancelled``, ``.complete`` and ``.summary()`` say what did not finish.

    Examples
    --------
    >>> results = regularize_stack(zstack, n_boot=100)            # doctest: +SKIP
    >>> results.complete, results.errors                           # doctest: +SKIP
    (False, {3: 'The image is constant ...'})
    """
    arch = options.pop("arch", None)
    config = _config_from(options, "regularize_stack")
    if provenance:
        config = replace(config, extra={**provenance, **config.extra})
    if isinstance(stack, (str, os.PathLike)):  # was "Image dtype <U18 is not numeric"
        raise ValueError(f"{stack!s}: this regularize_stack() takes pixels, not a file; use "
                         "napari_attnreg.regularize_stack(path, ...), which opens files as "
                         "the command line does.")
    if isinstance(stack, PlaneStack):  # its layout is decided (a file's, read_stack)
        if config.channel_axis is not None or channel_last:
            raise ValueError("channel_axis= and channel_last= do not apply to a PlaneStack: "
                             "it states its channels already.")
        planes_of = stack
    else:  # a PlaneStack given here failed with "Image dtype object is not numeric"
        planes_of = PlaneStack.from_array(stack, channel_axis=config.channel_axis,
                                          channel_last=channel_last, stack=True)
    spec = _checked_model(model, arch, config)
    planes = planes_of.planes()

    def events(step: JobProgress) -> None:
        if progress is not None and step.event is not None:  # not the model-loading step
            progress(step.plane_number, len(planes), step.event)

    outcome = run_job_sync(Job(spec, planes_of, planes, config), cancel=cancel,
                           on_progress=events)
    results = _stack_results(outcome, planes)
    failure = _stack_failure(outcome, results, planes)
    if failure is not None:
        failure.partial = results  # type: ignore[attr-defined]
        raise failure
    if not results.complete:
        warnings.warn(f"regularize_stack: {results.summary()}", PartialStackWarning, stacklevel=2)
    return results


def _stack_results(outcome: Outcome, planes: list[PlaneIndex]) -> StackResults:
    """The outcome by plane number: results (None where missing), errors, cancelled."""
    number = {plane: i for i, plane in enumerate(planes)}
    results = StackResults([outcome.results.get(plane) for plane in planes],
                           errors={number[p]: text for p, text in outcome.errors.items()})
    # a cancel that came after the last plane finished cancelled nothing
    results.cancelled = outcome.status == "cancelled" and not results.complete
    return results


def _stack_failure(outcome: Outcome, results: StackResults,
                   planes: list[PlaneIndex]) -> BaseException | None:
    """The error :func:`regularize_stack` raises, if any: one that ended the run, or the
    ValueError when no plane at all could be analysed."""
    if outcome.error is not None:
        outcome.error.add_note(f"regularize_stack: {results.summary()} They are in this "
                               "error's 'partial' attribute.")
        return outcome.error
    if results.finished or not results.errors or results.cancelled:
        return None
    if len(planes) == 1:
        return outcome.exceptions.get(planes[0]) or ValueError(results.errors[0])
    return ValueError(f"No plane of the stack could be analysed: {results.summary()}")

"""The Python entry points: :func:`regularize` for one image, :func:`regularize_stack` for a stack.

Both check keyword options once (unknown names are a TypeError) and run the engine; the
front ends reach the same engine through :mod:`.service`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from napari_attnreg.core.models.backbones import Backbone, load_backbone, resolve_device
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.engine import (
    CancelToken,
    Progress,
    RunCancelled,
    RunConfig,
    check_model_options,
    drain,
    run_engine,
)


def regularize(
    image: Any,
    model: str | Backbone | torch.nn.Module = "demo",
    *,
    progress: Callable[[Progress], Any] | None = None,
    cancel: CancelToken | None = None,
    arch: str | None = None,
    **options: Any,
) -> AttentionResult:
    """Bootstrap significance and regularized attention maps for one 2D image.

    Parameters
    ----------
    image : array-like
        2D grayscale, RGB(A) or multichannel (``channel_axis=``), any numeric dtype.
    model : str, Backbone or nn.Module
        ``"demo"`` (bundled), a timm name, a weights file (with ``arch=``) or a module.
    progress : callable, optional
        Called with each :class:`Progress` event.
    cancel : CancelToken, optional
    arch : str, optional
        timm architecture of a weights file.
    **options
        Any :class:`RunConfig` field: ``method`` ("normal", "uniform", "pixel", "patch"),
        ``n_boot`` (200), ``seed`` (0), ``device`` ("auto"), ``chunk_size``, ``precision``,
        ``layer``, ``head``, ``p_method``, ``alternative``, ``pi0_method``, ``null``, ``rule``
        ("lfdr"), ``z_th``, ``p_th``, ``l_th``, ``keep_nulls``, ``target_size``, ...

    Returns
    -------
    AttentionResult

    Examples
    --------
    >>> from napari_attnreg import regularize
    >>> from skimage.data import cell
    >>> result = regularize(cell(), n_boot=100, seed=1)          # doctest: +SKIP
    >>> result.posterior.shape, result.regularized("p", p_th=0.05).max()  # doctest: +SKIP
    """
    config = _config_from(options, "regularize")
    backbone = model if isinstance(model, Backbone) else load_backbone(model, arch=arch)
    return drain(run_engine(image, backbone, config, cancel), progress)


def _config_from(options: dict[str, Any], caller: str) -> RunConfig:
    """A checked :class:`RunConfig` from keyword options (unknown names are a TypeError)."""
    known = set(RunConfig.__dataclass_fields__) - {"extra"}
    unknown = set(options) - known
    if unknown:
        raise TypeError(f"{caller}() got unknown options {sorted(unknown)}; valid: {sorted(known)}")
    return RunConfig(**options).validate()


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
    stack : array-like
        ``(..., H, W)`` or, with ``channel_last``, ``(..., H, W, C)``; with ``channel_axis=``
        the stack's axis of channels. Planes and channels are told apart by
        :class:`~napari_attnreg.core.run.planes.PlaneStack` (an ``(N, H, W, 3)`` stack needs
        ``channel_last=True``).
    progress : callable, optional
        Called with ``(plane_index, n_planes, Progress)``.

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
    from napari_attnreg.core.run.planes import PlaneStack

    arch = options.pop("arch", None)
    config = _config_from(options, "regularize_stack")
    planes_of = PlaneStack.from_array(stack, channel_axis=config.channel_axis,
                                      channel_last=channel_last, stack=True)
    backbone = model if isinstance(model, Backbone) else load_backbone(model, arch=arch)
    check_model_options(config, backbone)
    resolve_device(config.device)
    planes = planes_of.planes()
    results = StackResults([None] * len(planes))
    for index, where in enumerate(planes):
        if cancel is not None and cancel.cancelled:
            results.cancelled = True
            break
        cb = (lambda ev, i=index: progress(i, len(planes), ev)) if progress else None
        try:
            plane, channel_axis = planes_of.read(where)
            plane_config = replace(config, channel_axis=channel_axis)
            results[index] = drain(run_engine(plane, backbone, plane_config, cancel), cb)
        except RunCancelled:
            results.cancelled = True
            break
        except ValueError as err:  # this plane's data (constant, NaN, too small): go on
            results.errors[index] = str(err)
        except Exception as err:
            err.partial = results  # type: ignore[attr-defined]
            err.add_note(f"regularize_stack: {results.summary()} They are in this error's "
                         "'partial' attribute.")
            raise
    if not results.finished and results.errors and not results.cancelled:
        err = ValueError(results.errors[0] if len(planes) == 1 else
                         f"No plane of the stack could be analysed: {results.summary()}")
        err.partial = results  # type: ignore[attr-defined]
        raise err
    if not results.complete:
        warnings.warn(f"regularize_stack: {results.summary()}", PartialStackWarning, stacklevel=2)
    return results

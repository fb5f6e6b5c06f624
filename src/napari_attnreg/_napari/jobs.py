"""What one Run does, as a generator for napari's ``thread_worker`` (no Qt in here).

The worker thread loads the model, reads each image plane and drives the core's
:func:`~napari_attnreg.core.engine.run_engine`, yielding :class:`JobProgress` once per
chunk. Every failure the analyst can act on ends as a :class:`JobOutcome` carrying the
core's message, so the widget can show a notification instead of napari's traceback
dialog, and a cancelled run ends as ``cancelled=True`` with no results.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._compat import avoid_triton_llvm_clash

avoid_triton_llvm_clash()  # before anything below can import timm (see _compat)

from ..core.backbones import Backbone, BackboneError, load_backbone
from ..core.engine import CancelToken, Progress, RunCancelled, RunConfig, run_engine
from ..core.result import AttentionResult

logger = logging.getLogger(__name__)

PlaneIndex = tuple[int, ...]


@dataclass(frozen=True)
class ModelSpec:
    """Which backbone a run uses.

    Attributes
    ----------
    source : {"demo", "timm", "file", "module"}
    name : str
        timm name, weights-file path, or a display name for a given module.
    arch : str, optional
        timm architecture of a weights file.
    module : Backbone or nn.Module, optional
        Given programmatically (tests, scripts); never chosen in the UI.
    """

    source: str = "demo"
    name: str = "demo"
    arch: str | None = None
    module: Any = field(default=None, compare=False, hash=False)

    def key(self) -> tuple:
        return (self.source, self.name, self.arch, id(self.module) if self.module is not None else None)

    def label(self) -> str:
        if self.source == "file":
            return f"{self.name} ({self.arch or 'arch from file'})"
        return self.name


_model_cache: dict[tuple, Backbone] = {}
_model_lock = threading.Lock()


def load_model(spec: ModelSpec) -> Backbone:
    """Load (or reuse) the backbone of ``spec``; raises the core's ``BackboneError``."""
    avoid_triton_llvm_clash()
    with _model_lock:
        key = spec.key()
        if key not in _model_cache:
            if spec.source == "module":
                if spec.module is None:
                    raise ValueError("No model was given; choose the demo model, a timm name or a file.")
                backbone = load_backbone(spec.module)
            elif spec.source == "demo":
                backbone = load_backbone("demo")
            elif spec.source == "catalogue":
                backbone = load_backbone(spec.name)
            elif spec.source == "timm":
                if not spec.name.strip():
                    raise ValueError("Type a timm model name (e.g. vit_small_patch8_224.dino) or "
                                     "choose the bundled demo model.")
                backbone = load_backbone(spec.name.strip())
            elif spec.source == "file":
                if not spec.name.strip():
                    raise ValueError("Choose a weights file (.safetensors, .pth, .ckpt) first.")
                backbone = load_backbone(spec.name.strip(), arch=spec.arch or None)
            else:
                raise ValueError(f"Unknown model source {spec.source!r}.")
            _model_cache.clear()  # keep one model in memory: GPU memory is the scarce resource
            _model_cache[key] = backbone
        return _model_cache[key]


@dataclass
class JobSpec:
    """Everything a run needs, captured on the GUI thread.

    Attributes
    ----------
    task_id : int
        Tags progress and outcome so results of an older run are recognised and dropped.
    data : array-like
        The source layer's data (numpy, dask, zarr); planes are read on the worker thread.
    planes : list of tuple of int
        Indices over the stack axes (empty tuple for a 2D image).
    stack_axes : tuple of int
        Data axes indexed by ``planes``.
    channel_axis : int, optional
        Data axis holding channels (multichannel fluorescence); RGB needs none.
    model : ModelSpec
    config : RunConfig
    """

    task_id: int
    data: Any
    planes: list[PlaneIndex]
    stack_axes: tuple[int, ...]
    channel_axis: int | None
    model: ModelSpec
    config: RunConfig


@dataclass(frozen=True)
class JobProgress:
    """One progress event of a (possibly multi-plane) run."""

    task_id: int
    plane_number: int
    n_planes: int
    event: Progress | None
    message: str

    @property
    def fraction(self) -> float:
        inner = self.event.fraction if self.event is not None else 0.0
        return min(1.0, (self.plane_number + inner) / max(self.n_planes, 1))


@dataclass
class JobOutcome:
    """How a run ended: results, or an error message, or cancelled."""

    task_id: int
    results: dict[PlaneIndex, AttentionResult] = field(default_factory=dict)
    error: str | None = None
    cancelled: bool = False
    model_description: str = ""
    elapsed_s: float = 0.0


def read_plane(data: Any, plane: PlaneIndex, stack_axes: tuple[int, ...],
               channel_axis: int | None) -> tuple[np.ndarray, int | None]:
    """The 2D (or channels + 2D, or RGB) array of one plane, and its channel axis.

    Stack axes are indexed away; a channel axis keeps its relative place, which is in front
    of the two image axes (napari's image axes are always the last two, RGB's last three).
    """
    index: list[Any] = [slice(None)] * np.ndim(data)
    for axis, i in zip(stack_axes, plane):
        index[axis] = int(i)
    arr = np.asarray(data[tuple(index)])
    if channel_axis is None:
        return arr, None
    return arr, channel_axis - sum(1 for a in stack_axes if a < channel_axis)


def _user_message(err: BaseException) -> str:
    """The core's message for errors an analyst can act on, a short line otherwise."""
    if isinstance(err, BackboneError):  # its advice in the words of the controls, not a call
        return err.for_gui()
    if isinstance(err, (ValueError, MemoryError)):
        return str(err)
    text = str(err)
    if "out of memory" in text.lower():
        return ("Out of memory: lower the chunk size or the number of bootstrap images, "
                f"or use device 'cpu'. ({text.splitlines()[0]})")
    if isinstance(err, (IndexError, KeyError, TypeError)):
        return f"{type(err).__name__}: {text}"
    return f"Unexpected {type(err).__name__}: {text} (details in the terminal log)"


def run_job(spec: JobSpec, cancel: CancelToken) -> Generator[JobProgress, None, JobOutcome]:
    """Load the model and run every requested plane; the generator a ``thread_worker`` drives."""
    t0 = time.perf_counter()
    n = len(spec.planes)
    outcome = JobOutcome(spec.task_id)
    try:
        yield JobProgress(spec.task_id, 0, n, None, f"loading model {spec.model.label()}")
        backbone = load_model(spec.model)
        outcome.model_description = backbone.describe()
        head = spec.config.head
        if head != "mean" and not 0 <= int(head) < backbone.num_heads:
            raise ValueError(f"Head {head} does not exist: {backbone.name} has {backbone.num_heads} "
                             f"heads (0–{backbone.num_heads - 1}); choose one of them or 'mean'.")
        for number, plane in enumerate(spec.planes):
            cancel.raise_if_cancelled()
            image, channel_axis = read_plane(spec.data, plane, spec.stack_axes, spec.channel_axis)
            config = _config_for_plane(spec.config, channel_axis, plane)
            gen = run_engine(image, backbone, config, cancel)
            where = f"plane {plane} ({number + 1}/{n}): " if plane else ""
            while True:
                try:
                    event = next(gen)
                except StopIteration as stop:
                    outcome.results[plane] = stop.value
                    break
                yield JobProgress(spec.task_id, number, n, event, where + event.message)
    except RunCancelled:
        outcome.results = {}
        outcome.cancelled = True
    except Exception as err:  # every failure becomes a message for a notification
        if not isinstance(err, (ValueError, MemoryError)):
            logger.exception("napari-attnreg run failed")
        outcome.results = {}
        outcome.error = _user_message(err)
    outcome.elapsed_s = time.perf_counter() - t0
    if cancel.cancelled:  # cancelled after the last chunk: still nothing to add
        outcome.results = {}
        outcome.cancelled = True
    return outcome


def _config_for_plane(config: RunConfig, channel_axis: int | None, plane: PlaneIndex) -> RunConfig:
    from dataclasses import replace

    extra = dict(config.extra)
    if plane:
        extra["plane"] = list(plane)
    return replace(config, channel_axis=channel_axis, extra=extra)

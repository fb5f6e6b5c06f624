"""The one pipeline service: load a model, run planes, end with an :class:`Outcome`.

The napari worker (``thread_worker``), the notebook's background runner and the command
line all drive :func:`run_job`: a generator that loads the model (kept in a one-model
cache), reads each plane of a :class:`~napari_attnreg.core.run.planes.PlaneStack`, ``yield from``
the engine, and returns an :class:`Outcome`. Failures an analyst can act on become one
message (:func:`user_message`); finished planes are kept when a later plane fails or the
run is cancelled, and the outcome says which planes are missing and why.

Example
-------
>>> job = Job(ModelSpec("demo"), PlaneStack.from_array(image), [()], RunConfig(n_boot=50))
>>> outcome = run_job_sync(job)                                      # doctest: +SKIP
>>> outcome.status, outcome.results[()].summary()                     # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from napari_attnreg.core.models.backbones import Backbone, load_backbone
from napari_attnreg.core.models.errors import BackboneError
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.engine import (
    CancelToken,
    Progress,
    RunCancelled,
    RunConfig,
    drain,
    prepare_for,
    run_engine,
)
from napari_attnreg.core.run.planes import PlaneIndex, PlaneStack, plane_label

if TYPE_CHECKING:
    from napari_attnreg.core.run.lazy import LazyImage

logger = logging.getLogger(__name__)

MODEL_SOURCES = ("demo", "catalogue", "timm", "file", "module")
#: How the model-source choices read in a front end ("module" is named after the module).
MODEL_SOURCE_LABELS = {"demo": "demo (bundled)", "catalogue": "known model (catalogue)",
                       "timm": "timm model name", "file": "weights file"}


@dataclass(frozen=True)
class ModelSpec:
    """Which backbone a run uses.

    Attributes
    ----------
    source : {"demo", "catalogue", "timm", "file", "module"}
    name : str
        Catalogue id, timm name (or ``hf-hub:``/``hf:`` id), weights-file path, or a display
        name for a given module.
    arch : str, optional
        Architecture (timm name or catalogue id) of a weights file.
    module : Backbone or nn.Module, optional
        Given programmatically (scripts, tests); never typed into a control.
    """

    source: str = "demo"
    name: str = "demo"
    arch: str | None = None
    module: Any = field(default=None, compare=False, hash=False)

    @classmethod
    def from_setting(cls, text: str) -> ModelSpec:
        """The spec of a default-model setting: 'demo', a catalogue id, a timm name or a file."""
        from napari_attnreg.core.models.catalogue import find

        name = text.strip() or "demo"
        if name == "demo":
            return cls("demo", "demo")
        entry = find(name)
        if entry is not None:
            return cls("catalogue", entry.id)
        return cls("file" if Path(name).exists() else "timm", name)

    @classmethod
    def from_model(cls, model: Any, arch: str | None = None) -> ModelSpec:
        """The spec of what scripts and the command line pass as ``model`` (and ``arch``)."""
        if not isinstance(model, (str, Path)):
            return cls("module", getattr(model, "name", type(model).__name__), module=model)
        name = str(model)
        if name == "demo" and arch is None:
            return cls("demo", "demo")
        return cls("file" if arch is not None or Path(name).exists() else "timm", name, arch)

    def key(self) -> tuple:
        module = id(self.module) if self.module is not None else None
        return (self.source, self.name.strip(), self.arch or None, module)

    def label(self) -> str:
        if self.source == "file":
            return f"{self.name} ({self.arch or 'architecture from the file'})"
        return self.name


class _ModelCache:
    """Keeps the last loaded model: GPU memory, not load time, is the scarce resource."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # the spec is kept with its backbone: a given module is keyed by its id, which must
        # not be reused by another module while the entry lives
        self._models: dict[tuple, tuple[ModelSpec, Backbone]] = {}

    def get(self, spec: ModelSpec) -> Backbone:
        with self._lock:  # two docks / two explorers must not load the same model twice
            key = spec.key()
            if key not in self._models:
                backbone = _load(spec)
                self._models.clear()
                self._models[key] = (spec, backbone)
            return self._models[key][1]

    def clear(self) -> None:
        with self._lock:
            self._models.clear()

    def keys(self) -> list[tuple]:
        with self._lock:
            return list(self._models)


_CACHE = _ModelCache()


def _load(spec: ModelSpec) -> Backbone:
    name = spec.name.strip()
    if spec.source not in MODEL_SOURCES:
        raise ValueError(f"Unknown model source {spec.source!r}; use one of {MODEL_SOURCES}.")
    if spec.source == "module":
        if spec.module is None:
            raise ValueError("No model was given; choose the demo model, a catalogue model, a "
                             "timm name or a weights file.")
        return spec.module if isinstance(spec.module, Backbone) else load_backbone(spec.module)
    if spec.source == "demo":
        return load_backbone("demo")
    if not name:
        raise ValueError({"timm": "Type a timm model name (e.g. vit_small_patch8_224.dino) or "
                                  "choose the bundled demo model.",
                          "catalogue": "Choose a model from the catalogue.",
                          "file": "Choose a weights file (.safetensors, .pth, .ckpt) first."}
                         [spec.source])
    if spec.source == "file":
        return load_backbone(name, arch=spec.arch or None)
    return load_backbone(name)


def load_model(spec: ModelSpec) -> Backbone:
    """The backbone of ``spec``, loaded once and kept until another model is asked for.

    Raises
    ------
    BackboneError, ValueError
        With a message that says what to choose instead.
    """
    return _CACHE.get(spec)


def cached_models() -> list[tuple]:
    """Keys (:meth:`ModelSpec.key`) of the models this process holds."""
    return _CACHE.keys()


def clear_model_cache() -> None:
    """Forget the cached model (frees its memory once no run uses it)."""
    _CACHE.clear()


def available_devices() -> list[str]:
    """The compute devices this machine has, ``auto`` first (for device drop-downs)."""
    import torch

    names = ["auto", "cpu"]
    if torch.cuda.is_available():
        names.append("cuda")
        names += [f"cuda:{i}" for i in range(1, torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        names.append("mps")
    return names


def user_message(err: BaseException) -> str:
    """The one line every front end (napari, notebook, command line) shows for ``err``.

    The core's advice for a model or option error, the OS's own words for a file that cannot
    be read or written, a hint for running out of memory, else a short report that points at
    the log (where :func:`run_job` wrote the traceback).
    """
    if isinstance(err, BackboneError):  # its advice in the words of the controls, not a call
        return err.for_gui()
    text = str(err)
    if isinstance(err, MemoryError) or "out of memory" in text.lower():
        first = text.splitlines()[0] if text else type(err).__name__
        return ("Out of memory: lower the chunk size or the number of bootstrap images, or use "
                f"device 'cpu'. ({first})")
    if isinstance(err, ValueError):
        return text
    if isinstance(err, OSError) and not isinstance(err, (ConnectionError, TimeoutError)):
        # a full disk, a read-only folder: the OS says what is wrong, no traceback needed
        where = f": {err.filename}" if err.filename else ""
        return f"Cannot write or read a file ({err.strerror or err}{where})"
    return f"Unexpected {type(err).__name__}: {text} (details in the log)"


def plane_fingerprint(plane: np.ndarray) -> str:
    """A short hash of a plane's pixels, to notice data replaced while a run was computing."""
    arr = np.ascontiguousarray(plane)
    if arr.size > (1 << 22):  # large planes: a strided sample keeps this well under a second
        arr = np.ascontiguousarray(arr.reshape(-1)[:: arr.size // (1 << 22) + 1])
    digest = hashlib.blake2b(arr.view(np.uint8), digest_size=12)
    digest.update(repr((plane.shape, plane.dtype.str)).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Job:
    """Everything a run needs, captured when the user pressed Run.

    Attributes
    ----------
    model : ModelSpec
    stack : PlaneStack or LazyImage
        The image (numpy, dask or zarr data; planes are read inside the run), or one 2D image
        that stays on disk (:class:`~napari_attnreg.core.run.lazy.LazyImage`, read tile by
        tile by a tiled run; planes ``[()]``).
    planes : list of tuple of int
        Planes to run (``[()]`` for a single image).
    config : RunConfig
    task_id : int
        Tags progress and outcome, so a front end drops those of an older run.
    keep_display : bool
        Hand back each plane's display image (the scaled pixels a figure shows under the
        maps) in :attr:`Outcome.displays`.
    plane_names : tuple of str
        The stack axes' names where the file or viewer names them (``("z",)``): progress
        then says "z = 2" instead of "plane 2".
    """

    model: ModelSpec
    stack: PlaneStack | LazyImage
    planes: list[PlaneIndex]
    config: RunConfig
    task_id: int = 0
    keep_display: bool = False
    plane_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobProgress:
    """One progress event of a job (one per engine chunk)."""

    task_id: int
    plane_number: int
    n_planes: int
    plane: PlaneIndex
    event: Progress | None
    message: str

    @property
    def fraction(self) -> float:
        inner = self.event.fraction if self.event is not None else 0.0
        return min(1.0, (self.plane_number + inner) / max(self.n_planes, 1))


@dataclass
class Outcome:
    """How a job ended.

    Attributes
    ----------
    status : {"done", "partial", "cancelled", "failed"}
        ``partial``: some planes failed (see ``errors``), the others are in ``results``.
    results : dict
        Plane index → result, for every plane that finished (also after a cancel).
    errors : dict
        Plane index → message, for planes that failed.
    message : str
        One line for a status bar or notification.
    fingerprints : dict
        Plane index → :func:`plane_fingerprint` of the pixels the result was computed from
        (none for an image read lazily, whose pixels were never all in memory).
    displays : dict
        Plane index → display image, when the job asked for them (``keep_display``).
    exceptions : dict
        Plane index → the error behind ``errors[plane]`` (without its traceback, which would
        keep the plane's pixels alive), for scripts that raise it again.
    """

    task_id: int
    status: str = "done"
    results: dict[PlaneIndex, AttentionResult] = field(default_factory=dict)
    errors: dict[PlaneIndex, str] = field(default_factory=dict)
    message: str = ""
    error: BaseException | None = None
    model_description: str = ""
    elapsed_s: float = 0.0
    fingerprints: dict[PlaneIndex, str] = field(default_factory=dict)
    displays: dict[PlaneIndex, np.ndarray] = field(default_factory=dict)
    exceptions: dict[PlaneIndex, BaseException] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "done"

    def missing(self, planes: list[PlaneIndex]) -> list[PlaneIndex]:
        """Planes of ``planes`` without a result."""
        return [p for p in planes if p not in self.results]


def run_job(job: Job, cancel: CancelToken | None = None,
            ) -> Generator[JobProgress, None, Outcome]:
    """Load the model and run every plane of ``job``; never raises for a failed run.

    Yields
    ------
    JobProgress
        Once while the model loads and once per engine chunk (each a cancellation point).

    Returns
    -------
    Outcome
    """
    cancel = cancel or CancelToken()
    t0 = time.perf_counter()
    n = len(job.planes)
    outcome = Outcome(job.task_id)
    current: PlaneIndex | None = None  # the plane being computed when something fails
    try:
        config = job.config.validate()  # before loading: an option error is nobody's model
        yield JobProgress(job.task_id, 0, n, job.planes[0] if n else (), None,
                          f"loading model {job.model.label()}")
        backbone = load_model(job.model)
        outcome.model_description = backbone.describe()
        head = config.head
        if head != "mean" and not 0 <= int(head) < backbone.num_heads:
            raise ValueError(f"Head {head} does not exist: {backbone.name} has "
                             f"{backbone.num_heads} heads (0–{backbone.num_heads - 1}); choose "
                             "one of them or 'mean'.")
        load_s = time.perf_counter() - t0
        for number, plane in enumerate(job.planes):
            cancel.raise_if_cancelled()
            current = plane
            try:
                yield from _run_plane(job, config, backbone, number, plane, load_s, cancel,
                                      outcome)
            except (ValueError, MemoryError) as err:  # this plane only (e.g. a constant slice)
                outcome.errors[plane] = user_message(err)
                if isinstance(err, MemoryError):
                    raise
                outcome.exceptions[plane] = err.with_traceback(None)
    except RunCancelled:
        outcome.status = "cancelled"
    except Exception as err:
        if not isinstance(err, (ValueError, MemoryError)):
            logger.exception("napari-attnreg run failed")
        outcome.error = err
        if current is not None:
            outcome.errors.setdefault(current, user_message(err))
        outcome.status = "partial" if outcome.results else "failed"
    if cancel.cancelled and outcome.status != "failed":
        outcome.status = "cancelled"
    elif outcome.status == "done" and outcome.errors:
        outcome.status = "partial" if outcome.results else "failed"
    outcome.elapsed_s = time.perf_counter() - t0
    outcome.message = _message(outcome, job)
    return outcome


def _run_plane(job: Job, config: RunConfig, backbone: Backbone, number: int, plane: PlaneIndex,
               load_s: float, cancel: CancelToken, outcome: Outcome,
               ) -> Generator[JobProgress, None, None]:
    image, channel_axis = _read_plane(job.stack, plane, config)
    # now, not after the run: a numpy plane is a view, and would show a later in-place edit
    fingerprint = plane_fingerprint(image) if isinstance(image, np.ndarray) else None
    # what a slide says (the level read, its resampling), unless the caller said it
    said = image.run_extra() if hasattr(image, "run_extra") else {}
    extra = {**said, **config.extra, "model_load_s": load_s if number == 0 else 0.0}
    if plane:  # unless the caller names planes its own way (the batch: "0-3")
        extra.setdefault("plane", list(plane))
    plane_config = replace(config, channel_axis=channel_axis, extra=extra)
    display = None
    if job.keep_display:  # prepared here, as the engine would, to keep the display image;
        image = prepare_for(image, backbone, plane_config)  # the raw pixels are freed
        display = image.display
    where = (f"{plane_label(plane, job.plane_names)} ({number + 1}/{len(job.planes)}): "
             if plane else "")
    engine = run_engine(image, backbone, plane_config, cancel)
    while True:
        try:
            event = next(engine)
        except StopIteration as stop:
            outcome.results[plane] = stop.value
            if fingerprint is not None:
                outcome.fingerprints[plane] = fingerprint
            if display is not None:
                outcome.displays[plane] = display
            return
        yield JobProgress(job.task_id, number, len(job.planes), plane, event,
                          where + event.message)


def _read_plane(stack: PlaneStack | LazyImage, plane: PlaneIndex,
                config: RunConfig) -> tuple[Any, int | None]:
    """A plane's pixels and channel axis; a lazy image is handed on whole, unread.

    An untiled run of a plane above the pixel budget is refused here, before it is read."""
    from napari_attnreg.core.run.lazy import check_untiled_size

    if isinstance(stack, PlaneStack):
        if not config.tiled:
            check_untiled_size(_rows_and_columns(stack))
        return stack.read(plane)
    if not config.tiled:
        check_untiled_size(stack.analysed_shape)
    return stack, config.channel_axis


def _rows_and_columns(stack: PlaneStack) -> tuple[int, int]:
    # the first two axes that are neither planes nor channels: an (H, W, 3) image whose colour
    # axis the preparation decides later still has its rows and columns first
    axes = [a for a in range(len(stack.shape))
            if a != stack.channel_axis and a not in stack.stack_axes]
    return stack.shape[axes[0]], stack.shape[axes[1]]


def _message(outcome: Outcome, job: Job) -> str:
    n, done = len(job.planes), len(outcome.results)
    took = f"{outcome.elapsed_s:.1f} s"
    if outcome.status == "done":
        return f"Done in {took}" + (f": {n} planes." if n > 1 else ".")
    if outcome.status == "cancelled":
        kept = f" {done} of {n} planes finished and are kept." if done else ""
        return f"Cancelled after {took}.{kept}"
    by_message: dict[str, list[PlaneIndex]] = {}
    for plane, text in outcome.errors.items():
        by_message.setdefault(text, []).append(plane)
    failed = "; ".join(text if planes == [()] else f"{_planes_text(planes, job.plane_names)}: {text}"
                       for text, planes in by_message.items())
    if outcome.error is not None and not outcome.errors:
        failed = user_message(outcome.error)
    if outcome.status == "partial":
        return f"{done} of {n} planes done; {len(outcome.errors)} failed: {failed}"
    return failed or "The run failed."


def _planes_text(planes: list[PlaneIndex], names: tuple[str, ...]) -> str:
    shown = "; ".join(plane_label(p, names) for p in planes[:4])
    return shown + (" …" if len(planes) > 4 else "")


def run_job_sync(job: Job, *, cancel: CancelToken | None = None,
                 on_progress: Callable[[JobProgress], Any] | None = None) -> Outcome:
    """Drive :func:`run_job` in this thread (scripts, the command line, tests)."""
    return drain(run_job(job, cancel), on_progress)

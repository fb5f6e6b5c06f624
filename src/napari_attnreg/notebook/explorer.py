"""AttentionExplorer: the notebook twin of the napari widget.

The explorer is a ``VBox`` whose state lives in plain traitlets (``overlay``, ``p_th``,
``n_boot``, ...). Every control is ``link``-ed to one of them, and observers turn state
changes into a re-render, so the same thing happens whether a user moves a slider or
sets ``explorer.p_th = 0.05`` in code. Thresholds only re-render: nothing is recomputed.
Runs go through :class:`~.runner.BackgroundRunner` (engine steps in a worker thread,
widget updates on the kernel's event loop).

Example
-------
>>> from napari_attnreg.notebook import AttentionExplorer
>>> from napari_attnreg.samples import demo_image
>>> explorer = AttentionExplorer(demo_image(), model="demo", n_boot=100)   # doctest: +SKIP
>>> explorer                                # displays the widget; press Run  # doctest: +SKIP
>>> explorer.run(wait=True).summary()       # or run from code              # doctest: +SKIP
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import numpy as np
import traitlets as t

from ..core.backbones import Backbone, load_backbone
from ..core.display import (
    MAPS_BY_KEY,
    PRESET_HELP,
    RULE_HELP,
    RULE_LABELS,
    TILED_LABEL,
    TILING_HELP,
    diagnostics_lines,
    run_caption,
    significance_caption,
    with_thresholds,
)
from ..core.engine import CancelToken, Progress, RunConfig, run_engine
from ..core.errors import gui_text
from ..core.images import scale_intensity, to_channels_last
from ..core.nulls import NULL_METHODS
from ..core.presets import DEFAULT_PRESET, PRESETS, THRESHOLD_KEYS, default_thresholds
from ..core.regularize import RULES
from ..core.result import AttentionResult
from ..core.tiling import TILE_OVERLAP_MAX, TILE_SCALE_RANGE
from . import render
from .model_picker import ModelPicker
from .regions import add_region, as_labels, polygon_mask, rectangle_vertices
from .runner import BackgroundRunner, Outcome
from .views import DRAW_MODES, ImageView, MplView, ipympl_available

#: Overlay choices: (label shown, state value); the value is a core.display map key.
OVERLAYS = (
    ("regularized attention", "regularized"),
    ("raw attention", "attention"),
    ("posterior", "posterior"),
    ("−log10 p", "pvalue"),
    ("none (image only)", "none"),
)
#: "auto": each map in its own colormap (core.display), as napari and the CLI show it.
COLORMAPS = ("auto", "magma", "inferno", "viridis", "turbo", "hot", "gray", "magma_r", "viridis_r")
#: Options of :class:`RunConfig` the explorer's own controls set.
_CONTROLLED = {"preset", "method", "n_boot", "seed", "device", "tiled", "tile_scale",
               "tile_overlap", *THRESHOLD_KEYS, "extra"}
#: The engine's defaults (the tiling options' among them).
_RUN_DEFAULTS = RunConfig()
#: Default of the threshold arguments: take the preset's value (``z_th=None`` is "no z mask").
FROM_PRESET = "from preset"
#: z threshold the slider shows while the z mask is off.
Z_TH_WHEN_ON = 0.0
WARNING_COLOR = "#b26a00"


def _devices(requested: str) -> list[str]:
    import torch

    names = ["auto", "cpu"]
    if torch.cuda.is_available():
        names.append("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        names.append("mps")
    if requested not in names:  # keep it selectable: Run then explains why it is unavailable
        names.append(requested)
    return names


class AttentionExplorer(widgets.VBox):
    """Interactive attention regularization for one image in Jupyter.

    Parameters
    ----------
    image : array-like
        2D grayscale, RGB(A) ``(H, W, 3|4)``, any dtype (16-bit and float are percentile
        scaled). nD stacks ``(..., H, W)`` (or ``(..., H, W, 3)``) get one slider per
        leading axis to choose the plane that is analysed.
    model : str or Backbone or nn.Module
        ``"demo"`` (bundled), a timm name, a weights file (with ``arch``) or a loaded model.
    arch : str, optional
        timm architecture of a weights file.
    preset : {"directional", "paper"}
        ``"directional"`` (default): is a patch's attention *higher* than noise gives
        (one-sided p⁺, q⁺, posterior⁺)? ``"paper"``: the published two-sided procedure.
        Changing it resets the thresholds to the preset's defaults.
    method, n_boot, seed, device
        Bootstrap null method, number of null images, seed, compute device.
    tiled, tile_overlap, tile_scale
        Tiled run at native resolution (docs/scale-out.md): the image is cut into model-sized
        tiles at its own pixel size divided by ``tile_scale``, ``tile_overlap`` pixels
        shared by neighbours, with one null for the whole image (``n_tiles + B`` forward
        passes). For images much larger than the model input.
    rule, q_th, p_th, l_th, z_th
        Regularization rule and thresholds (see docs/method.md); left out, the preset's
        defaults; ``z_th=None`` applies no z mask. Changing them re-renders only.
    overlay : {"regularized", "attention", "posterior", "pvalue", "none"}
        ``"pvalue"`` shows −log10 p (``"p"`` is accepted for it).
    colormap : str
        ``"auto"`` (each map its own) or a matplotlib colormap name.
    opacity : float
    outline : bool
        Outline the tokens kept by the rule.
    roi : array, optional
        Boolean mask or integer labels ``(H, W)`` of regions for the ROI table.
    channel_axis : int, optional
        Channel axis of multichannel data (passed on to the core's image preparation).
    rgb : bool, optional
        Whether a trailing axis of length 3/4 is colour (default: guess so).
    view : {"auto", "ipympl", "image"}
        ``"ipympl"`` draws ROIs with the mouse; ``"image"`` is a plain PNG (no drawing);
        ``"auto"`` picks ipympl when it is installed.
    width : int
        Width of the image area in pixels.
    max_display : int
        Long side, in pixels, of the rendered image (large images are subsampled for display).
    **run_options
        Any other :class:`~napari_attnreg.core.engine.RunConfig` field (``chunk_size``,
        ``target_size``, ``p_method``, ``pi0_method``, ``layer``, ``head``, ...).

    Attributes
    ----------
    result : AttentionResult or None
        The latest finished run, carrying the thresholds currently set in the widget.
    """

    # ---- state (each control is linked to one of these) -----------------------------------
    model_name = t.Unicode("demo")
    method = t.Enum(NULL_METHODS, default_value="normal")
    n_boot = t.Int(200)
    seed = t.Int(0)
    device = t.Unicode("auto")
    tiled = t.Bool(_RUN_DEFAULTS.tiled)
    tile_overlap = t.Int(_RUN_DEFAULTS.tile_overlap)
    tile_scale = t.Float(_RUN_DEFAULTS.tile_scale)
    preset = t.Enum(PRESETS, default_value=DEFAULT_PRESET)
    rule = t.Enum(RULES, default_value=default_thresholds(DEFAULT_PRESET)["rule"])
    q_th = t.Float(default_thresholds(DEFAULT_PRESET)["q_th"])
    p_th = t.Float(default_thresholds(DEFAULT_PRESET)["p_th"])
    l_th = t.Float(default_thresholds(DEFAULT_PRESET)["l_th"])
    z_th = t.Float(default_thresholds(DEFAULT_PRESET)["z_th"], allow_none=True)
    overlay = t.Enum([v for _, v in OVERLAYS] + ["p"], default_value="regularized")  # "p": old name
    colormap = t.Unicode("auto")
    opacity = t.Float(0.6)
    outline = t.Bool(True)
    draw_mode = t.Enum(DRAW_MODES, default_value="off")
    slice_index = t.Tuple()
    running = t.Bool(False)
    status = t.Unicode("")

    def __init__(
        self,
        image: Any,
        model: str | Backbone | Any = "demo",
        *,
        arch: str | None = None,
        preset: str = DEFAULT_PRESET,
        method: str = "normal",
        n_boot: int = 200,
        seed: int = 0,
        device: str = "auto",
        tiled: bool = _RUN_DEFAULTS.tiled,
        tile_overlap: int = _RUN_DEFAULTS.tile_overlap,
        tile_scale: float = _RUN_DEFAULTS.tile_scale,
        rule: str = FROM_PRESET,
        q_th: float | str = FROM_PRESET,
        p_th: float | str = FROM_PRESET,
        l_th: float | str = FROM_PRESET,
        z_th: float | None | str = FROM_PRESET,
        overlay: str = "regularized",
        colormap: str = "auto",
        opacity: float = 0.6,
        outline: bool = True,
        roi: np.ndarray | None = None,
        channel_axis: int | None = None,
        rgb: bool | None = None,
        view: str = "auto",
        width: int = 560,
        max_display: int = 768,
        **run_options: Any,
    ) -> None:
        super().__init__()
        unknown = set(run_options) - (set(RunConfig.__dataclass_fields__) - _CONTROLLED)
        if unknown:
            raise TypeError(f"AttentionExplorer got unknown options {sorted(unknown)}; the run "
                            "options are the RunConfig fields.")
        if view not in ("auto", "ipympl", "image"):
            raise ValueError(f"view must be 'auto', 'ipympl' or 'image', got {view!r}.")
        if colormap != "auto":
            render.colormap_lut(colormap)  # unknown names fail here, not at the first render
        self._run_options = dict(run_options)
        self._arch = arch
        self._backbones: dict[str, Backbone] = {}
        if isinstance(model, str):
            name = model
        else:
            backbone = model if isinstance(model, Backbone) else load_backbone(model)
            name = backbone.name
            self._backbones[name] = backbone
            self._given_name = name
        self._max_display = max_display
        self._result: AttentionResult | None = None
        self._result_slice: tuple[int, ...] | None = None
        self._pending_slice: tuple[int, ...] = ()
        self.last_error: BaseException | None = None
        self._labels: np.ndarray | None = None
        self._token_index: np.ndarray | None = None  # display pixel → flat token id
        self._rendered: np.ndarray | None = None
        self._t_start = 0.0
        self._runner = BackgroundRunner(self._on_event, self._on_finish)

        self.preset = preset  # first: its observer resets the thresholds given below
        given = {"rule": rule, "q_th": q_th, "p_th": p_th, "l_th": l_th, "z_th": z_th}
        with self.hold_trait_notifications():
            self.model_name, self.method, self.n_boot, self.seed = name, method, int(n_boot), int(seed)
            self.device = device
            self.tiled, self.tile_overlap, self.tile_scale = bool(tiled), tile_overlap, tile_scale
            for key, value in given.items():
                if not (isinstance(value, str) and value == FROM_PRESET):
                    setattr(self, key, value)
            self.overlay, self.colormap = overlay, colormap
            self.opacity, self.outline = float(opacity), bool(outline)

        use_mpl = view == "ipympl" or (view == "auto" and ipympl_available())
        self._view = MplView(width) if use_mpl else ImageView(width)
        self._view.on_region = self._on_drawn_region
        self._view.describe = self._describe_pixel
        self._build_controls()

        self._stack: np.ndarray | None = None
        self._set_image(image, channel_axis=channel_axis, rgb=rgb)
        if roi is not None and self._stack is not None:
            self.set_roi(roi)
        self._render()

    # ---- public API -----------------------------------------------------------------------
    @property
    def result(self) -> AttentionResult | None:
        """The latest result, with the widget's current thresholds as its defaults."""
        if self._result is None:
            return None
        return with_thresholds(self._result, self.thresholds())

    def thresholds(self) -> dict[str, Any]:
        """The rule and thresholds the controls set (``z_th`` None: no z mask)."""
        return {key: getattr(self, key) for key in THRESHOLD_KEYS}

    @property
    def rendered(self) -> np.ndarray | None:
        """The ``(h, w, 3)`` uint8 image the view shows (image, overlay and outlines)."""
        return self._rendered

    @property
    def roi_labels(self) -> np.ndarray | None:
        """Integer ROI labels on the current plane (0 = background), or None."""
        return None if self._labels is None else self._labels.copy()

    def run(self, *, wait: bool = False) -> AttentionResult | None:
        """Start a run with the current settings (what the Run button does).

        Parameters
        ----------
        wait : bool
            Block until the run ends and return its result (None if it failed or was
            cancelled; the status line says why). Without ``wait``, inside a kernel the
            run continues in the background and :attr:`result` is set when it finishes.
        """
        if self._runner.running:
            self._set_status("A run is already in progress; cancel it first.", "warning")
            return None
        if self._stack is None:
            self._set_status("No usable image: give the explorer a 2D image first.", "error")
            return None
        plane, slice_index = self._plane(), tuple(self.slice_index)
        config_options = dict(self._run_options)
        if self._channel_explicit:
            config_options["channel_axis"] = -1
        extra = {"slice": list(slice_index)} if slice_index else {}
        # untiled runs keep the engine's tiling defaults, so their metadata says nothing stale
        tiling = {"tiled": self.tiled,
                  "tile_overlap": self.tile_overlap if self.tiled else _RUN_DEFAULTS.tile_overlap,
                  "tile_scale": self.tile_scale if self.tiled else _RUN_DEFAULTS.tile_scale}
        try:
            config = RunConfig(preset=self.preset, method=self.method, n_boot=self.n_boot,
                               seed=self.seed, device=self.device, extra=extra, **tiling,
                               **self.thresholds(), **config_options)
            config.validate()
        except ValueError as err:
            self._fail(err)
            return None
        self._pending_slice = slice_index
        self._t_start = time.perf_counter()
        self.running = True
        self._progress.value = 0.0
        self._progress.bar_style = "info"
        tiled = ", tiled" if self.tiled else ""
        self._set_status(f"Starting: {self.model_name}, {self.preset}, {self.method}, "
                         f"B={self.n_boot}{tiled} …", "info")
        name = self.model_name
        outcome = self._runner.start(lambda token: self._pipeline(name, plane, config, token),
                                     background=not wait)
        if outcome is None:  # continues on the event loop
            return None
        return outcome.result if outcome.kind == "done" else None

    def cancel(self) -> None:
        """Stop the current run after the chunk being computed (what Cancel does)."""
        if self._runner.running:
            self._runner.cancel()
            self._set_status("Cancelling after the current chunk …", "warning")

    async def wait(self) -> AttentionResult | None:
        """Await the background run (``await explorer.wait()`` in a notebook cell)."""
        task = self._runner.task
        if task is not None and not task.done():
            await task
        return self.result

    def save(self, path: str | Path) -> Path:
        """Save :attr:`result` (with the widget's thresholds) as ``.npz``; returns the path."""
        result = self.result
        if result is None:
            raise ValueError("Nothing to save yet: press Run (or call run()) first.")
        return result.save(path)

    def set_image(self, image: Any, *, channel_axis: int | None = None,
                  rgb: bool | None = None) -> None:
        """Show another image. A bad one keeps the current image and says why in the status."""
        if self._runner.running:
            self._set_status("Cannot change the image during a run; cancel it first.", "warning")
            return
        if self._set_image(image, channel_axis=channel_axis, rgb=rgb):
            self._result = None
            self._result_slice = None
            self._refresh_after_result()

    def set_roi(self, roi: np.ndarray | None) -> None:
        """Replace the ROIs by a boolean mask or integer labels on the image plane (None clears)."""
        if roi is None:
            self._labels = None
        else:
            self._labels = as_labels(roi, self._plane_shape)
        self._refresh_rois()

    def add_roi(self, *, rectangle: Sequence[float] | None = None,
                polygon: Sequence[Sequence[float]] | None = None,
                mask: np.ndarray | None = None) -> int:
        """Add one ROI and return its label.

        Parameters
        ----------
        rectangle : (row0, col0, row1, col1), optional
            Two opposite corners in pixel coordinates.
        polygon : sequence of (row, col), optional
        mask : (H, W) bool, optional
        """
        given = [v is not None for v in (rectangle, polygon, mask)]
        if sum(given) != 1:
            raise ValueError("Give exactly one of rectangle=, polygon= or mask=.")
        if rectangle is not None:
            region = polygon_mask(rectangle_vertices(*rectangle), self._plane_shape)
        elif polygon is not None:
            region = polygon_mask(polygon, self._plane_shape)
        else:
            region = as_labels(mask, self._plane_shape) > 0
        if self._labels is None:
            self._labels = np.zeros(self._plane_shape, dtype=np.int32)
        label = add_region(self._labels, region)
        self._refresh_rois()
        return label

    def clear_rois(self) -> None:
        self.set_roi(None)

    def roi_table(self) -> list[dict]:
        """Per-ROI statistics (``core.roi.roi_table``) at the widget's thresholds."""
        from ..core.roi import roi_table

        result = self._current_result()
        if result is None or self._labels is None or not self._labels.any():
            return []
        # the thresholds travel as the result's own (q_th and "no z mask" included)
        return roi_table(with_thresholds(result, self.thresholds()), self._labels)

    def export_roi_csv(self, path: str | Path) -> Path:
        """Write :meth:`roi_table` to a CSV file and return its path."""
        from ..core.roi import roi_table_to_csv

        rows = self.roi_table()
        if not rows:
            raise ValueError("No ROI statistics to export: run the analysis and draw or pass ROIs.")
        path = Path(path)
        roi_table_to_csv(rows, path)
        return path

    def close(self) -> None:
        self._runner.shutdown()
        self._view.close()
        super().close()

    # ---- the computation (runs in the worker thread) ----------------------------------------
    def _pipeline(self, name: str, plane: np.ndarray, config: RunConfig,
                  token: CancelToken) -> Generator[Progress, None, AttentionResult]:
        t0 = time.perf_counter()
        backbone = self._backbones.get(name)
        if backbone is None:
            yield Progress("model", 0, config.n_boot, 0, 0.0, f"loading model {name} …")
            backbone = load_backbone(name, arch=self._arch)
            # keep one loaded-by-name model in memory at a time (plus one the user passed)
            given = getattr(self, "_given_name", None)
            self._backbones = {k: v for k, v in self._backbones.items() if k == given}
            self._backbones[name] = backbone
        load_s = time.perf_counter() - t0
        token.raise_if_cancelled()
        config.extra = {**config.extra, "model_load_s": load_s}
        return (yield from run_engine(plane, backbone, config, token))

    # ---- runner callbacks (on the kernel's event loop) --------------------------------------
    def _on_event(self, event: Progress) -> None:
        self._progress.value = event.fraction if event.stage != "model" else 0.0
        elapsed = time.perf_counter() - self._t_start
        if self._runner.cancel_requested:
            return  # keep "Cancelling …" visible
        self._progress_label.value = f"{event.done}/{event.total}"
        self._set_status(f"{event.message} · {elapsed:.1f} s", "info")

    def _on_finish(self, outcome: Outcome) -> None:
        self.running = False
        elapsed = time.perf_counter() - self._t_start
        if outcome.kind == "done":
            self._result = outcome.result
            self._result_slice = self._pending_slice
            self.last_error = None
            self._progress.value = 1.0
            self._progress.bar_style = "success"
            n_warnings = len(diagnostics_lines(outcome.result, include_info=False))
            note = f" ⚠ {n_warnings} warning(s) below." if n_warnings else ""
            self._set_status(self._timing_text(outcome.result) + note,
                             "warning" if n_warnings else "success")
            self._refresh_after_result()
        elif outcome.kind == "cancelled":
            self._progress.bar_style = "warning"
            kept = " The previous result is still shown." if self._result is not None else ""
            self._set_status(f"Cancelled after {elapsed:.1f} s.{kept}", "warning")
        else:
            self._progress.bar_style = "danger"
            self._fail(outcome.error)

    def _fail(self, err: BaseException | None) -> None:
        self.last_error = err
        if isinstance(err, (ValueError, MemoryError)):
            message = gui_text(err)  # the core's messages are written for users
        else:
            message = f"Run failed ({type(err).__name__}: {err}); see explorer.last_error."
        kept = " The previous result is kept." if self._result is not None else ""
        self._set_status(message + kept, "error")

    @staticmethod
    def _timing_text(result: AttentionResult) -> str:
        md = result.metadata
        tm = md.get("timings", {})
        load = md.get("model_load_s", 0.0)
        parts = [f"model {load:.1f} s"] if load >= 0.05 else []
        observed = f"{md['n_tiles']} tiles" if md.get("tiled") else "observed"
        parts += [f"{observed} {tm.get('observed_s', math.nan):.2f} s",
                  f"{md.get('n_boot', '?')} nulls {tm.get('nulls_s', math.nan):.1f} s",
                  f"statistics {tm.get('statistics_s', math.nan):.2f} s"]
        total = tm.get("total_s", math.nan) + load
        return f"Done in {total:.1f} s on {md.get('device', '?')} ({', '.join(parts)})."

    # ---- image and slices -------------------------------------------------------------------
    def _set_image(self, image: Any, *, channel_axis: int | None, rgb: bool | None) -> bool:
        try:
            stack, channel_last, explicit = self._normalise_stack(image, channel_axis, rgb)
            lead = stack.shape[: stack.ndim - (3 if channel_last else 2)]
            first = stack[(0,) * len(lead)]
            base = self._display_base(first, explicit)
        except ValueError as err:
            self.last_error = err
            self._set_status(str(err), "error")
            return False
        self._stack, self._channel_last, self._channel_explicit = stack, channel_last, explicit
        self._plane_shape = tuple(int(v) for v in first.shape[:2])
        self._grid = render.DisplayGrid.for_shape(self._plane_shape, self._max_display)
        self._base = self._grid.sample(base)
        self._labels = None
        self._build_slice_sliders(lead)
        self._set_status("nD image: choose the plane to analyse with the slider(s), then Run."
                         if lead else "Ready: press Run.", "info")
        return True

    @staticmethod
    def _normalise_stack(image: Any, channel_axis: int | None,
                         rgb: bool | None) -> tuple[np.ndarray, bool, bool]:
        arr = np.asarray(image)
        if arr.ndim < 2:
            raise ValueError(f"Expected an image with at least 2 dimensions, got shape {arr.shape}.")
        if channel_axis is not None:
            if arr.ndim < 3:
                raise ValueError("channel_axis needs an image with a channel axis (3D or more).")
            return np.moveaxis(arr, channel_axis, -1), True, True
        if rgb is None:
            rgb = arr.ndim >= 3 and arr.shape[-1] in (3, 4)
        if rgb and (arr.ndim < 3 or arr.shape[-1] not in (3, 4)):
            raise ValueError(f"rgb=True needs a last axis of length 3 or 4, got shape {arr.shape}.")
        return arr, bool(rgb), False

    def _display_base(self, plane: np.ndarray, explicit: bool) -> np.ndarray:
        options = {k: self._run_options.get(k) for k in ("channels", "merge")}
        arr = to_channels_last(plane, channel_axis=-1 if explicit else None, **options)
        shown = scale_intensity(arr)
        if shown.ndim == 3 and shown.shape[-1] == 2:  # two channels: red/green like a microscope
            shown = np.concatenate([shown, np.zeros_like(shown[..., :1])], axis=-1)
        return shown

    def _plane(self) -> np.ndarray:
        index = tuple(self.slice_index)
        return self._stack[index] if index else self._stack

    def _build_slice_sliders(self, lead: tuple[int, ...]) -> None:
        self._slice_sliders = [
            widgets.IntSlider(value=0, min=0, max=n - 1, description=f"axis {i}",
                              continuous_update=False, layout=widgets.Layout(width="360px"))
            for i, n in enumerate(lead)
        ]
        for slider in self._slice_sliders:
            slider.observe(self._on_slice_slider, "value")
        self._slice_box.children = tuple(self._slice_sliders)
        self._slice_box.layout.display = "flex" if lead else "none"
        self.slice_index = tuple(0 for _ in lead)

    def _on_slice_slider(self, _change: dict) -> None:
        self.slice_index = tuple(s.value for s in self._slice_sliders)

    @t.observe("slice_index")
    def _slice_changed(self, _change: dict) -> None:
        if self._stack is None:
            return
        try:
            self._base = self._grid.sample(self._display_base(self._plane(), self._channel_explicit))
        except ValueError as err:  # e.g. an empty (constant) plane: say so, keep the last view
            self._set_status(f"Plane {tuple(self.slice_index)}: {err}", "error")
            return
        if self._result is not None and self._result_slice != tuple(self.slice_index):
            self._set_status(f"The result is for plane {self._result_slice}; press Run to analyse "
                             f"plane {tuple(self.slice_index)}.", "info")
        self._refresh_after_result()

    def _current_result(self) -> AttentionResult | None:
        """The result, if it belongs to the plane on screen."""
        if self._result is None or self._result_slice != tuple(self.slice_index):
            return None
        return self._result

    # ---- rendering ------------------------------------------------------------------------
    def _refresh_after_result(self) -> None:
        result = self._current_result()
        self._token_index = None
        if result is not None:
            gh, gw = result.grid_shape
            ids = np.arange(gh * gw, dtype=np.int64).reshape(gh, gw)
            self._token_index = self._grid.sample_tokens(result, ids)
        self._render()
        self._update_summary()
        self._update_roi_table()

    def _overlay_values(self, result: AttentionResult) -> tuple[np.ndarray | None, float, float]:
        """Token values of the chosen overlay and their colour range (core.display)."""
        if self.overlay == "none":
            return None, 0.0, 1.0
        view = MAPS_BY_KEY[self.overlay]
        values = view.values(result, self.thresholds())
        vmin, vmax = view.limits(result)
        if self.overlay == "regularized":
            # removed tokens are transparent, so the image shows where attention was not real
            values = np.where(values > 0, values, np.nan)
        return values, vmin, vmax

    def _lut(self) -> np.ndarray:
        name = self.colormap
        if name == "auto":
            name = MAPS_BY_KEY[self.overlay].colormap if self.overlay != "none" else "magma"
        return render.colormap_lut(name)

    def _render(self) -> None:
        if self._stack is None:
            return
        lut = self._lut()
        result = self._current_result()
        values = outline = None
        vmin, vmax = 0.0, 1.0
        if result is not None and self._token_index is not None:
            token_values, vmin, vmax = self._overlay_values(result)
            if token_values is not None:
                values = np.asarray(token_values, dtype=np.float64).ravel()[self._token_index]
            if self.outline:
                sig = with_thresholds(result, self.thresholds()).significant()
                outline = render.boundary(sig.ravel()[self._token_index], self._line_width())
        roi_edges = None
        if self._labels is not None and self._labels.any():
            roi_edges = render.label_boundaries(self._grid.sample(self._labels), self._line_width())
        self._rendered = render.composite(self._base, values, lut=lut, vmin=vmin, vmax=vmax,
                                          opacity=self.opacity, outline=outline, roi_edges=roi_edges)
        self._view.show(self._rendered, self._plane_shape)
        shown = result if values is not None else None
        self._update_colorbar(lut, vmin, vmax, shown)

    def _line_width(self) -> int:
        # about 1 px of the ~560 px view whatever the image size
        return max(1, round(max(self._grid.shape) / 500))

    def _update_colorbar(self, lut: np.ndarray, vmin: float, vmax: float,
                         result: AttentionResult | None) -> None:
        """Colour scale, the map's title and its one-sentence legend (core.display)."""
        shown = result is not None
        self._colorbar_box.layout.display = "flex" if shown else "none"
        self._legend.layout.display = "block" if shown else "none"
        if not shown:
            return
        view = MAPS_BY_KEY[self.overlay]
        self._colorbar.value = render.to_png(render.colorbar(lut))
        self._colorbar_lo.value = f"{vmin:.3g}"
        self._colorbar_hi.value = f"{vmax:.3g}"
        self._colorbar_label.value = view.title(result.preset, self.thresholds())
        outline = (f" <span style='color:{render.hex_color(render.SIGNIFICANT_COLOR)}'>■</span> "
                   "outline: significant patches." if self.outline else "")
        legend = html.escape(view.legend(result.preset), quote=False)
        self._legend.value = (f"<div style='font-size:90%;line-height:1.35'>{legend}{outline}"
                              "</div>")

    def _describe_pixel(self, row: float, col: float) -> str:
        r, c = round(row), round(col)
        h0, w0 = self._plane_shape
        if not (0 <= r < h0 and 0 <= c < w0):
            return ""
        text = f"x={c} y={r}"
        result = self._current_result()
        if result is not None:
            sy, sx = result.token_scale
            gh, gw = result.grid_shape
            i, j = min(int((r + 0.5) / sy), gh - 1), min(int((c + 0.5) / sx), gw - 1)
            text += (f" · token ({i},{j}) attention={result.attention[i, j]:.4g} z={result.z[i, j]:.2f}"
                     f" p={result.p[i, j]:.3g} q={result.q[i, j]:.3g}"
                     f" posterior={result.posterior[i, j]:.3g}")
        return text

    def _update_summary(self) -> None:
        """Significance count at the current thresholds, then the run's diagnostics (§14)."""
        result = self._current_result()
        if result is None:
            self._summary.value = ""
            self._diagnostics.value = ""
            return
        shown = with_thresholds(result, self.thresholds())
        reg = shown.regularized()
        kept = float(reg.sum() / result.attention.sum()) if result.attention.sum() > 0 else math.nan
        self._summary.value = (
            f"<b>{html.escape(significance_caption(result, self.thresholds()), quote=False)}</b> · "
            f"π0 = {result.pi0:.3f} · regularized map keeps {100 * kept:.1f}% of the attention")
        lines = [html.escape(run_caption(result), quote=False)]
        for line in diagnostics_lines(result):
            text = html.escape(line, quote=False)
            lines.append(f"<span style='color:{WARNING_COLOR}'>{text}</span>"
                         if line.startswith("⚠") else text)
        self._diagnostics.value = "<br>".join(lines)

    # ---- ROIs -------------------------------------------------------------------------------
    def _on_drawn_region(self, vertices: np.ndarray) -> None:
        try:
            self.add_roi(polygon=vertices)
        except ValueError as err:
            self._set_status(str(err), "warning")

    def _refresh_rois(self) -> None:
        self._render()
        self._update_roi_table()

    def _update_roi_table(self) -> None:
        from ..core.roi import ROI_COLUMNS

        n_rois = 0 if self._labels is None else len(np.unique(self._labels[self._labels > 0]))
        if n_rois == 0:
            self._roi_table.value = "<i>No ROIs: draw one on the image, or pass roi=mask.</i>"
            return
        try:
            rows = self.roi_table()
        except ValueError as err:
            self._roi_table.value = f"<i>{html.escape(str(err))}</i>"
            return
        if not rows:
            self._roi_table.value = f"<i>{n_rois} ROI(s); run the analysis to see their statistics.</i>"
            return
        head = "".join(f"<th>{html.escape(c)}</th>" for c in ROI_COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td>{_fmt(row[c])}</td>" for c in ROI_COLUMNS) + "</tr>" for row in rows)
        self._roi_table.value = (
            "<table class='attnreg-roi' style='border-collapse:collapse;font-size:90%'>"
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def _on_export(self, _button: Any) -> None:
        try:
            path = self.export_roi_csv(self._csv_path.value.strip() or "roi_table.csv")
        except (ValueError, OSError) as err:
            self._set_status(f"CSV not written: {err}", "error")
            return
        self._set_status(f"ROI table written to {path}", "success")

    # ---- controls ---------------------------------------------------------------------------
    def _set_status(self, message: str, level: str = "info") -> None:
        self.status = message
        colour = {"error": "#c62828", "warning": "#b26a00", "success": "#2e7d32"}.get(level, "inherit")
        self._status.value = f"<span style='color:{colour}'>{html.escape(message)}</span>"

    def _build_controls(self) -> None:
        W = widgets
        short = W.Layout(width="250px")
        style = {"description_width": "90px"}

        def link(widget: W.Widget, trait: str) -> W.Widget:
            W.link((self, trait), (widget, "value"))  # the state is the source of the first sync
            return widget

        self.controls: dict[str, W.Widget] = {
            "model": link(ModelPicker(description="model", layout=short, style=style), "model_name"),
            "method": link(W.Dropdown(options=list(NULL_METHODS), description="null method",
                                      layout=short, style=style), "method"),
            "n_boot": link(W.BoundedIntText(min=1, max=100_000, description="bootstrap B",
                                            layout=short, style=style), "n_boot"),
            "seed": link(W.IntText(description="seed", layout=short, style=style), "seed"),
            "device": link(W.Dropdown(options=_devices(self.device), description="device",
                                      layout=short, style=style), "device"),
            "overlay": link(W.Dropdown(options=list(OVERLAYS), description="overlay",
                                       layout=short, style=style), "overlay"),
            "colormap": link(W.Dropdown(options=[*COLORMAPS, *{self.colormap} - set(COLORMAPS)],
                                        description="colormap", layout=short, style=style), "colormap"),
            "opacity": link(W.FloatSlider(min=0, max=1, step=0.05, description="opacity",
                                          layout=short, style=style), "opacity"),
            "outline": link(W.Checkbox(description="outline significant", indent=False), "outline"),
            "preset": link(W.Dropdown(
                options=[(p, p) for p in PRESETS], description="statistics", layout=short,
                style=style, tooltip="Which question the statistics answer.\n" + "\n".join(
                    f"• {PRESET_HELP[p]}" for p in PRESETS)
                + "\nChanging it resets the thresholds; press Run to compute with it."), "preset"),
            "rule": link(W.Dropdown(options=[(RULE_LABELS[r], r) for r in RULES],
                                    description="rule", layout=short, style=style,
                                    tooltip="Which patches count as significant:\n" + "\n".join(
                                        f"• {RULE_HELP[r]}" for r in RULES)), "rule"),
            "q_th": link(W.FloatSlider(min=0, max=1, step=0.005, readout_format=".3f",
                                       description="q ≤", layout=short, style=style,
                                       tooltip="False discovery rate of rule 'q': 0.1 = about "
                                               "10% of the highlighted patches may be noise."),
                         "q_th"),
            "p_th": link(W.FloatSlider(min=0, max=1, step=0.005, readout_format=".3f",
                                       description="p ≤", layout=short, style=style,
                                       tooltip="Per-patch p-value threshold of rule 'p'."), "p_th"),
            "l_th": link(W.FloatSlider(min=0, max=1, step=0.01, description="lfdr ≤",
                                       layout=short, style=style,
                                       tooltip="Local fdr threshold of rule 'lfdr' "
                                               "(posterior = 1 − lfdr)."), "l_th"),
            # z_th may be None (no z mask): a checkbox and a slider, kept in step by hand
            "z_mask": W.Checkbox(description="z mask", indent=False,
                                 layout=W.Layout(width="80px"),
                                 tooltip="Also require z ≥ threshold (the paper's mask). Off: "
                                         "no z mask, the directional default."),
            "z_th": W.FloatSlider(min=-3, max=6, step=0.1, description="z ≥",
                                  layout=W.Layout(width="170px"), style={"description_width": "30px"},
                                  tooltip="Standardised log-attention threshold of the z mask."),
            "tiled": link(W.Checkbox(description=TILED_LABEL, indent=False,
                                     tooltip=TILING_HELP["tiled"]), "tiled"),
            "tile_overlap": link(W.BoundedIntText(min=0, max=TILE_OVERLAP_MAX, description="overlap px",
                                                  layout=short, style=style,
                                                  tooltip=TILING_HELP["tile_overlap"]), "tile_overlap"),
            "tile_scale": link(W.BoundedFloatText(min=TILE_SCALE_RANGE[0], max=TILE_SCALE_RANGE[1],
                                                  step=0.5, description="downsample ÷",
                                                  layout=short, style=style,
                                                  tooltip=TILING_HELP["tile_scale"]), "tile_scale"),
            "draw": link(W.ToggleButtons(options=list(DRAW_MODES), description="draw ROI",
                                         style={"description_width": "60px", "button_width": "84px"}),
                         "draw_mode"),
        }
        self._run_button = W.Button(description="Run", button_style="primary", icon="play",
                                    layout=W.Layout(width="120px"))
        self._cancel_button = W.Button(description="Cancel", icon="stop", disabled=True,
                                       layout=W.Layout(width="120px"))
        self._run_button.on_click(lambda _b: self.run())
        self._cancel_button.on_click(lambda _b: self.cancel())
        self._progress = W.FloatProgress(value=0.0, min=0.0, max=1.0, layout=W.Layout(width="190px"))
        self._progress_label = W.Label("")
        # CSS classes name the parts for front-end tests and for users' own styling
        self._status = W.HTML().add_class("attnreg-status")
        self._summary = W.HTML().add_class("attnreg-summary")
        self._roi_table = W.HTML().add_class("attnreg-roi-table")
        clear = W.Button(description="Clear ROIs", layout=W.Layout(width="120px"))
        clear.on_click(lambda _b: self.clear_rois())
        self._csv_path = W.Text(value="roi_table.csv", layout=W.Layout(width="150px"))
        export = W.Button(description="Export CSV", icon="download", layout=W.Layout(width="120px"))
        export.on_click(self._on_export)
        self._colorbar = W.Image(format="png", layout=W.Layout(width="200px", height="12px"))
        self._colorbar_lo, self._colorbar_hi, self._colorbar_label = W.Label(), W.Label(), W.Label()
        self._colorbar_box = W.HBox([self._colorbar_lo, self._colorbar, self._colorbar_hi,
                                     self._colorbar_label],
                                    layout=W.Layout(align_items="center"))
        self._legend = W.HTML(layout=W.Layout(max_width="560px")).add_class("attnreg-legend")
        self._diagnostics = W.HTML().add_class("attnreg-diagnostics")
        self.controls["z_th"].value = Z_TH_WHEN_ON if self.z_th is None else self.z_th
        self.controls["z_mask"].observe(self._on_z_controls, "value")
        self.controls["z_th"].observe(self._on_z_controls, "value")
        self._sync_z_controls()
        self._sync_run_controls()
        self._slice_box = W.HBox(layout=W.Layout(display="none"))
        self.buttons = {"run": self._run_button, "cancel": self._cancel_button, "clear": clear,
                        "export": export}
        if not self._view.can_draw:
            self.controls["draw"].disabled = True
            self.controls["draw"].tooltip = "Drawing needs ipympl; pass roi=mask instead."

        c = self.controls
        section = lambda text: W.HTML(f"<b>{text}</b>")
        panel = W.VBox([
            section("Run"), c["model"], c["preset"], c["method"], c["n_boot"], c["seed"],
            c["device"], c["tiled"], c["tile_overlap"], c["tile_scale"],
            W.HBox([self._run_button, self._cancel_button]),
            W.HBox([self._progress, self._progress_label]),
            section("Display"), c["overlay"], c["colormap"], c["opacity"], c["outline"],
            section("Thresholds (live)"), c["rule"], c["q_th"], c["p_th"], c["l_th"],
            W.HBox([c["z_mask"], c["z_th"]]),
            section("Regions of interest"), c["draw"], W.HBox([clear]),
            W.HBox([self._csv_path, export]),
        ], layout=W.Layout(margin="0 0 0 12px"))
        image_area = W.VBox([self._slice_box, self._view.widget, self._colorbar_box, self._legend])
        # flex-start: the tall control panel must not stretch the image column (a gap would
        # open between the canvas and its colorbar)
        top = W.HBox([image_area, panel], layout=W.Layout(align_items="flex-start"))
        self.children = (top, self._status, self._summary, self._diagnostics, self._roi_table)

    # ---- state observers --------------------------------------------------------------------
    @t.observe("overlay", "colormap", "opacity", "outline")
    def _display_changed(self, _change: dict) -> None:
        if hasattr(self, "_grid"):
            self._render()

    @t.observe("rule", *THRESHOLD_KEYS)
    def _thresholds_changed(self, _change: dict) -> None:
        if hasattr(self, "controls"):
            self._sync_z_controls()
        if hasattr(self, "_grid"):
            self._render()
            self._update_summary()
            self._update_roi_table()

    @t.observe("preset")
    def _preset_changed(self, change: dict) -> None:
        """The thresholds take the new preset's defaults (one re-render)."""
        with self.hold_trait_notifications():
            for key, value in default_thresholds(change["new"]).items():
                setattr(self, key, value)

    def _sync_z_controls(self) -> None:
        box, slider = self.controls["z_mask"], self.controls["z_th"]
        self._syncing_z = True
        try:
            box.value = self.z_th is not None
            if self.z_th is not None:
                slider.value = self.z_th
            slider.disabled = self.z_th is None
        finally:
            self._syncing_z = False

    def _on_z_controls(self, _change: dict) -> None:
        if getattr(self, "_syncing_z", False):
            return
        box, slider = self.controls["z_mask"], self.controls["z_th"]
        # the slider keeps its value while the mask is off, so ticking the box restores it
        self.z_th = float(slider.value) if box.value else None

    @t.validate("z_th")
    def _valid_z_th(self, proposal: dict) -> float | None:
        value = proposal["value"]
        if value is not None and not math.isfinite(value):
            raise t.TraitError(f"z_th must be a finite number or None (no z mask), got {value}.")
        return value

    @t.validate("overlay")
    def _valid_overlay(self, proposal: dict) -> str:
        return "pvalue" if proposal["value"] == "p" else proposal["value"]

    @t.validate("colormap")
    def _valid_colormap(self, proposal: dict) -> str:
        if proposal["value"] != "auto":
            render.colormap_lut(proposal["value"])
        return proposal["value"]

    @t.validate("p_th", "l_th")
    def _valid_fraction(self, proposal: dict) -> float:
        value = float(proposal["value"])
        if not 0.0 <= value <= 1.0:
            raise t.TraitError(f"{proposal['trait'].name} must be in [0, 1], got {value}.")
        return value

    @t.validate("n_boot")
    def _valid_n_boot(self, proposal: dict) -> int:
        if proposal["value"] < 1:
            raise t.TraitError(f"n_boot must be at least 1, got {proposal['value']}.")
        return proposal["value"]

    @t.observe("model_name")
    def _model_changed(self, change: dict) -> None:
        # free a model loaded by name; a model object the user passed cannot be reloaded, keep it
        if change["old"] != getattr(self, "_given_name", None):
            self._backbones.pop(change["old"], None)

    @t.validate("tile_scale")
    def _valid_tile_scale(self, proposal: dict) -> float:
        value = float(proposal["value"])
        lo, hi = TILE_SCALE_RANGE
        if not lo <= value <= hi:
            raise t.TraitError(f"tile_scale must be in [{lo:g}, {hi:g}] (1 = native pixels, "
                               f"2 = half size), got {value}.")
        return value

    @t.validate("tile_overlap")
    def _valid_tile_overlap(self, proposal: dict) -> int:
        value = proposal["value"]
        if not 0 <= value <= TILE_OVERLAP_MAX:
            raise t.TraitError(f"tile_overlap must be 0–{TILE_OVERLAP_MAX} pixels (a multiple of "
                               f"the patch size), got {value}.")
        return value

    @t.observe("running", "tiled")
    def _running_changed(self, _change: dict) -> None:
        if hasattr(self, "_run_button"):
            self._sync_run_controls()

    def _sync_run_controls(self) -> None:
        busy = self.running
        self._run_button.disabled = busy
        self._cancel_button.disabled = not busy
        for name in ("model", "preset", "method", "n_boot", "seed", "device", "tiled"):
            self.controls[name].disabled = busy
        for name in ("tile_overlap", "tile_scale"):
            self.controls[name].disabled = busy or not self.tiled

    @t.observe("draw_mode")
    def _draw_mode_changed(self, change: dict) -> None:
        try:
            self._view.set_draw_mode(change["new"])
        except ValueError as err:
            self._set_status(str(err), "warning")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.4g}"
    return html.escape(str(value))

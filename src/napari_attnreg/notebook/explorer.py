"""AttentionExplorer: the notebook twin of the napari widget, assembled from small panels.

The explorer's state lives in traitlets (:class:`~.state.ExplorerState`); each panel links
its controls to them, so a slider move and ``explorer.p_th = 0.05`` do the same thing.
Thresholds only re-render: nothing is recomputed. Runs go through the run panel (engine
steps in a worker thread, widget updates on the kernel's event loop); results are kept per
plane, under the plane they were computed for.

Example
-------
>>> from napari_attnreg.notebook import AttentionExplorer
>>> from napari_attnreg.samples import demo_image
>>> explorer = AttentionExplorer(demo_image(), model="demo", n_boot=100)   # doctest: +SKIP
>>> explorer                                # displays the widget; press Run  # doctest: +SKIP
>>> explorer.run(wait=True).summary()       # or run from code              # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import ipywidgets as W
import numpy as np

from napari_attnreg.core.models.backbones import Backbone
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.service import Outcome, user_message
from napari_attnreg.core.stats.presets import DEFAULT_PRESET
from napari_attnreg.notebook import render
from napari_attnreg.notebook.api import ExplorerApi
from napari_attnreg.notebook.canvas import OverlayCanvas, make_view
from napari_attnreg.notebook.display_panel import DisplayPanel
from napari_attnreg.notebook.image_panel import ImagePanel, check_max_display
from napari_attnreg.notebook.options_panel import OptionsPanel
from napari_attnreg.notebook.pipeline import (
    check_arguments,
    check_run_options,
    given_model,
    make_job,
    model_spec,
)
from napari_attnreg.notebook.roi_panel import RoiPanel
from napari_attnreg.notebook.run_panel import RunPanel
from napari_attnreg.notebook.state import RUN_DEFAULTS
from napari_attnreg.notebook.summary_panel import SummaryPanel, done_text
from napari_attnreg.notebook.thresholds_panel import ThresholdsPanel

#: Default of the threshold arguments: take the preset's value (``z_th=None`` is "no z mask").
FROM_PRESET = "from preset"


def _section(title: str) -> W.HTML:
    return W.HTML(f"<b>{title}</b>")


class AttentionExplorer(ExplorerApi):
    """Interactive attention regularization for one image in Jupyter.

    Parameters
    ----------
    image : array-like
        2D grayscale, RGB(A) ``(H, W, 3|4)``, any dtype (16-bit and float are percentile
        scaled). nD stacks ``(..., H, W)`` (or ``(..., H, W, 3)``) get one slider per
        leading axis to choose the plane that is analysed.
    model : str or Backbone or nn.Module
        ``"demo"`` (bundled), a catalogue id, a timm name, a weights file (with ``arch``) or
        a loaded model.
    arch : str, optional
        timm architecture of a weights file.
    preset : {"stepdown", "directional", "paper"}
        ``"stepdown"`` (default): does the attention concentrate on anything more than on
        the image's own half-patch blocks shuffled, and where? ``"directional"``: is a
        patch's attention *higher* than noise gives? ``"paper"``: the published two-sided
        procedure. Changing it resets the thresholds and the null method.
    method, n_boot, seed, device
        Bootstrap null method (None: the preset's), number of null images, seed, compute
        device (one that exists
        here: ``auto``, ``cpu``, ``cuda``, ``mps``).
    tiled, tile_overlap, tile_scale
        Tiled run at native resolution (docs/scale-out.md), for images much larger than the
        model input.
    rule, q_th, p_th, l_th, z_th
        Regularization rule and thresholds (docs/method.md); left out, the preset's
        defaults; ``z_th=None`` applies no z mask. Changing them re-renders only.
    overlay : {"regularized", "attention", "posterior", "pvalue", "none"}
    colormap : str
        ``"auto"`` (each map its own) or a matplotlib colormap name.
    opacity : float
    outline : bool
        Outline the patches kept by the rule.
    roi : array, optional
        Boolean mask or integer labels ``(H, W)`` of regions for the ROI table.
    channel_axis : int, optional
        Channel axis of multichannel data.
    rgb : bool, optional
        Whether a trailing axis of length 3/4 is colour (default: guess so).
    view : {"auto", "ipympl", "image"}
        ``"ipympl"`` draws ROIs with the mouse; ``"image"`` is a plain PNG.
    width : int
        Width of the image area in pixels.
    max_display : int
        Long side, in pixels, of the rendered image (large images are subsampled for display).
    name : str, optional
        Name of the image in exported tables (their provenance columns).
    **run_options
        Any other :class:`~napari_attnreg.core.run.engine.RunConfig` field.

    Attributes
    ----------
    result : AttentionResult or None
        The latest finished run, carrying the thresholds currently set in the widget.
    """

    def __init__(self, image: Any, model: str | Backbone | Any = "demo", *,
                 arch: str | None = None, preset: str = DEFAULT_PRESET, method: str | None = None,
                 n_boot: int = 200, seed: int = 0, device: str = "auto",
                 tiled: bool = RUN_DEFAULTS.tiled, tile_overlap: int = RUN_DEFAULTS.tile_overlap,
                 tile_scale: float = RUN_DEFAULTS.tile_scale, rule: str = FROM_PRESET,
                 q_th: float | str = FROM_PRESET, p_th: float | str = FROM_PRESET,
                 l_th: float | str = FROM_PRESET, z_th: float | None | str = FROM_PRESET,
                 overlay: str = "regularized", colormap: str = "auto", opacity: float = 0.6,
                 outline: bool = True, roi: np.ndarray | None = None,
                 channel_axis: int | None = None, rgb: bool | None = None, view: str = "auto",
                 width: int = 560, max_display: int = 768, name: str | None = None,
                 **run_options: Any) -> None:
        super().__init__()
        self._parts: list[Any] = []  # closed by close(), also after a failed construction
        self._run_options = check_run_options(run_options)
        given = {"rule": rule, "q_th": q_th, "p_th": p_th, "l_th": l_th, "z_th": z_th}
        named = check_arguments({  # refused with the core's words, never rounded
            "preset": preset, "method": method, "n_boot": n_boot, "seed": seed,
            "device": device, "tiled": tiled, "tile_overlap": tile_overlap,
            "tile_scale": tile_scale, **{key: value for key, value in given.items()
                                         if not (isinstance(value, str) and value == FROM_PRESET)}},
            opacity=opacity)
        check_max_display(max_display)
        if colormap != "auto":
            render.colormap_lut(colormap)  # unknown names fail here, not at the first render
        self._arch = arch
        self._given = None if isinstance(model, str) else given_model(model)
        model_name = model if self._given is None else self._given.name
        self._image_name = name
        self._results: dict[tuple[int, ...], AttentionResult] = {}
        self._latest: tuple[int, ...] | None = None
        self._pending: tuple | None = None  # (plane, image generation, pixel fingerprint)
        self._generation = 0
        self.last_error: BaseException | None = None

        self.preset = named.pop("preset")  # first: its observer resets the given thresholds
        with self.hold_trait_notifications():
            self.model_name = model_name
            if named["method"] is None:  # None: the preset's null method
                del named["method"]
            for key, value in named.items():
                setattr(self, key, value)
            self.overlay, self.colormap = overlay, colormap
            self.outline = bool(outline)

        self._build(make_view(view, width), max_display, width)
        if self._load_image(image, channel_axis=channel_axis, rgb=rgb) and roi is not None:
            self.set_roi(roi)
        self._show_result()

    def _build(self, view: Any, max_display: int, width: int) -> None:
        self.image_panel = ImagePanel(self, max_display=max_display,
                                      run_options=self._run_options)
        self.options_panel = OptionsPanel(self, self._run_options)
        self.thresholds_panel = ThresholdsPanel(self)
        self.display_panel = DisplayPanel(self)
        self.run_panel = RunPanel(self, self.run, self._on_finish)
        self.roi_panel = RoiPanel(self, self._rois_changed, self._export_from_button)
        self.summary_panel = SummaryPanel()
        self.canvas = OverlayCanvas(self, view, self.image_panel, self.display_panel)
        self.canvas.roi_labels = lambda: self.roi_panel.labels
        view.on_region = self._on_drawn_region
        self._parts = [self.run_panel, view]
        self.controls: dict[str, W.Widget] = {
            **self.options_panel.controls, **self.display_panel.controls,
            **self.thresholds_panel.controls, "draw": self.roi_panel.draw}
        self.buttons = {"run": self.run_panel.run_button, "cancel": self.run_panel.cancel_button,
                        "clear": self.roi_panel.clear, "export": self.roi_panel.export}
        if not view.can_draw:
            self.controls["draw"].disabled = True
            self.controls["draw"].tooltip = "Drawing needs ipympl; pass roi=mask instead."
        side = W.VBox([_section("Run"), self.options_panel, self.run_panel,
                       _section("Display"), self.display_panel,
                       _section("Regions of interest"), self.roi_panel],
                      layout=W.Layout(margin="0 0 0 12px", min_width="380px"))
        # the live thresholds sit under the image they change
        # never narrower than the image (+ ipympl's toolbar): the side panel gives way instead
        image_area = W.VBox([self.image_panel, view.widget, self.display_panel.under_image,
                             _section("Thresholds (live)"), self.thresholds_panel],
                            layout=W.Layout(flex="0 0 auto", min_width=f"{width + 48}px"))
        # flex-start: the tall side panel must not stretch the image column
        top = W.HBox([image_area, side], layout=W.Layout(align_items="flex-start"))
        self.children = (top, self.run_panel.status, self.summary_panel,
                         self.roi_panel.table)

    # ---- runs ---------------------------------------------------------------------------
    def run(self, *, wait: bool = False) -> AttentionResult | None:
        """Start a run with the current settings (what the Run button does).

        Parameters
        ----------
        wait : bool
            Block until the run ends and return its result (None if it failed or was
            cancelled; the status line says why). Without ``wait``, inside a kernel the
            run continues in the background and :attr:`result` is set when it finishes.
        """
        if self.run_panel.busy:
            self._set_status("A run is already in progress; cancel it first.", "warning")
            return None
        if self.image_panel.stack is None:
            self._set_status("No usable image: give the explorer a 2D image first "
                             "(explorer.set_image(...)).", "error")
            return None
        plane_key = tuple(self.slice_index)
        model = model_spec(self.model_name, arch=self._arch, given=self._given)
        try:
            job = make_job(self, model, self.image_panel.stack, plane_key,
                           self.options_panel.advanced.values(), self.run_panel.next_task_id())
        except ValueError as err:
            self._fail(err)
            return None
        self._pending = (plane_key, self._generation, self._fingerprint(plane_key))
        where = f" on plane {plane_key}" if plane_key else ""
        tiled = ", tiled" if self.tiled else ""
        outcome = self.run_panel.start(job, wait=wait, message=(
            f"Starting{where}: {model.label()}, {self.preset}, {self.method}, "
            f"B={self.n_boot}{tiled} …"))
        if outcome is None:  # continues on the event loop
            return None
        kept = self._results.get(plane_key)  # None when dropped (e.g. pixels edited meanwhile)
        return kept if outcome.ok and kept is outcome.results.get(plane_key) else None

    def _on_finish(self, outcome: Outcome) -> None:
        pending, self._pending = self._pending, None
        if pending is None or outcome.task_id != self.run_panel.task_id:
            return  # a stale task: its result belongs to nothing on screen
        plane_key, generation, fingerprint = pending
        result = outcome.results.get(plane_key)
        if outcome.status == "cancelled":
            kept = " The previous result is still shown." if self._latest is not None else ""
            self._set_status(outcome.message + kept, "warning")
        elif result is None:
            self._fail(outcome.error, outcome.message)
        elif generation != self._generation or fingerprint != self._fingerprint(plane_key):
            self._set_status("The image changed during the run; its result was dropped. "
                             "Press Run again.", "warning")
        else:
            self._results[plane_key], self._latest = result, plane_key
            self.last_error = None
            self._set_status(*done_text(result, plane_key, tuple(self.slice_index)))
            self._show_result()

    def _fail(self, err: BaseException | None, message: str | None = None) -> None:
        self.last_error = err
        message = message or (user_message(err) if err is not None else "The run failed.")
        kept = " The previous result is kept." if self._latest is not None else ""
        self._set_status(message + kept, "error")

    def _set_status(self, message: str, level: str = "info") -> None:
        self.run_panel.set_status(message, level)

"""AttentionExplorer: the notebook twin of the napari widget, assembled from small parts.

The explorer holds, rather than is, its parts: the controls' traits
(:class:`~.state.ExplorerState`, also readable and settable as ``explorer.q_th``), the
session model (:class:`~napari_attnreg.session.Session`: settings, the result of each plane
with the thresholds chosen for it, the selected one), the panels, and
:class:`~.result_display.ResultDisplay`, which shows the selected result. A slider move and
``explorer.p_th = 0.05`` do the same thing: they change the thresholds of the result on
screen, and only re-render. Runs go through the run panel (engine steps in a worker thread,
widget updates on the kernel's event loop); results are kept per plane.

Example
-------
>>> from napari_attnreg.notebook import AttentionExplorer
>>> from napari_attnreg.samples import demo_image
>>> explorer = AttentionExplorer(demo_image(), model="demo", n_boot=100)   # doctest: +SKIP
>>> explorer                                # displays the widget; press Run  # doctest: +SKIP
>>> explorer.run(wait=True).summary()       # or run from code              # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as W
import numpy as np

from napari_attnreg.core.files import atomic_write
from napari_attnreg.core.models.backbones import Backbone
from napari_attnreg.core.results.display import MAPS_BY_KEY
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.thresholds import Thresholds
from napari_attnreg.core.stats.presets import DEFAULT_PRESET
from napari_attnreg.io.export import provenance, write_table_csv
from napari_attnreg.notebook import render
from napari_attnreg.notebook.canvas import OverlayCanvas, make_view
from napari_attnreg.notebook.concept_roi import ConceptPanel
from napari_attnreg.notebook.display_panel import DisplayPanel
from napari_attnreg.notebook.export_panel import (
    FIGURE_NAME,
    RESULT_NAME,
    ExportPanel,
    new_file,
    output_path,
)
from napari_attnreg.notebook.image_panel import ImagePanel, check_max_display
from napari_attnreg.notebook.options_panel import OptionsPanel
from napari_attnreg.notebook.pipeline import (
    check_arguments,
    check_run_options,
    given_model,
    model_spec,
)
from napari_attnreg.notebook.plane_runs import PlaneRuns
from napari_attnreg.notebook.regions import (
    check_on_picture,
    full_resolution,
    rectangle_vertices,
    region_mask,
)
from napari_attnreg.notebook.render import ROI_COLOR
from napari_attnreg.notebook.result_display import ResultDisplay
from napari_attnreg.notebook.roi_panel import NO_ROIS, NO_SLIDE_ROIS, RoiPanel
from napari_attnreg.notebook.run_panel import RunPanel
from napari_attnreg.notebook.session_link import SessionLink
from napari_attnreg.notebook.state import RUN_DEFAULTS, ExplorerState, StateTrait
from napari_attnreg.notebook.summary_panel import SummaryPanel
from napari_attnreg.notebook.thresholds_panel import ThresholdsPanel
from napari_attnreg.session import ResultEntry, Session

#: Default of the threshold arguments: take the preset's value (``z_th=None`` is "no z mask").
FROM_PRESET = "from preset"
#: Why the draw buttons are off in a plain-image view.
NO_DRAWING = "Drawing needs ipympl; pass roi=mask instead."
#: Why 'Concept from ROI' takes no regions on a slide.
NO_CONCEPT_ON_DISK = ("'Concept from ROI' reads the pixels inside the regions, so it needs an "
                      "image held in memory; this one stays on disk (a slide, shown from its "
                      "overview). Give the explorer one level in memory: "
                      "open_slide(path, level=2).read_whole().")
#: Why a slide's regions are not given as a mask.
NO_MASK_ON_SLIDE = ("A slide's regions are shapes on its picture, not a mask as large as the "
                    "slide: give add_roi(rectangle=(row0, col0, row1, col1)) or "
                    "add_roi(polygon=[(row, col), ...]) in the picture's pixels "
                    "(explorer.image_panel.plane_shape), or draw them.")


#: The ROI table's file inside a folder given (and the CSV box's first value).
ROI_TABLE_NAME = "roi_table.csv"

#: The side panel's narrowest width (its controls are 360 px), and its basis in a row.
SIDE_WIDTH = "380px"


def _plane_hint(source: Any, lead: tuple[int, ...]) -> str:
    """What to do with a stack; an array's short leading axis may be channels the caller
    did not name (``regularize`` refuses such an array as ambiguous; here each channel
    would be analysed alone, as a plane)."""
    hint = "nD image: choose the plane to analyse with the slider(s), then Run."
    stack = source.stack
    if stack is None or source.path is not None or stack.channel_axis is not None:
        return hint  # a file states its channels; a slide has no stack
    short = [axis for axis, n in zip(stack.stack_axes, lead) if 2 <= n <= 4]
    if not short:
        return hint
    return (f"{hint} If axis {short[0]} (length {stack.data.shape[short[0]]}) holds channels, "
            f"give channel_axis={short[0]} (AttentionExplorer(..., channel_axis={short[0]}) or "
            f"set_image(..., channel_axis={short[0]})) to analyse them together.")


def _section(title: str) -> W.HTML:
    return W.HTML(f"<b>{title}</b>")


class AttentionExplorer(W.VBox):
    """Interactive attention regularization for one image in Jupyter.

    Parameters
    ----------
    image : array-like, str, Path or LazyImage
        2D grayscale, RGB(A) ``(H, W, 3|4)``, any dtype (16-bit and float are percentile
        scaled). nD stacks ``(..., H, W)`` (or ``(..., H, W, 3)``) get one slider per
        leading axis to choose the plane that is analysed. Or the path of any image file
        ``attnreg run`` reads (a run opens it as the command line does and records what it
        says, pixel size included), or an opened slide
        (:func:`~napari_attnreg.io.slides.open_slide`). A slide is shown from its overview
        and never read whole for display; a run reads it at the *Slide level* / *Slide
        resolution* of the Advanced options (an opened slide: at the level it was opened
        at), tile by tile when tiled, with the automatic *Tissue mask* by default.
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
        Boolean mask or integer labels ``(H, W)`` of regions for the ROI table (an image in
        memory; a slide takes shapes: :meth:`add_roi`).
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
        The latest finished run, carrying the thresholds chosen for it.
    state : ExplorerState
        The controls' traits; each is also an attribute of the explorer
        (``explorer.q_th = 0.05`` moves the slider).
    session : Session
        Run settings, the result of each plane with its own thresholds, and the selected
        one (the plane on screen); see :mod:`napari_attnreg.session`.
    """


    # the state's traits under their public names (explorer.preset = "paper", ...)
    model_name = StateTrait()
    method = StateTrait()
    n_boot = StateTrait()
    seed = StateTrait()
    device = StateTrait()
    tiled = StateTrait()
    tile_overlap = StateTrait()
    tile_scale = StateTrait()
    preset = StateTrait()
    rule = StateTrait()
    q_th = StateTrait()
    p_th = StateTrait()
    l_th = StateTrait()
    z_th = StateTrait()
    overlay = StateTrait()
    colormap = StateTrait()
    opacity = StateTrait()
    outline = StateTrait()
    draw_mode = StateTrait()
    slice_index = StateTrait()
    running = StateTrait()
    status = StateTrait()

    def __init__(self, image: Any, model: str | Backbone | Any = "demo", *,
                 arch: str | None = None, preset: str = DEFAULT_PRESET, method: str | None = None,
                 n_boot: int = RUN_DEFAULTS.n_boot, seed: int = RUN_DEFAULTS.seed,
                 device: str = RUN_DEFAULTS.device,
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
        self._image_name = name
        self.state = ExplorerState()
        self.session = Session()
        self.link = SessionLink(self.state, self.session)
        thresholds = {key: named.pop(key) for key in given if key in named}
        self._set_traits(model if self._given is None else self._given.name,
                         named.pop("preset"), named.pop("method"),
                         {**named, "overlay": overlay, "colormap": colormap,
                          "opacity": float(opacity), "outline": bool(outline)}, thresholds)
        self._build(make_view(view, width), max_display, width)
        self.state.observe(self._slice_changed, names=["slice_index"])
        self.state.observe(self._draw_mode_changed, names=["draw_mode"])
        if self._load_image(image, channel_axis=channel_axis, rgb=rgb) and roi is not None:
            self.set_roi(roi)
        self.display.show()

    def _set_traits(self, model_name: str, preset: str, method: str | None,
                    values: dict[str, Any], thresholds: dict[str, Any]) -> None:
        self.state.preset = preset  # first: a new preset brings its thresholds and null method
        with self.state.hold_trait_notifications():
            self.state.model_name = model_name
            if method is not None:  # None: the preset's null method
                self.state.method = method
            for key, value in values.items():
                setattr(self.state, key, value)
            for key, value in thresholds.items():
                if not (isinstance(value, str) and value == FROM_PRESET):
                    setattr(self.state, key, value)

    def _build(self, view: Any, max_display: int, width: int) -> None:
        state = self.state
        self.image_panel = ImagePanel(state, max_display=max_display,
                                      run_options=self._run_options)
        self.options_panel = OptionsPanel(state, self._run_options,
                                          lambda message: self._set_status(message, "error"))
        self.concept_panel = ConceptPanel(self.options_panel.advanced, self.session,
                                          self._concept_source, self._load_model)
        self.options_panel.advanced.place_after("target", self.concept_panel)
        self.thresholds_panel = ThresholdsPanel(state)
        self.display_panel = DisplayPanel(state)
        self.run_panel = RunPanel(state, self.run, lambda outcome: self.runs.finish(outcome))
        self.roi_panel = RoiPanel(state, self._rois_changed, self._export_from_button,
                                  self._geojson_from_button)
        self.summary_panel = SummaryPanel()
        self.export_panel = ExportPanel(self._save_from_button, self._figure_from_button)
        self.canvas = OverlayCanvas(state, view, self.image_panel, self.display_panel)
        self.canvas.roi_labels = self.roi_panel.on_grid
        self.display = ResultDisplay(self.session, state, self.canvas, self.summary_panel,
                                     self.roi_panel)
        self.runs = PlaneRuns(state, self.session, self.image_panel, self.run_panel,
                              self.options_panel.advanced.values,
                              lambda: model_spec(state.model_name, arch=self._arch,
                                                 given=self._given))
        # the run reads the session (as napari's does): an option set there in code shows in
        # its control, so Run, which pushes the panel to the session, keeps it
        self.session.events.settings_changed.connect(self._show_settings_from_code)
        view.on_region = self._on_drawn_region
        self._parts = [self.run_panel, view]
        self.controls: dict[str, W.Widget] = {
            **self.options_panel.controls, **self.display_panel.controls,
            **self.thresholds_panel.controls, "draw": self.roi_panel.draw}
        self.buttons = {"run": self.run_panel.run_button, "cancel": self.run_panel.cancel_button,
                        "clear": self.roi_panel.clear, "export": self.roi_panel.export,
                        "geojson": self.roi_panel.geojson, "save": self.export_panel.save,
                        "figure": self.export_panel.figure}
        self.roi_panel.allow(view.can_draw, NO_DRAWING, None)
        side = W.VBox([_section("Run"), self.options_panel, self.run_panel,
                       _section("Display"), self.display_panel,
                       _section("Regions of interest"), self.roi_panel,
                       _section("Save and export"), self.export_panel],
                      # wrapping goes by its basis, not by its longest line of text (the
                      # model's description), which stood it under the image at any width
                      layout=W.Layout(margin="0 0 0 12px", min_width=SIDE_WIDTH,
                                      flex=f"1 1 {SIDE_WIDTH}"))
        # the live thresholds sit under the image they change
        # never narrower than the image (+ ipympl's toolbar): the side panel gives way instead
        # a stack's sliders (360 px each) wrap inside the image's width: side by side, two of
        # them widened the image column past the page and pushed Run under the image
        self.image_panel.layout.flex_flow = "row wrap"
        self.image_panel.layout.max_width = f"{width + 48}px"
        image_area = W.VBox([self.image_panel, view.widget, self.display_panel.under_image,
                             _section("Thresholds (live)"), self.thresholds_panel],
                            layout=W.Layout(flex="0 0 auto", min_width=f"{width + 48}px"))
        # flex-start: the tall side panel must not stretch the image column; wrap: where the
        # output is narrower than both columns (JupyterLab at 1280 px with its file browser
        # open gives 848 px for 1000), the side panel goes under the image instead of being
        # cut at the right edge, Run, Export and the options' boxes out of sight
        top = W.HBox([image_area, side], layout=W.Layout(align_items="flex-start",
                                                         flex_flow="row wrap"))
        self.children = (top, self.run_panel.status, self.summary_panel,
                         self.roi_panel.table)

    # ---- results ----------------------------------------------------------------------------
    @property
    def result(self) -> AttentionResult | None:
        """The latest result, applying the thresholds chosen for it."""
        latest = self.session.latest
        return None if latest is None else latest.shown()

    @property
    def rendered(self) -> np.ndarray | None:
        """The ``(h, w, 3)`` uint8 image the view shows (image, overlay and outlines)."""
        return self.canvas.rendered if self._parts else None

    def thresholds(self) -> Thresholds:
        """The thresholds shown: the result on screen's, else those the next run starts with."""
        return self.session.thresholds()

    def _current_result(self) -> AttentionResult | None:
        """The result computed for the plane on screen, if any (as the run returned it)."""
        entry = self.session.selected
        return None if entry is None else entry.any_result

    def save(self, path: str | Path) -> Path:
        """Save :attr:`result` (with its thresholds) as ``.npz``; returns the path written:
        ``.npz`` added to another ending, ``result.attnreg.npz`` inside a folder given (the
        Save result button saves the result on screen and never overwrites a file)."""
        result = self.result
        if result is None:
            raise ValueError("Nothing to save yet: press Run (or call run()) first.")
        return result.save(output_path(path, (".npz",), RESULT_NAME, case_sensitive=True))

    def open_result(self, path: str | Path) -> AttentionResult:
        """Show a saved result (:meth:`save`, ``attnreg run``'s ``.attnreg.npz``) over the
        image on screen, as if it had been run here: its thresholds move the sliders, the ROI
        table and the exports read it. The image must be the one it was made from (same
        size); a bad file or another image keeps what is shown and says why. A stack's
        result goes to the plane it was made from (the sliders move there).

        Raises
        ------
        ValueError
            Unreadable file, no image, another image's size, a plane the stack does not
            have, a slide, or a run going on.
        """
        if self.run_panel.busy:
            raise ValueError("Cannot open a result during a run; cancel it first.")
        source = self.image_panel.source
        if source is None:
            raise ValueError("Give the explorer the image the result was made from first "
                             "(AttentionExplorer(image) or set_image(image)).")
        if source.stack is None:
            raise ValueError("A slide's result reopens in napari (drop the .attnreg.npz on "
                             "the viewer with the slide open) or with AttentionResult.load.")
        result = AttentionResult.load(path)
        if tuple(result.image_shape) != tuple(self.image_panel.plane_shape):
            raise ValueError(
                f"{Path(path).name} was made from a {result.image_shape[0]}×"
                f"{result.image_shape[1]} image; the one on screen is "
                f"{self.image_panel.plane_shape[0]}×{self.image_panel.plane_shape[1]}. Show "
                "the image it was made from (set_image), then open it again.")
        plane = self._saved_plane(result, Path(path).name)
        if plane != tuple(self.state.slice_index):
            self.state.slice_index = plane  # the sliders go to the plane it was made from
        self.runs.generation += 1  # a run still reporting would replace it with older work
        # the file's own thresholds, not the replaced result's: they are what it was saved at
        self.session.add(plane, {plane: result}, params={"opened": str(path)},
                         thresholds=Thresholds.of(result))
        self.session.select(plane)
        self.runs.last_error = None
        # the Statistics dropdown kept the next run's preset while the thresholds offered
        # the file's rules: it shows the preset that made the result, as after a run here
        note = self.session.show_preset_of(plane)
        self._set_status(f"Opened {Path(path).name} (saved result; thresholds as saved)."
                         + (f" {note}" if note else ""), "success")
        return self.result

    def _saved_plane(self, result: AttentionResult, name: str) -> tuple[int, ...]:
        """The plane of the stack on screen a saved result was made from (its ``slice``, or
        the ``plane`` that napari, ``regularize_stack`` and the command line record), else
        the plane on screen (a 2D image's result, or a file that does not say).

        Raises
        ------
        ValueError
            A plane this stack does not have: it belongs to another stack.
        """
        on_screen = tuple(self.state.slice_index)
        saved = _plane_of(result.metadata)
        stack = tuple(self.image_panel.source.stack_shape)
        if saved is None or not stack:
            return on_screen
        plane = saved
        if len(plane) != len(stack) or not all(0 <= i < n for i, n in zip(plane, stack)):
            raise ValueError(f"{name} is the result of plane {plane}, which this stack "
                             f"({' × '.join(map(str, stack))} planes) does not have. Show the "
                             "stack it was made from (set_image), then open it again.")
        return plane

    def export_figure(self, path: str | Path, *, map_key: str = "regularized",
                      scale: int | None = None) -> Path:
        """Write the publication figure of :attr:`result` (PNG), the figure napari's Export
        figure writes (:func:`~napari_attnreg.core.results.figure.publication_figure`), over
        the plane it was computed from; returns the path written, ``.png`` added to another
        ending, ``figure.png`` inside a folder given."""
        entry = self.session.latest
        if entry is None:
            raise ValueError("Nothing to draw yet: press Run (or call run()) first.")
        # PNG bytes under cells.tif replaced the image: the ending is added
        return self._write_figure(entry, output_path(path, (".png",), FIGURE_NAME),
                                  map_key, scale)

    def _write_figure(self, entry: ResultEntry, path: Path, map_key: str,
                      scale: int | None) -> Path:
        from napari_attnreg.core.results.figure import publication_figure

        # the entry's own plane: the latest result of a stack drawn over the plane on
        # screen put plane 1's map over plane 2's pixels
        result, image = self._figure_image(entry.shown(), tuple(entry.key))
        return publication_figure(result, image, path, map_key=map_key, scale=scale)

    def _figure_image(self, result: AttentionResult,
                      plane: tuple[int, ...]) -> tuple[AttentionResult, np.ndarray]:
        """The image under a figure of ``plane``: at the resolution analysed, as napari's
        figure (a slide level read again from its file); above the untiled pixel budget, the
        overview under the result brought to its size, as the command line's figure."""
        panel = self.image_panel
        pixels = panel.source.figure_pixels(result, plane)
        if pixels is None:
            from napari_attnreg.batch.figure import FIGURE_MAX_SIDE, figure_view

            overview = panel.source.display_pixels(plane, FIGURE_MAX_SIDE ** 2)
            return figure_view(result, panel.display_image(*overview))
        h, w = result.image_shape  # a tiled run of a file read on demand: whole patches only
        return result, panel.display_image(*pixels)[:h, :w]

    def export_geojson(self, path: str | Path) -> Path:
        """Write :attr:`result`'s significant regions as GeoJSON polygons in image pixels
        (QuPath opens them; :mod:`napari_attnreg.io.geojson`)."""
        from napari_attnreg.io.geojson import GEOJSON_SUFFIXES, write_geojson

        result = self.result
        if result is None:
            raise ValueError("Nothing to export yet: press Run (or call run()) first.")
        # a folder gets a name inside it, as every export's (it wrote 'folder.geojson')
        return write_geojson(output_path(path, GEOJSON_SUFFIXES, "significant.geojson"),
                             result)

    def _show_settings_from_code(self, changes: dict[str, Any]) -> None:
        note = self.session.preset_note() if "preset" in changes else None
        if note:  # the dropdown moved away from the result on screen: for the next run only
            self._set_status(note, "info")
        if self.runs.pushing:
            return
        advanced = self.options_panel.advanced
        for name, value in changes.items():
            if name in advanced.controls and value is not None:
                advanced.show_setting(name, value)

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
        return self.runs.start(wait=wait)

    @property
    def last_error(self) -> BaseException | None:
        """Why the last run (or the last image) failed; None after a successful run."""
        return self.runs.last_error

    def cancel(self) -> None:
        """Stop the current run after the chunk being computed (what Cancel does)."""
        self.run_panel.cancel()

    async def wait(self) -> AttentionResult | None:
        """Await the background run (``await explorer.wait()`` in a notebook cell)."""
        task: asyncio.Task | None = self.run_panel.runner.task
        if task is not None and not task.done():
            await task
        return self.result

    def _set_status(self, message: str, level: str = "info") -> None:
        self.run_panel.set_status(message, level)

    # ---- the image and the plane on screen ------------------------------------------------
    def set_image(self, image: Any, *, channel_axis: int | None = None,
                  rgb: bool | None = None, name: str | None = None) -> None:
        """Show another image (an array, a file's path or an opened slide, as the
        constructor takes), named ``name`` in exported tables (default: its path, or its
        shape for an array). A bad one keeps the current image and says why in the status."""
        if self.run_panel.busy:
            self._set_status("Cannot change the image during a run; cancel it first.", "warning")
            return
        if self._load_image(image, channel_axis=channel_axis, rgb=rgb):
            # the constructor's name was the first image's: every later table of a loop
            # over files said it came from that one
            self._image_name = name
            self.display.show()

    def _load_image(self, image: Any, *, channel_axis: int | None, rgb: bool | None) -> bool:
        try:
            lead = self.image_panel.load(image, channel_axis=channel_axis, rgb=rgb)
        except ValueError as err:
            self.runs.last_error = err
            self._set_status(str(err), "error")
            self.run_panel.set_ready(self.image_panel.source is not None)  # a previous one stays
            return False
        self.runs.generation += 1  # a result of the previous image is dropped
        self.run_panel.set_ready(True)
        source = self.image_panel.source
        # the old image's regions go first: clearing the session redraws the canvas on the
        # new image, where a label image of the old one's size does not fit
        self.roi_panel.reset(source.downsample if source.stack is None else None)
        self.session.clear()  # results of the previous image belong to its pixels only
        self._allow_drawing()
        self._set_status(_plane_hint(source, lead) if lead else "Ready: press Run.", "info")
        return True

    def _plane_shape(self) -> tuple[int, int]:
        source = self.image_panel.source
        if source is None:
            raise ValueError("There is no usable image to draw regions on; give the explorer "
                             "an image first (explorer.set_image(...)).")
        return self.image_panel.plane_shape

    def _allow_drawing(self) -> None:
        self.roi_panel.allow(self.canvas.view.can_draw, NO_DRAWING, None)

    def _select_plane_on_screen(self) -> None:
        plane = tuple(self.state.slice_index)
        self.session.select(plane if plane in self.session else None)

    def _slice_changed(self, _change: dict) -> None:
        if not self._parts or self.image_panel.source is None:
            return
        try:
            self.image_panel.show_plane()
        except ValueError as err:  # e.g. an empty (constant) plane: say so, keep the last view
            self._set_status(f"Plane {tuple(self.state.slice_index)}: {err}", "error")
            return
        latest = self.session.latest
        if latest is not None and tuple(self.state.slice_index) not in self.session:
            self._set_status(f"The result is for plane {latest.key}; press Run to analyse "
                             f"plane {tuple(self.state.slice_index)}.", "info")
        self._select_plane_on_screen()
        self.display.show()  # the new plane's pixels, even when the selection stays

    def _draw_mode_changed(self, change: dict) -> None:
        try:
            self.canvas.view.set_draw_mode(change["new"])
        except ValueError as err:
            self._set_status(str(err), "warning")

    # ---- regions of interest --------------------------------------------------------------
    def _concept_source(self) -> tuple[np.ndarray, int | None, np.ndarray | None]:
        """The plane on screen, its channel axis and the drawn regions ('Concept from ROI')."""
        self._plane_shape()  # a ValueError without a usable image
        if self.image_panel.source.stack is None:
            raise ValueError(NO_CONCEPT_ON_DISK)
        image, channel_axis = self.image_panel.source.stack.read(tuple(self.state.slice_index))
        return image, channel_axis, self.roi_panel.labels

    def _load_model(self) -> Any:
        from napari_attnreg.core.run.service import load_model

        return load_model(model_spec(self.state.model_name, arch=self._arch, given=self._given))

    @property
    def roi_labels(self) -> np.ndarray | None:
        """Integer ROI labels on the current plane (0 = background), or None; on a slide,
        on the pixels of the result on screen (None before a run)."""
        panel = self.roi_panel
        if panel.on_slide:
            result = self.session.shown()
            return None if result is None or not panel.polygons else panel.labels_for(result).copy()
        return None if panel.labels is None else panel.labels.copy()

    def set_roi(self, roi: np.ndarray | None) -> None:
        """Replace the ROIs by a boolean mask or integer labels on the image plane (None
        clears). A slide takes shapes instead (:meth:`add_roi`)."""
        if roi is not None and self.roi_panel.on_slide:
            raise ValueError(NO_MASK_ON_SLIDE)
        self.roi_panel.set_labels(roi, None if roi is None else self._plane_shape())

    def add_roi(self, *, rectangle: Sequence[float] | None = None,
                polygon: Sequence[Sequence[float]] | None = None,
                mask: np.ndarray | None = None) -> int:
        """Add one ROI and return its label (see :func:`~.regions.region_mask`).

        Parameters
        ----------
        rectangle : (row0, col0, row1, col1), optional
            Two opposite corners in pixel coordinates.
        polygon : sequence of (row, col), optional
        mask : (H, W) bool, optional
            Not on a slide, whose regions are shapes (a mask would be as large as it).

        On a slide, coordinates are the picture's pixels (:attr:`image_panel.plane_shape
        <napari_attnreg.notebook.image_panel.ImagePanel.plane_shape>`: a slide opened by its
        path, its full-resolution pixels), as drawn; the table measures them on whatever
        level or resolution the result analysed.
        """
        if self.roi_panel.on_slide:
            if mask is not None or sum(v is not None for v in (rectangle, polygon)) != 1:
                raise ValueError(NO_MASK_ON_SLIDE)
            verts = rectangle_vertices(*rectangle) if rectangle is not None else polygon
            return self.roi_panel.add_polygon(check_on_picture(verts, self._plane_shape()))
        region = region_mask(self._plane_shape(), rectangle=rectangle, polygon=polygon,
                             mask=mask)
        return self.roi_panel.add(region)

    def add_rois_from_geojson(self, path: str | Path) -> list[int]:
        """Add the polygon annotations of a GeoJSON file (QuPath's *Export objects as GeoJSON*,
        this package's export) as ROIs, one per annotation in file order; returns their labels.

        Coordinates are the image's pixels from its top-left corner (a slide's full-resolution
        pixels), as QuPath writes them. On an image in memory holes are left out of their
        region; a slide's regions are outlines, so a hole there is part of its region (the
        status says so).

        Raises
        ------
        ValueError
            Unreadable file, no polygon, or no annotation over the image.
        """
        from napari_attnreg.io.geojson import polygons_to_labels, read_geojson_annotations

        panel, shape = self.roi_panel, self._plane_shape()
        found = read_geojson_annotations(path)
        added, outside, holes = [], 0, 0
        for geom, _about in found:
            if panel.on_slide:
                for part in getattr(geom, "geoms", [geom]):
                    holes += len(part.interiors)
                    xy = np.asarray(part.exterior.coords)[:-1] / float(panel.slide_downsample)
                    try:
                        added.append(panel.add_polygon(check_on_picture(
                            (xy - 0.5)[:, ::-1], shape)))
                    except ValueError:
                        outside += 1
                continue
            region = polygons_to_labels([geom], shape) > 0
            if region.any():
                added.append(panel.add(region))
            else:
                outside += 1
        name = Path(path).name
        if not added:
            raise ValueError(f"No annotation of {name} lies on this image "
                             f"({shape[1]}×{shape[0]} pixels): its coordinates are another "
                             "image's, or a coarser level's (QuPath writes full-resolution "
                             "pixels).")
        notes = [f"{len(added)} ROI(s) added from {name}."]
        if outside:
            notes.append(f"{outside} annotation(s) lie off the image and were skipped.")
        if holes:
            notes.append(f"{holes} hole(s) are part of their region here (a slide's regions "
                         "are outlines).")
        self._set_status(" ".join(notes), "warning" if outside or holes else "success")
        return added

    def clear_rois(self) -> None:
        self.set_roi(None)

    def roi_table(self) -> list[dict]:
        """Per-ROI statistics (``core.roi.roi_table``) of the result on screen, at its
        thresholds; a stack's rows start with its ``plane`` (``[2]``), as napari's do."""
        rows = self.roi_panel.rows(self.session.shown())
        entry = self.session.selected
        if entry is None or not entry.key:
            return rows
        return [{"plane": list(entry.key), **row} for row in rows]

    def provenance(self) -> dict[str, Any]:
        """How the result on screen was made (:func:`napari_attnreg.io.export.provenance`):
        image, model and weights hash, preset, its thresholds now, B, seed, version; a stack's
        plane as its own ``plane`` entry (``[2]``), as napari's ROI table has it."""
        entry = self.session.selected
        if entry is None:
            raise ValueError("No result on this plane yet: run the analysis first.")
        source = self._image_name or self.image_panel.source.name
        # the file's name alone, as napari's table has it: "stack.tif plane (0,)" was a name
        # no other front end wrote, and a Python tuple no analyst types in a filter
        made = provenance(entry.any_result.metadata, source=source,
                          thresholds=entry.thresholds)
        return {**made, "plane": list(entry.key)} if entry.key else made

    def export_roi_csv(self, path: str | Path) -> Path:
        """Write :meth:`roi_table` to a CSV file, each row with the run's provenance; returns
        the path written: ``.csv`` added to another ending (``cells.npz`` was overwritten by
        the table), ``roi_table.csv`` inside a folder given."""
        if self.roi_panel.unavailable:  # "draw or pass ROIs" cannot be done here
            raise ValueError(f"No ROI table to export: {self.roi_panel.unavailable}")
        rows = self.roi_table()
        if not rows:
            raise ValueError("No ROI statistics to export: run the analysis and draw or pass "
                             "ROIs.")
        return write_table_csv(output_path(path, (".csv",), ROI_TABLE_NAME), rows,
                               self.provenance())

    def export_roi_geojson(self, path: str | Path) -> Path:
        """Write the regions as GeoJSON annotations that QuPath opens on the image: polygons
        in its pixels, the top-left corner at 0 (a slide's full-resolution, level 0, pixels,
        whatever level was shown or analysed: :mod:`napari_attnreg.io.geojson`'s frame), each
        with its row of :meth:`roi_table` as QuPath ``measurements`` once there is a result.
        On an image in memory each region is the outline of its pixels (holes kept)."""
        from napari_attnreg.io.geojson import GEOJSON_SUFFIXES

        panel = self.roi_panel
        if panel.n_rois == 0:
            raise ValueError("No regions to export. "
                             + (NO_SLIDE_ROIS if panel.on_slide else NO_ROIS))
        note = {}
        try:
            rows = {row["label"]: row for row in self.roi_table()}
        except ValueError as err:  # a result too large to measure: the regions still go out
            rows, note = {}, {"note": f"no measurements: {err}"}
        features = []
        for label, geometry in self._roi_geometries():
            measured = {k: v for k, v in rows.get(label, {}).items() if k != "label"
                        and isinstance(v, (int, float)) and not isinstance(v, bool)
                        and np.isfinite(v)}
            features.append({
                "type": "Feature",
                "geometry": geometry,
                "properties": {"objectType": "annotation", "name": f"ROI {label}",
                               "classification": {"name": "ROI", "color": list(ROI_COLOR)},
                               "measurements": measured}})
        path = output_path(path, GEOJSON_SUFFIXES, "roi_regions.geojson")
        with atomic_write(path) as tmp:
            Path(tmp).write_text(json.dumps({"type": "FeatureCollection", "features": features,
                                             "properties": note}, indent=1), encoding="utf-8")
        return path

    def _roi_geometries(self) -> list[tuple[int, dict]]:
        """Each region's label and GeoJSON geometry in QuPath's frame (pixel corners at whole
        numbers, y down): a slide's drawn polygons at full resolution; the pixels of each
        label of an image in memory, outlined exactly (pixel (r, c) is [c, c+1] × [r, r+1])."""
        from shapely.affinity import translate
        from shapely.geometry import mapping
        from shapely.ops import unary_union

        from napari_attnreg.core.results.outline import mask_regions

        panel = self.roi_panel
        if panel.on_slide:
            found = []
            for label, verts in enumerate(panel.polygons, start=1):
                ring = full_resolution(verts, panel.slide_downsample).tolist()
                found.append((label, {"type": "Polygon", "coordinates": [ring + ring[:1]]}))
            return found
        labels = panel.labels
        found = []
        for label in np.unique(labels[labels > 0]):
            # mask_regions puts pixel (r, c) at [c - 0.5, c + 0.5]: QuPath's corner is at 0
            region = translate(unary_union(mask_regions(labels == label)), 0.5, 0.5)
            found.append((int(label), mapping(region)))
        return found

    def _export_from_button(self, path: str) -> None:
        try:
            written = self.export_roi_csv(new_file(output_path(path, (".csv",),
                                                               ROI_TABLE_NAME)))
        except (ValueError, OSError) as err:
            self._set_status(f"CSV not written: {err}", "error")
            return
        self._set_status(f"ROI table written to {written}", "success")

    def _geojson_from_button(self, path: str) -> None:
        typed = Path(path).expanduser()  # beside the CSV box's table, or in its folder
        target = typed / "roi_regions.geojson" if typed.is_dir() else typed.with_suffix(".geojson")
        try:
            written = self.export_roi_geojson(new_file(target))
        except (ValueError, OSError) as err:
            self._set_status(f"GeoJSON not written: {err}", "error")
            return
        self._set_status(f"Regions written to {written} (QuPath: File ▸ Import objects)",
                         "success")

    def _on_screen(self, what: str) -> ResultEntry | None:
        """The result on screen, else None with the status saying what to do."""
        entry = self.session.selected
        if entry is None:
            where = f" on plane {tuple(self.state.slice_index)}" if self.state.slice_index else ""
            self._set_status(f"{what} not written: no result{where} yet; press Run (or open a "
                             "saved one with explorer.open_result(path)).", "error")
        return entry

    def _save_from_button(self, typed: str) -> None:
        entry = self._on_screen("Result")
        if entry is None:
            return
        try:
            path = new_file(output_path(typed, (".npz",), RESULT_NAME, case_sensitive=True))
            written = entry.shown().save(path)
        except (ValueError, OSError) as err:
            self._set_status(f"Result not written: {err}", "error")
            return
        self._set_status(f"Result saved to {written} (reopen it over this image with "
                         "explorer.open_result(path), or drop it on napari).", "success")

    def _figure_from_button(self, typed: str) -> None:
        entry = self._on_screen("Figure")
        if entry is None:
            return
        overlay = self.state.overlay  # the map shown; with none shown, the regularized one
        map_key = overlay if overlay in MAPS_BY_KEY else "regularized"
        try:
            path = new_file(output_path(typed, (".png",), FIGURE_NAME))
            written = self._write_figure(entry, path, map_key, None)
        except (ValueError, OSError) as err:
            self._set_status(f"Figure not written: {err}", "error")
            return
        # named as the overlay menu names it ("raw attention", "evidence (1 − adjusted p)")
        label = {value: text for text, value in self.controls["overlay"].options}
        self._set_status(f"Figure of the {label.get(map_key, map_key)} written to {written}",
                         "success")

    def _on_drawn_region(self, vertices: np.ndarray) -> None:
        try:
            self.add_roi(polygon=vertices)
        except ValueError as err:
            self._set_status(str(err), "warning")

    def _rois_changed(self) -> None:
        self.canvas.redraw()
        self.display.update_roi_table()

    def close(self) -> None:
        for part in getattr(self, "_parts", ()):  # a failed construction has none yet
            part.close()
        self._parts = []
        super().close()


def _plane_of(metadata: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The plane a result records: the notebook's ``slice``, else the pipeline's ``plane``
    (a list of indices; a batch's ``"0-3"``); None for a 2D image's result."""
    saved = metadata.get("slice", metadata.get("plane"))
    if isinstance(saved, str):
        saved = saved.split("-") if saved else None
    if not saved:
        return None
    try:
        return tuple(int(i) for i in saved)
    except (TypeError, ValueError):
        return None

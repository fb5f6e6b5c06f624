"""The 'Attention Regularization' dock widget: an assembly of small panels.

- :class:`.source_panel.SourcePanel`: image, planes, channels (follows napari's selection)
- :class:`.model_picker.ModelPanel`: where the model comes from
- :class:`.options_panel.OptionsPanel`: device, bootstrap, preset, tiling, advanced
- :class:`.thresholds_panel.ThresholdsPanel`: live thresholds (no recomputation)
- :class:`.run_panel.RunPanel`: Run/Cancel, progress, task ids, one worker at a time
- :class:`.inspector.PatchInspector`: the patch under the mouse and the null it was compared with
- :class:`.roi_panel.RoiPanel`: per-ROI statistics and CSV export

The state lives in a Qt-free :class:`~napari_attnreg.session.Session` (``widget.session``):
the run settings the options push, one result per image with the thresholds chosen for it,
and the selected result (the image chosen under 'Image'). The panels only show it and send
the analyst's moves to it; a threshold move changes the selected result alone, and choosing
another image shows that image's own thresholds and count.

This module builds the job from the session and applies its outcome to the viewer: output
layers are tracked per run by object identity (:class:`.run_record.RunRecord`), so copies the
analyst makes and the layers of another dock are never overwritten.
"""

# ruff: noqa: E402  (the Triton guard must run before the imports that load timm)
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from html import escape as escape_html
from typing import Any

from qtpy.QtCore import QEvent, QStringListModel, Qt, QTimer, Signal
from qtpy.QtWidgets import (
    QCompleter,
    QDockWidget,
    QFormLayout,
    QGridLayout,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)
from superqt import QCollapsible

from napari_attnreg._napari._compat import avoid_triton_llvm_clash

avoid_triton_llvm_clash()  # before anything below can import timm (see core.triton_guard)

from napari_attnreg._napari.channel_layers import check_not_stale
from napari_attnreg._napari.concept_roi import ConceptFromRoi
from napari_attnreg._napari.dock_scroll import (
    VerticalScroll,
    fit_narrow,
    share_layer_controls_column,
)
from napari_attnreg._napari.figure import FigureButton, GeoJsonButton
from napari_attnreg._napari.inspector import PatchInspector
from napari_attnreg._napari.layers import refresh_thresholds, show_colorbars_of
from napari_attnreg._napari.model_picker import ModelPanel
from napari_attnreg._napari.options_panel import OptionsPanel
from napari_attnreg._napari.outline import adopt_read_outlines
from napari_attnreg._napari.pending import PendingRun
from napari_attnreg._napari.reader_choice import ReaderChoiceButton
from napari_attnreg._napari.records import RunRecords
from napari_attnreg._napari.results_io import SaveButton, sample_menu_hint
from napari_attnreg._napari.roi_panel import RoiPanel
from napari_attnreg._napari.run_panel import RunPanel
from napari_attnreg._napari.run_record import RunRecord
from napari_attnreg._napari.run_warnings import add_to_results, collect_warnings
from napari_attnreg._napari.settings import run_defaults
from napari_attnreg._napari.slice_cue import SliceCue
from napari_attnreg._napari.slide_run import labels_mask, mask_layer, place_on_slide, slide_of
from napari_attnreg._napari.source_panel import SourcePanel
from napari_attnreg._napari.status import (
    WARNING_COLOR,
    help_link,
    notify_diagnostics,
    notify_summary,
    summary_html,
    warn_missing_planes,
)
from napari_attnreg._napari.thresholds_panel import ThresholdsPanel
from napari_attnreg.core.run.engine import RunConfig
from napari_attnreg.core.run.planes import PlaneStack
from napari_attnreg.core.run.service import Job, ModelSpec, Outcome, run_job
from napari_attnreg.core.run.thresholds import Thresholds
from napari_attnreg.core.stats.presets import THRESHOLD_KEYS
from napari_attnreg.io.readers import ImageInfo
from napari_attnreg.session import Session
from napari_attnreg.session.model import same_setting


def section(title: str, content: QWidget, tip: str) -> QCollapsible:
    """A foldable section of the dock holding ``content``, open."""
    box = QCollapsible(title)
    box.setToolTip(tip)
    box.toggleButton().setToolTip(tip)
    box.addWidget(content)
    box.expand(animate=False)
    return box


class AttentionWidget(QWidget):
    """Dock widget: controls, Run/Cancel with progress, live thresholds and the ROI table.

    Parameters
    ----------
    napari_viewer : napari.Viewer

    Notes
    -----
    Programmatic use (tests, scripts): :meth:`set_model` accepts a ``Backbone`` or
    ``nn.Module``; :meth:`run` starts a job and returns the worker; ``run_finished`` fires
    once the outcome was applied (layers added) or dropped.
    """

    run_finished = Signal(object)  # core.service.Outcome
    outputs_updated = Signal(object)  # RunRecord, after a run or a threshold change

    def __init__(self, napari_viewer: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.viewer = napari_viewer
        self.session = Session()
        self._records = RunRecords(self.viewer, self.session,
                                   on_source_moved=self.outputs_updated.emit)
        self._pending: PendingRun | None = None
        self._docked = False
        self._detached = False
        self._placed = False  # placed in the window once, when first shown
        self._summary_shown = False  # the status line shows a result's count (not an error)
        self._pushing_settings = False
        self.last_outcome: Outcome | None = None

        self.title = help_link()
        self.source = SourcePanel(self.viewer)
        self.model = ModelPanel()
        model_form = QFormLayout()
        model_form.addRow("Model", self.model)
        self.options = OptionsPanel()
        self.concept = ConceptFromRoi(self)  # 'Concept from ROI', under Advanced ▸ Target
        self.options.attach_concept(self.concept)
        defaults = run_defaults()  # the user's plugin settings (napari Preferences)
        self.model.apply_setting(defaults.model)
        self.options.apply_settings(defaults)
        self.thresholds_panel = ThresholdsPanel()
        self.run_panel = RunPanel()
        self.save_button = SaveButton(self)
        self.figure_button = FigureButton(self.viewer, self.current_record,
                                          self._records.source_of)
        self.geojson_button = GeoJsonButton(self.viewer, self.current_record)
        self.reader_button = ReaderChoiceButton()
        self.inspector = PatchInspector(self.viewer, self.current_record, self._records.source_of)
        self.slice_cue = SliceCue(self.viewer, self.current_record)
        self.roi_panel = RoiPanel(self.viewer, self.current_record)
        # the inspector and the ROI table share one place (tabs): at 1280x800 both stacked
        # needed scrolling, and the dock's height is the canvas's
        self.result_tabs = QTabWidget()
        self.result_tabs.setUsesScrollButtons(False)  # two short tab titles always fit
        for button in self.result_tabs.tabBar().findChildren(QToolButton):  # Qt's own, hidden
            button.setToolTip("Scroll the tabs")
        self.result_tabs.addTab(self.inspector, "Patch inspector")
        self.result_tabs.addTab(self.roi_panel, "ROI statistics")
        self.result_tabs.setTabToolTip(1, "ROI statistics vs significant attention")
        outputs = QGridLayout()  # the output buttons two by two, not one row each
        for index, button in enumerate((self.save_button, self.figure_button,
                                        self.geojson_button)):
            outputs.addWidget(button, index // 2, index % 2)
        outputs_box = QWidget()
        outputs_layout = QVBoxLayout(outputs_box)
        outputs_layout.setContentsMargins(0, 0, 0, 0)
        outputs_layout.addLayout(outputs)
        outputs_layout.addWidget(self.reader_button)
        # foldable sections: at 1280x800 an analyst folds what is set to give the inspector
        # and the ROI table the dock's height (both start open)
        self.sections = {
            "Run options": section("Run options", self.options,
                                   "Preset, null images, B, tiling, device and the advanced "
                                   "options; fold them once set."),
            "Outputs": section("Outputs", outputs_box,
                               "Save the results, export the figure or GeoJSON, and napari's "
                               "reader choice."),
        }
        content = QWidget()
        layout = QVBoxLayout(content)
        for part in (self.title, self.source, model_form, self.sections["Run options"],
                     self.thresholds_panel, self.run_panel, self.sections["Outputs"],
                     self.result_tabs):
            (layout.addLayout if isinstance(part, (QFormLayout, QGridLayout))
             else layout.addWidget)(part)
        layout.addStretch(1)
        fit_narrow(content)  # a narrow column: the canvas keeps the window's width
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(VerticalScroll(content))  # a short window scrolls the dock

        events = self.session.events
        events.result_added.connect(self._on_result_added)
        events.selection_changed.connect(self._show_selected)
        events.thresholds_changed.connect(self._on_thresholds_changed)
        events.settings_changed.connect(self._on_settings_changed)
        self.source.layer_changed.connect(self._on_layer_changed)
        self.source.said.connect(lambda text: self.run_panel.show_status(
            escape_html(text, quote=False)))
        self.options.preset_changed.connect(self._on_preset_changed)
        self.thresholds_panel.changed.connect(self.apply_thresholds)
        self.thresholds_panel.refused.connect(self._note_over_summary)
        self.run_panel.run_requested.connect(self.run)
        self.run_panel.remaining_requested.connect(self.run_remaining)
        self.run_panel.returned.connect(self._on_returned)
        self.run_panel.finished.connect(self._on_finished)
        self.run_panel.bind_shortcut(self.viewer, self._on_run_shortcut)
        self._push_settings()  # the preset brings its thresholds: the panel shows them
        self._on_layer_changed()
        # outlines a reader opened (result files, saved folders) keep thin at any zoom too
        self.viewer.layers.events.inserted.connect(self._on_layer_inserted)
        self._on_layer_inserted()
        # Tissue mask: 'auto', 'none', a file, or a Labels or Shapes layer by name (offered as typed)
        self._mask_names = QStringListModel(self)
        completer = QCompleter(self._mask_names, self)
        completer.setCaseSensitivity(Qt.CaseInsensitive)
        mask_field = self.options.controls["tissue_mask"]
        mask_field.setCompleter(completer)
        mask_field.setPlaceholderText("auto (slides) / none / a Labels or Shapes layer / a mask or GeoJSON file")
        self.viewer.layers.events.inserted.connect(self._offer_mask_layers)
        self.viewer.layers.events.removed.connect(self._offer_mask_layers)
        self._offer_mask_layers()

    def _place_annotations(self, layer: Any) -> None:
        """QuPath annotations read from GeoJSON go over the slide they were drawn on: the
        image chosen in the dock when it is a slide, else the only slide open; with no slide
        open, over the image chosen (in its pixels: laid at scale 1 over a µm-scaled image
        they missed it, and napari warned of inconsistent units at every layer added)."""
        from napari.layers import Image, Shapes

        if not isinstance(layer, Shapes):
            return
        chosen = self.current_layer()
        slides = [lay for lay in self.viewer.layers
                  if isinstance(lay, Image) and slide_of(lay) is not None]
        target = chosen if chosen in slides or not slides else (
            slides[0] if len(slides) == 1 else None)
        if target is not None:
            place_on_slide(layer, target)

    def _offer_mask_layers(self, event: Any = None) -> None:
        from napari.layers import Labels, Shapes

        from napari_attnreg._napari.source_panel import is_output

        # the dock's own significant layers mark no tissue: offered, they read as masks to use
        drawn = [lay.name for lay in self.viewer.layers
                 if isinstance(lay, (Labels, Shapes)) and not is_output(lay)]
        self._mask_names.setStringList(["auto", "none", *drawn])

    def _on_layer_inserted(self, event: Any = None) -> None:
        adopt_read_outlines(self.viewer)
        self._place_annotations(getattr(event, "value", None))
        # a reader adds its layers one by one: take the result up once all of them are in
        QTimer.singleShot(0, self.adopt_reopened)

    def adopt_reopened(self) -> None:
        """Results a reader reopened (saved folder, result file) become this dock's, as if it
        had run them, once their image layer is open (called as layers arrive)."""
        if self._detached:
            return
        try:
            made = self._records.adopt_reopened()
        except ValueError as err:  # a damaged result file beside the maps: say which
            self.run_panel.show_error(str(err))
            return
        for record in made:
            self._show_reopened_tissue(record)
            self._source_beneath(record)
        if made:
            self._select_current()  # shows the result when its image is the one chosen
            # the picker showed the demo (or the last) model while the status named the
            # result's: a re-run would silently use another model
            shown = self.current_record()
            record = shown if shown in made else made[-1]
            note = self.model.show_model_of(next(iter(record.results.values())).metadata)
            # the Statistics box kept the next run's preset while the thresholds offered the
            # result's rules: it names the preset that made the result, as after a run here
            preset_note = self.session.show_preset_of(record.source_id)
            note = " ".join(n for n in (note, preset_note) if n)
            if note:
                self._note_over_summary(note)
        elif self._records.waiting and self.current_record() is None:
            names = ", ".join(repr(n) for n in self._records.waiting)
            self.run_panel.show_status(
                f"Reopened result of {names}: open that image (same name and size) to move "
                "its thresholds, inspect its patches and measure ROIs.")

    # ---- small accessors used by scripts and tests ---------------------------------------
    def current_layer(self) -> Any | None:
        return self.source.current_layer()

    def set_layer(self, layer: Any) -> None:
        self.source.set_layer(layer)

    def set_model(self, model: Any, name: str | None = None) -> None:
        """Use a ``Backbone`` or ``nn.Module`` given in code (tests, scripts)."""
        self.model.set_model(model, name)

    def model_spec(self) -> ModelSpec:
        return self.model.model_spec()

    def preset(self) -> str:
        return self.options.preset()

    def thresholds(self) -> Thresholds:
        """The selected result's thresholds (nothing selected: those the next run starts with)."""
        return self.session.thresholds()

    @property
    def busy(self) -> bool:
        return self.run_panel.busy

    @property
    def worker(self) -> Any:
        return self.run_panel.worker

    def current_record(self) -> RunRecord | None:
        """The record of the selected result (that of the chosen image), if it has one."""
        return self._records.by_key(self.session.selected_key)

    def records(self) -> list[RunRecord]:
        return self._records.values()

    # ---- settings: the options panel pushes, the session holds --------------------------------
    def _push_settings(self, with_source: bool = False) -> None:
        values = dict(self.options.config_kwargs())
        if with_source:  # may raise ValueError (e.g. channels that are no numbers)
            values.update(self.source.channel_options(), channel_axis=self.source.channel_axis())
        self._pushing_settings = True
        try:
            self.session.update_settings(values)
        finally:
            self._pushing_settings = False

    def _on_preset_changed(self, preset: str) -> None:
        self._push_settings()  # the session gives the next run the preset's thresholds
        note = self.session.preset_note()
        if note:  # the box moved away from the result shown: its thresholds stay its own
            self._note_over_summary(note)

    def _on_settings_changed(self, changes: dict[str, Any]) -> None:
        if not self._pushing_settings:  # set in code (session.update_settings): show it
            for name, value in changes.items():
                if name in self.options.controls and value is not None \
                        and not same_setting(self.options.value(name), value):
                    self.options.set(name, value)
        if self.session.selected is None and changes.keys() & {"preset", *THRESHOLD_KEYS}:
            self._show_selected()  # the panel shows the next run's thresholds

    # ---- selection: the chosen image's result ------------------------------------------------
    def _on_layer_changed(self) -> None:
        pending = self._pending
        if pending is not None and pending.layer not in self.viewer.layers:
            # its image was closed: nothing the run computes can be added, so stop it now
            # rather than let it hold the CPU to its end (minutes for a slide)
            self.run_panel.cancel()
            self.run_panel.show_status(f"{pending.layer.name!r} was closed: its run stops at "
                                       "the next chunk.")  # not "Cancelling", never pressed
        self.thresholds_panel.flush()  # a move made just before belongs to the result shown
        self._records.tidy()
        self._select_current()
        has_image = self.current_layer() is not None
        self.options.set_slide(not has_image or slide_of(self.current_layer()) is not None)
        self.run_panel.set_can_run(has_image, "" if has_image else
                                   f"Add an image layer first ({sample_menu_hint()}).")

    def _select_current(self) -> None:
        layer = self.current_layer()
        key = None if layer is None else layer.unique_id
        self.session.select(key if key in self.session else None)

    def _show_selected(self, *_: Any) -> None:
        """Show the selected result: its thresholds, count, diagnostics and ROI table."""
        record = self.current_record()
        self.thresholds_panel.offer_rules(record.preset if record else self.session.preset)
        shown = self.session.thresholds()
        if self.thresholds_panel.thresholds() != shown:
            self.thresholds_panel.set_thresholds(shown)
        self.save_button.setEnabled(record is not None)
        if record is not None:
            self._show_summary(record)
            show_colorbars_of(self.viewer, self.records(), record)
        elif self.current_layer() is None and not self.run_panel.busy:
            # the last image was closed: "press Run" (Run is disabled) or the closed image's
            # count would speak of an image no longer there
            self._summary_shown = False
            self.run_panel.show_status(f"No image to analyse: add an image layer "
                                       f"({sample_menu_hint()}).")
        elif self._summary_shown:  # another image's count must not stay on screen
            self._summary_shown = False
            self.run_panel.show_status("No result for this image yet: press Run.")
        self.roi_panel.update_table()
        self.inspector.refresh()
        self.run_panel.offer_remaining(len(self.missing_planes()))
        self.slice_cue.update()

    def _on_result_added(self, key: Any) -> None:
        if key == self.session.selected_key:  # a re-run of the image shown
            self._show_selected()
        elif (shown := self.current_record()) is not None:  # another image's new bars
            show_colorbars_of(self.viewer, self.records(), shown)

    def _on_run_shortcut(self, viewer: Any = None) -> None:
        if not self.run_panel.busy:
            self.run()

    # ---- run -----------------------------------------------------------------------------
    def run_config(self, layer: Any = None, geometry: Any = None) -> RunConfig:
        """The :class:`RunConfig` the controls describe (raises ValueError when invalid).

        With the image ``layer`` (and its ``geometry``), a *Tissue mask* that names a Labels
        layer becomes that layer's mask on the image's pixel grid.
        """
        self._push_settings(with_source=True)
        # a re-run keeps the thresholds chosen for its image (Session.run_thresholds)
        values = {**self.session.settings, **self.session.run_thresholds()}
        if layer is not None:
            values["tissue_mask"] = labels_mask(self.viewer, values.get("tissue_mask"), layer,
                                                geometry)
        config = RunConfig(**values)
        config.validate()
        return config

    def missing_planes(self) -> list[tuple[int, ...]]:
        """The planes of the selected stack that have no result (empty: none selected or all
        computed)."""
        record = self.current_record()
        if record is None:
            return []
        return [p for p in record.geometry.planes() if p not in record.results]

    def run_remaining(self) -> Any:
        """Run the slices of the selected stack without a result (see :meth:`run`)."""
        record, missing = self.current_record(), self.missing_planes()
        if record is None or not missing:
            self.run_panel.show_error("Every slice of this image has a result already.")
            return None
        spec = self.model_spec()
        if spec.label() != record.params.get("model") or self.session.preset != record.preset:
            self.run_panel.show_error(
                f"The computed slices were made with {record.params.get('model')!r} and the "
                f"{record.preset} preset; choose those again to add the remaining slices, or "
                "set Planes to 'all slices' and Run to recompute every slice.")
            return None
        return self.run(planes=missing)

    def _build_job(self, planes: list[tuple[int, ...]] | None = None) -> PendingRun:
        from napari_attnreg._napari.geometry import SourceGeometry
        from napari_attnreg._napari.slide_run import slide_run

        layer = self.current_layer()
        if layer is None:
            raise ValueError(f"Add an image layer ({sample_menu_hint()}) and choose it under "
                             "'Image'.")
        if layer.multiscale and slide_of(layer) is None:  # a slide's pyramid is read from file
            raise ValueError(f"{layer.name!r} is a multiscale (pyramid) image; add one level as "
                             "its own image layer (e.g. layer.data[1]) and run on that.")
        check_not_stale(layer)  # a joined layer of channels is a copy of them
        axis = self.source.channel_axis()
        geometry = SourceGeometry.from_layer(layer, axis)
        config = self.run_config(layer, geometry)
        # a slide layer: the slide read again at the level asked, placed over the layer
        image, grid, config = slide_run(layer, config)
        placed = geometry if grid is None else grid.place(geometry)
        # what the file says (DICOM Modality → the off-domain check) and where the image lies
        found = ImageInfo.from_layer_metadata(layer.metadata).run_extra()
        config = replace(config, extra={**config.extra, **found, "spatial": placed.spatial()})
        # napari's image axes are the last two (three with RGB): no layout guessing here
        stack = image if image is not None else PlaneStack(
            layer.data, geometry.stack_axes, layer.data.ndim - 1 if layer.rgb else axis,
            bool(layer.rgb))
        job = Job(self.model_spec(), stack,
                  self.source.planes(layer, geometry) if planes is None else planes, config,
                  task_id=self.run_panel.next_task_id(),
                  plane_names=tuple(geometry.axis_name(a) for a in geometry.stack_axes))
        return PendingRun(job, layer, geometry, grid=grid, source_data=layer.data)

    def run(self, planes: list[tuple[int, ...]] | None = None) -> Any:
        """Start a run on the chosen layer; returns the worker (None if it could not start).

        ``planes``: the planes to run (default: those the Planes control says).
        """
        if self.run_panel.busy:
            self.run_panel.show_error("A run is already in progress; cancel it first.")
            return None
        raised: list[str] = []  # UserWarnings of reading the options (a GeoJSON outline's)
        try:
            with collect_warnings(raised):
                pending = self._build_job(planes)
        except ValueError as err:
            self.run_panel.show_error(str(err), raised)
            return None
        pending.warnings = raised
        pending.mask_layer = mask_layer(self.viewer, self.session.settings.get("tissue_mask"))
        self._pending = pending
        # a Labels layer painted as the tissue mask was taken up as the ROI layer when it was
        # added: its table showed the tissue as the one ROI
        self.roi_panel.set_aside(pending.mask_layer)
        self.last_outcome = None
        name, n = pending.layer.name, len(pending.job.planes)
        worker = self.run_panel.start(run_job, pending.job,
                                      description=f"Attention regularization: {name}")
        self.run_panel.show_status(f"Running on {name!r}" + (f" ({n} planes)" if n > 1 else "")
                                   + "…")
        self._summary_shown = False  # the status line now follows the run
        return worker

    def cancel(self) -> None:
        """Stop the running job at its next chunk; nothing it computed is added."""
        self.run_panel.cancel()

    def _on_returned(self, outcome: Outcome) -> None:
        pending = self._pending
        if self._detached or pending is None:  # the dock was closed: add nothing
            outcome.results, outcome.status = {}, "cancelled"
            return
        raised = [*pending.warnings, *self.run_panel.run_warnings]
        if not outcome.results and outcome.status == "cancelled" \
                and pending.layer not in self.viewer.layers:  # stopped when its image closed
            outcome.status, outcome.message = "failed", pending.problem(self.viewer, outcome)
        if not outcome.results:
            if outcome.status == "cancelled":
                self._note_over_summary("Cancelled; nothing was added.")
            else:
                self.run_panel.show_error(outcome.message, raised)
            return
        problem = pending.problem(self.viewer, outcome)
        if problem is not None:
            outcome.results, outcome.status, outcome.message = {}, "failed", problem
            self.run_panel.show_error(problem)
            return
        # the status line, the warning toast and the saved result then carry them
        add_to_results(outcome.results.values(), raised)
        record = self._records.attach(outcome, pending)
        self._show_tissue(outcome, record, pending.mask_layer)
        self._select_current()  # the run's image, when it is still the one chosen
        # the session selected the result before its layers were added: the cue found none
        # shown, and the slider moved during the run stayed on a slice without a result, unsaid
        self.slice_cue.update()
        if record.source_id != self.session.selected_key:
            self._note_over_summary(f"Finished {record.source_name!r}; choose it under "
                                    "Image to see its result.")
        notify_summary(record)
        notify_diagnostics(record)
        self.outputs_updated.emit(record)
        if not outcome.ok:  # cancelled or partly failed: the finished planes, and what is missing
            text = warn_missing_planes(outcome, pending.job.planes, record.geometry)
            self.run_panel.show_status(f"<span style='color:{WARNING_COLOR}'>{text}</span><br>"
                                       + self.run_panel.status_label.text())

    def _show_tissue(self, outcome: Outcome, record: RunRecord, drawn: Any = None) -> None:
        """A tiled run's tissue mask as a Labels layer over its image, beneath its maps.

        A rerun replaces the mask this dock added before, and removes it when the new run has
        none (it would show a mask the run did not use); a mask layer the analyst has painted
        on is theirs, and stays. When the mask came from the analyst's own layer ``drawn``,
        that layer is the mask shown: a copy of it at the mask's coarse pixels lay over it as
        a second mask, and an earlier run's mask layer named as this run's is kept as it is.
        """
        from napari_attnreg._napari.io import tissue_layer, tissue_untouched

        source_name = record.source_name
        made = None
        if drawn is None and () in outcome.results:
            made = tissue_layer(outcome.results[()], source_name)
        for old in [lay for lay in self.viewer.layers
                    if lay is not drawn and tissue_untouched(lay, source_name)]:
            self.viewer.layers.remove(old)
        if made is not None:
            self._add_tissue(made, record)

    def _add_tissue(self, made: Any, record: RunRecord) -> None:
        """Add the tissue mask layer ``made`` just beneath ``record``'s output layers.

        On top (where napari adds a layer) its fill tinted the maps and the significant
        outline it marks the tested area for; a reopened result file has it beneath them too.
        The layer chosen before stays chosen: left on the mask, napari's new-layer buttons
        made a Labels layer to paint ROIs in at the mask's coarse pixels (8 µm on a slide).
        """
        data, kwargs, _ = made
        layers = self.viewer.layers
        chosen = layers.selection.active
        layer = self.viewer.add_labels(data, **kwargs)  # napari numbers a name already taken
        below = [layers.index(lay) for lay in record.outputs.values() if lay in layers]
        if below and min(below) < layers.index(layer):
            layers.move(layers.index(layer), min(below))
        if chosen is not None and chosen in layers:
            layers.selection.active = chosen

    def _source_beneath(self, record: RunRecord) -> None:
        """Move a reopened result's image beneath its maps, outline and tissue mask: opened
        after them (napari adds a layer on top), the opaque image hid all of them."""
        from napari_attnreg._napari.roi_panel import is_tissue_mask

        source = self._records.source_of(record)
        layers = self.viewer.layers
        if source is None or source not in layers:
            return
        marks = [layers.index(lay) for lay in record.outputs.values() if lay in layers]
        marks += [i for i, lay in enumerate(layers) if is_tissue_mask(lay)
                  and lay.metadata["tissue"].get("image") == record.source_name]
        if marks and min(marks) < layers.index(source):
            layers.move(layers.index(source), min(marks))

    def _show_reopened_tissue(self, record: RunRecord) -> None:
        """A reopened tiled result's tissue mask, as after its run: a saved folder holds the
        result layers, not the mask layer, so the tested area was no longer drawn. Not when
        a mask of that image is open already (a result file's reader adds one)."""
        from napari_attnreg._napari.io import tissue_layer

        for lay in self.viewer.layers:
            meta = lay.metadata.get("tissue") if isinstance(lay.metadata, dict) else None
            if isinstance(meta, dict) and meta.get("image") == record.source_name:
                return
        made = tissue_layer(record.results[()], record.source_name) \
            if () in record.results else None
        if made is not None:
            self._add_tissue(made, record)

    def _on_finished(self, outcome: Outcome) -> None:
        self._pending = None
        self.last_outcome = outcome
        if not self._detached:
            self.run_finished.emit(outcome)

    def _note_over_summary(self, note: str) -> None:
        """``note`` on the status line, above the summary of the result shown: that result
        stays on screen, and the run's progress had replaced its count and warnings."""
        record = self.current_record()
        if record is not None:
            self._show_summary(record)
            note = f"{note}<br>{self.run_panel.status_label.text()}"
        self.run_panel.show_status(note)

    def _show_summary(self, record: RunRecord) -> None:
        html, status = summary_html(record)
        self.run_panel.show_status(html)
        self.viewer.status = status
        self._summary_shown = True

    # ---- thresholds ----------------------------------------------------------------------------
    def apply_thresholds(self, thresholds: Mapping[str, Any]) -> None:
        """Give the selected result the emitted ``thresholds`` (none selected: the next run).

        The session's ``thresholds_changed`` then redraws that result's layers alone.
        """
        if not self._detached:
            self.session.set_thresholds(thresholds)

    def _on_thresholds_changed(self, key: Any, thresholds: Thresholds) -> None:
        record = self._records.by_key(key)
        if record is None or self._detached:
            return
        self._records.sync_geometry(record)
        refresh_thresholds(self.viewer, record)
        if key == self.session.selected_key:
            self._show_selected()  # its count, its ROI table (and the panel, if set in code)
        self.outputs_updated.emit(record)

    # ---- closing the dock ------------------------------------------------------------------
    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        if not self._placed:  # once: an arrangement the analyst makes later is theirs
            self._placed = True
            QTimer.singleShot(0, self.place_in_window)

    def place_in_window(self) -> bool:
        """At a small window, share napari's left column (a tab beside its layer controls) so
        the canvas keeps most of the width; returns whether the dock moved (see
        :func:`.dock_scroll.share_layer_controls_column`)."""
        dock = self.parentWidget()
        while dock is not None and not isinstance(dock, QDockWidget):
            dock = dock.parentWidget()
        if dock is None or self._detached or not share_layer_controls_column(dock):
            return False
        # the shared column is ~500 px tall: the run options (set once, with good defaults)
        # fold so Run, the status and the result tabs are in view; one click opens them
        self.sections["Run options"].collapse(animate=False)
        return True

    def event(self, event: QEvent) -> bool:
        # napari's remove_dock_widget un-parents this widget; a closed dock must not add layers
        if event.type() == QEvent.Type.ParentChange:
            if self.parent() is not None:
                self._docked = True
            elif self._docked:
                self.detach()
        return super().event(event)

    def closeEvent(self, event: Any) -> None:
        self.detach()
        super().closeEvent(event)

    def detach(self) -> None:
        """Cancel a running job and stop reacting to the viewer (the dock was removed)."""
        if self._detached:
            return
        self._detached = True
        self.run_panel.cancel()
        self.source.disconnect_viewer()
        self.roi_panel.disconnect_viewer()
        self.inspector.disconnect_viewer()
        self.slice_cue.disconnect_viewer()
        self._records.stop_following()
        self.run_panel.unbind_shortcut(self.viewer, self._on_run_shortcut)
        self.viewer.layers.events.inserted.disconnect(self._offer_mask_layers)
        self.viewer.layers.events.removed.disconnect(self._offer_mask_layers)

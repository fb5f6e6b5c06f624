"""The 'Attention Regularization' dock widget: an assembly of small panels.

- :class:`.source_panel.SourcePanel`: image, planes, channels (follows napari's selection)
- :class:`.model_picker.ModelPanel`: where the model comes from
- :class:`.options_panel.OptionsPanel`: device, bootstrap, preset, tiling, advanced
- :class:`.thresholds_panel.ThresholdsPanel`: live thresholds (no recomputation)
- :class:`.run_panel.RunPanel`: Run/Cancel, progress, task ids, one worker at a time
- :class:`.roi_panel.RoiPanel`: per-ROI statistics and CSV export

This module builds the job from the panels and applies its outcome to the viewer: output
layers are tracked per run by object identity (:class:`.layers.RunRecord`), so copies the
analyst makes and the layers of another dock are never overwritten.
"""

# ruff: noqa: E402  (the Triton guard must run before the imports that load timm)
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from qtpy.QtCore import QEvent, Signal
from qtpy.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from ._compat import avoid_triton_llvm_clash

avoid_triton_llvm_clash()  # before anything below can import timm (see core.triton_guard)

from ..core.engine import RunConfig
from ..core.planes import PlaneStack
from ..core.service import Job, ModelSpec, Outcome, run_job
from .layers import RunRecord, place_outputs, refresh_thresholds, upsert_outputs
from .model_picker import ModelPanel
from .options_panel import OptionsPanel
from .pending import PendingRun
from .results_io import SaveButton, sample_menu_hint
from .roi_panel import RoiPanel
from .run_panel import RUN_SHORTCUT, RunPanel
from .source_panel import SourcePanel
from .status import TRANSFORM_EVENTS, notify_diagnostics, summary_html
from .thresholds_panel import ThresholdsPanel

#: The method and its defaults, in the project's own words.
DOCS_URL = "https://github.com/napari-attnreg/napari-attnreg/blob/main/docs/method.md"
TITLE = "Attention Regularization"


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
        self._records: dict[Any, RunRecord] = {}
        self._pending: PendingRun | None = None
        self._docked = False
        self._detached = False
        self.last_outcome: Outcome | None = None

        self.title = QLabel(f"<b>{TITLE}</b> · <a href='{DOCS_URL}'>Help</a>")
        self.title.setOpenExternalLinks(True)
        self.title.setToolTip(f"How to read the maps and choose the options: {DOCS_URL}")
        self.source = SourcePanel(self.viewer)
        self.model = ModelPanel()
        model_form = QFormLayout()
        model_form.addRow("Model", self.model)
        self.options = OptionsPanel()
        self.thresholds_panel = ThresholdsPanel()
        self.run_panel = RunPanel()
        self.save_button = SaveButton(self)
        self.roi_panel = RoiPanel(self.viewer, self.current_record)
        roi_group = QGroupBox("ROI statistics vs significant attention")
        QVBoxLayout(roi_group).addWidget(self.roi_panel)
        layout = QVBoxLayout(self)
        for part in (self.title, self.source, model_form, self.options, self.thresholds_panel,
                     self.run_panel, self.save_button, roi_group):
            (layout.addLayout if isinstance(part, QFormLayout) else layout.addWidget)(part)
        layout.addStretch(1)

        self.source.layer_changed.connect(self._on_layer_changed)
        self.options.preset_changed.connect(self._on_preset_changed)
        self.thresholds_panel.changed.connect(self.apply_thresholds)
        self.run_panel.run_requested.connect(self.run)
        self.run_panel.returned.connect(self._on_returned)
        self.run_panel.finished.connect(self._on_finished)
        self.viewer.bind_key(RUN_SHORTCUT, self._on_run_shortcut, overwrite=True)
        self._on_preset_changed(self.options.preset())
        self._on_layer_changed()

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

    def thresholds(self) -> dict[str, Any]:
        return self.thresholds_panel.thresholds()

    @property
    def busy(self) -> bool:
        return self.run_panel.busy

    @property
    def worker(self) -> Any:
        return self.run_panel.worker

    def current_record(self) -> RunRecord | None:
        layer = self.current_layer()
        return None if layer is None else self._records.get(layer.unique_id)

    def records(self) -> list[RunRecord]:
        return list(self._records.values())

    # ---- reactions -------------------------------------------------------------------------
    def _on_preset_changed(self, preset: str) -> None:
        from ..core.presets import default_thresholds

        self.thresholds_panel.set_thresholds(default_thresholds(preset))

    def _on_layer_changed(self) -> None:
        alive = {layer.unique_id: layer for layer in self.viewer.layers}
        for key in [k for k in self._records if k not in alive]:
            del self._records[key]
        for key, record in self._records.items():
            if record.source_name != alive[key].name:
                self._rename_outputs(record, alive[key].name)
        has_image = self.current_layer() is not None
        self.run_panel.set_can_run(has_image, "" if has_image else
                                   f"Add an image layer first ({sample_menu_hint()}).")
        self.save_button.setEnabled(self.current_record() is not None)
        self.roi_panel.update_table()

    def _rename_outputs(self, record: RunRecord, new_name: str) -> None:
        """Output layers follow a renamed input, unless the analyst renamed them already."""
        from .layers import META_KEY, layer_name

        old_name, record.source_name = record.source_name, new_name
        for kind, out in record.outputs.items():
            if out not in self.viewer.layers:
                continue
            out.metadata[META_KEY]["source"] = new_name
            if out.name.startswith(layer_name(old_name, kind, record.preset)):
                out.name = layer_name(new_name, kind, record.preset)

    def _on_run_shortcut(self, viewer: Any = None) -> None:
        if not self.run_panel.busy:
            self.run()

    # ---- run -----------------------------------------------------------------------------
    def run_config(self) -> RunConfig:
        """The :class:`RunConfig` the controls describe (raises ValueError when invalid)."""
        config = RunConfig(**self.options.config_kwargs(), **self.source.channel_options(),
                           channel_axis=self.source.channel_axis(), **self.thresholds())
        config.validate()
        return config

    def _build_job(self) -> PendingRun:
        from .geometry import SourceGeometry

        layer = self.current_layer()
        if layer is None:
            raise ValueError(f"Add an image layer ({sample_menu_hint()}) and choose it under "
                             "'Image'.")
        if layer.multiscale:
            raise ValueError(f"{layer.name!r} is a multiscale (pyramid) image; add one level as "
                             "its own image layer (e.g. layer.data[1]) and run on that.")
        axis = self.source.channel_axis()
        geometry = SourceGeometry.from_layer(layer, axis)
        config = self.run_config()
        # napari's image axes are the last two (three with RGB): no layout guessing here
        stack = PlaneStack(layer.data, geometry.stack_axes,
                           layer.data.ndim - 1 if layer.rgb else axis, bool(layer.rgb))
        job = Job(self.model_spec(), stack, self.source.planes(layer, geometry), config,
                  task_id=self.run_panel.next_task_id())
        return PendingRun(job, layer, geometry)

    def run(self) -> Any:
        """Start a run on the chosen layer; returns the worker (None if it could not start)."""
        if self.run_panel.busy:
            self.run_panel.show_error("A run is already in progress; cancel it first.")
            return None
        try:
            pending = self._build_job()
        except ValueError as err:
            self.run_panel.show_error(str(err))
            return None
        self._pending = pending
        self.last_outcome = None
        name, n = pending.layer.name, len(pending.job.planes)
        worker = self.run_panel.start(run_job, pending.job,
                                      description=f"Attention regularization: {name}")
        self.run_panel.show_status(f"Running on {name!r}" + (f" ({n} planes)" if n > 1 else "")
                                   + "…")
        return worker

    def cancel(self) -> None:
        """Stop the running job at its next chunk; nothing it computed is added."""
        self.run_panel.cancel()

    def _on_returned(self, outcome: Outcome) -> None:
        pending = self._pending
        if self._detached or pending is None:  # the dock was closed: add nothing
            outcome.results, outcome.status = {}, "cancelled"
            return
        if not outcome.results:
            if outcome.status == "cancelled":
                self.run_panel.show_status("Cancelled; nothing was added.")
            else:
                self.run_panel.show_error(outcome.message)
            return
        problem = pending.problem(self.viewer, outcome)
        if problem is not None:
            outcome.results, outcome.status, outcome.message = {}, "failed", problem
            self.run_panel.show_error(problem)
            return
        self._attach(outcome, pending)
        if not outcome.ok:  # cancelled or partly failed: the finished planes, and what is missing
            from napari.utils.notifications import show_warning

            missing = ", ".join(str(p) for p in outcome.missing(pending.job.planes))
            text = f"{outcome.message} Not computed: {missing}."
            self.run_panel.show_status(f"<span style='color:#e0a030'>{text}</span><br>"
                                       + self.run_panel.status_label.text())
            show_warning(text)

    def _attach(self, outcome: Outcome, pending: PendingRun) -> None:
        from .geometry import SourceGeometry

        source, spec = pending.layer, pending.job
        geometry = SourceGeometry.from_layer(source, pending.geometry.channel_axis)  # moved?
        params = {k: v for k, v in asdict(spec.config).items() if k != "extra"}
        planes_run = [p for p in spec.planes if p in outcome.results]
        params.update(model=spec.model.label(), model_description=outcome.model_description,
                      source=source.name, planes_run=[list(p) for p in planes_run],
                      elapsed_s=round(outcome.elapsed_s, 3),
                      device_used=next(iter(outcome.results.values())).metadata.get("device"))
        record = RunRecord(source.unique_id, source.name, geometry, dict(outcome.results), params,
                           self.thresholds())
        old = self._records.get(source.unique_id)
        if old is not None:
            if geometry.stack_axes and len(planes_run) < len(geometry.planes()) \
                    and old.merge(record):
                record = old  # another slice of the same stack: keep the planes computed before
            else:
                record.outputs = old.outputs  # a re-run updates this dock's layers in place
        record.thresholds = self.thresholds()
        self._records[source.unique_id] = record
        upsert_outputs(self.viewer, record)
        self._follow_source(source)
        self._show_summary(record)
        notify_diagnostics(record)
        self.save_button.setEnabled(True)
        self.roi_panel.update_table()
        self.outputs_updated.emit(record)

    def _on_finished(self, outcome: Outcome) -> None:
        self._pending = None
        self.last_outcome = outcome
        if not self._detached:
            self.run_finished.emit(outcome)

    def _show_summary(self, record: RunRecord) -> None:
        html, status = summary_html(record)
        self.run_panel.show_status(html)
        self.viewer.status = status

    # ---- thresholds and source transform -------------------------------------------------
    def apply_thresholds(self, *_: Any) -> None:
        """Re-threshold the selected image's results into its regularized and Labels layers."""
        record = self.current_record()
        if record is None or self._detached:
            return
        record.thresholds = self.thresholds()
        self._sync_geometry(record)
        refresh_thresholds(self.viewer, record)
        self._show_summary(record)  # the count follows the thresholds
        self.roi_panel.update_table()
        self.outputs_updated.emit(record)

    def _sync_geometry(self, record: RunRecord) -> None:
        """Take the source layer's current transform (the analyst may have rescaled it)."""
        from .geometry import SourceGeometry

        source = next((lay for lay in self.viewer.layers if lay.unique_id == record.source_id),
                      None)
        if source is None:
            return
        geometry = SourceGeometry.from_layer(source, record.geometry.channel_axis)
        if geometry.shape == record.geometry.shape and not geometry.same_grid(record.geometry):
            record.geometry = geometry
            place_outputs(self.viewer, record)

    def _follow_source(self, source: Any) -> None:
        for name in TRANSFORM_EVENTS:
            getattr(source.events, name).connect(self._on_source_moved)

    def _on_source_moved(self, event: Any) -> None:
        record = self._records.get(getattr(event.source, "unique_id", None))
        if record is not None and not self._detached:
            self._sync_geometry(record)

    # ---- closing the dock ------------------------------------------------------------------
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
        for record in self._records.values():
            source = next((lay for lay in self.viewer.layers
                           if lay.unique_id == record.source_id), None)
            for name in TRANSFORM_EVENTS if source is not None else ():
                getattr(source.events, name).disconnect(self._on_source_moved)
        from napari.utils.key_bindings import KeyBinding

        key = KeyBinding.from_str(RUN_SHORTCUT)
        if self.viewer.keymap.get(key) == self._on_run_shortcut:  # another dock may own it now
            self.viewer.bind_key(RUN_SHORTCUT, None)

"""The 'Attention Regularization' dock widget: an assembly of small panels.

- :class:`.source_panel.SourcePanel`: image, planes, channels (follows napari's selection)
- :class:`.model_picker.ModelPanel`: where the model comes from
- :class:`.options_panel.OptionsPanel`: device, bootstrap, preset, tiling, advanced
- :class:`.thresholds_panel.ThresholdsPanel`: live thresholds (no recomputation)
- :class:`.run_panel.RunPanel`: Run/Cancel, progress, task ids, one worker at a time
- :class:`.roi_panel.RoiPanel`: per-ROI statistics and CSV export

This module builds the job from the panels and applies its outcome to the viewer: output
layers are tracked per run by object identity (:class:`.run_record.RunRecord`), so copies the
analyst makes and the layers of another dock are never overwritten.
"""

# ruff: noqa: E402  (the Triton guard must run before the imports that load timm)
from __future__ import annotations

from typing import Any

from qtpy.QtCore import QEvent, Signal
from qtpy.QtWidgets import QFormLayout, QGroupBox, QVBoxLayout, QWidget

from napari_attnreg._napari._compat import avoid_triton_llvm_clash

avoid_triton_llvm_clash()  # before anything below can import timm (see core.triton_guard)

from napari_attnreg._napari.dock_scroll import VerticalScroll
from napari_attnreg._napari.layers import refresh_thresholds
from napari_attnreg._napari.model_picker import ModelPanel
from napari_attnreg._napari.options_panel import OptionsPanel
from napari_attnreg._napari.pending import PendingRun
from napari_attnreg._napari.records import RunRecords
from napari_attnreg._napari.results_io import SaveButton, sample_menu_hint
from napari_attnreg._napari.roi_panel import RoiPanel
from napari_attnreg._napari.run_panel import RunPanel
from napari_attnreg._napari.run_record import RunRecord
from napari_attnreg._napari.settings import run_defaults
from napari_attnreg._napari.source_panel import SourcePanel
from napari_attnreg._napari.status import (
    WARNING_COLOR,
    help_link,
    notify_diagnostics,
    summary_html,
    warn_missing_planes,
)
from napari_attnreg._napari.thresholds_panel import ThresholdsPanel
from napari_attnreg.core.run.engine import RunConfig
from napari_attnreg.core.run.planes import PlaneStack
from napari_attnreg.core.run.service import Job, ModelSpec, Outcome, run_job


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
        self._records = RunRecords(self.viewer, on_source_moved=self.outputs_updated.emit)
        self._pending: PendingRun | None = None
        self._docked = False
        self._detached = False
        self.last_outcome: Outcome | None = None

        self.title = help_link()
        self.source = SourcePanel(self.viewer)
        self.model = ModelPanel()
        model_form = QFormLayout()
        model_form.addRow("Model", self.model)
        self.options = OptionsPanel()
        defaults = run_defaults()  # the user's plugin settings (napari Preferences)
        self.model.apply_setting(defaults.model)
        self.options.apply_settings(defaults)
        self.thresholds_panel = ThresholdsPanel()
        self.run_panel = RunPanel()
        self.save_button = SaveButton(self)
        self.roi_panel = RoiPanel(self.viewer, self.current_record)
        roi_group = QGroupBox("ROI statistics vs significant attention")
        QVBoxLayout(roi_group).addWidget(self.roi_panel)
        content = QWidget()
        layout = QVBoxLayout(content)
        for part in (self.title, self.source, model_form, self.options, self.thresholds_panel,
                     self.run_panel, self.save_button, roi_group):
            (layout.addLayout if isinstance(part, QFormLayout) else layout.addWidget)(part)
        layout.addStretch(1)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(VerticalScroll(content))  # a short window scrolls the dock

        self.source.layer_changed.connect(self._on_layer_changed)
        self.options.preset_changed.connect(self._on_preset_changed)
        self.thresholds_panel.changed.connect(self.apply_thresholds)
        self.run_panel.run_requested.connect(self.run)
        self.run_panel.returned.connect(self._on_returned)
        self.run_panel.finished.connect(self._on_finished)
        self.run_panel.bind_shortcut(self.viewer, self._on_run_shortcut)
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
        return self._records.get(self.current_layer())

    def records(self) -> list[RunRecord]:
        return self._records.values()

    # ---- reactions -------------------------------------------------------------------------
    def _on_preset_changed(self, preset: str) -> None:
        from napari_attnreg.core.stats.presets import default_thresholds

        self.thresholds_panel.offer_rules(preset)
        self.thresholds_panel.set_thresholds(default_thresholds(preset))

    def _on_layer_changed(self) -> None:
        self._records.tidy()
        has_image = self.current_layer() is not None
        self.run_panel.set_can_run(has_image, "" if has_image else
                                   f"Add an image layer first ({sample_menu_hint()}).")
        self.save_button.setEnabled(self.current_record() is not None)
        self.roi_panel.update_table()

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
        from napari_attnreg._napari.geometry import SourceGeometry

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
        record = self._records.attach(outcome, pending, self.thresholds())
        self._show_summary(record)
        notify_diagnostics(record)
        self.save_button.setEnabled(True)
        self.roi_panel.update_table()
        self.outputs_updated.emit(record)
        if not outcome.ok:  # cancelled or partly failed: the finished planes, and what is missing
            text = warn_missing_planes(outcome, pending.job.planes)
            self.run_panel.show_status(f"<span style='color:{WARNING_COLOR}'>{text}</span><br>"
                                       + self.run_panel.status_label.text())

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
        self._records.sync_geometry(record)
        refresh_thresholds(self.viewer, record)
        self._show_summary(record)  # the count follows the thresholds
        self.roi_panel.update_table()
        self.outputs_updated.emit(record)

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
        self._records.stop_following()
        self.run_panel.unbind_shortcut(self.viewer, self._on_run_shortcut)

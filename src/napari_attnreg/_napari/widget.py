"""The 'Attention Regularization' dock widget.

One worker at a time (napari ``thread_worker`` over :func:`.jobs.run_job`, itself driving
the core generator), task ids so a cancelled or superseded run never adds layers, Cancel
through the core's :class:`CancelToken` so the generator always ends on its own thread,
and thresholds that re-threshold the stored results without recomputing anything.
"""

from __future__ import annotations

import html
import time
from dataclasses import asdict
from typing import Any

import numpy as np
from qtpy.QtCore import Qt, QTimer, Signal
from qtpy.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)
from superqt import QCollapsible, QLabeledDoubleSlider

from ..core.directional import NULL_POOLS
from ..core.display import (
    PRESET_HELP,
    RULE_HELP,
    RULE_LABELS,
    TILED_LABEL,
    TILING_HELP,
    run_caption,
    significance_caption,
    unique_diagnostics,
)
from ..core.engine import CancelToken, RunConfig, resolve_device
from ..core.presets import DEFAULT_PRESET, PRESET_DEFAULTS, PRESETS, default_thresholds
from ..core.regularize import RULES
from ..core.stats import ALTERNATIVES, NULL_MODELS, P_METHODS, PI0_METHODS
from ..core.tiling import TILE_OVERLAP_MAX, TILE_SCALE_RANGE
from .jobs import JobOutcome, JobProgress, JobSpec, ModelSpec, run_job
from .layers import (
    KINDS,
    META_KEY,
    RunRecord,
    SourceGeometry,
    find_output,
    layer_name,
    refresh_thresholds,
    upsert_outputs,
)
from .model_picker import CataloguePicker
from .roi_panel import RoiPanel

#: UI default = the engine's (200): with the demo model a 512×512 image takes a few seconds on a
#: laptop CPU (see benchmarks/bench_napari_responsiveness.py); p resolution is 1 / (T·(B + 1)).
DEFAULT_N_BOOT = RunConfig().n_boot
#: The engine's defaults for the tiling options (untiled; native pixels, no overlap).
RUN_DEFAULTS = RunConfig()
#: Shortest interval between progress-display refreshes (seconds), see ``_on_progress``.
UI_UPDATE_S = 0.5
MODEL_SOURCES = {"demo": "demo (bundled)", "catalogue": "known model (catalogue)",
                 "timm": "timm model name", "file": "weights file"}
#: z threshold shown while the z mask is off (the paper's 0, a natural first value).
Z_TH_WHEN_ON = 0.0
WARNING_COLOR = "#e0a030"


def _select(combo: QComboBox, text: str) -> None:
    """Show ``text`` in a combo box, adding it if the core gained a choice the box lacks
    (never silently keep another value)."""
    if combo.findText(text) < 0:
        combo.addItem(text)
    combo.setCurrentText(text)


def _make_worker_class():
    from napari.qt.threading import GeneratorWorker

    class RunWorker(GeneratorWorker):
        """Quit (also napari's activity-dock cancel) = cancel the token, not abandon the generator.

        An abandoned generator would be finalised later on another thread, with torch's
        thread-local inference mode still open; cancelling lets it end where it runs.
        """

        cancel_token: CancelToken | None = None

        def quit(self) -> None:
            if self.cancel_token is not None:
                self.cancel_token.cancel()
            else:
                super().quit()

    return RunWorker


class AttentionWidget(QWidget):
    """Dock widget: controls, Run/Cancel with progress, live thresholds and the ROI table.

    Parameters
    ----------
    napari_viewer : napari.Viewer

    Notes
    -----
    Programmatic use (tests, scripts): :meth:`set_model` accepts a ``Backbone`` or
    ``nn.Module``; :meth:`run` starts a job and returns the worker; the ``run_finished``
    signal fires once the outcome was applied (layers added) or dropped.
    """

    #: Also show progress in napari's activity dock. napari then animates a "busy" GIF in the
    #: status bar for the whole run; with software OpenGL (Mesa llvmpipe: CI, VMs, remote
    #: desktops) every frame recomposites the window, which costs CPU the run would use.
    activity_progress: bool = True

    run_finished = Signal(object)  # JobOutcome
    outputs_updated = Signal(object)  # RunRecord, after a run or a threshold change

    def __init__(self, napari_viewer: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.viewer = napari_viewer
        self.worker: Any = None
        self._task_id = 0
        self._cancel: CancelToken | None = None
        self._pbar: Any = None
        self._pending: JobSpec | None = None
        self._last_ui_update = 0.0
        self._pending_geometry: SourceGeometry | None = None
        self._pending_source: Any = None
        self._records: dict[Any, RunRecord] = {}
        self._custom_model: ModelSpec | None = None
        self.last_outcome: JobOutcome | None = None
        self._build_ui()
        self._connect_viewer()
        self._refresh_layers()
        self._on_layer_changed()
        self._on_device_changed()
        self._on_method_changed()
        self._on_model_source_changed()

    # ================================================================ UI
    def _build_ui(self) -> None:
        layout = QVBoxLayout(self)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
        layout.addLayout(form)
        self._form = form

        self.layer_combo = QComboBox()
        self.layer_combo.setToolTip("Image layer to analyse; follows layers being added, removed, renamed.")
        form.addRow("Image", self.layer_combo)

        self.scope_combo = QComboBox()
        self.scope_combo.addItems(["current slice", "all slices"])
        self.scope_combo.setToolTip("For nD images: the slice shown now, or every plane (output "
                                    "layers are stacked along the same axes).")
        form.addRow("Planes", self.scope_combo)

        self.channel_box = QWidget()
        ch = QHBoxLayout(self.channel_box)
        ch.setContentsMargins(0, 0, 0, 0)
        self.channel_axis_combo = QComboBox()
        self.channel_axis_combo.setToolTip("Axis holding fluorescence channels (not a z/t axis).")
        self.channels_edit = QLineEdit()
        self.channels_edit.setPlaceholderText("channels e.g. 0,2")
        self.channels_edit.setToolTip("Up to three channels mapped to R, G, B; empty = all (≤ 3).")
        self.merge_combo = QComboBox()
        self.merge_combo.addItems(["no merge", "mean", "max"])
        self.merge_combo.setToolTip("Merge the channels into one grayscale image instead.")
        ch.addWidget(self.channel_axis_combo)
        ch.addWidget(self.channels_edit)
        ch.addWidget(self.merge_combo)
        form.addRow("Channels", self.channel_box)

        model_box = QWidget()
        mb = QVBoxLayout(model_box)
        mb.setContentsMargins(0, 0, 0, 0)
        self.model_combo = QComboBox()
        for key, text in MODEL_SOURCES.items():
            self.model_combo.addItem(text, key)
        self.timm_edit = QLineEdit()
        self.timm_edit.setPlaceholderText("e.g. vit_small_patch8_224.dino (needs internet once)")
        self.file_box = QWidget()
        fb = QHBoxLayout(self.file_box)
        fb.setContentsMargins(0, 0, 0, 0)
        self.weights_edit = QLineEdit()
        self.weights_edit.setPlaceholderText("weights .safetensors / .pth / .ckpt")
        self.browse_button = QPushButton("…")
        self.browse_button.setMaximumWidth(30)
        self.arch_edit = QLineEdit()
        self.arch_edit.setPlaceholderText("timm arch or catalogue id")
        fb.addWidget(self.weights_edit, 3)
        fb.addWidget(self.browse_button)
        fb.addWidget(self.arch_edit, 2)
        mb.addWidget(self.model_combo)
        self.catalogue_picker = CataloguePicker()
        mb.addWidget(self.catalogue_picker)
        mb.addWidget(self.timm_edit)
        mb.addWidget(self.file_box)
        form.addRow("Model", model_box)

        self.tiled_check = QCheckBox(TILED_LABEL)
        self.tiled_check.setChecked(RUN_DEFAULTS.tiled)
        self.tiled_check.setToolTip(TILING_HELP["tiled"] + " Tile overlap and downsampling are "
                                    "under Advanced; 'Model input' does not apply.")
        form.addRow("Tiling", self.tiled_check)

        dev = QHBoxLayout()
        self.device_combo = QComboBox()
        self.device_combo.addItems(["auto", "cuda", "mps", "cpu"])
        self.device_label = QLabel()
        dev.addWidget(self.device_combo)
        dev.addWidget(self.device_label, 1)
        form.addRow("Device", dev)

        meth = QHBoxLayout()
        self.method_combo = QComboBox()
        self.method_combo.addItems(["normal", "uniform", "pixel", "patch"])
        self.method_combo.setToolTip("Bootstrap null images: noise made from the image itself ('normal' is the paper's; 'patch' shuffles the image's own blocks).")
        self.std_factor_spin = QDoubleSpinBox()
        self.std_factor_spin.setRange(0.05, 10.0)
        self.std_factor_spin.setSingleStep(0.1)
        self.std_factor_spin.setValue(1.0)
        self.std_factor_spin.setPrefix("std × ")
        self.std_factor_spin.setMinimumWidth(95)
        self.block_size_spin = QSpinBox()
        self.block_size_spin.setRange(0, 512)
        self.block_size_spin.setSpecialValueText("block = patch")
        self.block_size_spin.setPrefix("block ")
        self.block_size_spin.setMinimumWidth(110)
        self.per_channel_check = QCheckBox("per channel")
        self.per_channel_check.setChecked(True)
        meth.addWidget(self.method_combo)
        meth.addWidget(self.std_factor_spin)
        meth.addWidget(self.block_size_spin)
        meth.addWidget(self.per_channel_check)
        form.addRow("Bootstrap", meth)

        self.n_boot_spin = QSpinBox()
        self.n_boot_spin.setRange(1, 100_000)
        self.n_boot_spin.setValue(DEFAULT_N_BOOT)
        self.n_boot_spin.setToolTip("Number of bootstrap (null) images B.")
        form.addRow("Null images", self.n_boot_spin)

        self.seed_spin = QSpinBox()
        self.seed_spin.setRange(0, 2**31 - 1)
        self.seed_spin.setToolTip("Seed of the null images: the same seed gives the same result.")
        form.addRow("Seed", self.seed_spin)

        self.preset_combo = QComboBox()
        for preset in PRESETS:
            self.preset_combo.addItem(preset, preset)
            self.preset_combo.setItemData(self.preset_combo.count() - 1, PRESET_HELP[preset],
                                          Qt.ItemDataRole.ToolTipRole)
        self.preset_combo.setCurrentIndex(self.preset_combo.findData(DEFAULT_PRESET))
        self.preset_combo.setToolTip("Which question the statistics answer.\n" + "\n".join(
            f"• {PRESET_HELP[p]}" for p in PRESETS) + "\nChanging it resets the thresholds "
            "to the preset's defaults; press Run to compute with it.")
        form.addRow("Statistics", self.preset_combo)

        # ---- advanced
        adv = QWidget()
        af = QFormLayout(adv)
        self.chunk_spin = QSpinBox()
        self.chunk_spin.setRange(0, 4096)
        self.chunk_spin.setSpecialValueText("auto")
        self.chunk_spin.setToolTip("Null images per forward pass (auto: from free memory). Cancel "
                                   "and progress act once per chunk.")
        af.addRow("Chunk size", self.chunk_spin)
        self.head_spin = QSpinBox()
        self.head_spin.setRange(-1, 255)
        self.head_spin.setSpecialValueText("mean")
        self.head_spin.setValue(-1)
        self.head_spin.setToolTip("Attention head: mean over heads (paper) or one head index.")
        af.addRow("Head", self.head_spin)
        pv = QHBoxLayout()
        self.p_method_combo = QComboBox()
        self.p_method_combo.addItems(list(P_METHODS))
        self.p_method_combo.setToolTip("pooled: paper; null: conservative (1 + #null ≥ obs)/(1 + BT).")
        self.alternative_combo = QComboBox()
        self.alternative_combo.addItems(list(ALTERNATIVES))
        pv.addWidget(self.p_method_combo)
        pv.addWidget(self.alternative_combo)
        af.addRow("p-value", pv)
        self.pi0_combo = QComboBox()
        self.pi0_combo.addItems(list(PI0_METHODS))
        self.pi0_combo.setToolTip("π0 estimator (proportion of null patches): each preset "
                                  "sets its own; reference = the paper's.")
        af.addRow("π0", self.pi0_combo)
        self.null_combo = QComboBox()
        self.null_combo.addItems(list(NULL_MODELS))
        self.null_combo.setToolTip("lfdr null: theoretical N(0,1) (paper) or Efron's empirical null.")
        af.addRow("lfdr null", self.null_combo)
        self.null_pool_combo = QComboBox()
        self.null_pool_combo.addItems(list(NULL_POOLS))
        self.null_pool_combo.setToolTip("Directional only. pooled: compare each patch with every "
                                        "null patch; position: only with its own position "
                                        "(ignores position-locked attention, e.g. border tokens).")
        af.addRow("Null pool", self.null_pool_combo)
        self.size_combo = QComboBox()
        self.size_combo.addItems(["model default", "native", "224", "448", "896"])
        self.size_combo.setToolTip("Long side the image is resized to for the model.")
        af.addRow("Model input", self.size_combo)
        self.tile_overlap_spin = QSpinBox()
        self.tile_overlap_spin.setRange(0, TILE_OVERLAP_MAX)
        self.tile_overlap_spin.setValue(RUN_DEFAULTS.tile_overlap)
        self.tile_overlap_spin.setSuffix(" px")
        self.tile_overlap_spin.setToolTip(TILING_HELP["tile_overlap"])
        af.addRow("Tile overlap", self.tile_overlap_spin)
        self.tile_scale_spin = QDoubleSpinBox()
        self.tile_scale_spin.setRange(*TILE_SCALE_RANGE)
        self.tile_scale_spin.setDecimals(2)
        self.tile_scale_spin.setSingleStep(0.5)
        self.tile_scale_spin.setValue(RUN_DEFAULTS.tile_scale)
        self.tile_scale_spin.setPrefix("÷ ")
        self.tile_scale_spin.setToolTip(TILING_HELP["tile_scale"])
        af.addRow("Tile downsampling", self.tile_scale_spin)
        self.advanced = QCollapsible("Advanced")
        self.advanced.addWidget(adv)
        layout.addWidget(self.advanced)

        # ---- thresholds (live)
        thr = QGroupBox("Thresholds (live, no recomputation)")
        thr.setToolTip("Moving these redraws the regularized and significant layers of the chosen "
                       "image (edits painted into its significant labels are replaced).")
        tf = QFormLayout(thr)
        defaults = default_thresholds(DEFAULT_PRESET)
        self.rule_combo = QComboBox()
        for rule in RULES:
            self.rule_combo.addItem(RULE_LABELS[rule], rule)
            self.rule_combo.setItemData(self.rule_combo.count() - 1, RULE_HELP[rule],
                                        Qt.ItemDataRole.ToolTipRole)
        self.rule_combo.setToolTip("Which patches count as significant (the regularized map keeps "
                                   "their attention, the outline marks them).")
        self.q_th_slider = self._slider(0.0, 1.0, defaults["q_th"], 3)
        self.q_th_slider.setToolTip("q ≤: false discovery rate; 0.1 = about 10% of the "
                                    "highlighted patches may be noise (rule 'q').")
        self.p_th_slider = self._slider(0.0, 1.0, defaults["p_th"], 3)
        self.p_th_slider.setToolTip("p ≤: per-patch p-value threshold (rule 'p').")
        self.l_th_slider = self._slider(0.0, 1.0, defaults["l_th"], 3)
        self.l_th_slider.setToolTip("lfdr ≤: local false discovery rate threshold (rule 'lfdr'); "
                                    "posterior = 1 − lfdr.")
        self.z_mask_check = QCheckBox("z mask")
        self.z_mask_check.setToolTip("Also require z ≥ threshold (the paper's mask, on by default "
                                     "under 'paper'). Off: no z mask (the directional default).")
        self.z_th_slider = self._slider(-3.0, 5.0, Z_TH_WHEN_ON, 2)
        self.z_th_slider.setToolTip("z ≥: standardised log-attention threshold of the z mask.")
        z_row = QHBoxLayout()
        z_row.addWidget(self.z_mask_check)
        z_row.addWidget(self.z_th_slider, 1)
        tf.addRow("Rule", self.rule_combo)
        tf.addRow("q ≤", self.q_th_slider)
        tf.addRow("p ≤", self.p_th_slider)
        tf.addRow("lfdr ≤", self.l_th_slider)
        tf.addRow("z ≥", z_row)
        layout.addWidget(thr)

        # ---- run
        buttons = QHBoxLayout()
        self.run_button = QPushButton("Run")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        layout.addLayout(buttons)
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setValue(0)
        self.progress_bar.setTextVisible(False)
        layout.addWidget(self.progress_bar)
        self.status_label = QLabel("Ready.")
        self.status_label.setWordWrap(True)
        self.status_label.setTextFormat(Qt.TextFormat.RichText)
        self.status_label.setToolTip("Progress, then the run's model, significance count and "
                                     "diagnostics (⚠ = read the maps with care).")
        layout.addWidget(self.status_label)

        roi_group = QGroupBox("ROI statistics vs significant attention")
        rl = QVBoxLayout(roi_group)
        self.roi_panel = RoiPanel(self.viewer, self.current_record)
        rl.addWidget(self.roi_panel)
        layout.addWidget(roi_group)
        layout.addStretch(1)

        # threshold slider drags fire many events: re-threshold once per short pause
        self._threshold_timer = QTimer(self)
        self._threshold_timer.setSingleShot(True)
        self._threshold_timer.setInterval(40)
        self._threshold_timer.timeout.connect(self.apply_thresholds)

        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)
        self.layer_combo.currentIndexChanged.connect(self._on_layer_changed)
        self.channel_axis_combo.currentIndexChanged.connect(self._on_channel_axis_changed)
        self.model_combo.currentIndexChanged.connect(self._on_model_source_changed)
        self.browse_button.clicked.connect(self._browse_weights)
        self.device_combo.currentIndexChanged.connect(self._on_device_changed)
        self.method_combo.currentIndexChanged.connect(self._on_method_changed)
        self.tiled_check.toggled.connect(self._on_tiled_toggled)
        self.preset_combo.currentIndexChanged.connect(self._on_preset_changed)
        self.rule_combo.currentIndexChanged.connect(self._schedule_thresholds)
        self.z_mask_check.toggled.connect(self._on_z_mask_toggled)
        for slider in (self.q_th_slider, self.p_th_slider, self.l_th_slider, self.z_th_slider):
            slider.valueChanged.connect(self._schedule_thresholds)
        self._on_preset_changed()
        self._on_tiled_toggled(self.tiled_check.isChecked())

    @staticmethod
    def _slider(lo: float, hi: float, value: float, decimals: int) -> QLabeledDoubleSlider:
        s = QLabeledDoubleSlider(Qt.Orientation.Horizontal)
        s.setRange(lo, hi)
        s.setDecimals(decimals)
        s.setSingleStep(10.0 ** -decimals * 10)
        s.setValue(value)
        return s

    # ================================================================ preset
    def preset(self) -> str:
        return self.preset_combo.currentData()

    def _on_preset_changed(self, *_: Any) -> None:
        """Thresholds and statistics options take the preset's defaults (one threshold update)."""
        preset = self.preset()
        defaults = PRESET_DEFAULTS[preset]
        self._set_thresholds(default_thresholds(preset))
        for key, combo in (("p_method", self.p_method_combo), ("alternative", self.alternative_combo),
                           ("pi0_method", self.pi0_combo), ("null", self.null_combo),
                           ("null_pool", self.null_pool_combo)):
            _select(combo, str(defaults[key]))
        directional = preset == "directional"
        for combo in (self.p_method_combo, self.alternative_combo, self.null_combo):
            combo.setEnabled(not directional)  # fixed by construction: one-sided p⁺, lfdr⁺ from p⁺
        self.null_pool_combo.setEnabled(directional)

    def _set_thresholds(self, thresholds: dict[str, Any]) -> None:
        controls = (self.rule_combo, self.z_mask_check, self.q_th_slider, self.p_th_slider,
                    self.l_th_slider, self.z_th_slider)
        for control in controls:
            control.blockSignals(True)
        self.rule_combo.setCurrentIndex(self.rule_combo.findData(thresholds["rule"]))
        for key, slider in (("q_th", self.q_th_slider), ("p_th", self.p_th_slider),
                            ("l_th", self.l_th_slider)):
            slider.setValue(float(thresholds[key]))
        z_on = thresholds["z_th"] is not None
        self.z_mask_check.setChecked(z_on)
        self.z_th_slider.setValue(float(thresholds["z_th"]) if z_on else Z_TH_WHEN_ON)
        self.z_th_slider.setEnabled(z_on)
        for control in controls:
            control.blockSignals(False)
        self._schedule_thresholds()

    def _on_z_mask_toggled(self, on: bool) -> None:
        self.z_th_slider.setEnabled(on)
        self._schedule_thresholds()

    # ================================================================ layer list
    def _connect_viewer(self) -> None:
        ev = self.viewer.layers.events
        for emitter in (ev.inserted, ev.removed, ev.moved, ev.renamed):
            emitter.connect(self._refresh_layers)

    def image_layers(self) -> list[Any]:
        from napari.layers import Image

        return [layer for layer in self.viewer.layers
                if isinstance(layer, Image) and not self._is_output(layer)]

    @staticmethod
    def _is_output(layer: Any) -> bool:
        return isinstance(layer.metadata, dict) and "attnreg" in layer.metadata

    def _refresh_layers(self, event: Any = None) -> None:
        current = self.current_layer()
        layers = self.image_layers()
        self.layer_combo.blockSignals(True)
        self.layer_combo.clear()
        for layer in layers:
            self.layer_combo.addItem(layer.name, layer)
        if current in layers:
            self.layer_combo.setCurrentIndex(layers.index(current))
        elif layers:
            self.layer_combo.setCurrentIndex(len(layers) - 1)  # the newest image
        self.layer_combo.blockSignals(False)
        alive = {layer.unique_id for layer in self.viewer.layers}
        for key in [k for k in self._records if k not in alive]:
            del self._records[key]
        for layer in layers:
            record = self._records.get(layer.unique_id)
            if record is not None and record.source_name != layer.name:
                self._rename_outputs(record, layer.name)
        if self.current_layer() is not current:
            self._on_layer_changed()

    def _rename_outputs(self, record: RunRecord, new_name: str) -> None:
        """Output layers follow a renamed input, unless the analyst renamed them already."""
        old_name, record.source_name = record.source_name, new_name
        for kind in KINDS:
            out = find_output(self.viewer, record.source_id, kind)
            if out is not None:
                out.metadata[META_KEY]["source"] = new_name
                if out.name == layer_name(old_name, kind, record.preset):
                    out.name = layer_name(new_name, kind, record.preset)

    def current_layer(self) -> Any | None:
        return self.layer_combo.currentData() if self.layer_combo.count() else None

    def set_layer(self, layer: Any) -> None:
        """Choose the image layer programmatically."""
        for i in range(self.layer_combo.count()):
            if self.layer_combo.itemData(i) is layer:
                self.layer_combo.setCurrentIndex(i)
                return
        raise ValueError(f"{getattr(layer, 'name', layer)!r} is not an image layer of this viewer.")

    def _on_layer_changed(self, *_: Any) -> None:
        layer = self.current_layer()
        self.channel_axis_combo.blockSignals(True)
        self.channel_axis_combo.clear()
        self.channel_axis_combo.addItem("no channel axis", None)
        multi = layer is not None and not layer.rgb and layer.ndim > 2
        if multi:
            shape = layer.data[0].shape if layer.multiscale else layer.data.shape
            for axis in range(layer.ndim - 2):
                self.channel_axis_combo.addItem(f"axis {axis} ({shape[axis]})", axis)
        self.channel_axis_combo.blockSignals(False)
        self._set_row_visible(self.channel_box, multi)
        self._on_channel_axis_changed()
        self.roi_panel.update_table()

    def _on_channel_axis_changed(self, *_: Any) -> None:
        layer = self.current_layer()
        axis = self.channel_axis_combo.currentData()
        stack = layer is not None and (layer.ndim - 2 - (axis is not None)) > 0
        self._set_row_visible(self.scope_combo, stack)
        self.channels_edit.setEnabled(axis is not None)
        self.merge_combo.setEnabled(axis is not None)

    def _set_row_visible(self, field: QWidget, visible: bool) -> None:
        field.setVisible(visible)
        label = self._form.labelForField(field)
        if label is not None:
            label.setVisible(visible)

    # ================================================================ model / device / method
    def _on_model_source_changed(self, *_: Any) -> None:
        source = self.model_combo.currentData()
        self.catalogue_picker.setVisible(source == "catalogue")
        self.timm_edit.setVisible(source == "timm")
        self.file_box.setVisible(source == "file")

    def _browse_weights(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Model weights", "", "Weights (*.safetensors *.pth *.pt *.ckpt *.bin);;All (*)")
        if path:
            self.weights_edit.setText(path)

    def set_model(self, model: Any, name: str | None = None) -> None:
        """Use a ``Backbone`` or ``nn.Module`` given in code (tests, scripts)."""
        label = name or getattr(model, "name", None) or type(model).__name__
        self._custom_model = ModelSpec("module", f"{label} (given)", module=model)
        index = self.model_combo.findData("module")
        if index < 0:
            self.model_combo.addItem(self._custom_model.name, "module")
            index = self.model_combo.count() - 1
        else:
            self.model_combo.setItemText(index, self._custom_model.name)
        self.model_combo.setCurrentIndex(index)

    def model_spec(self) -> ModelSpec:
        source = self.model_combo.currentData()
        if source == "module" and self._custom_model is not None:
            return self._custom_model
        if source == "catalogue":
            return ModelSpec("catalogue", self.catalogue_picker.model_id())
        if source == "timm":
            return ModelSpec("timm", self.timm_edit.text().strip())
        if source == "file":
            return ModelSpec("file", self.weights_edit.text().strip(),
                             arch=self.arch_edit.text().strip() or None)
        return ModelSpec("demo", "demo")

    def _on_device_changed(self, *_: Any) -> None:
        choice = self.device_combo.currentText()
        try:
            dev = resolve_device(choice)
        except ValueError:
            self.device_label.setText("<span style='color:#e55'>not available here</span>")
            return
        text = f"→ {dev.type}"
        if dev.type == "cuda":
            import torch

            text += f" ({torch.cuda.get_device_name(dev)})"
        self.device_label.setText(text)

    def _on_method_changed(self, *_: Any) -> None:
        method = self.method_combo.currentText()
        self.std_factor_spin.setVisible(method == "normal")
        self.block_size_spin.setVisible(method == "patch")
        self.per_channel_check.setVisible(method in ("normal", "uniform"))

    def _on_tiled_toggled(self, tiled: bool) -> None:
        self.tile_overlap_spin.setEnabled(tiled)
        self.tile_scale_spin.setEnabled(tiled)
        self.size_combo.setEnabled(not tiled)  # tiles are the model's input size

    # ================================================================ run configuration
    def thresholds(self) -> dict[str, Any]:
        """Rule and thresholds as the controls set them (``z_th`` None: z mask off)."""
        z_th = float(self.z_th_slider.value()) if self.z_mask_check.isChecked() else None
        return {"rule": self.rule_combo.currentData(), "z_th": z_th,
                "p_th": float(self.p_th_slider.value()), "l_th": float(self.l_th_slider.value()),
                "q_th": float(self.q_th_slider.value())}

    def run_config(self) -> RunConfig:
        """The :class:`RunConfig` the controls describe (raises ValueError when invalid)."""
        size = self.size_combo.currentText()
        target: Any = "model" if size == "model default" else ("native" if size == "native" else int(size))
        axis = self.channel_axis_combo.currentData() if self.channel_box.isVisibleTo(self) else None
        channels = None
        merge = None
        if axis is not None:
            text = self.channels_edit.text().strip()
            if text:
                try:
                    channels = [int(v) for v in text.replace(";", ",").split(",") if v.strip()]
                except ValueError:
                    raise ValueError(f"Channels {text!r}: give comma-separated channel numbers, "
                                     "e.g. 0,2.") from None
            merge = None if self.merge_combo.currentText() == "no merge" else self.merge_combo.currentText()
        t = self.thresholds()
        preset = self.preset()
        directional = preset == "directional"
        statistics = {
            # options a preset fixes go as None ("from the preset"), the others as shown
            "p_method": None if directional else self.p_method_combo.currentText(),
            "alternative": None if directional else self.alternative_combo.currentText(),
            "null": None if directional else self.null_combo.currentText(),
            "null_pool": self.null_pool_combo.currentText() if directional else None,
            "pi0_method": self.pi0_combo.currentText(),
        }
        tiled = self.tiled_check.isChecked()
        # untiled runs keep the engine's tiling defaults, so their metadata says nothing stale
        tiling = {"tiled": tiled,
                  "tile_overlap": int(self.tile_overlap_spin.value()) if tiled else RUN_DEFAULTS.tile_overlap,
                  "tile_scale": float(self.tile_scale_spin.value()) if tiled else RUN_DEFAULTS.tile_scale}
        config = RunConfig(
            preset=preset,
            method=self.method_combo.currentText(), n_boot=int(self.n_boot_spin.value()),
            seed=int(self.seed_spin.value()), device=self.device_combo.currentText(),
            chunk_size=int(self.chunk_spin.value()) or None,
            head="mean" if self.head_spin.value() < 0 else int(self.head_spin.value()),
            **statistics, **t,
            std_factor=float(self.std_factor_spin.value()),
            per_channel=self.per_channel_check.isChecked(),
            block_size=int(self.block_size_spin.value()) or None,
            target_size=target, channels=channels, merge=merge, **tiling,
        )
        config.validate()
        return config

    def _planes(self, layer: Any, geometry: SourceGeometry) -> list[tuple[int, ...]]:
        if not geometry.stack_axes:
            return [()]
        if self.scope_combo.currentText() == "all slices":
            return geometry.planes()
        pos = np.asarray(layer.world_to_data(self.viewer.dims.point), dtype=float)
        return [tuple(int(np.clip(np.rint(pos[a]), 0, geometry.shape[a] - 1))
                      for a in geometry.stack_axes)]

    def _build_job(self) -> tuple[JobSpec, SourceGeometry, Any]:
        layer = self.current_layer()
        if layer is None:
            raise ValueError("Add an image layer (e.g. File ▸ Open Sample ▸ napari-attnreg) and "
                             "choose it under 'Image'.")
        if layer.multiscale:
            raise ValueError(f"{layer.name!r} is a multiscale (pyramid) image; add one level as "
                             "its own image layer (e.g. layer.data[1]) and run on that.")
        axis = self.channel_axis_combo.currentData() if self.channel_box.isVisibleTo(self) else None
        geometry = SourceGeometry.from_layer(layer, axis)
        config = self.run_config()
        if axis is not None:
            config.channel_axis = axis  # replaced per plane by the plane's own axis
        self._task_id += 1
        spec = JobSpec(task_id=self._task_id, data=layer.data, planes=self._planes(layer, geometry),
                       stack_axes=geometry.stack_axes, channel_axis=axis,
                       model=self.model_spec(), config=config)
        return spec, geometry, layer

    # ================================================================ run / cancel
    @property
    def busy(self) -> bool:
        return self.worker is not None

    def run(self) -> Any:
        """Start a run on the chosen layer; returns the worker (None if it could not start)."""
        from napari.qt.threading import thread_worker
        from napari.utils import progress

        if self.busy:
            self._notify_error("A run is already in progress; cancel it first.")
            return None
        try:
            spec, geometry, layer = self._build_job()
        except ValueError as err:
            self._notify_error(str(err))
            return None
        self._pending, self._pending_geometry, self._pending_source = spec, geometry, layer
        self._cancel = CancelToken()
        worker = thread_worker(run_job, start_thread=False,
                               worker_class=_make_worker_class())(spec, self._cancel)
        worker.cancel_token = self._cancel
        worker.yielded.connect(self._on_progress)
        worker.returned.connect(self._on_returned)
        worker.finished.connect(self._on_finished)
        self.worker = worker
        self.last_outcome = None
        self._pbar = progress(total=1000, desc=f"Attention regularization: {layer.name}") \
            if self.activity_progress else None
        self._set_busy(True)
        n = len(spec.planes)
        self.status_label.setText(f"Running on {layer.name!r}" + (f" ({n} planes)" if n > 1 else "") + "…")
        worker.start()
        return worker

    def cancel(self) -> None:
        """Stop the running job at its next chunk; nothing it computed is added."""
        if self._cancel is not None:
            self._cancel.cancel()
            self.status_label.setText("Cancelling at the next chunk…")
            self.cancel_button.setEnabled(False)

    def _set_busy(self, busy: bool) -> None:
        self.run_button.setEnabled(not busy)
        self.cancel_button.setEnabled(busy)
        if not busy:
            self.progress_bar.setValue(0)

    def _on_progress(self, item: JobProgress) -> None:
        if item.task_id != self._task_id or self.worker is None:
            return
        # Every repaint recomposites the whole window through OpenGL (QOpenGLWidget in Qt5);
        # with software GL (Mesa llvmpipe) that costs ~50 ms of CPU taken from the run, so
        # the progress display refreshes at most UI_UPDATE_S apart.
        now = time.perf_counter()
        if now - self._last_ui_update < UI_UPDATE_S and item.fraction < 1.0:
            return
        self._last_ui_update = now
        value = round(1000 * item.fraction)
        self.progress_bar.setValue(value)
        if self._cancel is None or not self._cancel.cancelled:
            self.status_label.setText(item.message)
        # last: updating napari's activity-dock bar can process events, this run's end included
        pbar = self._pbar
        if pbar is not None:
            pbar.set_description(item.message)
            pbar.update(value - pbar.n)

    def _on_returned(self, outcome: JobOutcome) -> None:
        self.last_outcome = outcome
        stale = outcome.task_id != self._task_id or (self._cancel is not None and self._cancel.cancelled)
        if outcome.cancelled or stale:
            outcome.results = {}
            outcome.cancelled = True
            self.status_label.setText("Cancelled; nothing was added.")
            return
        if outcome.error is not None:
            self._notify_error(outcome.error)
            return
        source, geometry, spec = self._pending_source, self._pending_geometry, self._pending
        assert geometry is not None and spec is not None
        if source not in self.viewer.layers:
            self._notify_error(f"The image layer {source.name!r} was removed during the run; "
                               "nothing was added.")
            return
        shape_now = tuple(source.data.shape[: source.ndim])
        if shape_now != geometry.shape:
            self._notify_error(f"{source.name!r} changed shape during the run; run it again.")
            return
        geometry = SourceGeometry.from_layer(source, geometry.channel_axis)  # follow a moved layer
        params = {k: v for k, v in asdict(spec.config).items() if k != "extra"}
        params.update(model=spec.model.label(), model_description=outcome.model_description,
                      source=source.name, planes_run=[list(p) for p in spec.planes],
                      elapsed_s=round(outcome.elapsed_s, 3))
        params["device_used"] = next(iter(outcome.results.values())).metadata.get("device")
        record = RunRecord(source.unique_id, source.name, geometry, dict(outcome.results), params,
                           self.thresholds())
        old = self._records.get(source.unique_id)
        if old is not None and geometry.stack_axes and len(spec.planes) < len(geometry.planes()) \
                and old.merge(record):
            record = old  # another slice of the same stack: keep the planes computed before
        record.thresholds = self.thresholds()
        self._records[source.unique_id] = record
        upsert_outputs(self.viewer, record)
        self._show_summary(record)
        self._notify_diagnostics(record)
        self.roi_panel.update_table()
        self.outputs_updated.emit(record)

    def _on_finished(self) -> None:
        if self._pbar is not None:
            self._pbar.close()
            self._pbar = None
        self.worker = None
        self._cancel = None
        self._set_busy(False)
        outcome = self.last_outcome
        if outcome is None:  # ended without returning (should not happen: run_job catches all)
            outcome = JobOutcome(self._task_id, error="The run ended unexpectedly.")
            self.last_outcome = outcome
        self.run_finished.emit(outcome)

    def _show_summary(self, record: RunRecord) -> None:
        """Status label and napari's status bar: run, significance count, diagnostics."""
        results = [record.results[p] for p in sorted(record.results)]
        caption = significance_caption(results, record.thresholds)
        lines = [html.escape(run_caption(results[0], planes=len(results)), quote=False),
                 f"<b>{html.escape(caption, quote=False)}</b>"]
        for line in unique_diagnostics(results):
            text = html.escape(line, quote=False)
            lines.append(f"<span style='color:{WARNING_COLOR}'>{text}</span>"
                         if line.startswith("⚠") else text)
        self.status_label.setText("<br>".join(lines))
        self.viewer.status = f"{record.source_name}: {caption}"

    def _notify_diagnostics(self, record: RunRecord) -> None:
        """One warning notification listing what makes this result doubtful (if anything)."""
        from napari.utils.notifications import show_warning

        warnings_ = unique_diagnostics(list(record.results.values()), include_info=False)
        if warnings_:
            show_warning(f"Attention regularization of {record.source_name!r}:\n"
                         + "\n".join(warnings_))

    def _notify_error(self, message: str) -> None:
        from napari.utils.notifications import show_error

        self.status_label.setText(f"<span style='color:#e55'>{message}</span>")
        show_error(message)

    # ================================================================ thresholds / records
    def current_record(self) -> RunRecord | None:
        layer = self.current_layer()
        return None if layer is None else self._records.get(layer.unique_id)

    def _schedule_thresholds(self, *_: Any) -> None:
        self._threshold_timer.start()

    def apply_thresholds(self) -> None:
        """Re-threshold the selected image's results into its regularized and Labels layers."""
        self._threshold_timer.stop()
        record = self.current_record()
        if record is None:
            return
        record.thresholds = self.thresholds()
        refresh_thresholds(self.viewer, record)
        self._show_summary(record)  # the count follows the thresholds
        self.roi_panel.update_table()
        self.outputs_updated.emit(record)

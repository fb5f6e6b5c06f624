"""Run options: device, bootstrap, statistics preset, tiling, and the advanced ones.

Choices and defaults come from the core (engine, presets, stats, tiling); this panel only
shows them and reads them back as :class:`RunConfig` keyword arguments.
"""

from __future__ import annotations

from typing import Any

from qtpy.QtCore import Qt, Signal
from qtpy.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)
from superqt import QCollapsible

from ..core.directional import NULL_POOLS
from ..core.display import PRESET_HELP, TILED_LABEL, TILING_HELP
from ..core.engine import RunConfig, resolve_device
from ..core.presets import DEFAULT_PRESET, PRESET_DEFAULTS, PRESETS
from ..core.stats import ALTERNATIVES, NULL_MODELS, P_METHODS, PI0_METHODS
from ..core.tiling import TILE_OVERLAP_MAX, TILE_SCALE_RANGE

#: The engine's defaults (B = 200, untiled, native pixels, no overlap).
RUN_DEFAULTS = RunConfig()
DEVICES = ("auto", "cuda", "mps", "cpu")
NULL_METHODS = ("normal", "uniform", "pixel", "patch")
SIZES = ("model default", "native", "224", "448", "896")


def _combo(items: Any, tip: str, value: str | None = None) -> QComboBox:
    combo = QComboBox()
    combo.addItems([str(v) for v in items])
    combo.setToolTip(tip)
    if value is not None:
        select(combo, value)
    return combo


def _spin(cls: type, lo: float, hi: float, value: float, tip: str, **kw: Any) -> Any:
    spin = cls()
    spin.setRange(lo, hi)
    for key, arg in kw.items():  # e.g. decimals=2 → setDecimals(2)
        getattr(spin, "set" + key[0].upper() + key[1:])(arg)
    spin.setValue(value)
    spin.setToolTip(tip)
    return spin


def select(combo: QComboBox, text: str) -> None:
    """Show ``text``, adding it if the core gained a choice the box lacks (never keep another)."""
    if combo.findText(text) < 0:
        combo.addItem(text)
    combo.setCurrentText(text)


class OptionsPanel(QWidget):
    """Options of a run; ``preset_changed(preset)`` fires when the statistics preset changes."""

    preset_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tiled_check = QCheckBox(TILED_LABEL)
        self.tiled_check.setChecked(RUN_DEFAULTS.tiled)
        self.tiled_check.setToolTip(TILING_HELP["tiled"] + " Tile overlap and downsampling are "
                                    "under Advanced; 'Model input' does not apply.")
        self.device_combo = _combo(DEVICES, "Where the model runs: auto = CUDA GPU, then Apple "
                                   "MPS, then CPU.")
        self.device_label = QLabel()
        self.method_combo = _combo(NULL_METHODS, "Bootstrap null images: noise made from the "
                                   "image itself ('normal' is the paper's; 'patch' shuffles the "
                                   "image's own blocks).")
        self.per_channel_check = QCheckBox("per channel")
        self.per_channel_check.setChecked(True)
        self.per_channel_check.setToolTip("Draw the noise with each channel's own mean and std.")
        self.std_factor_spin = _spin(QDoubleSpinBox, 0.05, 10.0, 1.0, "Noise std as a multiple "
                                     "of the image's std ('normal' null).", singleStep=0.1)
        self.block_size_spin = _spin(QSpinBox, 0, 512, 0, "Side of the shuffled blocks in pixels "
                                     "('patch' null); 0 = the model's patch size.", suffix=" px",
                                     specialValueText="patch size")
        self.n_boot_spin = _spin(QSpinBox, 1, 100_000, RUN_DEFAULTS.n_boot,
                                 "Number of bootstrap (null) images B; p resolution is "
                                 "1 / (tokens·(B + 1)).")
        self.seed_spin = _spin(QSpinBox, 0, 2**31 - 1, 0, "Seed of the null images: the same "
                               "seed gives the same result.")
        self.preset_combo = QComboBox()
        for preset in PRESETS:
            self.preset_combo.addItem(preset, preset)
            self.preset_combo.setItemData(self.preset_combo.count() - 1, PRESET_HELP[preset],
                                          Qt.ItemDataRole.ToolTipRole)
        self.preset_combo.setCurrentIndex(self.preset_combo.findData(DEFAULT_PRESET))
        self.preset_combo.setToolTip("Which question the statistics answer.\n" + "\n".join(
            f"• {PRESET_HELP[p]}" for p in PRESETS) + "\nChanging it resets the thresholds "
            "to the preset's defaults; press Run to compute with it.")

        self.form = QFormLayout()
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.form.addRow("Tiling", self.tiled_check)
        self.form.addRow("Device", self.device_combo)
        self.form.addRow("", self.device_label)
        self.form.addRow("Bootstrap", self.method_combo)
        self.form.addRow("", self.per_channel_check)
        self.form.addRow("Noise std ×", self.std_factor_spin)
        self.form.addRow("Block size", self.block_size_spin)
        self.form.addRow("Null images", self.n_boot_spin)
        self.form.addRow("Seed", self.seed_spin)
        self.form.addRow("Statistics", self.preset_combo)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(self.form)
        self._build_advanced(layout)

        self.device_combo.currentIndexChanged.connect(self._on_device_changed)
        self.method_combo.currentIndexChanged.connect(self._on_method_changed)
        self.tiled_check.toggled.connect(self._on_tiled_toggled)
        self.preset_combo.currentIndexChanged.connect(self._on_preset_changed)
        self._on_device_changed()
        self._on_method_changed()
        self._on_tiled_toggled(self.tiled_check.isChecked())
        self._apply_preset_options()

    def _build_advanced(self, layout: QVBoxLayout) -> None:
        self.chunk_spin = _spin(QSpinBox, 0, 4096, 0, "Null images per forward pass (auto: from "
                                "free memory). Cancel and progress act once per chunk.",
                                specialValueText="auto")
        self.head_spin = _spin(QSpinBox, -1, 255, -1, "Attention head: mean over heads (paper) "
                               "or one head index.", specialValueText="mean")
        self.p_method_combo = _combo(P_METHODS, "pooled: the paper's p-value; null: "
                                     "conservative (1 + #null ≥ obs)/(1 + BT).")
        self.alternative_combo = _combo(ALTERNATIVES, "Which side counts as extreme: greater = "
                                        "more attention than the null.")
        self.pi0_combo = _combo(PI0_METHODS, "π0 estimator (proportion of null patches): each "
                                "preset sets its own; reference = the paper's.")
        self.null_combo = _combo(NULL_MODELS, "lfdr null: theoretical N(0,1) (paper) or Efron's "
                                 "empirical null.")
        self.null_pool_combo = _combo(NULL_POOLS, "Directional only. pooled: compare each patch "
                                      "with every null patch; position: only with its own "
                                      "position (ignores position-locked attention, e.g. border "
                                      "tokens).")
        self.size_combo = _combo(SIZES, "Long side the image is resized to for the model.")
        self.tile_overlap_spin = _spin(QSpinBox, 0, TILE_OVERLAP_MAX, RUN_DEFAULTS.tile_overlap,
                                       TILING_HELP["tile_overlap"], suffix=" px")
        self.tile_scale_spin = _spin(QDoubleSpinBox, *TILE_SCALE_RANGE, RUN_DEFAULTS.tile_scale,
                                     TILING_HELP["tile_scale"], decimals=2, singleStep=0.5,
                                     prefix="÷ ")
        form = QFormLayout()
        for label, control in (("Chunk size", self.chunk_spin), ("Head", self.head_spin),
                               ("p-value", self.p_method_combo),
                               ("Alternative", self.alternative_combo), ("π0", self.pi0_combo),
                               ("lfdr null", self.null_combo), ("Null pool", self.null_pool_combo),
                               ("Model input", self.size_combo),
                               ("Tile overlap", self.tile_overlap_spin),
                               ("Tile downsampling", self.tile_scale_spin)):
            form.addRow(label, control)
        box = QWidget()
        box.setLayout(form)
        self.advanced = QCollapsible("Advanced")
        tip = "Chunk size, attention head, statistics details, model input size and tiling."
        self.advanced.setToolTip(tip)
        for button in self.advanced.findChildren(QPushButton):  # the expand/collapse toggle
            button.setToolTip(tip)
        self.advanced.addWidget(box)
        layout.addWidget(self.advanced)

    # ---- reactions -----------------------------------------------------------------------
    def preset(self) -> str:
        return self.preset_combo.currentData()

    def _set_row_visible(self, field: QWidget, visible: bool) -> None:
        field.setVisible(visible)
        label = self.form.labelForField(field)
        if label is not None:
            label.setVisible(visible)

    def _on_device_changed(self, *_: Any) -> None:
        try:
            dev = resolve_device(self.device_combo.currentText())
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
        self._set_row_visible(self.std_factor_spin, method == "normal")
        self._set_row_visible(self.block_size_spin, method == "patch")
        self._set_row_visible(self.per_channel_check, method in ("normal", "uniform"))

    def _on_tiled_toggled(self, tiled: bool) -> None:
        self.tile_overlap_spin.setEnabled(tiled)
        self.tile_scale_spin.setEnabled(tiled)
        self.size_combo.setEnabled(not tiled)  # tiles are the model's input size

    def _apply_preset_options(self) -> None:
        preset = self.preset()
        defaults = PRESET_DEFAULTS[preset]
        for key, combo in (("p_method", self.p_method_combo), ("alternative", self.alternative_combo),
                           ("pi0_method", self.pi0_combo), ("null", self.null_combo),
                           ("null_pool", self.null_pool_combo)):
            select(combo, str(defaults[key]))
        directional = preset == "directional"
        for combo in (self.p_method_combo, self.alternative_combo, self.null_combo):
            combo.setEnabled(not directional)  # fixed by construction: one-sided p⁺, lfdr⁺ from p⁺
        self.null_pool_combo.setEnabled(directional)

    def _on_preset_changed(self, *_: Any) -> None:
        self._apply_preset_options()
        self.preset_changed.emit(self.preset())

    # ---- read back -----------------------------------------------------------------------
    def config_kwargs(self) -> dict[str, Any]:
        """:class:`RunConfig` keyword arguments of these controls."""
        size = self.size_combo.currentText()
        target: Any = {"model default": "model", "native": "native"}.get(size) or int(size)
        directional = self.preset() == "directional"
        tiled = self.tiled_check.isChecked()
        return {
            "preset": self.preset(), "method": self.method_combo.currentText(),
            "n_boot": int(self.n_boot_spin.value()), "seed": int(self.seed_spin.value()),
            "device": self.device_combo.currentText(),
            "chunk_size": int(self.chunk_spin.value()) or None,
            "head": "mean" if self.head_spin.value() < 0 else int(self.head_spin.value()),
            # options a preset fixes go as None ("from the preset"), the others as shown
            "p_method": None if directional else self.p_method_combo.currentText(),
            "alternative": None if directional else self.alternative_combo.currentText(),
            "null": None if directional else self.null_combo.currentText(),
            "null_pool": self.null_pool_combo.currentText() if directional else None,
            "pi0_method": self.pi0_combo.currentText(),
            "std_factor": float(self.std_factor_spin.value()),
            "per_channel": self.per_channel_check.isChecked(),
            "block_size": int(self.block_size_spin.value()) or None,
            "target_size": target, "tiled": tiled,
            # untiled runs keep the engine's tiling defaults, so their metadata says nothing stale
            "tile_overlap": int(self.tile_overlap_spin.value()) if tiled
            else RUN_DEFAULTS.tile_overlap,
            "tile_scale": float(self.tile_scale_spin.value()) if tiled else RUN_DEFAULTS.tile_scale,
        }

"""Model choice for the dock widget: source (demo, catalogue, timm name, weights file).

The catalogue picker groups models by domain and shows licence and access.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qtpy.QtCore import Qt
from qtpy.QtGui import QStandardItem, QStandardItemModel
from qtpy.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from napari_attnreg._napari.status import link_color
from napari_attnreg.core.models.catalogue import CatalogueEntry, by_domain, find, is_bundled
from napari_attnreg.core.models.weights import WEIGHT_SUFFIXES
from napari_attnreg.core.run.service import MODEL_SOURCE_LABELS, ModelSpec

#: The file dialog's filter: the weight-file endings the loader reads, then anything.
WEIGHT_FILTER = f"Weights ({' '.join('*' + s for s in WEIGHT_SUFFIXES)});;All (*)"


def spec_of_result(metadata: Mapping[str, Any]) -> tuple[ModelSpec | None, str]:
    """The model a saved result was made with, as the picker can choose it, or (None, why not).

    Read from the result's provenance (``model``: the backbone's name, ``weights``: where its
    weights came from), the way the loader's routes name them.
    """
    name = str(metadata.get("model") or "").strip()
    weights = str(metadata.get("weights") or "").strip()
    if not name:
        return None, "the result does not name its model"
    if name == "demo" and is_bundled(name):
        return ModelSpec("demo", "demo"), ""
    if weights == "given module":
        return None, (f"{name!r} was a model given in code (a script or notebook), which the "
                      "picker cannot load")
    if weights == "random-init":
        return None, (f"{name!r} ran with random (untrained) weights, which the picker does "
                      "not load")
    if weights in ("", "pretrained") or is_bundled(name):
        entry = find(name)
        in_picker = entry is not None and entry.domain != "demo"
        return ModelSpec("catalogue" if in_picker else "timm", entry.id if in_picker else name), ""
    path = Path(weights)
    if not path.exists():
        return None, (f"its weights {weights!r} are not on this machine (or not at that path); "
                      "choose them under 'weights file'")
    # a transformers folder names its architecture itself; a file needs the one it ran as
    return ModelSpec("file", str(path), arch=None if path.is_dir() else name), ""


class CataloguePicker(QWidget):
    """A combo box of the catalogue with one non-selectable heading per domain.

    Below it a line names the selected model's domain, licence and whether the hub gates it,
    so an analyst sees a pathology model is not meant for their radiographs before running.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.combo = QComboBox()
        self.combo.setToolTip("Known domain models; the line below names domain, licence, access.")
        items = QStandardItemModel(self.combo)
        for domain, entries in by_domain().items():
            if domain == "demo":  # the bundled model has its own source entry in the widget
                continue
            heading = QStandardItem(f"— {domain} —")
            heading.setFlags(Qt.ItemFlag.NoItemFlags)
            items.appendRow(heading)
            for entry in entries:
                item = QStandardItem(f"{entry.name}{'  (gated)' if entry.gated else ''}")
                item.setData(entry.id, Qt.ItemDataRole.UserRole)
                item.setToolTip(entry.description)
                items.appendRow(item)
        self.combo.setModel(items)
        self.access_label = QLabel()
        self.access_label.setWordWrap(True)
        self.access_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.access_label.setOpenExternalLinks(True)
        layout.addWidget(self.combo)
        layout.addWidget(self.access_label)
        self.combo.currentIndexChanged.connect(self._on_changed)
        self.set_model_id(next(e.id for g in by_domain().values() for e in g if e.domain != "demo"))

    def model_id(self) -> str:
        """Catalogue id of the selected model."""
        return str(self.combo.currentData(Qt.ItemDataRole.UserRole) or "")

    def entry(self) -> CatalogueEntry | None:
        return find(self.model_id()) if self.model_id() else None

    def set_model_id(self, model_id: str) -> None:
        index = self.combo.findData(model_id, Qt.ItemDataRole.UserRole)
        if index < 0:
            raise ValueError(f"{model_id!r} is not in the catalogue; see `attnreg models`.")
        self.combo.setCurrentIndex(index)
        self._on_changed()

    def _on_changed(self, *_: object) -> None:
        entry = self.entry()
        if entry is None:
            self.access_label.setText("")
            return
        self.combo.setToolTip(entry.description)
        self.access_label.setText(
            f"<small><b>{entry.domain}</b> · {entry.description}<br>{entry.licence} · "
            + (f"gated: <a style='color:{link_color()}' href='{entry.page}'>request access</a>, "
               "then log in or set HF_TOKEN"
               if entry.gated else "open download")
            + " · offline: choose 'weights file' with this id as arch</small>")


def _fit_text(edit: QLineEdit, sample: str) -> None:
    """Wide enough to show ``sample`` (a placeholder) in full."""
    edit.setMinimumWidth(edit.fontMetrics().horizontalAdvance(sample) + 16)


class ModelPanel(QWidget):
    """Where the model comes from, and the field(s) that source needs."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._custom: ModelSpec | None = None
        self.source_combo = QComboBox()
        for key, text in MODEL_SOURCE_LABELS.items():
            self.source_combo.addItem(text, key)
        self.source_combo.setToolTip("The Vision Transformer: the bundled demo model (offline), a "
                                     "known domain model, any timm name, or a local weights file.")
        self.catalogue_picker = CataloguePicker()
        self.timm_edit = QLineEdit()
        self.timm_edit.setPlaceholderText("e.g. vit_small_patch8_224.dino")
        self.timm_edit.setToolTip("A timm model name; its weights download once (needs internet).")
        _fit_text(self.timm_edit, self.timm_edit.placeholderText())
        self.weights_edit = QLineEdit()
        self.weights_edit.setPlaceholderText("weights file")
        self.weights_edit.setToolTip(f"Local weights file ({', '.join(WEIGHT_SUFFIXES)}); "
                                     "works offline.")
        _fit_text(self.weights_edit, "/path/to/weights.safetensors")
        self.browse_button = QPushButton("…")
        self.browse_button.setToolTip("Choose a weights file.")
        self.browse_button.setMaximumWidth(30)
        self.arch_edit = QLineEdit()
        self.arch_edit.setPlaceholderText("architecture")
        self.arch_edit.setToolTip("timm architecture or catalogue id of the weights file "
                                  "(e.g. vit_small_patch16_224); empty = read from the file.")
        _fit_text(self.arch_edit, "vit_small_patch16_224")
        self.file_box = QWidget()
        file_rows = QVBoxLayout(self.file_box)  # two rows: neither field is squeezed
        file_rows.setContentsMargins(0, 0, 0, 0)
        path_row = QHBoxLayout()
        path_row.addWidget(self.weights_edit, 1)
        path_row.addWidget(self.browse_button)
        file_rows.addLayout(path_row)
        file_rows.addWidget(self.arch_edit)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for widget in (self.source_combo, self.catalogue_picker, self.timm_edit, self.file_box):
            layout.addWidget(widget)
        self.source_combo.currentIndexChanged.connect(self._on_source_changed)
        self.browse_button.clicked.connect(self._browse_weights)
        self._on_source_changed()

    def source(self) -> str:
        return self.source_combo.currentData()

    def set_source(self, source: str) -> None:
        self.source_combo.setCurrentIndex(self.source_combo.findData(source))

    def _on_source_changed(self, *_: Any) -> None:
        source = self.source()
        self.catalogue_picker.setVisible(source == "catalogue")
        self.timm_edit.setVisible(source == "timm")
        self.file_box.setVisible(source == "file")

    def _browse_weights(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Model weights", "", WEIGHT_FILTER)
        if path:
            self.weights_edit.setText(path)

    def set_model(self, model: Any, name: str | None = None) -> None:
        """Use a ``Backbone`` or ``nn.Module`` given in code (tests, scripts)."""
        label = name or getattr(model, "name", None) or type(model).__name__
        self._custom = ModelSpec("module", f"{label} (given)", module=model)
        index = self.source_combo.findData("module")
        if index < 0:
            self.source_combo.addItem(self._custom.name, "module")
            index = self.source_combo.count() - 1
        else:
            self.source_combo.setItemText(index, self._custom.name)
        self.source_combo.setCurrentIndex(index)

    def apply_setting(self, model: str) -> None:
        """Start with the default model of the plugin settings (napari Preferences)."""
        self.show_spec(ModelSpec.from_setting(model))

    def show_spec(self, spec: ModelSpec) -> None:
        """Choose ``spec`` (from :func:`spec_of_result`; not a module given in code)."""
        self.set_source(spec.source)
        if spec.source == "catalogue":
            self.catalogue_picker.set_model_id(spec.name)
        elif spec.source == "timm":
            self.timm_edit.setText(spec.name)
        elif spec.source == "file":
            self.weights_edit.setText(spec.name)
            self.arch_edit.setText(spec.arch or "")

    def show_model_of(self, metadata: Mapping[str, Any]) -> str:
        """Choose the model a reopened result was made with (its provenance ``metadata``), so
        a re-run uses it; returns what the status line should say (empty: nothing to say)."""
        name = str(metadata.get("model") or "").strip()
        module = self.custom_module
        if self.source() == "module" and name and getattr(module, "name", None) == name:
            return ""  # the very model given in code is chosen already
        spec, why = spec_of_result(metadata)
        if spec is None:
            return (f"The model picker still shows {self.model_spec().label()!r}, not this "
                    f"result's model: {why}. Choose it before re-running.")
        if spec.key() == self.model_spec().key():
            return ""  # chosen already: nothing changed to say
        self.show_spec(spec)
        return f"Model set to {spec.label()!r}, the one this result was made with."

    @property
    def custom_module(self) -> Any:
        return None if self._custom is None else self._custom.module

    def model_spec(self) -> ModelSpec:
        source = self.source()
        if source == "module" and self._custom is not None:
            return self._custom
        if source == "catalogue":
            return ModelSpec("catalogue", self.catalogue_picker.model_id())
        if source == "timm":
            return ModelSpec("timm", self.timm_edit.text().strip())
        if source == "file":
            return ModelSpec("file", self.weights_edit.text().strip(),
                             arch=self.arch_edit.text().strip() or None)
        return ModelSpec("demo", "demo")

"""Catalogue model picker for the dock widget: models grouped by domain, licence and access shown."""

from __future__ import annotations

from qtpy.QtCore import Qt
from qtpy.QtGui import QStandardItem, QStandardItemModel
from qtpy.QtWidgets import QComboBox, QLabel, QVBoxLayout, QWidget

from ..core.catalogue import CatalogueEntry, by_domain, find


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
            + (f"gated: <a href='{entry.page}'>request access</a>, then log in or set HF_TOKEN"
               if entry.gated else "open download")
            + " · offline: choose 'weights file' with this id as arch</small>")

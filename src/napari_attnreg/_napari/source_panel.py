"""Which image, which planes and which channels a run reads.

The Image combo follows napari: a newly added image and an image selected in the layer
list become the chosen one, so Run works on what the analyst is looking at.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from qtpy.QtCore import Signal
from qtpy.QtWidgets import (
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from napari_attnreg._napari.channel_layers import channel_siblings, join_channel_layers
from napari_attnreg._napari.geometry import SourceGeometry, is_placeholder, named_axes
from napari_attnreg._napari.layers import META_KEY
from napari_attnreg._napari.option_controls import choose_item
from napari_attnreg.core.run.options import MERGES as OPTION_MERGES

SCOPES = ("current slice", "all slices")
MERGES = ("no merge", *OPTION_MERGES)  # the core's merge choices, or none


def is_output(layer: Any) -> bool:
    """An output layer of this plugin (or a copy of one), never a source."""
    return isinstance(layer.metadata, dict) and META_KEY in layer.metadata


class SourcePanel(QWidget):
    """Image, planes and channels controls (a form of up to three rows).

    Signals
    -------
    layer_changed : the chosen image changed (or the layer list changed around it).
    said : str, a line for the dock's status (channel layers joined, or why not).
    """

    layer_changed = Signal()
    said = Signal(str)

    def __init__(self, viewer: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.viewer = viewer
        self.layer_combo = QComboBox()
        self.layer_combo.setToolTip("Image layer to analyse; follows the layer selected in the "
                                    "layer list and newly opened images.")
        self.scope_combo = QComboBox()
        self.scope_combo.addItems(SCOPES)
        self.scope_combo.setToolTip("For nD images: the slice shown now, or every plane (output "
                                    "layers are stacked along the same axes).")
        self.channel_box = QWidget()
        rows = QVBoxLayout(self.channel_box)  # two rows: the channels field is never squeezed
        rows.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        self.channel_axis_combo = QComboBox()
        self.channel_axis_combo.setToolTip("Axis holding fluorescence channels (not a z/t axis).")
        self.channels_edit = QLineEdit()
        self.channels_edit.setPlaceholderText("channels, e.g. 0,2 (empty = all)")
        self.channels_edit.setToolTip("Up to three channels mapped to R, G, B, comma-separated "
                                      "(e.g. 0,2); empty = all (≤ 3).")
        self.merge_combo = QComboBox()
        self.merge_combo.addItems(MERGES)
        self.merge_combo.setToolTip("Merge the channels into one grayscale image instead.")
        row.addWidget(self.channel_axis_combo, 1)
        row.addWidget(self.merge_combo)
        rows.addLayout(row)
        rows.addWidget(self.channels_edit)
        self.form = QFormLayout(self)
        self.form.setContentsMargins(0, 0, 0, 0)
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.form.addRow("Image", self.layer_combo)
        self.form.addRow("Planes", self.scope_combo)
        self.form.addRow("Channels", self.channel_box)
        # one layer per channel (napari's way with a multichannel file): join them to analyse
        self.join_button = QPushButton()
        self.join_button.setToolTip("Join grey image layers of the chosen image's size into one "
                                    "layer of channels, to analyse them together.")
        self.join_button.clicked.connect(self.join_channels)
        self.form.addRow("Channel layers", self.join_button)

        self.layer_combo.currentIndexChanged.connect(self._on_layer_chosen)
        self.channel_axis_combo.currentIndexChanged.connect(self._on_channel_axis_changed)
        ev = viewer.layers.events
        for emitter in (ev.removed, ev.moved, ev.renamed):
            emitter.connect(self.refresh)
        ev.inserted.connect(self._on_inserted)
        viewer.layers.selection.events.active.connect(self._on_active)
        viewer.layers.selection.events.changed.connect(self._show_join)
        self.refresh()
        self._on_layer_chosen()

    def disconnect_viewer(self) -> None:
        ev = self.viewer.layers.events
        for emitter in (ev.removed, ev.moved, ev.renamed):
            emitter.disconnect(self.refresh)
        ev.inserted.disconnect(self._on_inserted)
        self.viewer.layers.selection.events.active.disconnect(self._on_active)
        self.viewer.layers.selection.events.changed.disconnect(self._show_join)

    # ---- the image list ----------------------------------------------------------------
    def image_layers(self) -> list[Any]:
        from napari.layers import Image

        return [layer for layer in self.viewer.layers
                if isinstance(layer, Image) and not is_output(layer)]

    def current_layer(self) -> Any | None:
        return self.layer_combo.currentData() if self.layer_combo.count() else None

    def set_layer(self, layer: Any) -> None:
        """Choose the image layer programmatically."""
        if choose_item(self.layer_combo, layer):
            return
        raise ValueError(f"{getattr(layer, 'name', layer)!r} is not an image layer of this viewer.")

    def refresh(self, event: Any = None, prefer: Any = None) -> None:
        """Rebuild the list; keep the chosen image unless ``prefer`` names another."""
        current = self.current_layer()
        layers = self.image_layers()
        target = prefer if prefer in layers else current
        self.layer_combo.blockSignals(True)
        self.layer_combo.clear()
        for layer in layers:
            self.layer_combo.addItem(layer.name, layer)
        if target in layers:
            self.layer_combo.setCurrentIndex(layers.index(target))
        elif layers:
            self.layer_combo.setCurrentIndex(len(layers) - 1)  # the newest image
        self.layer_combo.blockSignals(False)
        if self.current_layer() is not current:
            self._on_layer_chosen()
        else:
            self._show_join()
            self.layer_changed.emit()  # renamed/removed neighbours: the widget tidies up

    def _on_inserted(self, event: Any) -> None:
        layer = event.value
        self.refresh(prefer=layer)  # a newly opened image is what the analyst wants next

    def _on_active(self, event: Any) -> None:
        layer = event.value
        if layer is not None and layer in self.image_layers() and layer is not self.current_layer():
            self.set_layer(layer)

    # ---- planes and channels -------------------------------------------------------------
    def _on_layer_chosen(self, *_: Any) -> None:
        layer = self.current_layer()
        self.channel_axis_combo.blockSignals(True)
        self.channel_axis_combo.clear()
        self.channel_axis_combo.addItem("no channel axis", None)
        multi = layer is not None and not layer.rgb and layer.ndim > 2
        if multi:
            shape = layer.data[0].shape if layer.multiscale else layer.data.shape
            names = named_axes(layer.axis_labels)  # the file's own ("c", "z"), if it named them
            for axis in range(layer.ndim - 2):
                named = len(names) == layer.ndim and not is_placeholder(names[axis])
                name = f" · {names[axis]}" if named else ""
                self.channel_axis_combo.addItem(f"axis {axis}{name} ({shape[axis]})", axis)
        self.channel_axis_combo.blockSignals(False)
        self._set_row_visible(self.channel_box, multi)
        self._on_channel_axis_changed()
        self._show_join()
        self.layer_changed.emit()

    # ---- channels kept as separate layers ----------------------------------------------------
    def _show_join(self, *_: Any) -> None:
        siblings = channel_siblings(self.viewer, self.current_layer())
        if siblings:
            names = ", ".join(repr(str(layer.name)) for layer in siblings)
            self.join_button.setText(f"Join {len(siblings)} layers as channels")
            self.join_button.setToolTip(
                f"{names} have the same size and place: add one hidden layer holding them as "
                "channels (napari's Merge to Stack; your layers are kept), to analyse them "
                "together. Select layers in the layer list to join only those.")
        self._set_row_visible(self.join_button, bool(siblings))

    def join_channels(self) -> Any | None:
        """Join the chosen image's channel layers into one layer and choose it, channels on
        axis 0; returns the new layer (None if there was nothing to join)."""
        siblings = channel_siblings(self.viewer, self.current_layer())
        if not siblings:
            self.said.emit("Choose an image that has other grey layers of its size to join.")
            return None
        try:
            joined = join_channel_layers(self.viewer, siblings)
        except (ValueError, MemoryError) as err:
            self.said.emit(f"Could not join the channel layers: {err}")
            return None
        self.set_layer(joined)
        self.channel_axis_combo.setCurrentIndex(self.channel_axis_combo.findData(0))
        more = len(siblings) > 3
        self.said.emit(
            f"Added {joined.name!r} (hidden) with {len(siblings)} channels on axis 0"
            + ("; choose up to three under Channels (e.g. 0,2) or a merge, then Run."
               if more else "; Run analyses them together as R, G, B (or choose a merge)."))
        return joined

    def _on_channel_axis_changed(self, *_: Any) -> None:
        layer = self.current_layer()
        axis = self.channel_axis_combo.currentData()
        stack = layer is not None and (layer.ndim - 2 - (axis is not None)) > 0
        self._set_row_visible(self.scope_combo, stack)
        self.channels_edit.setEnabled(axis is not None)
        self.merge_combo.setEnabled(axis is not None)

    def _set_row_visible(self, field: QWidget, visible: bool) -> None:
        field.setVisible(visible)
        label = self.form.labelForField(field)
        if label is not None:
            label.setVisible(visible)

    def channel_axis(self) -> int | None:
        return self.channel_axis_combo.currentData() if self.channel_box.isVisibleTo(self) else None

    def channel_options(self) -> dict[str, Any]:
        """``channels`` and ``merge`` of the run config (None without a channel axis)."""
        if self.channel_axis() is None:
            return {"channels": None, "merge": None}
        text = self.channels_edit.text().strip()
        channels = None
        if text:
            try:
                channels = [int(v) for v in text.replace(";", ",").split(",") if v.strip()]
            except ValueError:
                raise ValueError(f"Channels {text!r}: give comma-separated channel numbers, "
                                 "e.g. 0,2.") from None
        merge = self.merge_combo.currentText()
        return {"channels": channels, "merge": None if merge == MERGES[0] else merge}

    def planes(self, layer: Any, geometry: SourceGeometry) -> list[tuple[int, ...]]:
        """The planes to run: the one shown, or all of them."""
        if not geometry.stack_axes:
            return [()]
        if self.scope_combo.currentText() == SCOPES[1]:
            return geometry.planes()
        pos = np.asarray(layer.world_to_data(self.viewer.dims.point), dtype=float)
        return [tuple(int(np.clip(np.rint(pos[a]), 0, geometry.shape[a] - 1))
                      for a in geometry.stack_axes)]

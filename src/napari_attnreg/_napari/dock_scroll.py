"""The dock's room at a small window: a vertical-only scroll area, controls that fit a narrow
column, and — when the window is too small for the canvas beside two dock columns — one column
shared with napari's layer controls.

At 1280x800 napari's left column (layer controls over the layer list) takes ~320 px; a dock of
the same width on the right leaves the canvas about half the window, and a wider one less.
"""

from __future__ import annotations

from qtpy.QtCore import QEvent, QObject, QSize, Qt
from qtpy.QtWidgets import (
    QComboBox,
    QDockWidget,
    QFormLayout,
    QFrame,
    QLabel,
    QMainWindow,
    QScrollArea,
    QStyle,
    QWidget,
)
from superqt import QCollapsible

#: The canvas should keep at least this share of the window's width beside the docks.
CANVAS_SHARE = 0.55
#: Characters a drop-down keeps visible when the dock is narrow (its list shows every item).
COMBO_CHARS = 8
#: A form in a foldable section wider than this puts its labels above the fields.
NARROW_FORM = 340
#: Labels at most this long (a field's name) stay on one line.
SHORT_LABEL = 24
#: napari's own docks, by the object names napari gives them (its saved window layouts use
#: these names, so they stay stable across releases).
LAYER_CONTROLS, LAYER_LIST = "layer controls", "layer list"
#: Width of the shared column, and the layer list's height in it, in pixels.
SHARED_COLUMN_WIDTH, LAYER_LIST_HEIGHT = 360, 250


class VerticalScroll(QScrollArea):
    """Scrolls ``content`` vertically; its minimum width follows the content's (which grows
    once styles, fonts and long texts are known, after construction)."""

    def __init__(self, content: QWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setWidget(content)
        content.installEventFilter(self)

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        content = self.widget()
        if content is None:
            return hint
        bar = max(self.verticalScrollBar().sizeHint().width(),
                  self.style().pixelMetric(QStyle.PixelMetric.PM_ScrollBarExtent))
        width = content.minimumSizeHint().width() + bar + 2 * self.frameWidth() + 4
        return QSize(max(hint.width(), width), hint.height())

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.widget() and event.type() == QEvent.Type.LayoutRequest:
            self.updateGeometry()  # the dock asks for the new minimum width
        return super().eventFilter(watched, event)


def fit_narrow(content: QWidget) -> None:
    """Let ``content`` live in a narrow column: drop-downs stop demanding their longest
    item's width, every plain-text message wraps instead of widening the dock, and form rows
    outside a foldable section put a field under its label when both do not fit side by side.
    A foldable section sizes itself by its content's size hint, which does not know about
    rows wrapped for the width: a form in one keeps its rows whole, or (wider than
    :data:`NARROW_FORM`) puts every label above its field.
    """
    for form in content.findChildren(QFormLayout):
        if not _inside_collapsible(form.parentWidget(), content):
            form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        elif form.minimumSize().width() > NARROW_FORM:
            form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapAllRows)
    for combo in content.findChildren(QComboBox):
        combo.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        combo.setMinimumContentsLength(COMBO_CHARS)
        combo.view().setMinimumWidth(combo.view().sizeHintForColumn(0) + 24)  # full items
    for label in content.findChildren(QLabel):  # a form's own labels and links stay one line
        text = label.text()
        if label.buddy() is None and not text.startswith("<a ") and len(text) > SHORT_LABEL:
            label.setWordWrap(True)


def _inside_collapsible(widget: QWidget | None, top: QWidget) -> bool:
    while widget is not None and widget is not top:
        if isinstance(widget, QCollapsible):
            return True
        widget = widget.parentWidget()
    return False


def share_layer_controls_column(dock: QDockWidget) -> bool:
    """Put ``dock`` in napari's column as a tab beside the layer controls when the window
    leaves the canvas less than :data:`CANVAS_SHARE` of its width, or when napari placed the
    dock in that column already (it remembers a dock's side, not its tab); returns whether it
    moved the dock.

    Why this arrangement: at a laptop-sized window an analyst looks at the canvas, the layer
    list (which maps are shown) and this dock (thresholds, inspector); napari's layer controls
    (opacity, contrast, colormap) are set now and then and stay one tab away. Two side columns
    would leave the canvas about half the window. Only Qt's public QMainWindow API is used,
    with napari's docks found by their object names; a floating dock, a wide window or an
    arrangement without napari's layer controls is left as it is.
    """
    window = dock.parentWidget()
    if not isinstance(window, QMainWindow) or dock.isFloating():
        return False
    controls = window.findChild(QDockWidget, LAYER_CONTROLS)
    central = window.centralWidget()
    if controls is None or controls is dock or not controls.isVisible() or central is None \
            or window.dockWidgetArea(controls) == Qt.DockWidgetArea.NoDockWidgetArea \
            or dock in window.tabifiedDockWidgets(controls):
        return False
    same_column = window.dockWidgetArea(dock) == window.dockWidgetArea(controls)
    if not same_column and central.width() >= CANVAS_SHARE * window.width():
        return False
    window.tabifyDockWidget(controls, dock)
    dock.raise_()  # this dock's tab in front
    width = max(SHARED_COLUMN_WIDTH, dock.minimumSizeHint().width())
    window.resizeDocks([dock], [width], Qt.Orientation.Horizontal)
    layer_list = window.findChild(QDockWidget, LAYER_LIST)
    if layer_list is not None and layer_list.isVisible() \
            and window.dockWidgetArea(layer_list) == window.dockWidgetArea(dock):
        column = central.height()  # the docks just moved: their own heights are stale
        window.resizeDocks([dock, layer_list], [column - LAYER_LIST_HEIGHT, LAYER_LIST_HEIGHT],
                           Qt.Orientation.Vertical)
    return True

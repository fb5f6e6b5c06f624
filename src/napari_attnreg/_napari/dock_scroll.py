"""A vertical-only scroll area for the dock: it scrolls when the window is short, and is never
narrower than its content needs (nothing is clipped sideways)."""

from __future__ import annotations

from qtpy.QtCore import QEvent, QObject, QSize, Qt
from qtpy.QtWidgets import QFrame, QScrollArea, QStyle, QWidget


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

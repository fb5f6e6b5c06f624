"""What the screenshot scripts share: a virtual display when there is none, and a dock run
waited for the way a user waits for it (the event loop runs; no polling)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def ensure_display(screen: str = "1280x800") -> None:
    """Re-run this script under ``xvfb-run`` on a Linux machine without a display, with
    napari's settings in a scratch file: a screenshot neither depends on the user's saved
    window layout nor changes it (napari remembers where each dock was)."""
    if "NAPARI_CONFIG" not in os.environ:
        import tempfile

        os.environ["NAPARI_CONFIG"] = str(Path(tempfile.mkdtemp()) / "settings.yaml")
    if sys.platform.startswith("linux") and not os.environ.get("DISPLAY") \
            and not os.environ.get("WAYLAND_DISPLAY") and shutil.which("xvfb-run"):
        os.execvp("xvfb-run", ["xvfb-run", "-a", "-s", f"-screen 0 {screen}x24",
                               sys.executable, *sys.argv])


def run_and_wait(widget: Any, timeout_ms: int = 600_000) -> Any:
    """Press Run on the dock and wait for the outcome; a failed run ends the script."""
    from qtpy.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    widget.run_finished.connect(lambda _outcome: loop.quit())
    QTimer.singleShot(timeout_ms, loop.quit)
    widget.run()
    loop.exec_()
    outcome = widget.last_outcome
    if outcome is None or not outcome.ok:
        raise SystemExit(f"run failed: {outcome and outcome.message}")
    return outcome


def tidy_for_picture(viewer: Any, widget: Any) -> None:
    """Close napari's toasts (they cover the canvas's corner and show one cut line) and scroll
    the dock so the status — count, meaning of "significant", diagnostics — is in view."""
    from napari._qt.dialogs.qt_notification import NapariQtNotification
    from qtpy.QtWidgets import QApplication, QScrollArea

    for toast in viewer.window._qt_window.findChildren(NapariQtNotification):
        toast.close()
    QApplication.processEvents()
    widget.findChild(QScrollArea).ensureWidgetVisible(widget.run_panel.status_label, 0, 0)
    QApplication.processEvents()

"""The dock's save buttons: ask for a file, write it, say what happened.

A failed write (a full disk, a folder without permission, nothing to export) becomes an
error notification that names the problem, never a traceback in the analyst's face.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qtpy.QtWidgets import QFileDialog, QWidget


def save_through_dialog(parent: QWidget, title: str, suggested: str, file_filter: str,
                        write: Callable[[str], Any], done: Callable[[Any], str]) -> Any:
    """Ask for a file name, call ``write(path)`` and notify ``done(written)``.

    Returns what ``write`` returned, or None when the dialog was cancelled or writing failed.
    """
    from napari.utils.notifications import show_error, show_info

    path, _ = QFileDialog.getSaveFileName(parent, title, suggested, file_filter)
    if not path:
        return None
    try:
        written = write(path)
    except (OSError, ValueError, RuntimeError) as err:
        show_error(str(err))
        return None
    show_info(done(written))
    return written

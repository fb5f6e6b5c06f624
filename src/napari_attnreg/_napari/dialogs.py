"""The dock's save buttons: ask for a file, write it, say what happened.

A failed write (a full disk, a folder without permission, nothing to export) becomes an
error notification that names the problem, never a traceback in the analyst's face.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qtpy.QtWidgets import QFileDialog, QPushButton, QWidget


def save_in_background(button: QPushButton, title: str, suggested: str, file_filter: str,
                       prepare: Callable[[str], Callable[[], Any]],
                       done: Callable[[Any], str], busy_text: str) -> Any:
    """Ask for a file name, then write it on a worker thread; returns the worker (None when
    the dialog was cancelled or ``prepare`` refused).

    ``prepare(path)`` runs here, on the GUI thread (it reads the viewer), and returns the
    write itself, which runs on the worker: a slide's figure took half a minute, with the
    whole window frozen. ``button`` is disabled, showing ``busy_text``, until it ends; the
    outcome is notified as :func:`save_through_dialog` does.
    """
    from napari.qt.threading import create_worker
    from napari.utils.notifications import show_error, show_info

    path, _ = QFileDialog.getSaveFileName(button, title, suggested, file_filter)
    if not path:
        return None
    try:
        write = prepare(path)
    except (OSError, ValueError, RuntimeError) as err:
        show_error(str(err))
        return None
    text = button.text()

    def failed(err: BaseException) -> None:
        from napari_attnreg.core.run.service import user_message

        show_error(str(err) if isinstance(err, (OSError, ValueError, RuntimeError))
                   else user_message(err))

    def finished() -> None:
        button.setText(text)
        button.setEnabled(True)

    worker = create_worker(write, _start_thread=False, _ignore_errors=True)
    worker.returned.connect(lambda written: show_info(done(written)))
    worker.errored.connect(failed)
    worker.finished.connect(finished)
    button.setEnabled(False)
    button.setText(busy_text)
    worker.start()
    return worker


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

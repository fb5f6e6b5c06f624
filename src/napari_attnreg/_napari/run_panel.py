"""Run / Cancel, progress and status: one worker at a time, results of older tasks dropped.

The panel owns the worker (napari ``thread_worker`` over the core's ``run_job``). Every run
gets a task id; an outcome whose task id is not the latest never reaches the widget
(``returned`` is not emitted), so a superseded run adds no layers. ``finished`` always
fires, once the worker has ended, with the outcome as applied (or dropped).
"""

from __future__ import annotations

import html
import weakref
from collections.abc import Callable, Generator, Sequence
from contextlib import suppress
from functools import partial
from typing import Any

from napari.components import ViewerModel
from qtpy.QtCore import Qt, Signal
from qtpy.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget
from superqt.utils import qthrottled

from napari_attnreg._napari.run_warnings import relay_worker_warning
from napari_attnreg._napari.status import WARNING_COLOR
from napari_attnreg.core.run.engine import CancelToken

#: Shortest interval between progress-display refreshes (ms): every repaint recomposites the
#: window through OpenGL, which with software GL (Mesa llvmpipe) costs CPU the run would use.
UI_UPDATE_MS = 500
#: The keyboard shortcut that presses Run (napari key-binding syntax); the analyst can change
#: it under Preferences ▸ Shortcuts, where :data:`RUN_ACTION` is listed.
RUN_SHORTCUT = "Control-Shift-R"
#: napari action-manager name of 'press Run in the Attention Regularization dock'.
RUN_ACTION = "napari-attnreg:run"
#: The open docks' run callbacks by viewer, the latest last (the last dock opened owns the key);
#: both held weakly, so a closed viewer or dock is never kept alive by the shortcut.
_RUN_CALLBACKS: list[tuple[weakref.ref, weakref.ref]] = []
ERROR_COLOR = "#e55"


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


class RunPanel(QWidget):
    """Run and Cancel buttons, a progress bar and the status line.

    Signals
    -------
    run_requested : Run was pressed.
    remaining_requested : 'Compute remaining slices' was pressed.
    returned(outcome) : the latest task returned (done, partial, cancelled or failed).
    finished(outcome) : the worker ended (after ``returned``, if any).
    """

    run_requested = Signal()
    remaining_requested = Signal()
    returned = Signal(object)
    finished = Signal(object)

    #: Also show progress in napari's activity dock (napari then animates a "busy" GIF in the
    #: status bar for the whole run, which costs CPU with software OpenGL).
    activity_progress: bool = True

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.worker: Any = None
        #: The UserWarnings the running (or last) worker raised, in order.
        self.run_warnings: list[str] = []
        self.task_id = 0
        self._cancel: CancelToken | None = None
        self._pbar: Any = None
        self._outcome: Any = None
        self._can_run = (False, "")

        self.run_button = QPushButton("Run")
        self.run_button.setToolTip(f"Compute the maps for the chosen image ({_shortcut_text()}).")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop the run at its next chunk of null images; nothing "
                                      "it computed is added.")
        self.cancel_button.setEnabled(False)
        self.remaining_button = QPushButton("Compute remaining slices")
        self.remaining_button.setToolTip("Run the slices of this stack that have no result yet, "
                                         "with the same model and preset; their maps join the "
                                         "ones computed before.")
        self.remaining_button.setVisible(False)
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setTextVisible(False)
        self.progress_bar.setToolTip("Progress of the run (null images done).")
        self.status_label = QLabel("Ready.")
        self.status_label.setWordWrap(True)
        self.status_label.setTextFormat(Qt.TextFormat.RichText)
        self.status_label.setToolTip("Progress, then the run's model, significance count and "
                                     "diagnostics (⚠ = read the maps with care).")
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(buttons)
        layout.addWidget(self.remaining_button)
        layout.addWidget(self.progress_bar)
        layout.addWidget(self.status_label)
        self.run_button.clicked.connect(self.run_requested)
        self.cancel_button.clicked.connect(self.cancel)
        self.remaining_button.clicked.connect(self.remaining_requested)

    # ---- state -------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.worker is not None

    def set_can_run(self, ok: bool, reason: str = "") -> None:
        """Enable Run only when there is something to run on (``reason`` says what is missing)."""
        self._can_run = (ok, reason)
        self._update_buttons()

    def _update_buttons(self) -> None:
        ok, reason = self._can_run
        self.run_button.setEnabled(ok and not self.busy)
        tip = f"Compute the maps for the chosen image ({_shortcut_text()})."
        self.run_button.setToolTip(tip if ok else f"{reason} {tip}")
        self.cancel_button.setEnabled(self.busy and not (self._cancel and self._cancel.cancelled))
        self.remaining_button.setEnabled(ok and not self.busy)

    def offer_remaining(self, missing: int) -> None:
        """Show 'Compute remaining slices' while the selected stack lacks ``missing`` slices."""
        self.remaining_button.setVisible(missing > 0)
        self.remaining_button.setText(f"Compute remaining slices ({missing})")

    def show_status(self, html_text: str) -> None:
        self.status_label.setText(html_text)

    def show_error(self, message: str, warnings_: Sequence[str] = ()) -> None:
        """The error on the status line (red) and as a toast; ``warnings_`` the run raised
        first follow it (⚠), since they often say why it failed (an outline in a coarser
        level's pixels leaves no tile with tissue)."""
        from napari.utils.notifications import show_error

        notes = list(dict.fromkeys(warnings_))
        lines = [f"<span style='color:{ERROR_COLOR}'>{html.escape(message, quote=False)}</span>",
                 *(f"<span style='color:{WARNING_COLOR}'>⚠ {html.escape(n, quote=False)}</span>"
                   for n in notes)]
        self.status_label.setText("<br>".join(lines))
        show_error("\n".join([message, *(f"⚠ {n}" for n in notes)]))

    @staticmethod
    def bind_shortcut(viewer: Any, callback: Any) -> None:
        """Let :data:`RUN_ACTION` (and its shortcut) call ``callback`` (a bound method) in
        ``viewer``.

        The action is napari's (action manager), so Preferences ▸ Shortcuts lists it and the
        analyst can rebind it; the last dock opened in a viewer owns it.
        """
        register_run_action()
        _RUN_CALLBACKS.append((weakref.ref(_unwrapped(viewer)), weakref.WeakMethod(callback)))

    @staticmethod
    def unbind_shortcut(viewer: Any, callback: Any) -> None:
        viewer = _unwrapped(viewer)
        _RUN_CALLBACKS[:] = [(ref, cb) for ref, cb in _RUN_CALLBACKS
                             if ref() is not None and cb() is not None
                             and not (ref() is viewer and cb() == callback)]

    # ---- run / cancel ------------------------------------------------------------------
    def next_task_id(self) -> int:
        """A new task id; outcomes of every earlier task are dropped from now on."""
        self.task_id += 1
        return self.task_id

    def start(self, job: Callable[..., Generator], spec: Any, *, description: str) -> Any:
        """Run ``job(spec, cancel_token)`` on a napari thread worker; returns the worker."""
        from napari.qt.threading import thread_worker
        from napari.utils import progress

        if self.busy:
            raise RuntimeError("A run is already in progress; cancel it first.")
        self._cancel = CancelToken()
        worker = thread_worker(job, start_thread=False,
                               worker_class=_make_worker_class())(spec, self._cancel)
        worker.cancel_token = self._cancel
        # a UserWarning of the run is the dock's to show (run_warnings), not a fading toast
        self.run_warnings = []
        relay = getattr(worker, "_relay_warning", None)  # napari's (every warning as a toast),
        if relay is not None:  # where its mixin's __init__ ran: not with this worker class
            with suppress(TypeError, RuntimeError):
                worker.warned.disconnect(relay)
        worker.warned.connect(partial(relay_worker_warning, into=self.run_warnings))
        worker.yielded.connect(self._on_progress)
        worker.returned.connect(self._on_returned)
        worker.finished.connect(self._on_finished)
        self.worker = worker
        self._outcome = None
        self._pbar = progress(total=1000, desc=description) if self.activity_progress else None
        self.progress_bar.setValue(0)
        self._update_buttons()
        worker.start()
        return worker

    def cancel(self) -> None:
        """Stop the running job at its next chunk; nothing it computed is added."""
        if self._cancel is not None and not self._cancel.cancelled:
            self._cancel.cancel()
            self.status_label.setText("Cancelling at the next chunk…")
        self._update_buttons()

    @property
    def cancelled(self) -> bool:
        return self._cancel is not None and self._cancel.cancelled

    def _on_progress(self, item: Any) -> None:
        if item.task_id != self.task_id or self.worker is None:
            return
        if item.fraction >= 1.0:  # the end is always shown
            self._show_progress.cancel()
            self._render_progress(item)
        else:
            self._show_progress(item)

    @qthrottled(timeout=UI_UPDATE_MS, leading=True)
    def _show_progress(self, item: Any) -> None:
        if self.worker is not None:  # not a trailing call after the run ended
            self._render_progress(item)

    def _render_progress(self, item: Any) -> None:
        value = round(1000 * item.fraction)
        self.progress_bar.setValue(value)
        if not self.cancelled:
            self.status_label.setText(item.message)
        # last: updating napari's activity-dock bar can process events, this run's end included
        pbar = self._pbar
        if pbar is not None:
            pbar.set_description(item.message)
            pbar.update(value - pbar.n)

    def _on_returned(self, outcome: Any) -> None:
        self._outcome = outcome
        if outcome.task_id != self.task_id:  # an older task: never shown
            outcome.results, outcome.status = {}, "cancelled"
            return
        self.returned.emit(outcome)  # a cancelled run still brings its finished planes

    def _on_finished(self) -> None:
        self._show_progress.cancel()
        if self._pbar is not None:
            self._pbar.close()
            self._pbar = None
        self.worker = None
        self._cancel = None
        self.progress_bar.setValue(0)
        self._update_buttons()
        outcome = self._outcome
        if outcome is None:  # ended without returning (run_job catches every run failure)
            from napari_attnreg.core.run.service import Outcome

            outcome = Outcome(self.task_id, status="failed", message="The run ended unexpectedly.")
        self.finished.emit(outcome)


def _unwrapped(viewer: Any) -> Any:
    """The viewer itself: napari hands the action, and a dock opened from the Plugins menu,
    a PublicOnlyProxy of it (a new one each time), never the same object as each other."""
    return getattr(viewer, "__wrapped__", viewer)


def _run_in_viewer(viewer: ViewerModel) -> None:
    """The action: press Run in the dock last opened in ``viewer`` (none open: nothing).

    Annotated with napari's ``ViewerModel`` as napari's own viewer actions are, so the action
    manager injects the current viewer (``action_manager.trigger(RUN_ACTION)``, menus).
    """
    viewer = _unwrapped(viewer)
    for ref, method in reversed(_RUN_CALLBACKS):
        callback = method()
        if ref() is viewer and callback is not None:
            callback(viewer)
            return


def register_run_action() -> None:
    """Register :data:`RUN_ACTION` with napari's action manager, with its default shortcut.

    The default is bound only when the analyst's shortcut settings do not name the action
    (napari binds a stored choice itself, also an empty one).
    """
    from napari.settings import get_settings
    from napari.utils.action_manager import action_manager
    from napari.utils.key_bindings import KeyBinding

    action_manager.register_action(
        RUN_ACTION, _run_in_viewer,
        "Attention Regularization: Run on the chosen image (the dock must be open)",
        ViewerModel)
    if RUN_ACTION not in get_settings().shortcuts.shortcuts:
        # a KeyBinding, as napari stores its own: the editor, the keymap and a stored choice
        # then compare equal to it (a raw string never equals napari's parsed binding)
        action_manager.bind_shortcut(RUN_ACTION, KeyBinding.from_str(RUN_SHORTCUT))


def _shortcut_text() -> str:
    return RUN_SHORTCUT.replace("Control", "Ctrl").replace("-", "+")

"""One run at a time on the plane on screen; its result goes into the session if still valid.

An outcome is dropped when it is stale: an older task, another image given meanwhile, pixels
of the plane edited in place during the run (the stack never copies the user's array), or the
image's file changed meanwhile (a slide is never read to tell: its path, size, time and level
are).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.service import ModelSpec, Outcome, user_message
from napari_attnreg.notebook.image_panel import ImagePanel
from napari_attnreg.notebook.pipeline import make_job
from napari_attnreg.notebook.run_panel import RunPanel
from napari_attnreg.notebook.state import ExplorerState
from napari_attnreg.notebook.summary_panel import done_text
from napari_attnreg.session import Session


class PlaneRuns:
    """Starts runs from the state and the session, and files their results by plane.

    Parameters
    ----------
    state, session, image_panel, run_panel
        The explorer's parts it reads (settings, image) and reports to (status line).
    advanced : callable
        The advanced options that are set (ValueError for a value that is no number).
    model : callable
        The service's description of the chosen model.

    Attributes
    ----------
    pending : tuple or None
        ``(plane, image generation, pixel fingerprint)`` of the run in progress.
    generation : int
        Counts the images given to the explorer (a result of an earlier one is dropped).
    last_error : BaseException or None
        Why the last run (or image) failed; None after a success.
    """

    def __init__(self, state: ExplorerState, session: Session, image_panel: ImagePanel,
                 run_panel: RunPanel, advanced: Callable[[], dict[str, Any]],
                 model: Callable[[], ModelSpec]) -> None:
        self.state, self.session = state, session
        self.image_panel, self.run_panel = image_panel, run_panel
        self._advanced, self._model = advanced, model
        self.pending: tuple | None = None
        self.generation = 0
        self.last_error: BaseException | None = None
        #: Run is pushing the panel's options to the session (not settings set in code)
        self.pushing = False

    def fingerprint(self, plane: tuple[int, ...]) -> str:
        # taken at Run and at the end: the user's array may be edited in place meanwhile (the
        # stack never copies it), or the file rewritten, and then the result belongs to pixels
        # no longer there
        return self.image_panel.source.fingerprint(plane)

    def start(self, *, wait: bool) -> AttentionResult | None:
        """Run the plane on screen; with ``wait``, its result (None: failed or cancelled)."""
        if self.run_panel.busy:
            self.run_panel.set_status("A run is already in progress; cancel it first.",
                                      "warning")
            return None
        source = self.image_panel.source
        if source is None:
            self.run_panel.set_status("No usable image: give the explorer a 2D image first "
                                      "(explorer.set_image(...)).", "error")
            return None
        plane = tuple(self.state.slice_index)
        model = self._model()
        self.pushing = True
        try:  # a re-run of this plane keeps the thresholds chosen for it
            job = make_job(self.session, model, source, plane, self._advanced(),
                           self.run_panel.next_task_id(),
                           thresholds=self.session.run_thresholds())
        except ValueError as err:
            self.fail(err)
            return None
        finally:
            self.pushing = False
        self.pending = (plane, self.generation, self.fingerprint(plane))
        where = f" on plane {plane}" if plane else ""
        tiled = ", tiled" if self.state.tiled else ""
        # a file, or a slide's level, is opened in the run's worker (an array needs no word)
        opens = source.path is not None or source.stack is None
        outcome = self.run_panel.start(job, wait=wait, message=(
            f"Starting{where}: {model.label()}, {self.state.preset}, {self.state.method}, "
            f"B={self.state.n_boot}{tiled} …"), prepare=source.prepare,
            preparing=f"Opening {source.name} …" if opens else "")
        if outcome is None:  # continues on the event loop
            return None
        entry = self.session.get(plane)  # None when dropped (e.g. pixels edited meanwhile)
        kept = None if entry is None else entry.results[plane]
        return kept if outcome.ok and kept is outcome.results.get(plane) else None

    def finish(self, outcome: Outcome) -> None:
        """File the outcome's result under its plane, or say why it was not."""
        pending, self.pending = self.pending, None
        if pending is None or outcome.task_id != self.run_panel.task_id:
            return  # a stale task: its result belongs to nothing on screen
        plane, generation, fingerprint = pending
        result = outcome.results.get(plane)
        if outcome.status == "cancelled":
            kept = " The previous result is still shown." if self.session.latest else ""
            self.run_panel.set_status(outcome.message + kept, "warning")
        elif result is None:
            self.fail(outcome.error, outcome.message)
        elif generation != self.generation or fingerprint != self.fingerprint(plane):
            self.run_panel.set_status("The image changed during the run; its result was "
                                      "dropped. Press Run again.", "warning")
        else:
            self.last_error = None
            self.run_panel.set_status(*done_text(result, plane, tuple(self.state.slice_index)))
            self.session.add(plane, {plane: result},
                             params={"task_id": outcome.task_id, "plane": list(plane)})
            on_screen = tuple(self.state.slice_index)
            self.session.select(on_screen if on_screen in self.session else None)

    def fail(self, err: BaseException | None, message: str | None = None) -> None:
        """Say why a run failed (the previous result stays)."""
        self.last_error = err
        message = message or (user_message(err) if err is not None else "The run failed.")
        kept = " The previous result is kept." if self.session.latest else ""
        self.run_panel.set_status(message + kept, "error")

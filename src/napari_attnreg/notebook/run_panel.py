"""Run / Cancel, progress and the status line: one run at a time, each with a task id.

The panel drives the core's :func:`~napari_attnreg.core.run.service.run_job` on
:class:`~.runner.BackgroundRunner` (one engine chunk per worker-thread step) and hands the
service's :class:`~napari_attnreg.core.run.service.Outcome` to its owner. Outcomes carry the
task id of their job, so the owner can tell a current outcome from a stale one.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Generator
from typing import Any

import ipywidgets as W

from napari_attnreg.core.run.service import Job, JobProgress, Outcome, run_job, user_message
from napari_attnreg.notebook.runner import BackgroundRunner, Ended
from napari_attnreg.notebook.state import ExplorerState

LEVEL_COLORS = {"error": "#c62828", "warning": "#b26a00", "success": "#2e7d32"}
_BAR_STYLES = {"done": "success", "partial": "warning", "cancelled": "warning",
               "failed": "danger"}


def _prepared_run(job: Job, prepare: Callable[[Job], Job] | None, preparing: str,
                  cancel: Any) -> Generator[JobProgress, None, Outcome]:
    """:func:`run_job` of ``prepare(job)``: reading files happens here, in the worker."""
    if prepare is not None:
        if preparing:
            yield JobProgress(job.task_id, 0, len(job.planes), job.planes[0], None, preparing)
        job = prepare(job)
    return (yield from run_job(job, cancel))


class RunPanel(W.VBox):
    """Buttons and progress (side panel) plus the status line (under the image).

    Parameters
    ----------
    state : ExplorerState
        Its ``running`` and ``status`` traits are kept up to date.
    on_run : callable
        What the Run button does.
    on_finish : callable
        Called with the service's Outcome when a run ends, on the thread that started it.
    """

    def __init__(self, state: ExplorerState, on_run: Callable[[], Any],
                 on_finish: Callable[[Outcome], Any]) -> None:
        super().__init__()
        self.state = state
        self._on_finish_cb = on_finish
        self.run_button = W.Button(description="Run", button_style="primary", icon="play",
                                   tooltip="Compute with the settings above (one run at a time).",
                                   layout=W.Layout(width="120px"))
        self.cancel_button = W.Button(description="Cancel", icon="stop", disabled=True,
                                      tooltip="Stop after the chunk being computed.",
                                      layout=W.Layout(width="120px"))
        self.run_button.on_click(lambda _b: on_run())
        self.cancel_button.on_click(lambda _b: self.cancel())
        self.progress = W.FloatProgress(value=0.0, min=0.0, max=1.0,
                                        layout=W.Layout(width="190px"))
        self.progress_label = W.Label("")
        self.status = W.HTML().add_class("attnreg-status")  # CSS classes name parts for tests
        self.runner = BackgroundRunner(self._on_event, self._on_finish)
        self.task_id = 0  # id of the latest task started
        self._last: Outcome | None = None
        self._ready = True
        self.t_start = 0.0
        self.children = (W.HBox([self.run_button, self.cancel_button]),
                         W.HBox([self.progress, self.progress_label]))
        state.observe(lambda _c: self._sync_buttons(), names=["running"])

    @property
    def busy(self) -> bool:
        return self.runner.running

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def next_task_id(self) -> int:
        """The id the next job gets (tag the Job with it)."""
        return self.task_id + 1

    def start(self, job: Job, *, wait: bool, message: str,
              prepare: Callable[[Job], Job] | None = None,
              preparing: str = "") -> Outcome | None:
        """Run ``job``; returns its outcome when it ran to the end here (``wait`` or no loop).

        ``prepare`` turns the job into the one that runs, in the worker thread (a slide level
        opened and read); ``preparing`` is the status line meanwhile. What it raises ends the
        run as a failure with its message.
        """
        self.task_id = job.task_id
        self.t_start = time.perf_counter()
        self.progress.value, self.progress.bar_style = 0.0, "info"
        self.progress_label.value = ""
        self.set_status(message, "info")
        self.state.running = True
        ended = self.runner.start(lambda token: _prepared_run(job, prepare, preparing, token),
                                  background=not wait)
        return None if ended is None else self._last

    def cancel(self) -> None:
        """Ask the running task to stop after its current chunk."""
        if self.runner.running:
            self.runner.cancel()
            self.set_status("Cancelling after the current chunk …", "warning")

    def set_status(self, message: str, level: str = "info") -> None:
        self.state.status = message
        colour = LEVEL_COLORS.get(level, "inherit")
        self.status.value = f"<span style='color:{colour}'>{html.escape(message)}</span>"

    def set_ready(self, ready: bool) -> None:
        """Whether there is something to run (no usable image: Run is disabled)."""
        self._ready = ready
        self._sync_buttons()

    def _sync_buttons(self) -> None:
        self.run_button.disabled = self.state.running or not self._ready
        self.run_button.tooltip = ("Compute with the settings above (one run at a time)."
                                   if self._ready else "Give the explorer a usable image first "
                                   "(explorer.set_image(...)).")
        self.cancel_button.disabled = not self.state.running

    def _on_event(self, progress: JobProgress) -> None:
        event = progress.event
        self.progress.value = progress.fraction if event is not None and event.stage != "model" \
            else 0.0
        if self.runner.cancel_requested:
            return  # keep "Cancelling …" visible
        self.progress_label.value = "" if event is None else f"{event.done}/{event.total}"
        self.set_status(f"{progress.message} · {self.elapsed:.1f} s", "info")

    def _on_finish(self, ended: Ended) -> None:
        if ended.kind == "done":
            outcome = ended.result
        else:  # the task itself was stopped (kernel interrupt) or the service had a bug
            err = ended.error
            outcome = Outcome(self.task_id, status=ended.kind, error=err,
                              message=user_message(err) if err is not None else "Cancelled.")
        self._last = outcome
        self.state.running = False
        if outcome.status == "done":
            self.progress.value = 1.0
        self.progress.bar_style = _BAR_STYLES.get(outcome.status, "danger")
        self._on_finish_cb(outcome)

    def close(self) -> None:
        self.runner.shutdown()
        super().close()

"""Python warnings a run raises, brought to the dock instead of the terminal.

A run can raise a ``UserWarning`` the analyst must read: a GeoJSON tissue outline lying in
the slide's top-left quarter (a coarser level's pixels read as full-resolution ones), a
reader's note about a file. napari shows a warning raised on its own thread as a toast once
per session (the same warning on the next run: nothing) and a script's in the terminal; a
worker's were dropped (napari's relay is not connected on the run panel's worker class); none
reached the dock's status line or the result. Here a run's ``UserWarning``\\ s, those
raised while the job is built on the GUI thread and those the worker relays, become the
result's diagnostics (⚠ on the status line, the warning toast, the saved result and its
summary), or join the error of a run that failed. Other warnings (deprecations, numerical
noise) go where they went before. No Qt in here.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

#: Diagnostic code of a warning the run raised (see :mod:`napari_attnreg.core.stats.diagnostics`).
RUN_WARNING = "run_warning"


def is_for_analyst(category: type[Warning]) -> bool:
    """Whether a warning of ``category`` is one the dock shows (a ``UserWarning``): the
    project's readers and options say what to check with those; deprecations and numerical
    warnings are for developers."""
    return isinstance(category, type) and issubclass(category, UserWarning)


@contextmanager
def collect_warnings(into: list[str]) -> Iterator[None]:
    """Append the text of each ``UserWarning`` raised in the block to ``into`` (each time it
    is raised, not once per session); other warnings are shown as before, after the block."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", UserWarning)
        yield
    for found in seen:
        if is_for_analyst(found.category):
            into.append(str(found.message))
        else:
            warnings.showwarning(found.message, found.category, found.filename, found.lineno)


def relay_worker_warning(args: tuple, into: list[str]) -> None:
    """A thread worker's ``warned`` signal (``warnings.showwarning``'s arguments): a
    ``UserWarning``'s text joins ``into``; another goes to napari's notifications, as napari's
    own relay would have sent it."""
    message, category = args[0], args[1]
    if is_for_analyst(category):
        into.append(str(message))
        return
    from napari.utils.notifications import notification_manager

    notification_manager.receive_warning(*args)


def add_to_results(results: Any, messages: Sequence[str]) -> None:
    """Record ``messages`` as warnings among each result's diagnostics (each once, first)."""
    for result in results:
        stored = list(result.metadata.get("diagnostics") or [])
        known = {d.get("message") for d in stored if isinstance(d, dict)}
        new = [{"code": RUN_WARNING, "severity": "warning", "message": m}
               for m in dict.fromkeys(messages) if m not in known]
        if new:
            result.metadata["diagnostics"] = [*new, *stored]

"""A very small observer: a :class:`Signal` per event, called synchronously in connection order.

Why not psygnal: the session model is also used by the notebook and scripts, where napari
(and with it psygnal) may be absent, and it needs nothing beyond connect / disconnect / emit.
A slot that raises stops the emission and the error reaches the caller, as a direct call would.

Example
-------
>>> seen = []
>>> changed = Signal("changed")
>>> _ = changed.connect(seen.append)
>>> changed.emit(3)
>>> seen
[3]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Slot = Callable[..., Any]


class Signal:
    """One event: slots connected to it are called with the arguments of each :meth:`emit`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._slots: list[Slot] = []

    def connect(self, slot: Slot) -> Slot:
        """Call ``slot`` on every emission (once, however often it is connected); returns it."""
        if slot not in self._slots:
            self._slots.append(slot)
        return slot

    def disconnect(self, slot: Slot) -> None:
        """Stop calling ``slot`` (a slot never connected is ignored)."""
        if slot in self._slots:
            self._slots.remove(slot)

    def emit(self, *args: Any) -> None:
        """Call every slot with ``args``, in the order they were connected."""
        for slot in list(self._slots):  # a slot may disconnect itself (or another) meanwhile
            slot(*args)

    def __len__(self) -> int:
        return len(self._slots)

    def __repr__(self) -> str:
        return f"<Signal {self.name!r} with {len(self._slots)} slot(s)>"


class SessionEvents:
    """The events of a :class:`~napari_attnreg.session.model.Session`.

    Attributes
    ----------
    result_added : Signal
        ``(key)``: a result for image ``key`` was added or replaced (a re-run).
    result_removed : Signal
        ``(key)``: the result of image ``key`` is gone.
    selection_changed : Signal
        ``(key or None)``: another result is selected (None: none).
    thresholds_changed : Signal
        ``(key, thresholds)``: result ``key`` now applies ``thresholds``.
    settings_changed : Signal
        ``(changes)``: a dict of the run settings that changed, with their new values.
    """

    def __init__(self) -> None:
        self.result_added = Signal("result_added")
        self.result_removed = Signal("result_removed")
        self.selection_changed = Signal("selection_changed")
        self.thresholds_changed = Signal("thresholds_changed")
        self.settings_changed = Signal("settings_changed")

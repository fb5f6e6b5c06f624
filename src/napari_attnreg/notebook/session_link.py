"""Keeps the explorer's traits and its session in step (the notebook side of the session model).

- Run settings: a trait change is pushed to ``session.update_settings``; a setting changed in
  code (``explorer.session.update_settings(n_boot=50)``) is pulled back into its trait.
- Thresholds: the ``rule``/``*_th`` traits show the session's thresholds (the selected
  result's, else those the next run starts with), and a move of them goes to that result only.
"""

from __future__ import annotations

from typing import Any

from napari_attnreg.core.results.map_info import MapInfo
from napari_attnreg.core.stats.presets import THRESHOLD_KEYS
from napari_attnreg.notebook.state import ExplorerState
from napari_attnreg.session import Session

#: Traits that are run settings (RunConfig options of the same name).
SETTING_TRAITS = ("preset", "method", "n_boot", "seed", "device", "tiled", "tile_overlap",
                  "tile_scale")


class SessionLink:
    """Binds an :class:`ExplorerState`'s settings and thresholds traits to a :class:`Session`."""

    def __init__(self, state: ExplorerState, session: Session) -> None:
        self.state, self.session = state, session
        self._showing = False  # traits being set from the session: nothing to push back
        state.observe(self._on_setting, names=list(SETTING_TRAITS))
        state.observe(self._on_threshold, names=list(THRESHOLD_KEYS))
        events = session.events
        events.settings_changed.connect(self._on_settings_changed)
        events.selection_changed.connect(self.show)
        events.thresholds_changed.connect(self._on_result_changed)
        events.result_added.connect(self._on_result_changed)  # a re-run of the plane shown
        session.update_settings({name: getattr(state, name) for name in SETTING_TRAITS})
        session.set_thresholds(state.thresholds())

    def _on_setting(self, change: dict) -> None:
        self.session.update_settings({change["name"]: change["new"]})

    def _on_threshold(self, _change: dict) -> None:
        if not self._showing:
            self.session.set_thresholds(self.state.thresholds())

    def _on_settings_changed(self, changes: dict[str, Any]) -> None:
        for name in SETTING_TRAITS:
            if name in changes and getattr(self.state, name) != changes[name]:
                setattr(self.state, name, changes[name])  # set in code: the control follows
        if self.session.selected is None and changes.keys() & {"preset", *THRESHOLD_KEYS}:
            self.show()  # e.g. a new preset's thresholds for the next run

    def _on_result_changed(self, key: Any, *_: Any) -> None:
        if key == self.session.selected_key:
            self.show()

    def show(self, *_: Any) -> None:
        """Set the thresholds traits to the session's (the selected result's, else the next
        run's) and offer the rules of their preset."""
        entry = self.session.selected
        thresholds = self.session.thresholds()
        self._showing = True
        try:
            with self.state.hold_trait_notifications():
                self.state.shown_preset = self.session.preset if entry is None else entry.preset
                self.state.shown_map = ("attention" if entry is None
                                        else MapInfo.of(entry.any_result).label)
                for key, value in thresholds.items():
                    setattr(self.state, key, value)
        finally:
            self._showing = False

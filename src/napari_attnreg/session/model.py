"""The session model: run settings, results per image with their own thresholds, the selection.

Plain Python, no GUI toolkit (napari-animation's model/view split): the napari dock and the
notebook explorer only bind their controls to a :class:`Session` and react to its events
(:class:`~napari_attnreg.session.events.SessionEvents`). Results are keyed by the image they
belong to (a napari layer id, a notebook plane), one current result per image; each keeps the
thresholds chosen for it, so selecting another image shows *its* thresholds and count.

Example
-------
>>> session = Session({"preset": "directional"})
>>> session.thresholds().rule                      # nothing selected: what a run starts with
'q'
>>> session.add("cells", {(): result})             # doctest: +SKIP
>>> session.select("cells")                        # doctest: +SKIP
>>> session.set_thresholds({"q_th": 0.05})         # only the selected result's  # doctest: +SKIP
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.options import option
from napari_attnreg.core.run.thresholds import Thresholds
from napari_attnreg.core.stats.presets import DEFAULT_PRESET, THRESHOLD_KEYS
from napari_attnreg.core.stats.procedures import get_procedure
from napari_attnreg.session.events import SessionEvents

#: Index of one plane of an image (``()`` for a 2D image).
PlaneIndex = tuple[int, ...]


def _new_run_id() -> str:
    return uuid.uuid4().hex


def same_setting(a: Any, b: Any) -> bool:
    """Whether two setting values are equal; a concept (an array ``target``) compares by its
    numbers, where ``==`` would compare element by element."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.shape == b.shape and bool(np.array_equal(a, b)))
    return bool(a == b)


def preset_name(preset: str) -> str:
    """A preset as the Statistics control names it, without its note (``"step-down"``)."""
    return option("preset").label_of(preset).split(" (")[0]


def check_rule(rule: str, preset: str) -> None:
    """Refuse a significance rule that ``preset``'s results do not define, in the words the
    core's option check uses (a step-down result has no q, p or lfdr map to apply it to).

    Raises
    ------
    ValueError
        ``rule`` is not one of the preset's rules.
    """
    rules = get_procedure(preset).rules
    if rule not in rules:
        raise ValueError(f"rule={rule!r} is not available under preset={preset!r}; use one of "
                         f"{', '.join(rules)}.")


@dataclass(frozen=True)
class RunInfo:
    """One run: its id (front ends find their outputs by it) and the parameters that made it."""

    run_id: str = field(default_factory=_new_run_id)
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ResultEntry:
    """The current result of one image: its planes, its run and the thresholds chosen for it."""

    key: Hashable
    results: Mapping[PlaneIndex, AttentionResult]
    thresholds: Thresholds
    run: RunInfo

    @property
    def any_result(self) -> AttentionResult:
        """The first plane's result (the only one of a 2D image)."""
        return next(iter(self.results.values()))

    @property
    def preset(self) -> str:
        """The statistics preset that made the result (its planes share it)."""
        return self.any_result.preset

    def shown(self, plane: PlaneIndex | None = None) -> AttentionResult:
        """The result of ``plane`` (default: the first) applying this entry's thresholds.

        The maps are shared, not copied; ``z_th`` None is "no z mask".
        """
        result = self.any_result if plane is None else self.results[plane]
        return result.with_thresholds(**self.thresholds)


class Session:
    """Run settings, one result per image with its own thresholds, and the selected result.

    Parameters
    ----------
    settings : mapping, optional
        Run options as a dict of :class:`~napari_attnreg.core.run.engine.RunConfig` keyword
        arguments (the options panels push theirs here; a run reads them back).

    Attributes
    ----------
    events : SessionEvents
        ``result_added``, ``result_removed``, ``selection_changed``, ``thresholds_changed``,
        ``settings_changed``.
    """

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.events = SessionEvents()
        self._settings: dict[str, Any] = dict(settings or {})
        self._entries: dict[Hashable, ResultEntry] = {}  # the latest added last
        self._selected: Hashable | None = None

    # ---- settings ---------------------------------------------------------------------------
    @property
    def settings(self) -> Mapping[str, Any]:
        """The run settings (read-only; change them with :meth:`update_settings`)."""
        return MappingProxyType(self._settings)

    @property
    def preset(self) -> str:
        """The statistics preset the next run uses."""
        return self._settings.get("preset") or DEFAULT_PRESET

    def update_settings(self, values: Mapping[str, Any] | None = None,
                        **more: Any) -> dict[str, Any]:
        """Set run options; ``settings_changed`` fires once with those that changed (returned).

        A new ``preset`` brings its own default thresholds (unless given in the same call),
        as the preset controls of every front end do.
        """
        given = {**(values or {}), **more}
        preset = given.get("preset")
        if preset is not None and preset != self._settings.get("preset"):
            given = {**Thresholds.from_preset(preset).as_dict(), **given}
        changed = {k: v for k, v in given.items()
                   if k not in self._settings or not same_setting(self._settings[k], v)}
        if changed:
            self._settings.update(changed)
            self.events.settings_changed.emit(dict(changed))
        return changed

    def show_preset_of(self, key: Hashable | None = None) -> str | None:
        """Make the next run's preset the one of result ``key`` (default: the selected one).

        An opened (saved) result is shown as if it had been run here: the Statistics control
        names the preset that made it, as it would after that run, and its threshold
        controls already offer that preset's rules; the dropdown showing another preset
        while the thresholds showed this one read as a contradiction. Only a result the
        analyst opens takes the control: selecting another image leaves their choice for the
        next run alone.

        Returns
        -------
        str or None
            What the status line should say (None: the preset was that already).
        """
        entry = self.selected if key is None else self._entries[key]
        if entry is None or entry.preset == self.preset:
            return None
        self.update_settings(preset=entry.preset)
        return (f"Statistics set to {preset_name(entry.preset)}, the preset this result was "
                "made with; choose another for the next run.")

    def preset_note(self) -> str | None:
        """What the status line says when the next run's preset is not that of the selected
        result (None: they agree, or nothing is selected): a new choice applies to the next
        run only, and the result on screen keeps its own statistics and thresholds."""
        entry = self.selected
        if entry is None or entry.preset == self.preset:
            return None
        return (f"Statistics: {preset_name(self.preset)} applies to the next run; the result "
                f"shown keeps its {preset_name(entry.preset)} statistics and thresholds.")

    def settings_thresholds(self) -> Thresholds:
        """The thresholds in the settings (the preset's defaults for keys they lack)."""
        return Thresholds.from_mapping(self._settings, self.preset)

    def run_thresholds(self) -> Thresholds:
        """The thresholds a new run starts with.

        The selected result's when it has the settings' preset (a re-run keeps what the
        analyst chose for this image); otherwise those in the settings.
        """
        entry = self.selected
        if entry is not None and entry.preset == self.preset:
            return entry.thresholds
        return self.settings_thresholds()

    # ---- results ----------------------------------------------------------------------------
    def add(self, key: Hashable, results: Mapping[PlaneIndex, AttentionResult], *,
            params: Mapping[str, Any] | None = None, run_id: str | None = None,
            thresholds: Mapping[str, Any] | None = None) -> ResultEntry:
        """Make ``results`` (by plane) the current result of image ``key``.

        Parameters
        ----------
        key : hashable
            The image (a napari layer id, a notebook plane); a result it had is replaced.
        results : mapping
            The planes of the result, at least one.
        params : mapping, optional
            How the run was made (kept with the entry as its :class:`RunInfo`).
        run_id : str, optional
            A new id by default.
        thresholds : mapping, optional
            Default: those of the replaced result when it has the same preset (a re-run or
            another slice keeps the analyst's choice), else the results' own (their run's).

        Returns
        -------
        ResultEntry
        """
        if not results:
            raise ValueError(f"A result of {key!r} needs at least one plane.")
        old = self._entries.pop(key, None)  # re-inserted last: the latest result
        planes = MappingProxyType(dict(results))
        first = next(iter(planes.values()))
        if thresholds is not None:
            chosen = Thresholds.from_mapping(thresholds, first.preset)
        elif old is not None and old.preset == first.preset:
            chosen = old.thresholds
        else:
            chosen = Thresholds.of(first)
        run = RunInfo(run_id or _new_run_id(), MappingProxyType(dict(params or {})))
        entry = self._entries[key] = ResultEntry(key, planes, chosen, run)
        self.events.result_added.emit(key)
        return entry

    def remove(self, key: Hashable) -> None:
        """Forget the result of ``key`` (deselecting it first when it is selected)."""
        if key not in self._entries:
            raise KeyError(key)
        if key == self._selected:
            self.select(None)
        del self._entries[key]
        self.events.result_removed.emit(key)

    def clear(self) -> None:
        """Forget every result (e.g. the explorer was given another image)."""
        for key in list(self._entries):
            self.remove(key)

    def get(self, key: Hashable) -> ResultEntry | None:
        """The result of image ``key``, or None."""
        return self._entries.get(key)

    def __getitem__(self, key: Hashable) -> ResultEntry:
        return self._entries[key]

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def latest(self) -> ResultEntry | None:
        """The result added last (None: none yet)."""
        return next(reversed(self._entries.values()), None)

    def find_run(self, run_id: str) -> ResultEntry | None:
        """The entry made by run ``run_id`` (None: replaced or removed since)."""
        return next((e for e in self._entries.values() if e.run.run_id == run_id), None)

    # ---- selection ----------------------------------------------------------------------
    @property
    def selected_key(self) -> Hashable | None:
        """The image whose result is selected (None: none)."""
        return self._selected

    @property
    def selected(self) -> ResultEntry | None:
        """The selected result (None: none, e.g. the chosen image has no result yet)."""
        return None if self._selected is None else self._entries[self._selected]

    def select(self, key: Hashable | None) -> None:
        """Select the result of ``key`` (None: none); ``selection_changed`` fires on a change."""
        if key is not None and key not in self._entries:
            raise KeyError(f"No result for {key!r} to select.")
        if key == self._selected:
            return
        self._selected = key
        self.events.selection_changed.emit(key)

    def shown(self, key: Hashable | None = None,
              plane: PlaneIndex | None = None) -> AttentionResult | None:
        """The result of ``key`` (default: the selected one) applying its own thresholds."""
        entry = self.selected if key is None else self._entries.get(key)
        return None if entry is None else entry.shown(plane)

    # ---- thresholds -----------------------------------------------------------------------
    def thresholds(self, key: Hashable | None = None) -> Thresholds:
        """The thresholds of result ``key`` (default: the selected one).

        With nothing selected: those in the settings, which the next run starts with.
        """
        key = self._selected if key is None else key
        if key is None:
            return self.settings_thresholds()
        return self._entries[key].thresholds

    def set_thresholds(self, thresholds: Mapping[str, Any],
                       key: Hashable | None = None) -> Thresholds:
        """Change the thresholds of result ``key`` (default: the selected one); returns them.

        Keys not given keep their value. With nothing selected (and no ``key``) the settings'
        thresholds change instead. ``thresholds_changed`` fires only on a change.

        Raises
        ------
        ValueError
            A threshold out of range, an unknown rule or one the preset does not define (the
            core's words); nothing changes.
        KeyError
            ``key`` has no result.
        """
        key = self._selected if key is None else key
        if key is None:
            new = Thresholds.from_mapping({**self.settings_thresholds(), **thresholds},
                                          self.preset)
            check_rule(new.rule, self.preset)
            self.update_settings(new.as_dict())
            return new
        entry = self._entries[key]
        given = {k: v for k, v in thresholds.items() if k in THRESHOLD_KEYS}
        new = Thresholds.from_mapping({**entry.thresholds, **given}, entry.preset)
        # rule='q' on a step-down result was kept: every redraw, table and export then
        # failed with "a step-down result has no 'p' map"
        check_rule(new.rule, entry.preset)
        if new != entry.thresholds:
            self._entries[key] = replace(entry, thresholds=new)  # same place: not the latest
            self.events.thresholds_changed.emit(key, new)
        return new

"""One dock's runs: a :class:`RunRecord` per source layer and the output layers it owns.

GUI thread only. The results and their thresholds go into the dock's session (keyed by the
source layer's ``unique_id``); a record keeps what only napari has: the source's geometry and
the output layers, tracked by object identity, so a copy the analyst makes, or the layers of
another dock, are never updated, renamed or moved here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from napari_attnreg._napari.geometry import SourceGeometry, named_axes
from napari_attnreg._napari.layers import (
    KINDS,
    META_KEY,
    give_name,
    layer_name,
    map_label,
    place_outputs,
    upsert_outputs,
)
from napari_attnreg._napari.pending import PendingRun
from napari_attnreg._napari.reopen import RESULT_FILES_KEY, load_linked, remember
from napari_attnreg._napari.run_record import RunRecord
from napari_attnreg._napari.slide_run import saved_grid, slide_of
from napari_attnreg._napari.status import TRANSFORM_EVENTS
from napari_attnreg.core.run.service import Outcome
from napari_attnreg.session import Session


def run_params(outcome: Outcome, pending: PendingRun) -> dict[str, Any]:
    """The run's options and provenance, as its output layers' metadata carries them."""
    source, job = pending.layer, pending.job
    params = {k: v for k, v in asdict(job.config).items() if k != "extra"}
    planes_run = [p for p in job.planes if p in outcome.results]
    made = next(iter(outcome.results.values())).metadata  # provenance of saved layers
    params.update(model=job.model.label(), model_description=outcome.model_description,
                  source=source.name, planes_run=[list(p) for p in planes_run],
                  elapsed_s=round(outcome.elapsed_s, 3), device_used=made.get("device"),
                  source_path=source.metadata.get("source_path"),
                  **{k: made.get(k) for k in ("weights", "weights_sha256", "model_domain",
                                              "package_version")})
    return params


def _name_axes(record: RunRecord) -> None:
    """A reopened result's layers take the axis names of its image ("z", "t"): the saved
    maps' files keep none, so their layers read "-3" where the image's read "z"."""
    from napari_attnreg._napari.outline import outline_of

    names = record.geometry.axis_labels
    layers = [*record.outputs.values(), outline_of(record.outputs.get("significant"))]
    for layer in layers:
        if layer is not None and names and layer.ndim == len(names) \
                and not named_axes(layer.axis_labels):
            layer.axis_labels = names


def reopened_outputs(viewer: Any, records: list[RunRecord]) -> dict[str, dict[str, Any]]:
    """Output layers a reader opened with their run's result files, no record's yet, by run
    id and kind (the outline is drawn from the significant layer, not tracked)."""
    tracked = {id(out) for record in records for out in record.outputs.values()}
    found: dict[str, dict[str, Any]] = {}
    for layer in viewer.layers:
        meta = layer.metadata.get(META_KEY) if isinstance(layer.metadata, dict) else None
        if not isinstance(meta, dict) or not meta.get(RESULT_FILES_KEY) \
                or meta.get("kind") not in KINDS or id(layer) in tracked:
            continue
        found.setdefault(str(meta.get("run_id")), {}).setdefault(meta["kind"], layer)
    return found


class RunRecords:
    """The records of one dock, keyed by the source layer's ``unique_id`` (as the session)."""

    def __init__(self, viewer: Any, session: Session,
                 on_source_moved: Callable[[RunRecord], None]) -> None:
        self.viewer = viewer
        self.session = session
        self._records: dict[Any, RunRecord] = {}
        self._on_source_moved = on_source_moved
        self._followed: list[Any] = []
        #: Source names of reopened results whose image is not open (:meth:`adopt_reopened`).
        self.waiting: list[str] = []
        session.events.result_removed.connect(self._forget)

    def _forget(self, key: Any) -> None:
        # a result removed from the session (its source was deleted, or by a script) has
        # nothing left for its record to show
        self._records.pop(key, None)

    def get(self, layer: Any) -> RunRecord | None:
        return None if layer is None else self._records.get(layer.unique_id)

    def by_key(self, key: Any) -> RunRecord | None:
        """The record of the session result ``key`` (a source layer's ``unique_id``)."""
        return self._records.get(key)

    def values(self) -> list[RunRecord]:
        return list(self._records.values())

    def source_of(self, record: RunRecord) -> Any | None:
        return next((lay for lay in self.viewer.layers if lay.unique_id == record.source_id),
                    None)

    def attach(self, outcome: Outcome, pending: PendingRun) -> RunRecord:
        """Put the outcome's finished planes into the session and add or update this dock's
        output layers."""
        source = pending.layer
        # moved since the start? (and a slide read at another level lies over the layer)
        geometry = pending.placed(SourceGeometry.from_layer(source, pending.geometry.channel_axis))
        params = run_params(outcome, pending)
        results = dict(outcome.results)
        old = self._records.get(source.unique_id)
        if old is not None and geometry.stack_axes and \
                len(results) < len(geometry.planes()) and old.takes_planes_of(geometry, results,
                                                                                  params):
            results = {**old.results, **results}  # another slice: keep the planes computed before
        # a re-run updates this dock's layers in place
        record = RunRecord(self.session, source.unique_id, source.name, geometry,
                           outputs=old.outputs if old is not None else {}, grid=pending.grid)
        self._records[source.unique_id] = record
        entry = self.session.add(source.unique_id, results, params=params)
        remember(entry.run.run_id, entry.results)  # the writer saves them with the layers
        upsert_outputs(self.viewer, record, new_run=True)
        self._follow(source)
        return record

    def adopt_reopened(self) -> list[RunRecord]:
        """Take up the results a reader reopened (a saved folder, a result file) as if this
        dock had run them: their layers become the record's outputs, on the image layer they
        were made from (same name and shape, without a result of its own). Returns the new
        records; a result whose image is not open stays as plain layers until it is."""
        made = []
        self.waiting = []  # the images of reopened results that are not open
        for run_id, outputs in reopened_outputs(self.viewer, self.values()).items():
            meta = next(iter(outputs.values())).metadata[META_KEY]
            source = self._reopened_source(meta)
            if source is None:
                self.waiting.append(str(meta.get("source")))
                continue
            results = load_linked(meta)
            first = next(iter(results.values()))
            # a slide's result at another level lies over the slide layer's pixels
            grid = saved_grid(source, first)
            geometry = SourceGeometry.from_layer(source)
            if grid is None and geometry.shape[-2:] != tuple(first.image_shape):
                self.waiting.append(str(meta.get("source")))  # same name, another image
                continue
            geometry = geometry if grid is None else grid.place(geometry)
            record = RunRecord(self.session, source.unique_id, source.name, geometry,
                               outputs=outputs, grid=grid)
            self._records[source.unique_id] = record
            _name_axes(record)
            # the thresholds in force when saved: the result files were written at them (the
            # attention layer's metadata, ``meta``, keeps the run's first ones: it does not
            # depend on them, and a reopened dock showed those over the saved layers)
            entry = self.session.add(source.unique_id, results, params=meta.get("run") or {},
                                     run_id=run_id,
                                     thresholds=first.thresholds or meta.get("thresholds"))
            remember(run_id, entry.results)
            self._follow(source)
            made.append(record)
        return made

    def _reopened_source(self, meta: dict[str, Any]) -> Any | None:
        from napari.layers import Image

        return next((lay for lay in self.viewer.layers
                     if isinstance(lay, Image) and lay.name == meta.get("source")
                     and META_KEY not in lay.metadata
                     and (not lay.multiscale or slide_of(lay) is not None)
                     and lay.ndim == 2 + len(next(iter(meta.get("planes") or [[]])))
                     and lay.unique_id not in self._records), None)

    def tidy(self) -> None:
        """Forget records of removed sources; outputs follow a renamed source."""
        alive = {layer.unique_id: layer for layer in self.viewer.layers}
        for key in [k for k in self._records if k not in alive]:
            self.session.remove(key)  # the record goes with it (_forget)
        for key, record in self._records.items():
            if record.source_name != alive[key].name:
                self._rename_outputs(record, alive[key].name)

    def _rename_outputs(self, record: RunRecord, new_name: str) -> None:
        """Output layers follow a renamed input, unless the analyst renamed them already."""
        old_name, record.source_name = record.source_name, new_name
        for kind, out in record.outputs.items():
            if out not in self.viewer.layers:
                continue
            out.metadata[META_KEY]["source"] = new_name
            label = map_label(record)
            if out.name.startswith(layer_name(old_name, kind, record.preset, label)):
                give_name(out, layer_name(new_name, kind, record.preset, label))

    def sync_geometry(self, record: RunRecord) -> None:
        """Take the source layer's current transform (the analyst may have rescaled it)."""
        source = self.source_of(record)
        if source is None:
            return
        geometry = record.placed(SourceGeometry.from_layer(source, record.geometry.channel_axis))
        if geometry.shape == record.geometry.shape and not geometry.same_grid(record.geometry):
            record.geometry = geometry
            place_outputs(self.viewer, record)

    # ---- following the source's transform ---------------------------------------------------
    def _follow(self, source: Any) -> None:
        if source in self._followed:
            return
        self._followed.append(source)
        for name in TRANSFORM_EVENTS:
            getattr(source.events, name).connect(self._on_transform)

    def _on_transform(self, event: Any) -> None:
        record = self._records.get(getattr(event.source, "unique_id", None))
        if record is not None:
            self.sync_geometry(record)
            self._on_source_moved(record)

    def stop_following(self) -> None:
        for source in self._followed:
            for name in TRANSFORM_EVENTS:
                getattr(source.events, name).disconnect(self._on_transform)
        self._followed.clear()

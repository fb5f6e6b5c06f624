"""One dock's runs: a :class:`RunRecord` per source layer and the output layers it owns.

GUI thread only. A record's output layers are tracked by object identity, so a copy the
analyst makes, or the layers of another dock, are never updated, renamed or moved here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from napari_attnreg._napari.geometry import SourceGeometry
from napari_attnreg._napari.layers import META_KEY, layer_name, place_outputs, upsert_outputs
from napari_attnreg._napari.pending import PendingRun
from napari_attnreg._napari.run_record import RunRecord
from napari_attnreg._napari.status import TRANSFORM_EVENTS
from napari_attnreg.core.run.service import Outcome


class RunRecords:
    """The records of one dock, keyed by the source layer's ``unique_id``."""

    def __init__(self, viewer: Any, on_source_moved: Callable[[RunRecord], None]) -> None:
        self.viewer = viewer
        self._records: dict[Any, RunRecord] = {}
        self._on_source_moved = on_source_moved
        self._followed: list[Any] = []

    def get(self, layer: Any) -> RunRecord | None:
        return None if layer is None else self._records.get(layer.unique_id)

    def values(self) -> list[RunRecord]:
        return list(self._records.values())

    def source_of(self, record: RunRecord) -> Any | None:
        return next((lay for lay in self.viewer.layers if lay.unique_id == record.source_id),
                    None)

    def attach(self, outcome: Outcome, pending: PendingRun, thresholds: Any) -> RunRecord:
        """Record the outcome's finished planes and add or update this dock's output layers."""
        source, job = pending.layer, pending.job
        geometry = SourceGeometry.from_layer(source, pending.geometry.channel_axis)  # moved?
        params = {k: v for k, v in asdict(job.config).items() if k != "extra"}
        planes_run = [p for p in job.planes if p in outcome.results]
        made = next(iter(outcome.results.values())).metadata  # provenance of saved layers
        params.update(model=job.model.label(), model_description=outcome.model_description,
                      source=source.name, planes_run=[list(p) for p in planes_run],
                      elapsed_s=round(outcome.elapsed_s, 3), device_used=made.get("device"),
                      source_path=source.metadata.get("source_path"),
                      **{k: made.get(k) for k in ("weights", "weights_sha256", "model_domain",
                                                  "package_version")})
        record = RunRecord(source.unique_id, source.name, geometry, dict(outcome.results), params,
                           thresholds)
        old = self._records.get(source.unique_id)
        if old is not None:
            if geometry.stack_axes and len(planes_run) < len(geometry.planes()) \
                    and old.merge(record):
                record = old  # another slice of the same stack: keep the planes computed before
            else:
                record.outputs = old.outputs  # a re-run updates this dock's layers in place
        record.thresholds = thresholds
        self._records[source.unique_id] = record
        upsert_outputs(self.viewer, record)
        self._follow(source)
        return record

    def tidy(self) -> None:
        """Forget records of removed sources; outputs follow a renamed source."""
        alive = {layer.unique_id: layer for layer in self.viewer.layers}
        for key in [k for k in self._records if k not in alive]:
            del self._records[key]
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
            if out.name.startswith(layer_name(old_name, kind, record.preset)):
                out.name = layer_name(new_name, kind, record.preset)

    def sync_geometry(self, record: RunRecord) -> None:
        """Take the source layer's current transform (the analyst may have rescaled it)."""
        source = self.source_of(record)
        if source is None:
            return
        geometry = SourceGeometry.from_layer(source, record.geometry.channel_axis)
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

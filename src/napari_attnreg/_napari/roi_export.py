"""ROI table export: the core's rows as CSV, each row stating what made it."""

from __future__ import annotations

from pathlib import Path

from napari_attnreg._napari.run_record import RunRecord


def small_rois(rows: list[dict], record: RunRecord) -> list[str]:
    """ROIs smaller than one token's footprint: their statistics rest on one coarse token."""
    sy, sx = record.any_result.token_scale
    return [str(r["label"]) for r in rows if r["area_px"] < sy * sx]


def run_provenance(record: RunRecord) -> dict:
    """What made the table: :func:`napari_attnreg.io.export.provenance` of the run (the
    values it resolved and used), with the thresholds in force now (they move live after the
    run) and the run id. The output layers carry the same record, so every file saved from
    the run states one provenance."""
    from napari_attnreg.io.export import provenance

    source = record.params.get("source_path") or record.source_name
    prov = provenance(record.any_result.metadata, source=source,
                      thresholds=dict(record.thresholds))
    return {**prov, "run_id": record.run_id}


def write_roi_csv(rows: list[dict], path: str | Path, record: RunRecord | None) -> Path:
    """The rows as CSV, each with the run's provenance columns (see ``io.export``)."""
    from napari_attnreg.io.export import write_table_csv

    return write_table_csv(path, rows, run_provenance(record) if record is not None else None)

"""ROI table export: the core's rows as CSV, with what made them on top."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from ..core.roi import ROI_COLUMNS
from .layers import RunRecord


def small_rois(rows: list[dict], record: RunRecord) -> list[str]:
    """ROIs smaller than one token's footprint: their statistics rest on one coarse token."""
    sy, sx = record.any_result.token_scale
    return [str(r["label"]) for r in rows if r["area_px"] < sy * sx]


def provenance_lines(record: RunRecord) -> list[str]:
    """``key: value`` lines naming what made the table (written as ``#`` lines in the CSV)."""
    from .. import __version__

    meta = record.any_result.metadata
    items = {
        "image": record.source_name,
        "model": record.params.get("model_description") or meta.get("model"),
        "weights": meta.get("weights"),
        "preset": record.preset,
        "thresholds": json.dumps(dict(record.thresholds)),
        "B (null images)": meta.get("n_boot"),
        "null method": meta.get("method"),
        "seed": meta.get("seed"),
        "planes": json.dumps([list(p) for p in sorted(record.results)]),
        "run id": record.run_id,
        "package version": meta.get("package_version") or __version__,
    }
    return [f"{key}: {value}" for key, value in items.items()]


def write_roi_csv(rows: list[dict], path: str | Path, record: RunRecord | None) -> Path:
    """The rows as CSV: ``#`` provenance lines, then a header and one line per ROI."""
    path = Path(path)
    extra = [k for row in rows for k in row if k not in ROI_COLUMNS]
    fields = list(dict.fromkeys(extra)) + list(ROI_COLUMNS)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        if record is not None:
            handle.writelines(f"# {line}\n" for line in provenance_lines(record))
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
    return path

"""ROI table export: the CSV with what made it, and the odds-ratio display rule."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from ..core.roi import ROI_COLUMNS
from .layers import RunRecord

#: Shown instead of an odds ratio when no significant token lies in the ROI: the core's
#: Haldane-corrected value (+0.5 per cell) is then an artefact of the correction (e.g. 33.8).
NO_ODDS = "—"
NO_ODDS_NOTE = ("odds ratio '—': no significant token in the ROI (the ratio is 0; a "
                "0.5-corrected value would only reflect the correction)")


def odds_ratio_shown(row: dict) -> float | None:
    """The odds ratio to show and export: None when the ROI has no significant token."""
    return None if row.get("frac_significant", 0.0) == 0.0 else row.get("odds_ratio")


def provenance_lines(record: RunRecord) -> list[str]:
    """``key: value`` lines naming what made the table (written as ``#`` lines in the CSV)."""
    from .. import __version__

    meta = record.any_result.metadata
    items = {
        "image": record.source_name,
        "model": record.params.get("model_description") or meta.get("model"),
        "weights": meta.get("weights"),
        "preset": record.preset,
        "thresholds": json.dumps(record.thresholds),
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
        handle.write(f"# {NO_ODDS_NOTE}\n")
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "odds_ratio": odds_ratio_shown(row)})
    return path

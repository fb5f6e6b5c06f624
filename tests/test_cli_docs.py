"""What the documentation says about the command line's outputs matches what it writes."""

from __future__ import annotations

import csv
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def documented_summary_columns() -> list[str]:
    """The first column of the table between the summary-columns markers of scale-out.md."""
    text = (DOCS / "scale-out.md").read_text(encoding="utf-8")
    table = re.search(r"<!-- summary-columns: begin -->(.*?)<!-- summary-columns: end -->",
                      text, re.S)
    assert table, "docs/scale-out.md lost its summary-columns table"
    return re.findall(r"^\| `([^`]+)` \|", table.group(1), re.M)


def test_the_documented_summary_columns_are_the_written_ones(tmp_path):
    from napari_attnreg.cli import main

    assert main(["demo", "--out", str(tmp_path), "--n-boot", "4", "--quiet"]) == 0
    with open(tmp_path / "summary.csv", newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh))
    assert documented_summary_columns() == header

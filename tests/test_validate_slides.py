"""The slide calibration harness (benchmarks/validate_slides.py): its smallest case."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tiffslide")
pytest.importorskip("tifffile")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def slides():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module("validate_slides")


def test_tissue_regions_are_nested_and_cover_the_asked_share(slides):
    regions = {g: slides.tissue_region(256, g, [slides.STREAM, 1, 0]) for g in (0.0, 0.35, 0.7)}
    assert regions[0.0].all()
    for g in (0.35, 0.7):
        assert abs(regions[g].mean() - (1 - g)) < 0.02
    # the same tissue, more of it under glass: 70 % glass leaves a part of the 35 % one
    assert not (regions[0.7] & ~regions[0.35]).any()


@pytest.mark.slow  # writes and runs two small SVS slides (~10 s alone, more on a busy CPU)
def test_quick_smallest_case_runs_a_slide_through_the_tissue_mask(slides, tmp_path):
    out = tmp_path / "slides.json"
    results = slides.main(["--models", "demo", "--presets", "stepdown", "--glass", "0.7",
                           "--n-null", "1", "--n-planted", "1", "--planted", "1",
                           "--n-boot", "10", "--json", str(out), "--workdir", str(tmp_path)])
    cell = results["models"]["demo"]["presets"]["stepdown"]["by_glass"]["0.7"]
    null, row = cell["null"], cell["null_rows"][0]
    assert null["n"] == 1 and null["refused"] == 0
    # 30 % tissue on near-white glass: the automatic mask runs the tissue tiles, no glass tile
    assert abs(row["tissue_share"] - 0.3) < 0.02
    assert row["mask"].startswith("auto") and 0 < row["n_run"] < row["n_tiles"]
    assert row["tissue_tiles_left_out"] == 0 and row["glass_tiles_run"] == 0
    assert len(row["family_p"]) == row["n_run"]
    assert all(0 < p <= 1 for p in row["family_p"])
    assert cell["planted"]["objects"] >= 1
    assert json.loads(out.read_text())["models"]["demo"]["n_boot"] == 10
    table = tmp_path / "table.md"
    slides.main(["--json", str(out), "--report", str(table)])
    assert "| demo | stepdown | 70% | 10 | 0/1" in table.read_text() \
        or "| demo | stepdown | 70% | 10 | 1/1" in table.read_text()
    assert np.isfinite(null["any_sig_ci"]).all()

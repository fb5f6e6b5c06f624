"""A fast subset of the validation harness: it runs, and planted objects are found."""

from __future__ import annotations

import importlib.util
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "benchmarks" / "validate.py"


def _load():
    spec = importlib.util.spec_from_file_location("validate", HARNESS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_harness_runs_and_localizes_better_than_chance(tmp_path):
    validate = _load()
    out = tmp_path / "v.md"
    text = validate.main(["--n-loc", "2", "--n-sim", "2", "--n-cal", "1", "--n-boot", "16",
                          "--methods", "normal,patch", "--out", str(out)])
    assert out.read_text() == text
    for heading in ("## 1. Localization", "## 2. Noise simulation", "## 3. Null calibration", "## 4. Runtime"):
        assert heading in text
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line
            for line in text.splitlines() if line.startswith("| ")}
    chance_precision = float(rows[("chance", "area")].split("|")[3])
    p_precision = float(rows[("normal", "p")].split("|")[3])
    assert p_precision > 3 * chance_precision, (p_precision, chance_precision)

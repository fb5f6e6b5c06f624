"""benchmarks/tail_refusals.py: the refusal rate of the tail's goodness-of-fit test."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def refusals():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module("tail_refusals")


def test_a_sound_tail_is_rarely_refused_and_a_broken_one_always(refusals):
    rng = np.random.default_rng(0)
    sound, _ = refusals.refused(rng.gamma(2.0, 1.0, (2000, 200)), 200)
    assert sound.mean() < 0.06  # a 0.05-level test (about 2 % here)
    top = np.concatenate([5 + 0.01 * rng.random((500, 10)), 10 + 0.01 * rng.random((500, 10))], 1)
    broken, _ = refusals.refused(np.concatenate([rng.random((500, 180)), top], 1), 200)
    assert broken.all()  # a tail of two tight clusters is no generalized Pareto tail


def test_the_simulated_rates_stay_at_or_below_the_level(refusals):
    rates = refusals.simulate(200, 4000, seed=3)
    assert set(rates) == {"-0.4", "-0.2", "+0.0", "+0.2", "+0.4"}
    assert all(0.0 < r < 0.07 for r in rates.values())

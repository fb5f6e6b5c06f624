"""The explorer shows a CT as the run analyses it: through its stored (or chosen) window."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pydicom = pytest.importorskip("pydicom")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_io_readers import write_ct_slice  # noqa: E402

from napari_attnreg.notebook import AttentionExplorer  # noqa: E402


@pytest.fixture
def ct(tmp_path):
    folder = tmp_path / "ct"
    folder.mkdir()
    rng = np.random.default_rng(0)
    hu = rng.normal(40, 200, (2, 48, 48))
    for k in range(2):
        write_ct_slice(folder / f"s{k}.dcm", 2.5 * k, k + 1, np.clip(hu[k] + 1024, 0, 4095),
                       window=(40.0, 400.0))
    return folder


def _windowed(values, low, high):
    return np.clip((values.astype(np.float64) - low) / (high - low), 0, 1)


@pytest.mark.parametrize("choice, window", [(None, (-160.0, 240.0)), ("lung", (-1350.0, 150.0))])
def test_the_picture_is_the_windowed_ct_the_run_analyses(ct, choice, window):
    from napari_attnreg.io.readers import read_source

    options = {} if choice is None else {"intensity_window": choice}
    explorer = AttentionExplorer(str(ct), model="demo", n_boot=4, device="cpu", **options)
    values = np.asarray(read_source(ct)[0].data[0])
    np.testing.assert_allclose(explorer.image_panel.base, _windowed(values, *window), atol=1e-6)
    assert [s.description for s in explorer.image_panel.sliders] == ["Z"]  # slices, not axis 0

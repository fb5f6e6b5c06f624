"""The core stays free of GUI toolkits; reduced precision runs through the same code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

GUI_MODULES = ("PyQt5", "PyQt6", "PySide2", "PySide6", "qtpy", "napari", "magicgui", "superqt",
               "ipywidgets", "IPython.display")


def test_core_imports_and_runs_without_any_gui_toolkit():
    """Block every GUI module at import time: the core must still import and run."""
    code = f"""
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in {GUI_MODULES!r} or name in {GUI_MODULES!r}:
            raise ImportError('blocked GUI module ' + name)
sys.meta_path.insert(0, Block())
import numpy as np, timm
from napari_attnreg import regularize, AttentionResult, load_backbone, __version__
import napari_attnreg.cli, napari_attnreg.core.stats.roi, napari_attnreg.samples
import napari_attnreg.io.export, napari_attnreg.io.dicom, napari_attnreg.io.ometiff
import napari_attnreg._napari.io  # the npe2 reader/writer hooks load without Qt too
bb = load_backbone(timm.create_model('vit_tiny_patch16_224', pretrained=False, depth=1))
img = np.random.default_rng(0).random((40, 40))
res = regularize(img, bb, n_boot=3, device='cpu')
print('OK', res.grid_shape, __version__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK (14, 14)" in out.stdout


def test_bfloat16_autocast_keeps_the_attention_row_in_float32(tiny_backbone, blob_image):
    from napari_attnreg import regularize
    full = regularize(blob_image, tiny_backbone, n_boot=6, device="cpu", precision="float32")
    low = regularize(blob_image, tiny_backbone, n_boot=6, device="cpu", precision="bfloat16")
    assert low.metadata["precision"] == "bfloat16" and full.metadata["precision"] == "float32"
    assert low.attention.dtype == np.float64
    # bf16 blocks perturb the scores by ~1e-2 relative, but the maps must agree in shape and rank
    assert np.corrcoef(low.attention.ravel(), full.attention.ravel())[0, 1] > 0.95
    assert len(np.unique(low.attention)) > 0.9 * low.attention.size  # float32 row: no mass ties


def test_version_is_exposed():
    import napari_attnreg

    assert napari_attnreg.__version__ not in ("", None)
    assert torch.__version__


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_licence_is_spdx_and_shipped():
    project = _pyproject()["project"]
    assert project["license"] == "BSD-3-Clause" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "BSD 3-Clause License" in text and "napari-attnreg developers" in text


def test_napari_extra_installs_pyqt6_not_the_deprecated_pyqt5():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert any(req.startswith("napari[pyqt6]") for req in extras["napari"])
    every_requirement = " ".join(req for reqs in extras.values() for req in reqs).lower()
    assert "pyqt5" not in every_requirement
    assert any(req.startswith("pydicom") for req in extras["dicom"])
    assert any(req.startswith("pydicom") for req in extras["test"])
    assert {"napari", "notebook", "dicom"} <= set(
        extras["all"][0].split("[")[1].rstrip("]").split(","))

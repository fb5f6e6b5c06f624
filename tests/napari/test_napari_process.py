"""The analyst's real order of events, in a fresh process: viewer first, model import later.

With Mesa's software OpenGL (this CI), importing timm after the viewer exists used to
segfault napari (Triton next to Mesa's libLLVM); the other tests import timm early.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gui

SCRIPT = r"""
import numpy as np
import napari
from qtpy.QtCore import QEventLoop, QTimer

viewer = napari.Viewer()
viewer.add_image(np.random.default_rng(0).random((64, 64)), name="img")
_, widget = viewer.window.add_plugin_dock_widget("napari-attnreg", "Attention Regularization")
import timm  # only now, as when a model is loaded after napari started

widget.set_model(timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1), name="tiny")
widget.options.controls["n_boot"].setValue(4)
widget.options.controls["device"].setCurrentText("cpu")
loop = QEventLoop()
widget.run_finished.connect(lambda outcome: loop.quit())
QTimer.singleShot(90_000, loop.quit)
widget.run()
loop.exec_()
print("STATUS", widget.last_outcome.status)
print("LAYERS", [layer.name for layer in viewer.layers])
viewer.close()
"""


def test_model_import_after_viewer_does_not_crash():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "STATUS done" in proc.stdout
    assert "img · attention" in proc.stdout and "img · significant" in proc.stdout


SCRIPT_CORE = r"""
import numpy as np
import napari

viewer = napari.Viewer()  # a notebook or script that opened napari, then calls the core
from napari_attnreg import regularize
res = regularize(np.random.default_rng(0).random((64, 64)), "demo", n_boot=4, device="cpu")
print("GRID", res.grid_shape)
viewer.close()
"""


def test_core_after_viewer_does_not_crash():
    """The guard lives in core.load_backbone, so scripts get it as well as the widget."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT_CORE],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GRID (16, 16)" in proc.stdout

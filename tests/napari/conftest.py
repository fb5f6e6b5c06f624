"""Fixtures for the napari widget tests: a viewer with the dock widget on a tiny random ViT.

The tests run under Xvfb (pytest-xvfb), with napari's real OpenGL canvas.
"""

from __future__ import annotations

import numpy as np
import pytest
import timm  # noqa: F401  # before any viewer: Triton must load before Mesa's libLLVM (see _compat)


@pytest.fixture
def notifications():
    """Notifications dispatched during the test (napari's notification manager)."""
    from napari.utils.notifications import notification_manager

    seen: list = []
    notification_manager.notification_ready.connect(seen.append)
    yield seen
    notification_manager.notification_ready.disconnect(seen.append)


@pytest.fixture
def viewer_widget(make_napari_viewer, tiny_backbone):
    """(viewer, widget) with the widget docked and set to a tiny model and a small run."""
    from napari_attnreg._napari.widget import AttentionWidget

    viewer = make_napari_viewer()
    widget = AttentionWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Attention Regularization")
    widget.set_model(tiny_backbone, name="tiny")
    widget.options.controls["n_boot"].setValue(16)
    widget.options.controls["chunk_size"].setValue(8)
    widget.options.controls["device"].setCurrentText("cpu")
    return viewer, widget


@pytest.fixture
def run_and_wait(qtbot):
    """``run_and_wait(widget)``: press Run, wait until the outcome was applied, return it."""

    def run(widget, timeout: int = 60_000):
        with qtbot.waitSignal(widget.run_finished, timeout=timeout) as blocker:
            assert widget.run() is not None
        return blocker.args[0]

    return run


@pytest.fixture
def cells_image():
    """A 120x100 uint16 field of bright blobs on noise (several objects, like the samples)."""
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[0:120, 0:100]
    img = 300 + 40 * rng.standard_normal((120, 100))
    for cy, cx, amp in ((30, 25, 3000), (80, 70, 2500), (95, 20, 1800)):
        img += amp * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 50)
    return np.clip(img, 0, 65535).astype(np.uint16)

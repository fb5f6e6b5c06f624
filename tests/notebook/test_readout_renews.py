"""The cursor readout of the notebook's view follows what is shown, not only the mouse.

The readout (ipympl's toolbar message) was asked for only when the mouse moved: after a run
(or a run at another slide level) it kept the previous result's numbers under a resting
cursor until the mouse moved.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ipympl")

from matplotlib.backend_bases import LocationEvent, MouseEvent

from napari_attnreg.notebook.views import MplView


def _move(view: MplView, x: float, y: float) -> None:
    px, py = view.ax.transData.transform((x, y))
    view.canvas.callbacks.process("motion_notify_event",
                                  MouseEvent("motion_notify_event", view.canvas, px, py))


def test_a_redraw_renews_the_readout_under_a_resting_cursor():
    view = MplView(200)
    shown = {"result": "first"}
    view.describe = lambda row, col: f"x={col:.0f} y={row:.0f} · {shown['result']}"
    view.show(np.zeros((50, 80, 3), np.uint8), (50, 80))
    _move(view, 20, 10)
    assert view.canvas.toolbar.message == "x=20 y=10 · first"
    shown["result"] = "second"  # a new run: the cursor has not moved
    view.show(np.ones((50, 80, 3), np.uint8), (50, 80))
    assert view.canvas.toolbar.message == "x=20 y=10 · second"


def test_a_cursor_that_left_the_view_gets_no_readout_on_redraw():
    view = MplView(200)
    view.describe = lambda row, col: "inside"
    view.show(np.zeros((50, 80, 3), np.uint8), (50, 80))
    _move(view, 20, 10)
    view.canvas.toolbar.set_message("")
    view.canvas.callbacks.process("axes_leave_event",
                                  LocationEvent("axes_leave_event", view.canvas, 0, 0))
    view.show(np.zeros((50, 80, 3), np.uint8), (50, 80))
    assert view.canvas.toolbar.message == ""

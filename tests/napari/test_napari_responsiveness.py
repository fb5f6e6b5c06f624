"""The Qt event loop keeps running while a job computes (generous bound; see the benchmark)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from napari.utils import progress
from qtpy.QtCore import QTimer

pytestmark = pytest.mark.gui


def test_event_loop_keeps_ticking_during_a_run(viewer_widget, qtbot, cells_image):
    viewer, widget = viewer_widget
    viewer.add_image(cells_image, name="cells")
    widget.options.controls["n_boot"].setValue(96)
    widget.options.controls["chunk_size"].setValue(8)
    ticks: list[float] = []
    last_yield: list[float] = []
    bar_values: list[int] = []
    widget.run_panel.progress_bar.valueChanged.connect(bar_values.append)
    timer = QTimer()
    timer.setInterval(10)
    timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
    timer.start()
    try:
        with qtbot.waitSignal(widget.run_finished, timeout=60_000):
            t0 = time.perf_counter()
            worker = widget.run()
            worker.yielded.connect(lambda _: last_yield.append(time.perf_counter()))
            # progress also goes to napari's activity dock (a napari progress bar)
            assert (
                isinstance(widget.run_panel._pbar, progress)
                and widget.run_panel._pbar in progress._all_instances
            )
    finally:
        timer.stop()
    # gaps while the worker computes: from Run to the last progress event (layers come after)
    during = np.array([t0] + [t for t in ticks if t0 <= t <= last_yield[-1]])
    gaps = np.diff(during)
    assert len(last_yield) >= 96 // 8  # one progress event per chunk reached the GUI thread
    # the bar moved (a fast run may finish, and reset it, before any poll could see it)
    assert max(bar_values) > 0
    assert len(during) > 10, "the timer never ticked while the job ran"
    assert gaps.max() < 1.0, f"event loop blocked for {gaps.max():.3f} s during the run"
    assert viewer.layers["cells · attention"].data.any()
    assert (
        widget.run_panel._pbar is None and not widget.run_panel.progress_bar.value()
    )  # closed and reset

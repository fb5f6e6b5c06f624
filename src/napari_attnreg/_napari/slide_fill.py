"""The overview of a slide stored as one large level, computed off napari's main thread.

napari draws on its main thread; a coarse level of such a slide
(:mod:`~napari_attnreg._napari.slide_pyramid`) read there decoded the file under it (the whole
file for the first whole view: 7 to 25 s of a frozen viewer for a 20000² to 40000² JPEG
slide). Here the reader attaches a :class:`~napari_attnreg._napari.slide_pyramid.BackgroundFill`
to the levels when it runs in a viewer, and a Qt timer on the main thread follows it: it
redraws the layer as blocks arrive, says what is read while blocks are read (napari's
progress bar and a line on the canvas), says a failed read in a notification, and stops the
fill when the layer is deleted, the viewer closes or the application quits. Qt is imported
only when a viewer is there (the reader called without one leaves the levels computing on
demand, as before).
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from napari_attnreg._napari.slide_pyramid import BackgroundFill, levels_of

#: Milliseconds between two looks at the fill's progress (on the main thread).
POLL_MS = 100
#: Seconds between two redraws while blocks arrive (each redraw uploads the level again).
REDRAW_S = 0.5
#: Seconds a fill waits for its layer to appear in the viewer before it stops.
UNSEEN_S = 30.0

_FOLLOWED: set[_Follower] = set()  # kept alive while they follow their fill


def fill_in_background(levels: list[Any], name: str) -> BackgroundFill | None:
    """Compute the coarse levels in ``levels`` (a slide's display levels) off the main
    thread and redraw their layer as they arrive, when napari's reader runs in a viewer;
    None (levels computed when read, as before) otherwise.

    Parameters
    ----------
    levels : list
        The layer's levels (block-mean levels, or levels of channels, among them).
    name : str
        The file's name, for the progress bar and messages.
    """
    coarse = levels_of(levels)
    if not coarse or threading.current_thread() is not threading.main_thread():
        return None
    import napari

    viewer = napari.current_viewer()
    if viewer is None:
        return None
    fill = BackgroundFill(name)
    for level in coarse:
        level.fill = fill
    _FOLLOWED.add(_Follower(viewer, fill))
    return fill


def redraw(layer: Any) -> None:
    """Read ``layer``'s view again (the blocks computed since it was drawn)."""
    # napari ≥ 0.9 keeps its coarsest level, read once as an array, for the thumbnail and
    # the whole view; it would show the first read (the stand-ins) for good
    kept = getattr(layer, "_level_materializer", None)
    if callable(getattr(kept, "cache_clear", None)):
        kept.cache_clear()
    layer.refresh(extent=False, highlight=False)


class _Follower:
    """Redraws the layers of ``fill``'s levels in ``viewer`` as blocks arrive (see module)."""

    def __init__(self, viewer: Any, fill: BackgroundFill) -> None:
        from qtpy.QtCore import QTimer
        from qtpy.QtWidgets import QApplication

        self.viewer = weakref.ref(viewer)
        self.fill = fill
        self.started = time.monotonic()
        self.seen = self.was_visible = False
        self.drawn_done, self.drawn_at, self.bar_from = 0, 0.0, 0
        self.bar: Any = None
        self.said: str | None = None
        self.ticking = False
        self.timer = QTimer()
        self.timer.setInterval(POLL_MS)
        self.timer.timeout.connect(self.tick)
        self.timer.start()
        app = QApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.stop)

    def layers(self) -> list[Any] | None:
        """The viewer's layers showing the fill's levels; None when the viewer is closed."""
        viewer = self.viewer()
        window = getattr(getattr(viewer, "window", None), "_qt_window", None)
        if viewer is None or window is None:
            return None
        visible = window.isVisible()
        if self.was_visible and not visible:  # its window was closed
            return None
        self.was_visible |= visible
        return [layer for layer in viewer.layers if getattr(layer, "multiscale", False)
                and any(level.fill is self.fill for level in levels_of(layer.data))]

    def tick(self) -> None:
        if self.ticking:  # napari's progress bar runs the event loop while it updates
            return
        self.ticking = True
        try:
            self.follow()
        finally:
            self.ticking = False

    def follow(self) -> None:
        layers = self.layers()
        if layers is None or (not layers and (
                self.seen or time.monotonic() - self.started > UNSEEN_S)):
            self.stop()  # the layer deleted, the viewer closed, or the layer never added
            return
        done, asked, errors = self.fill.news()
        if errors:
            from napari.utils.notifications import show_error

            for message in errors:
                show_error(message)
        if not layers:
            return
        self.seen = True
        now = time.monotonic()
        if done != self.drawn_done and (now - self.drawn_at >= REDRAW_S or done == asked):
            self.drawn_done, self.drawn_at = done, now
            for layer in layers:
                redraw(layer)
            self.progress(done, asked)
        elif (self.bar is None) != (done >= asked):
            # said at once when blocks are asked, then with the redraws: each change of the
            # canvas's text draws the canvas again, which took CPU from the blocks' decoding
            self.progress(done, asked)

    def progress(self, done: int, asked: int) -> None:
        """While blocks are queued: napari's progress bar (its activity panel) and a line
        on the canvas (napari's text overlay, the one place a user sees at once) saying
        what is read and how far it is."""
        if done >= asked:
            if self.bar is not None:
                self.bar.close()
                self.bar = None
            self.say(None)
            self.bar_from = done  # the next count starts from here
            return
        if self.bar is None:
            from napari.utils import progress

            self.bar = progress(total=asked - self.bar_from, desc=f"Reading {self.fill.name}")
        self.bar.total = asked - self.bar_from
        self.bar.update(done - self.bar_from - self.bar.n)
        self.say(f"Reading {self.fill.name} for this view: {done - self.bar_from} of "
                 f"{asked - self.bar_from} blocks")

    def say(self, text: str | None) -> None:
        """Show ``text`` in the viewer's text overlay; None hides it when it still shows
        ours (another plugin's text is left alone)."""
        viewer = self.viewer()
        if viewer is None:
            return
        # napari's text overlay: viewer.canvas.overlays since 0.9, viewer.text_overlay before
        # (slice_cue's helper does the same, but importing it loads the statistics: seconds)
        overlays = getattr(getattr(viewer, "canvas", None), "overlays", None)
        overlay = overlays["text"] if overlays is not None and "text" in overlays \
            else viewer.text_overlay
        if text is not None:
            overlay.text, overlay.visible = text, True
        elif self.said is not None and overlay.text == self.said:
            overlay.visible, overlay.text = False, ""
        self.said = text

    def stop(self) -> None:
        """Stop the fill, the timer and the progress bar (once)."""
        self.fill.stop()
        self.timer.stop()
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.say(None)
        _FOLLOWED.discard(self)

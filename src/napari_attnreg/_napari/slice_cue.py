"""A cue on the canvas when the slice in view has no result (a stack run on some slices only).

The output layers of uncomputed planes are NaN (transparent), but their colorbars stay on
screen, so a blank slice could read as "no attention here". While the viewer shows such a
slice of the selected result, napari's text overlay says which slices were computed and how
to compute the rest. The overlay is napari's one shared text overlay: it is only hidden again
when it still shows this cue (another plugin's text is left alone).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from napari_attnreg._napari.geometry import SourceGeometry
from napari_attnreg._napari.run_record import RunRecord

PlaneIndex = tuple[int, ...]
#: Computed planes named in the cue; more are counted.
NAMED_PLANES = 4
#: Characters per line of the cue (~350 px at napari's overlay font size).
CUE_WIDTH = 44


def shown_plane(geometry: SourceGeometry, point: Sequence[float]) -> PlaneIndex | None:
    """The plane of a source with ``geometry`` at viewer point ``point`` (None: 2D image).

    Plain scale/translate only (rotated stacks are rare; the nearest index is taken).
    """
    if not geometry.stack_axes:
        return None
    offset = len(point) - geometry.ndim
    return tuple(int(round((point[a + offset] - geometry.translate[a]) / geometry.scale[a]))
                 for a in geometry.stack_axes)


def plane_text(plane: PlaneIndex, geometry: SourceGeometry | None = None) -> str:
    """``"slice 3"`` for one stack axis, ``"plane (0, 3)"`` for several; ``"t = 3"`` where
    the file named the axes (``geometry``'s ``axis_labels``): a time point is no slice."""
    if getattr(geometry, "axis_labels", ()):
        return geometry.plane_name(plane)
    return f"slice {plane[0]}" if len(plane) == 1 else f"plane {plane}"


def missing_slice_text(record: RunRecord, point: Sequence[float]) -> str | None:
    """The cue for the slice at ``point`` (None: it has a result, or the image is 2D)."""
    plane = shown_plane(record.geometry, point)
    if plane is None or plane in record.results or \
            any(i < 0 or i >= n for i, n in zip(plane, record.geometry.stack_shape)):
        return None
    done = sorted(record.results)
    named = "; ".join(plane_text(p, record.geometry) for p in done[:NAMED_PLANES])
    more = f" and {len(done) - NAMED_PLANES} more" if len(done) > NAMED_PLANES else ""
    only = " only" if len(done) <= NAMED_PLANES else ""
    clauses = (f"{record.source_name}:", f"attention maps cover {named}{more}{only};",
               f"{plane_text(plane, record.geometry)} has no result", "('Compute remaining slices' in the dock).")
    # napari's text overlay never wraps: short lines stay whole on a narrow canvas
    return "\n".join(textwrap.fill(clause, CUE_WIDTH, break_long_words=False)
                     for clause in clauses)


def canvas_overlay(viewer: Any, name: str) -> Any:
    """napari's canvas overlay ``name`` (``"text"``, ``"scale_bar"``): ``viewer.canvas.overlays``
    since 0.9, ``viewer.text_overlay`` / ``viewer.scale_bar`` before."""
    canvas = getattr(viewer, "canvas", None)
    overlays = getattr(canvas, "overlays", None)
    if overlays is not None and name in overlays:
        return overlays[name]
    return getattr(viewer, "text_overlay" if name == "text" else name)  # napari < 0.9


def text_overlay(viewer: Any) -> Any:
    """napari's canvas text overlay."""
    return canvas_overlay(viewer, "text")


class SliceCue:
    """Shows :func:`missing_slice_text` in the viewer's text overlay while it applies."""

    def __init__(self, viewer: Any, current_record: Callable[[], RunRecord | None]) -> None:
        self._viewer = viewer
        self._current_record = current_record
        self.shown: str | None = None
        viewer.dims.events.current_step.connect(self.update)

    def disconnect_viewer(self) -> None:
        self._viewer.dims.events.current_step.disconnect(self.update)
        self._show(None)

    def update(self, event: Any = None) -> None:
        """Show, change or hide the cue for the selected result and the slice in view."""
        record = self._current_record()
        text = None
        if record is not None and any(layer in self._viewer.layers and layer.visible
                                      for layer in record.outputs.values()):
            text = missing_slice_text(record, self._viewer.dims.point)
        self._show(text)

    def _show(self, text: str | None) -> None:
        overlay = text_overlay(self._viewer)
        if text is not None:
            overlay.text = text
            overlay.visible = True
        elif self.shown is not None and overlay.text == self.shown:
            overlay.visible = False
            overlay.text = ""
        self.shown = text

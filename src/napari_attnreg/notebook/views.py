"""The image area of the explorer: an ipympl canvas (draws ROIs) or a plain PNG image.

Both show the same :func:`render.composite` array, so a view only places pixels; it never
decides what they look like. ipympl is used for its mouse events: matplotlib's
``RectangleSelector`` / ``PolygonSelector`` give ROI drawing, zoom/pan and a cursor readout
in JupyterLab, Notebook 7 and VS Code without a custom front-end extension of our own.
Where ipympl is not installed the PNG view still shows everything, and ROIs come from
masks (``AttentionExplorer(..., roi=mask)`` or :meth:`AttentionExplorer.add_roi`).
"""

from __future__ import annotations

import io
from collections.abc import Callable

import ipywidgets as widgets
import numpy as np

from napari_attnreg.notebook.regions import rectangle_vertices
from napari_attnreg.notebook.render import ROI_COLOR, to_png

DRAW_MODES = ("off", "rectangle", "polygon")
RegionCallback = Callable[[np.ndarray], None]


def ipympl_available() -> bool:
    try:
        import ipympl.backend_nbagg  # noqa: F401
    except ImportError:
        return False
    return True


def _extent(image_shape: tuple[int, int]) -> tuple[float, float, float, float]:
    # pixel centres at integer coordinates, as in napari and scikit-image
    h0, w0 = image_shape
    return (-0.5, w0 - 0.5, h0 - 0.5, -0.5)


class ImageView:
    """PNG in an ``ipywidgets.Image``: no drawing, works in every front end."""

    can_draw = False

    def __init__(self, width_px: int = 560) -> None:
        self.widget = widgets.Image(format="png", layout=widgets.Layout(width=f"{width_px}px"))
        self.on_region: RegionCallback | None = None
        self.describe: Callable[[float, float], str] | None = None

    def show(self, rgb: np.ndarray, image_shape: tuple[int, int]) -> None:
        self.widget.value = to_png(rgb)

    def displayed(self) -> np.ndarray:
        """The pixels the front end was sent (decoded), for tests."""
        from PIL import Image

        with Image.open(io.BytesIO(self.widget.value)) as im:
            return np.asarray(im.convert("RGB"))

    def set_draw_mode(self, mode: str) -> None:
        if mode != "off":
            raise ValueError("Drawing ROIs needs ipympl (pip install ipympl); pass roi=mask or "
                             "call add_roi(...) instead.")

    def close(self) -> None:
        self.widget.close()


class MplView:
    """An ipympl canvas with one ``imshow`` of the composite and ROI selectors.

    Built on ``Figure`` + ipympl's ``Canvas`` directly rather than pyplot, so creating an
    explorer neither registers a global figure nor changes the notebook's backend.
    """

    can_draw = True

    def __init__(self, width_px: int = 560) -> None:
        from ipympl.backend_nbagg import Canvas, FigureManager
        from matplotlib.figure import Figure
        from matplotlib.widgets import PolygonSelector, RectangleSelector

        self._width_px = width_px
        self.figure = Figure(figsize=(width_px / 100, width_px / 100), dpi=100)
        self.canvas = Canvas(self.figure)
        self.manager = FigureManager(self.canvas, 0)
        self.canvas.header_visible = False
        self.canvas.resizable = False
        self.canvas.toolbar_position = "left"
        self.ax = self.figure.add_axes((0, 0, 1, 1))
        self.ax.set_axis_off()
        self.ax.format_coord = self._format_coord
        self._image = None
        self._shape: tuple[int, int] | None = None
        self.on_region: RegionCallback | None = None
        self.describe: Callable[[float, float], str] | None = None
        # useblit=False: the WebAgg canvas cannot blit; each drag step redraws the figure
        line = {"color": "#{:02x}{:02x}{:02x}".format(*ROI_COLOR), "linewidth": 1.5}
        self.rectangle = RectangleSelector(
            self.ax, self._rectangle_done, useblit=False, button=[1], minspanx=1.0,
            minspany=1.0, spancoords="data", interactive=False,
            props={"edgecolor": line["color"], "facecolor": "none", "linewidth": 1.5})
        self.polygon = PolygonSelector(self.ax, self._polygon_done, useblit=False, props=line)
        self.widget = self.canvas
        self.set_draw_mode("off")
        # where the cursor rests, so a redraw (a new result, another level) renews the
        # readout at once: the toolbar only asks again when the mouse moves
        self._cursor: tuple[float, float] | None = None
        self.canvas.mpl_connect("motion_notify_event", self._track_cursor)
        self.canvas.mpl_connect("axes_leave_event", lambda event: self._forget_cursor())
        self.canvas.mpl_connect("figure_leave_event", lambda event: self._forget_cursor())

    # ---- display --------------------------------------------------------------------------
    def show(self, rgb: np.ndarray, image_shape: tuple[int, int]) -> None:
        image_shape = (int(image_shape[0]), int(image_shape[1]))
        extent = _extent(image_shape)
        if self._image is None:
            self._image = self.ax.imshow(rgb, extent=extent, interpolation="nearest")
            self._image.get_cursor_data = lambda event: None  # the footer shows statistics
        else:
            self._image.set_data(rgb)
        if image_shape != self._shape:
            self._image.set_extent(extent)
            self.ax.set_xlim(extent[0], extent[1])
            self.ax.set_ylim(extent[2], extent[3])
            h0, w0 = image_shape
            scale = self._width_px / max(h0, w0)
            self.figure.set_size_inches(w0 * scale / 100, h0 * scale / 100, forward=True)
            self._shape = image_shape
        self.canvas.draw_idle()
        self._renew_readout()

    def displayed(self) -> np.ndarray:
        """The composite currently in the figure, for tests."""
        if self._image is None:
            return np.zeros((0, 0, 3))
        return np.asarray(self._image.get_array())

    def _format_coord(self, x: float, y: float) -> str:
        return self.describe(y, x) if self.describe is not None else f"x={x:.1f} y={y:.1f}"

    def _track_cursor(self, event) -> None:
        inside = event.inaxes is self.ax and event.xdata is not None
        self._cursor = (float(event.xdata), float(event.ydata)) if inside else None

    def _forget_cursor(self) -> None:
        self._cursor = None

    def _renew_readout(self) -> None:
        """The readout of the pixel under a resting cursor, from what is shown now."""
        toolbar = getattr(self.canvas, "toolbar", None)
        if self._cursor is not None and toolbar is not None:
            toolbar.set_message(self._format_coord(*self._cursor))

    # ---- ROI drawing ----------------------------------------------------------------------
    def set_draw_mode(self, mode: str) -> None:
        if mode not in DRAW_MODES:
            raise ValueError(f"draw mode must be one of {DRAW_MODES}, got {mode!r}")
        self.rectangle.set_active(mode == "rectangle")
        self.polygon.set_active(mode == "polygon")
        if mode != "polygon":
            self.polygon.clear()

    def _rectangle_done(self, press, release) -> None:
        if None in (press.xdata, press.ydata, release.xdata, release.ydata):
            return
        verts = rectangle_vertices(press.ydata, press.xdata, release.ydata, release.xdata)
        self._emit(verts)

    def _polygon_done(self, vertices) -> None:
        verts = np.asarray(vertices, dtype=np.float64)[:, ::-1]  # (x, y) → (row, col)
        # start a fresh polygon for the next ROI once matplotlib has finished this event
        self.canvas.new_timer(interval=1, callbacks=[(self.polygon.clear, (), {})]).start() \
            if _has_running_loop() else self.polygon.clear()
        self._emit(verts)

    def _emit(self, verts: np.ndarray) -> None:
        if self.on_region is not None:
            self.on_region(verts)

    def close(self) -> None:
        self.canvas.close()


def _has_running_loop() -> bool:
    from napari_attnreg.notebook.runner import running_loop

    return running_loop() is not None

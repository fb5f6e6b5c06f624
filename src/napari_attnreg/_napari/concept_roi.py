"""'Concept from ROI': the target of a class map from regions drawn on the chosen image.

Foundation models have no classification head, so a class map (CDAM, Grad-CAM) scores a
concept: a vector of the model's width. Here the analyst outlines a few examples of it — the
shapes of a Shapes layer (the selected shapes, or all of them) or the regions of a Labels
layer — on the image chosen under 'Image', and the core's
:func:`~napari_attnreg.core.run.concept.concept_from` builds the concept from crops around
them (a few forward passes, on a worker thread). The concept becomes the run's target: the
options panel reports it as ``target`` and the dock's session holds it.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import numpy as np
from qtpy.QtCore import Qt, Signal
from qtpy.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from napari_attnreg.core.models.scorers import map_names, scorer_class
from napari_attnreg.core.run.concept import region_count
from napari_attnreg.core.run.options import option
from napari_attnreg.session.model import same_setting

#: The map offered when a concept is built while the chosen map does not read a target.
SUGGESTED_MAP = "cdam"
ERROR_COLOR = "#e55"


def class_maps() -> tuple[str, ...]:
    """The registered maps that score a target (a class or a concept)."""
    return tuple(name for name in map_names() if scorer_class(name).needs.target)


@dataclass(frozen=True)
class RoiRequest:
    """What a concept is built from, captured on the GUI thread.

    Attributes
    ----------
    image : np.ndarray
        The plane of the chosen image in view.
    channel_axis : int or None
        Its channel axis (None: grey or RGB).
    labels : np.ndarray
        The regions on the image's pixel grid (0 = background).
    layer_name : str
        The ROI layer they come from.
    channels, merge : optional
        The dock's channel choice, as the run applies it.
    """

    image: np.ndarray
    channel_axis: int | None
    labels: np.ndarray
    layer_name: str
    channels: list[int] | None = None
    merge: str | None = None

    @property
    def n_regions(self) -> int:
        return region_count(self.labels)


def roi_layer(viewer: Any) -> Any:
    """The ROI layer: the selected Shapes or Labels layer, else the only one in the viewer.

    Output layers of a run (its significant labels and their outline) never count.
    """
    from napari.layers import Labels, Shapes

    from napari_attnreg._napari.source_panel import is_output

    def usable(layer: Any) -> bool:
        return isinstance(layer, (Shapes, Labels)) and not is_output(layer)

    active = viewer.layers.selection.active
    if active is not None and usable(active):
        return active
    candidates = [layer for layer in viewer.layers if usable(layer)]
    if len(candidates) == 1:
        return candidates[0]
    where = ("Several Shapes/Labels layers are open: select the one"
             if candidates else "Draw rectangles or polygons in a Shapes layer (or paint a "
             "Labels layer)")
    raise ValueError(f"{where} around a few examples of the concept on the chosen image, then "
                     "press 'Concept from ROI'.")


def capture_request(viewer: Any, image_layer: Any, channel_axis: int | None,
                    channel_options: dict[str, Any] | None = None) -> RoiRequest:
    """The chosen image's plane in view and the ROI layer's regions on it (with the dock's
    ``channels``/``merge``, ``channel_options``).

    Raises
    ------
    ValueError
        No image, no ROI layer, or no region on this plane (what to do is said).
    """
    from napari_attnreg._napari.geometry import SourceGeometry
    from napari_attnreg._napari.roi_geometry import roi_labels
    from napari_attnreg._napari.slice_cue import shown_plane
    from napari_attnreg.core.run.planes import PlaneStack

    if image_layer is None:
        raise ValueError("Choose the image under 'Image' first: the concept is built from "
                         "regions on it.")
    data, grid = _pixels_of(image_layer)
    layer = roi_layer(viewer)
    geometry = SourceGeometry.from_layer(image_layer, channel_axis)
    if grid is not None:  # a slide pyramid: the regions drawn over the level read
        geometry = grid.place(geometry)
    plane = shown_plane(geometry, viewer.dims.point) or ()
    labels = roi_labels(layer, geometry, plane)
    selected = sorted(getattr(layer, "selected_data", ()) or ())
    if selected and labels.any():  # the selected shapes alone (shape i is label i + 1)
        labels = np.where(np.isin(labels, np.asarray(selected) + 1), labels, 0)
    if not labels.any():
        raise ValueError(f"{layer.name!r} has no region on {image_layer.name!r}"
                         + (f" (plane {list(plane)})" if plane else "")
                         + ": outline a few examples of the concept on this image.")
    stack = PlaneStack(data, geometry.stack_axes,
                       data.ndim - 1 if image_layer.rgb else channel_axis,
                       bool(image_layer.rgb))
    image, plane_axis = stack.read(plane)
    return RoiRequest(image, plane_axis, labels, layer.name, **(channel_options or {}))


def _pixels_of(image_layer: Any) -> tuple[Any, Any]:
    """``(pixels, grid)`` the concept is built from: the layer's own (grid None), or for a
    slide pyramid the level an untiled run reads (``run_level``), tied to the layer's
    full-resolution pixels by an :class:`~napari_attnreg._napari.geometry.AnalysedGrid`.

    Raises
    ------
    ValueError
        A multiscale layer that is no slide (which level to read is not known).
    """
    from napari_attnreg._napari.geometry import AnalysedGrid
    from napari_attnreg._napari.slide_run import slide_of

    if not image_layer.multiscale:
        return image_layer.data, None
    slide = slide_of(image_layer)
    if slide is None:
        raise ValueError(f"{image_layer.name!r} is a multiscale image; add one level as its "
                         "own image layer to build a concept on it.")
    level = min(int(slide.get("run_level") or 0), len(image_layer.data) - 1)
    data = image_layer.data[level]
    full, shape = image_layer.data[0].shape[:2], tuple(int(n) for n in data.shape[:2])
    if level == 0:
        return data, None
    return data, AnalysedGrid(shape, (full[0] / shape[0], full[1] / shape[1]))


def build_concept(request: RoiRequest, spec: Any) -> np.ndarray:
    """The concept of ``request`` for the model of ``spec`` (worker thread: loads the
    model through the service's cache, then a forward pass per region)."""
    from napari_attnreg.core.run.concept import concept_from
    from napari_attnreg.core.run.service import load_model

    return concept_from(request.image, load_model(spec), request.labels,
                        channel_axis=request.channel_axis, channels=request.channels,
                        merge=request.merge)


class ConceptFromRoi(QWidget):
    """The 'Concept from ROI' button, the target it set, and 'Clear'.

    Parameters
    ----------
    dock : AttentionWidget
        Gives the viewer, the chosen image and its channel axis, the model, the options
        (whose ``target`` and ``map`` this sets) and the session (which holds the target).

    Signals
    -------
    built(concept) : a build ended (the vector, or None when it failed; the label says why).
    """

    built = Signal(object)

    def __init__(self, dock: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._dock = dock
        self.vector: np.ndarray | None = None
        self.description = ""
        self.worker: Any = None
        self._made: np.ndarray | None = None  # what the running build returned
        self.button = QPushButton("Concept from ROI")
        self.button.setToolTip(
            "Build the target of a class map (CDAM, Grad-CAM) from a few examples outlined "
            "on the chosen image: the selected shapes of a Shapes layer (all of them when "
            "none is selected) or the regions of a Labels layer. The map then shows which "
            "patches make an image look like them.")
        self.clear_button = QPushButton("Clear")
        self.clear_button.setToolTip("Forget the concept: the target is the text above again.")
        self.clear_button.setEnabled(False)
        self.switch_button = QPushButton(f"Use {option('map').label_of(SUGGESTED_MAP)}")
        self.switch_button.setToolTip("Switch the map to CDAM (a class map reads the concept) "
                                      "and build the concept.")
        self.switch_button.setVisible(False)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.RichText)
        buttons = QHBoxLayout()
        buttons.addWidget(self.button)
        buttons.addWidget(self.clear_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(buttons)
        layout.addWidget(self.switch_button)
        layout.addWidget(self.label)
        self.button.clicked.connect(self.request)
        self.clear_button.clicked.connect(self.clear)
        self.switch_button.clicked.connect(self._switch_map)
        self._show_target()

    # ---- state ---------------------------------------------------------------------------
    def adopt(self, value: Any, description: str = "target: a concept given in code") -> bool:
        """Hold ``value`` as the concept when it is one (an array); False otherwise."""
        if not isinstance(value, np.ndarray):
            return False
        if self.vector is None or not same_setting(self.vector, value):  # else: as described
            self.vector = np.asarray(value, dtype=np.float32)
            self.description = description
        self._show_target()
        return True

    def clear(self) -> None:
        """Forget the concept (the target control's text applies again)."""
        had = self.vector is not None
        self.vector, self.description = None, ""
        self._show_target()
        if had:
            options = self._dock.options
            self._dock.session.update_settings(target=options.value("target"))

    def _show_target(self, error: str | None = None) -> None:
        self.clear_button.setEnabled(self.vector is not None)
        text = self._dock.options.controls["target"]
        text.setPlaceholderText("concept (below)" if self.vector is not None
                                else str(option("target").default))
        if error is not None:  # layer names are the analyst's: never read as markup
            text = html.escape(error, quote=False)
            self.label.setText(f"<span style='color:{ERROR_COLOR}'>{text}</span>")
        else:
            self.label.setText(html.escape(self.description, quote=False))

    # ---- building ------------------------------------------------------------------------
    def request(self) -> Any:
        """Build the concept from the ROI (worker thread); returns the worker (None: refused,
        the label says why)."""
        if self.worker is not None:
            self.built.emit(None)  # the running build reports its own end
            return None
        dock = self._dock
        chosen = dock.options.value("map")
        if chosen not in class_maps():
            names = " or ".join(class_maps())
            self.switch_button.setVisible(True)
            self._show_target(f"A concept is the target of a class map ({names}); the map is "
                              f"{chosen!r}, which does not read it. Switch the map to "
                              f"{SUGGESTED_MAP} (button above) or choose one under Map.")
            self.built.emit(None)
            return None
        self.switch_button.setVisible(False)
        try:
            request = capture_request(dock.viewer, dock.current_layer(),
                                      dock.source.channel_axis(), dock.source.channel_options())
            spec = dock.model_spec()
        except ValueError as err:
            self._show_target(str(err))
            self.built.emit(None)
            return None
        return self._start(request, spec)

    def _start(self, request: RoiRequest, spec: Any) -> Any:
        from napari.qt.threading import create_worker

        worker = create_worker(build_concept, request, spec, _start_thread=False)
        worker.returned.connect(lambda vector: self._on_built(vector, request))
        worker.errored.connect(self._on_failed)
        worker.finished.connect(self._on_finished)
        self.worker, self._made = worker, None
        self.button.setEnabled(False)
        self.label.setText(html.escape(f"Building the concept from {request.n_regions} "
                                       f"region(s) of {request.layer_name!r}…", quote=False))
        worker.start()
        return worker

    def _on_built(self, vector: np.ndarray, request: RoiRequest) -> None:
        n = request.n_regions
        description = (f"target: concept from {n} region{'s' if n != 1 else ''} of "
                       f"{request.layer_name}")
        self.adopt(vector, description)
        options = self._dock.options
        options.set("target", vector)
        self._dock.session.update_settings(target=vector)
        self._made = vector

    def _on_failed(self, err: BaseException) -> None:
        from napari_attnreg.core.run.service import user_message

        self._show_target(f"No concept: {user_message(err)}")

    def _on_finished(self) -> None:
        self.worker = None
        self.button.setEnabled(True)
        self.built.emit(self._made)  # last: a new build may start from a slot of this signal

    def _switch_map(self) -> None:
        self._dock.options.set("map", SUGGESTED_MAP)
        self.switch_button.setVisible(False)
        self.request()

"""'Concept from ROI' in the explorer: the target of a class map from the drawn regions.

The regions drawn on the plane on screen (or passed as ``roi=``) go to the core's
:func:`~napari_attnreg.core.run.concept.concept_from` with that plane and the chosen model;
the concept becomes the run's target — held by the advanced options (which Run reads) and
put into the explorer's session. A concept is the target of a class map only (CDAM,
Grad-CAM): with another map chosen, the panel says so and offers to switch to CDAM.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as W
import numpy as np

from napari_attnreg.core.models.scorers import map_names, scorer_class
from napari_attnreg.core.run.options import option, validate_options
from napari_attnreg.notebook.advanced_panel import AdvancedPanel
from napari_attnreg.session import Session

#: The map offered when a concept is built while the chosen map does not read a target.
SUGGESTED_MAP = "cdam"
ERROR_COLOR = "#c62828"


def class_maps() -> tuple[str, ...]:
    """The registered maps that score a target (a class or a concept)."""
    return tuple(name for name in map_names() if scorer_class(name).needs.target)


class ConceptPanel(W.VBox):
    """The 'Concept from ROI' button, what the target is now, and 'Use CDAM' when needed.

    Parameters
    ----------
    advanced : AdvancedPanel
        Holds the ``map`` and ``target`` controls Run reads.
    session : Session
        The explorer's session; its ``target`` setting follows the concept.
    source : callable
        ``() -> (image, channel_axis, labels)``: the plane on screen and the drawn regions
        (labels None: none drawn); raises ValueError without an image.
    backbone : callable
        Loads the chosen model (the service's cache).
    """

    def __init__(self, advanced: AdvancedPanel, session: Session,
                 source: Callable[[], tuple[np.ndarray, int | None, np.ndarray | None]],
                 backbone: Callable[[], Any]) -> None:
        self.advanced, self.session = advanced, session
        self._source, self._backbone = source, backbone
        self.button = W.Button(description="Concept from ROI", icon="crosshairs",
                               tooltip="Build the target of a class map (CDAM, Grad-CAM) from "
                                       "the regions drawn on the image: which patches make an "
                                       "image look like them.",
                               layout=W.Layout(width="180px"))
        self.switch = W.Button(description=f"Use {option('map').label_of(SUGGESTED_MAP)}",
                               tooltip="Switch the map to CDAM and build the concept.",
                               layout=W.Layout(width="180px", display="none"))
        self.status = W.HTML()
        self.button.on_click(lambda _b: self.build())
        self.switch.on_click(lambda _b: self._switch_map())
        super().__init__([W.HBox([self.button, self.switch]), self.status])

    @property
    def vector(self) -> np.ndarray | None:
        """The concept the next run scores (None: none, or a target typed since)."""
        held = self.advanced.held("target")
        return held if isinstance(held, np.ndarray) else None

    def _say(self, text: str, error: bool = False) -> None:
        text = html.escape(text, quote=False)
        self.status.value = f"<span style='color:{ERROR_COLOR}'>{text}</span>" if error else text

    def build(self) -> np.ndarray | None:
        """Build the concept from the drawn regions and make it the target; the concept, or
        None when there is none to build (the panel says why)."""
        from napari_attnreg.core.run.concept import concept_from, region_count
        from napari_attnreg.core.run.service import user_message

        chosen = self.advanced.controls["map"].value
        if chosen not in class_maps():
            self.switch.layout.display = None
            self._say(f"A concept is the target of a class map ({' or '.join(class_maps())}); "
                      f"the map is {chosen!r}, which does not read it. Press 'Use "
                      f"{option('map').label_of(SUGGESTED_MAP)}' or choose one under Map.",
                      error=True)
            return None
        self.switch.layout.display = "none"
        try:
            image, channel_axis, labels = self._source()
            if labels is None or not np.any(labels):
                raise ValueError("No region drawn: draw a rectangle or polygon around a few "
                                 "examples of the concept (or pass roi=mask), then press "
                                 "'Concept from ROI'.")
            self._say("Building the concept…")
            # the run's channels / merge, as the run checks and applies them
            given = self.advanced.values()
            chosen = validate_options({k: given[k] for k in ("channels", "merge") if k in given})
            vector = concept_from(image, self._backbone(), labels, channel_axis=channel_axis,
                                  channels=chosen.get("channels"), merge=chosen.get("merge"))
        except Exception as err:  # noqa: BLE001 - every failure is said in the panel
            self._say(f"No concept: {user_message(err)}", error=True)
            return None
        n = region_count(labels)
        text = f"concept from {n} region{'s' if n != 1 else ''} of the drawn ROI"
        self.advanced.hold("target", vector, text)
        self.session.update_settings(target=vector)
        self._say(f"target: {text}")
        return vector

    def _switch_map(self) -> None:
        self.advanced.controls["map"].value = SUGGESTED_MAP
        self.build()

"""What one dock shows of the result on one input layer: its source, geometry and output layers.

The results, the run's parameters and the thresholds live in the dock's
:class:`~napari_attnreg.session.Session` (keyed by the source layer's ``unique_id``); a record
reads them from there, so a threshold set anywhere is the one its layers, status line and ROI
table use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from napari_attnreg._napari.geometry import AnalysedGrid, SourceGeometry
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.planes import PlaneIndex
from napari_attnreg.core.run.thresholds import Thresholds
from napari_attnreg.session import ResultEntry, Session


@dataclass
class RunRecord:
    """The napari side of the session result of one input layer."""

    session: Session = field(repr=False)
    source_id: Any  # the layer's unique_id, the session key of its result
    source_name: str
    geometry: SourceGeometry
    #: The output layers of this run, by kind (object identity, not names or metadata).
    outputs: dict[str, Any] = field(default_factory=dict, repr=False)
    #: The analysed pixels on the layer's, when the run read a slide at another level (then
    #: ``geometry`` is the analysed image's, placed over the layer).
    grid: AnalysedGrid | None = None

    def placed(self, layer_geometry: SourceGeometry) -> SourceGeometry:
        """The analysed image's geometry over a source layer placed by ``layer_geometry``."""
        return layer_geometry if self.grid is None else self.grid.place(layer_geometry)

    # ---- read from the session (results, params, run id, thresholds) -----------------------
    @property
    def entry(self) -> ResultEntry:
        """This image's entry in the session (KeyError once the session forgot it)."""
        return self.session[self.source_id]

    @property
    def results(self) -> Mapping[PlaneIndex, AttentionResult]:
        return self.entry.results

    @property
    def params(self) -> Mapping[str, Any]:
        return self.entry.run.params

    @property
    def run_id(self) -> str:
        return self.entry.run.run_id

    @property
    def thresholds(self) -> Thresholds:
        return self.entry.thresholds

    @property
    def any_result(self) -> AttentionResult:
        return self.entry.any_result

    @property
    def preset(self) -> str:
        return self.entry.preset

    @property
    def grid_shape(self) -> tuple[int, int]:
        return self.any_result.grid_shape

    def shown(self, plane: PlaneIndex) -> AttentionResult:
        """The result of ``plane`` applying the thresholds chosen for this image."""
        return self.entry.shown(plane)

    # ---- geometry of the output layers ------------------------------------------------------
    def output_shape(self, supersample: int = 1) -> tuple[int, ...]:
        shape = list(self.geometry.shape[:-2]) + [n * supersample for n in self.grid_shape]
        if self.geometry.channel_axis is not None:
            shape[self.geometry.channel_axis] = 1
        return tuple(shape)

    def plane_slot(self, plane: PlaneIndex) -> tuple[Any, ...]:
        """Index of one plane's token grid in the stacked output array."""
        slot: list[Any] = [slice(None)] * len(self.output_shape())
        for axis, i in zip(self.geometry.stack_axes, plane):
            slot[axis] = i
        if self.geometry.channel_axis is not None:
            slot[self.geometry.channel_axis] = 0
        return tuple(slot)

    def takes_planes_of(self, geometry: SourceGeometry,
                        results: Mapping[PlaneIndex, AttentionResult],
                        params: Mapping[str, Any]) -> bool:
        """Whether another run's planes belong with this result (same stack, grid, model,
        preset): a run on one more slice then adds its plane instead of replacing the rest."""
        first = next(iter(results.values()))
        return (self.geometry.same_grid(geometry) and self.grid_shape == first.grid_shape
                and self.params.get("model") == params.get("model")
                and self.preset == first.preset)

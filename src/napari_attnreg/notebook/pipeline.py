"""From the explorer's controls to a :class:`~napari_attnreg.core.run.service.Job`.

The computation itself is the core's pipeline service (:func:`core.service.run_job`: model
cache, load-then-run, outcome and messages); this module only says which model, which plane
and which options the controls describe.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from napari_attnreg.core.models.backbones import Backbone, load_backbone
from napari_attnreg.core.models.catalogue import find
from napari_attnreg.core.models.weights import WEIGHT_SUFFIXES
from napari_attnreg.core.run.engine import RunConfig
from napari_attnreg.core.run.options import options_in, reset_inapplicable, validate_options
from napari_attnreg.core.run.planes import PlaneIndex
from napari_attnreg.core.run.service import Job, ModelSpec
from napari_attnreg.io.geojson import geojson_tissue_mask, is_geojson_path
from napari_attnreg.notebook.advanced_panel import ELSEWHERE, STATE_OPTIONS, read_back_options
from napari_attnreg.notebook.option_controls import check_opacity
from napari_attnreg.notebook.sources import DiskSource, MemorySource
from napari_attnreg.session import Session

#: Options of :class:`RunConfig` the explorer's own arguments and controls set.
CONTROLLED = {*STATE_OPTIONS, *ELSEWHERE, *(o.name for o in options_in("thresholds")), "extra"}


def check_run_options(options: dict[str, Any]) -> dict[str, Any]:
    """The extra keyword arguments of the explorer: RunConfig fields its controls do not set."""
    unknown = set(options) - (set(RunConfig.__dataclass_fields__) - CONTROLLED)
    if unknown:
        raise TypeError(f"AttentionExplorer got unknown options {sorted(unknown)}; the run "
                        "options are the RunConfig fields.")
    return validate_options(options)  # bad values fail now, with the core's words


def check_arguments(named: Mapping[str, Any], *, opacity: Any) -> dict[str, Any]:
    """The explorer's named arguments, checked as ``regularize()`` and the CLI check them.

    Parameters
    ----------
    named : mapping
        Run options given by name (``n_boot``, ``tiled``, thresholds ...).
    opacity : float
        The overlay's opacity, in [0, 1].

    Returns
    -------
    dict
        The options normalised by the core's validator, and ``opacity`` as a float.

    Raises
    ------
    ValueError
        With the core's words, e.g. ``n_boot=1.5`` is not rounded but refused.
    """
    return {**validate_options(named), "opacity": check_opacity(opacity)}


def given_model(model: Any) -> Backbone:
    """A model object the user passed, as a Backbone (it cannot be reloaded by name)."""
    return model if isinstance(model, Backbone) else load_backbone(model)


def model_spec(name: str, *, arch: str | None, given: Backbone | None) -> ModelSpec:
    """The service's description of the model the picker names."""
    name = name.strip()
    if given is not None and name == given.name:
        return ModelSpec("module", name, module=given)
    if name == "demo":
        return ModelSpec("demo")
    if find(name) is not None:
        return ModelSpec("catalogue", name)
    if name.lower().endswith(WEIGHT_SUFFIXES) or Path(name).expanduser().is_file():
        return ModelSpec("file", name, arch=arch)
    return ModelSpec("timm", name)


def run_config(session: Session, options: Mapping[str, Any],
               thresholds: Mapping[str, Any] | None = None) -> RunConfig:
    """The validated RunConfig of the session's settings, read as napari's dock reads them.

    The explorer's own traits reach the session as they change (``SessionLink``); the
    Advanced panel's ``options`` (those that differ from their defaults) are pushed at Run,
    every other option of the panel put back to unset, so the session never keeps a value the
    panel no longer shows. ``thresholds``: those the run starts with (default: the session's
    thresholds for a new run). Raises ValueError for an invalid combination.
    """
    pushed = {o.name: o.unset for o in read_back_options()}
    session.update_settings({**pushed, **options})
    # options the run does not read go back to unset: an untiled run records no tiling
    settings = {**session.settings, **dict(thresholds or session.run_thresholds())}
    config = RunConfig(**reset_inapplicable(settings))
    config.validate()
    return config


def make_job(session: Session, spec: ModelSpec, source: MemorySource | DiskSource,
             plane: PlaneIndex, options: Mapping[str, Any], task_id: int,
             thresholds: Mapping[str, Any] | None = None) -> Job:
    """One plane of ``source`` with the session's settings, tagged with ``task_id``.

    The job reads the image shown; ``source.prepare`` (in the run's worker) turns it into
    what the run reads: a file opened again with the run's options, a slide at its level.
    """
    config = run_config(session, options, thresholds)
    source.check_config(config)  # before anything starts: the status says why
    if is_geojson_path(config.tissue_mask):  # QuPath's outline, in full-resolution pixels
        config.tissue_mask = geojson_tissue_mask(
            str(config.tissue_mask).strip(), source.plane_shape, float(source.downsample),
            slide=bool(getattr(source, "slide", False)))
    if plane:  # the result says which plane it is (as napari's and the CLI's do)
        config.extra = {**config.extra, "slice": list(plane)}
    return Job(spec, source.run_image, [tuple(plane)], config, task_id=task_id)

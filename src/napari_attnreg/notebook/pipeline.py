"""The explorer's computation: its run options → a RunConfig, and "load the model, then run".

The generator runs on the runner's worker thread; each yield is a cancellation point.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

import numpy as np

from ..core.backbones import Backbone, load_backbone
from ..core.engine import CancelToken, Progress, RunConfig, run_engine
from ..core.options import validate_options
from ..core.presets import THRESHOLD_KEYS
from .state import RUN_DEFAULTS, ExplorerState

#: Options of :class:`RunConfig` the explorer's own controls set.
CONTROLLED = {"preset", "method", "n_boot", "seed", "device", "tiled", "tile_scale",
              "tile_overlap", *THRESHOLD_KEYS, "extra"}


def check_run_options(options: dict[str, Any]) -> dict[str, Any]:
    """The extra keyword arguments of the explorer: RunConfig fields its controls do not set."""
    unknown = set(options) - (set(RunConfig.__dataclass_fields__) - CONTROLLED)
    if unknown:
        raise TypeError(f"AttentionExplorer got unknown options {sorted(unknown)}; the run "
                        "options are the RunConfig fields.")
    return validate_options(options)  # bad values fail now, with the core's words


def run_config(state: ExplorerState, options: dict[str, Any], *, channel_last: bool,
               plane: tuple[int, ...]) -> RunConfig:
    """The validated RunConfig of the current controls (ValueError says what is wrong)."""
    options = dict(options)
    if channel_last:
        options["channel_axis"] = -1
    # untiled runs keep the engine's tiling defaults, so their metadata says nothing stale
    tiling = {"tiled": state.tiled,
              "tile_overlap": state.tile_overlap if state.tiled else RUN_DEFAULTS.tile_overlap,
              "tile_scale": state.tile_scale if state.tiled else RUN_DEFAULTS.tile_scale}
    config = RunConfig(preset=state.preset, method=state.method, n_boot=state.n_boot,
                       seed=state.seed, device=state.device,
                       extra={"slice": list(plane)} if plane else {}, **tiling,
                       **state.thresholds(), **options)
    config.validate()
    return config


class ModelCache:
    """Keeps one model loaded by name (plus one model object the user passed)."""

    def __init__(self, arch: str | None = None) -> None:
        self.arch = arch
        self.given: str | None = None
        self._models: dict[str, Backbone] = {}

    def give(self, model: Any) -> str:
        """Keep a model object the user passed (it cannot be reloaded by name); its name."""
        backbone = model if isinstance(model, Backbone) else load_backbone(model)
        self.given = backbone.name
        self._models[backbone.name] = backbone
        return backbone.name

    def run(self, name: str, plane: np.ndarray, config: RunConfig,
            token: CancelToken) -> Generator[Progress, None, Any]:
        """Load ``name`` if needed, then the engine's generator; returns the result."""
        t0 = time.perf_counter()
        backbone = self._models.get(name)
        if backbone is None:
            yield Progress("model", 0, config.n_boot, 0, 0.0, f"loading model {name} …")
            backbone = load_backbone(name, arch=self.arch)
            self._models = {k: v for k, v in self._models.items() if k == self.given}
            self._models[name] = backbone
        token.raise_if_cancelled()
        config.extra = {**config.extra, "model_load_s": time.perf_counter() - t0}
        return (yield from run_engine(plane, backbone, config, token))

    def forget(self, name: str) -> None:
        """Free a model loaded by name (not the one the user passed)."""
        if name != self.given:
            self._models.pop(name, None)

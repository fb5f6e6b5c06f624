"""Shared helpers of the validation harness (benchmarks/validate.py).

Every run goes through the public engine exactly as a user's image does (an ndarray into
``run_engine``), once per preset. A *reading* is a preset with options that change only the
statistics (here the π0 estimate); it is computed from that preset's run with the same
observed and null maps (:func:`with_preset`), which ``tests/test_validate.py`` checks against
a separate engine run with that option.
"""

from __future__ import annotations

import sys
import time
import warnings
from dataclasses import replace

import numpy as np
import torch

from napari_attnreg.core.attention import cls_attention
from napari_attnreg.core.directional import directional_statistics
from napari_attnreg.core.engine import RunConfig, drain, run_engine
from napari_attnreg.core.images import PreparedImage, prepare_image
from napari_attnreg.core.nulls import NullConfig, null_images
from napari_attnreg.core.presets import PRESET_DEFAULTS
from napari_attnreg.core.result import AttentionResult
from napari_attnreg.core.stats import StatisticsWarning, TokenStatistics, compute_statistics

PRESETS = ("directional", "paper")


def _other_pi0(default) -> tuple[str, object]:
    """The π0 estimate shown next to the directional default: π0 = 1 if the default estimates
    π0 from the data, else Storey's smoother (the data-driven estimate)."""
    data_driven = isinstance(default, str) and default not in ("bh",)
    return ("directional, pi0_method=1", 1.0) if data_driven else (
        "directional, pi0_method='smoother'", "smoother")


VARIANT, _VARIANT_PI0 = _other_pi0(PRESET_DEFAULTS["directional"]["pi0_method"])
#: How each run is read: name → (preset, options). The last is a diagnostic, not a preset.
READINGS: dict[str, tuple[str, dict]] = {
    "directional": ("directional", {}),
    "paper": ("paper", {}),
    VARIANT: ("directional", {"pi0_method": _VARIANT_PI0}),
}
_T0 = time.perf_counter()


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.0f} s] {message}", file=sys.stderr, flush=True)


def prepare(bb, image, **options) -> PreparedImage:
    """What the engine does to an ndarray (``target_size="model"``)."""
    return prepare_image(image, patch_size=bb.patch_size, mean=bb.mean, std=bb.std,
                         default_size=bb.input_size[1:], target_size="model", **options)


def preset_statistics(observed, null_scores, preset: str, **options) -> TokenStatistics:
    """A preset's token statistics (its defaults, unless ``options`` say otherwise)."""
    cfg = RunConfig(preset=preset, **options).resolved()
    observed = torch.as_tensor(np.asarray(observed, dtype=np.float32)).reshape(-1)
    null_scores = torch.as_tensor(np.asarray(null_scores, dtype=np.float32))
    null_scores = null_scores.reshape(null_scores.shape[0], -1)
    if preset == "directional":
        return directional_statistics(observed, null_scores, null_pool=cfg.null_pool,
                                      pi0_method=cfg.pi0_method)
    return compute_statistics(observed, null_scores, p_method=cfg.p_method,
                              alternative=cfg.alternative, pi0_method=cfg.pi0_method, null=cfg.null)


def with_preset(result: AttentionResult, preset: str, **options) -> AttentionResult:
    """The result the engine gives under ``preset`` (and ``options``) for the same image,
    seed and null images."""
    if result.null_scores is None:
        raise ValueError("with_preset needs a result run with keep_nulls=True")
    with warnings.catch_warnings():  # π0 at a bound etc.: the harness reports π0 itself
        warnings.simplefilter("ignore", StatisticsWarning)
        stats = preset_statistics(result.attention, result.null_scores, preset, **options)
    cfg = RunConfig(preset=preset, **options).resolved()
    grid = result.grid_shape
    keys = ("p_method", "alternative", "pi0_method", "null", "null_pool")
    metadata = {**result.metadata, "preset": preset, **{k: getattr(cfg, k) for k in keys},
                **cfg.thresholds(), "lfdr_fit": stats.null_summary.get("lfdr_fit")}
    return replace(result, z=stats.z.reshape(grid), p=stats.p.reshape(grid),
                   lfdr=stats.lfdr.reshape(grid), posterior=stats.posterior.reshape(grid),
                   q=stats.q.reshape(grid), pi0=float(stats.pi0), thresholds=cfg.thresholds(),
                   metadata=metadata)


def run_presets(bb, image, *, n_boot: int, seed: int, method: str = "normal", device: str = "cpu",
                **options) -> dict[str, AttentionResult]:
    """One engine run per preset of an ndarray image, read every way of :data:`READINGS`."""
    runs = {}
    with warnings.catch_warnings():  # π0 at a bound etc.: the harness reports π0 itself
        warnings.simplefilter("ignore", StatisticsWarning)
        for preset in PRESETS:
            cfg = RunConfig(preset=preset, method=method, n_boot=n_boot, seed=seed, device=device,
                            keep_nulls=True, **options)
            runs[preset] = drain(run_engine(image, bb, cfg))
    return {name: runs[preset] if not opts else with_preset(runs[preset], preset, **opts)
            for name, (preset, opts) in READINGS.items()}


def model_channel_null_scores(bb, prepared: PreparedImage, *, n_boot: int, seed: int,
                              method: str = "normal", chunk: int = 25) -> np.ndarray:
    """The deliberately wrong null: ``(B, T)`` scores of nulls drawn per *model* channel.

    The nulls come from ``prepared.tensor`` (normalised, model channels) instead of the
    image's own channels. For a grey image the three model channels are copies of one
    channel; drawing them independently gives colour noise that a grey image never holds.
    """
    x = prepared.tensor
    rows = []
    with torch.inference_mode():
        for start in range(0, n_boot, chunk):
            batch = null_images(x, range(start, min(n_boot, start + chunk)), NullConfig(method),
                                seed=seed, patch_size=bb.patch_size[0])
            rows.append(cls_attention(bb, batch).reshape(batch.shape[0], -1).float().numpy())
    return np.concatenate(rows)


def null_input(field: np.ndarray, method: str, rng: np.random.Generator,
               size: tuple[int, int] | None = None) -> np.ndarray:
    """A null *image* drawn in the field's own channels, float32 ``(H, W[, C])``.

    ``normal``: i.i.d. Gaussian with each channel's mean/std; ``uniform``: U(min, max) per
    channel; ``pixel``: the field's pixel vectors resampled with replacement. ``size`` defaults
    to the field's size.
    """
    data = field.astype(np.float64)
    flat = data.reshape(-1, 1 if data.ndim == 2 else data.shape[-1])
    h, w = size or data.shape[:2]
    if method == "normal":
        out = rng.normal(flat.mean(0), flat.std(0), size=(h * w, flat.shape[1]))
    elif method == "uniform":
        out = rng.uniform(flat.min(0), flat.max(0), size=(h * w, flat.shape[1]))
    elif method == "pixel":
        out = flat[rng.integers(0, flat.shape[0], size=h * w)]
    else:
        raise ValueError(f"no null image for method {method!r}")
    out = out.reshape(h, w, flat.shape[1])
    return (out[..., 0] if data.ndim == 2 else out).astype(np.float32)


def overlap(pred: np.ndarray, truth: np.ndarray) -> tuple[float, float, float, float]:
    """Precision, recall, F1, IoU of a boolean prediction (0 where undefined)."""
    tp = float(np.sum(pred & truth))
    precision = tp / pred.sum() if pred.sum() else 0.0
    recall = tp / truth.sum() if truth.sum() else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    union = float(np.sum(pred | truth))
    return precision, recall, f1, (tp / union if union else 0.0)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """|a ∩ b| / |a ∪ b|; 1 when both are empty."""
    union = np.sum(a | b)
    return float(np.sum(a & b) / union) if union else 1.0

"""What a run does with its map, between the scorer and the statistical procedure.

- :func:`values_for_procedure`: the values a procedure tests. Step-down procedures test shares: a
  signed map gives its positive part (``sign="for"``) or its negative part (``"against"``).
  Pooled-null procedures take logs, which suits attention shares; a gradient map (signed,
  or with ReLU zeros) is handed to them as ``exp(x / c)``, so their log-scale z is exactly
  the z of the map's own values (``(x − μ0)/σ0`` is unchanged by the affine map
  ``x → x / c``) and their rank p-values see the same order. Maps with
  exact zeros (Grad-CAM's ReLU, a positive part) get a floor far below every value, the
  same share of each map's mean for every map, so the zero tokens are one tie group that
  no null map fails to match.
- :func:`families`: the families of a run — one map, one per head (``map="heads"``), with
  attention sinks left out on request (``exclude_sinks=True``). Every preset tests them: the
  step-down runs one step-down per family (BH over the heads, METHOD's tiles rule); the
  pooled-null presets (paper, directional) test each family alone against its own null
  columns and take the q-values over all families' tokens together, the local fdr per family
  (:mod:`napari_attnreg.core.stats.pooled_families`). Per token, the statistics reported are
  those of the family (head) that gives it the most attention. A head tested this way is a
  whole map against the null images' same head: one that is uneven all over the image (it
  maps background structure that the nulls erase) while nearly even on every null image is
  significant at nearly every step, so nearly all its tokens are kept — as the step-down
  prescribes (tests/test_stepdown_uneven_head.py; docs/validation.md, phantom ``heads``).
- :func:`map_checks`: the sanity check and the attention-sink check as diagnostics.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from napari_attnreg.core.models.backbones import Backbone
from napari_attnreg.core.models.entering import Entering
from napari_attnreg.core.models.scorers import Scorer, make_scorer
from napari_attnreg.core.stats.map_checks import (
    SinkReport,
    earlier_block,
    sanity_from_maps,
    sanity_maps,
    sink_tensors,
    sinks_from_tensors,
)

SIGNS = ("for", "against")
#: Exact zeros are raised to this share of their map's mean (far below any real value).
ZERO_FLOOR = 1e-6
#: Signed values reach the pooled procedures as exp(x / c), c = (largest |x|) / this: the
#: exponent stays within ±40, well inside float32.
EXP_RANGE = 40.0


def scorer_for(map_name: str, *, layer: int, head: Any, target: Any) -> Scorer:
    """The configured scorer of a run (a ValueError for an unknown map or target)."""
    return make_scorer(map_name, layer=layer, head=head, target=target)


def floor_zeros(maps: torch.Tensor) -> torch.Tensor:
    """Each row (map) with values ≤ 0 raised to at least :data:`ZERO_FLOOR` × its mean.

    Rows whose values are all positive are returned unchanged; a row with nothing above 0
    becomes flat (equal values: nothing concentrates).
    """
    rows = maps.reshape(-1, maps.shape[-1])
    needs = (rows <= 0).any(dim=1)
    if not bool(needs.any()):
        return maps
    out = rows.clone()
    part = out[needs].clamp_min(0.0)
    mean = part.mean(dim=1, keepdim=True)
    floor = torch.where(mean > 0, mean * ZERO_FLOOR, torch.ones_like(mean))
    out[needs] = torch.maximum(part, floor)
    return out.reshape(maps.shape)


def values_for_procedure(observed: torch.Tensor, null: torch.Tensor, *, signed: bool,
                         sign: str, shares: bool,
                         log_scale: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The observed and null values a procedure tests (see the module's notes).

    Parameters
    ----------
    observed, null : tensor
        The map's raw scores; the last axis is the tokens of one map.
    signed : bool
        The map can be negative (``Needs.signed``).
    sign : {"for", "against"}
        Which part of a signed map a share procedure tests.
    shares : bool
        The procedure tests re-normalised shares (the step-down), not pooled logs.
    log_scale : bool
        The map is attention shares (``Needs.shares``): pooled procedures take its logs.
        Otherwise (and for every signed map) they see its own values.
    """
    if sign not in SIGNS:
        raise ValueError(f"sign={sign!r}: use 'for' (the evidence for the target) or "
                         "'against' (the evidence against it).")
    if shares:
        if signed and sign == "against":
            observed, null = -observed, -null
        return floor_zeros(observed), floor_zeros(null)
    if signed or not log_scale:
        scale = float(max(observed.abs().max(), null.abs().max())) / EXP_RANGE
        scale = scale if scale > 0 else 1.0
        return torch.exp(observed / scale), torch.exp(null / scale)
    return floor_zeros(observed), floor_zeros(null)


@dataclass(frozen=True)
class Families:
    """The families of an untiled run, as ``Procedure.statistics`` takes them.

    Attributes
    ----------
    observed : tensor ``(T,)``
        The image's map (for the display z): the tested map, or the mean of the heads.
    null : tensor
        ``(B, T_kept)`` shared by every family, or ``(B, F·T_kept)`` family after family.
    keywords : dict
        ``families``, ``owner`` and ``family_tokens`` (empty for one plain family).
    excluded : np.ndarray
        Token indices left out of every family (reported as not tested).
    """

    observed: torch.Tensor
    null: torch.Tensor
    keywords: dict[str, Any]
    excluded: np.ndarray


def families(observed: torch.Tensor, null: torch.Tensor, *, per_family: bool,
             excluded: tuple[int, ...] = ()) -> Families:
    """Families of one map ``(T,)``/``(B, T)`` or of heads ``(H, T)``/``(B, H·T)``.

    ``per_family``: the observed rows are families (heads) with their own null columns.
    ``excluded`` tokens leave every family (and its null columns) before the test.
    """
    fam_obs = observed.reshape(-1, observed.shape[-1]) if per_family else observed.reshape(1, -1)
    n_fam, n_tok = fam_obs.shape
    mean = fam_obs.mean(dim=0)
    if n_fam == 1 and not excluded:
        return Families(fam_obs[0], null.reshape(null.shape[0], -1), {}, np.array([], int))
    keep = np.setdiff1d(np.arange(n_tok), np.asarray(excluded, dtype=np.int64))
    if keep.size == 0:
        raise ValueError("Every token is an attention sink; run with exclude_sinks=False.")
    index = torch.as_tensor(keep, device=null.device)
    fam_null = null.reshape(null.shape[0], n_fam, n_tok)[:, :, index].reshape(null.shape[0], -1)
    kept_obs = fam_obs[:, index.to(fam_obs.device)]
    # a token's reported step p is that of the family that gives it the most attention
    owner_fam = kept_obs.argmax(dim=0).cpu().numpy() if n_fam > 1 else np.zeros(keep.size, int)
    family_of = np.zeros(n_tok, dtype=np.int64)
    local = np.zeros(n_tok, dtype=np.int64)
    family_of[keep], local[keep] = owner_fam, np.arange(keep.size)
    keywords = {"families": kept_obs, "owner": (family_of, local),
                "family_tokens": np.tile(keep, (n_fam, 1))}
    return Families(mean, fam_null, keywords, np.setdiff1d(np.arange(n_tok), keep))


def mark_untested(stats: Any, excluded: np.ndarray) -> Any:
    """Token statistics with the excluded tokens' p, q, lfdr and evidence set to NaN."""
    if excluded.size == 0:
        return stats
    arrays = {}
    for name in ("p", "q", "lfdr", "posterior"):
        values = np.array(getattr(stats, name), dtype=np.float64, copy=True)
        values.reshape(-1)[excluded] = np.nan
        arrays[name] = values
    return replace(stats, **arrays)


def family_evidence(null_summary: dict[str, Any], n_tokens: int) -> np.ndarray:
    """``(F, T)`` evidence of every family (head) on its own, NaN where a token was not
    tested in that family: under the step-down 1 − its adjusted p (with the family's BH
    floor), under the pooled-null presets its posterior (1 − its own local fdr)."""
    if "family_posterior" in null_summary:
        return np.asarray(null_summary["family_posterior"], dtype=np.float64)
    tokens = np.asarray(null_summary["stepdown_step_token"])
    adjusted = np.maximum(np.asarray(null_summary["stepdown_adjusted_p"]),
                          np.asarray(null_summary["stepdown_family_adjusted_p"])[:, None])
    out = np.full((tokens.shape[0], n_tokens), np.nan)
    np.put_along_axis(out, tokens, 1.0 - adjusted, axis=1)
    return out


def map_checks(scorer: Scorer, backbone: Backbone, image: torch.Tensor, *, seed: int,
               original: torch.Tensor | None = None, share: torch.Tensor | None = None,
               amp: Callable[[], AbstractContextManager] = nullcontext,
               entering: Entering | None = None,
               ) -> tuple[list[dict[str, str]], dict[str, Any], SinkReport]:
    """The sanity check and the sink check of one model-ready image ``(C, H, W)``.

    ``original`` (the scorer's map of the image) and ``share`` (the image's head-mean CLS
    attention of the last block) spare the checks a forward pass each where the caller has
    them already; both are computed under ``amp``, the autocast context the checks' own
    passes run in. ``entering`` (what entered the last block in the image's pass) lets
    both checks run that block alone instead of the whole model. Every pass is queued
    before anything is read back, so on a GPU they run back to back behind whatever the
    device still has queued. Returns the diagnostics that
    fired (as dicts), the numbers for the metadata, and the sink report (its tokens are what
    ``exclude_sinks=True`` leaves out).
    """
    maps = sanity_maps(scorer, backbone, image, seed, original, amp, entering)
    tensors = sink_tensors(backbone, image, share, amp, entering)
    sanity, sinks = sanity_from_maps(*maps, seed), sinks_from_tensors(*tensors)
    found = [d.as_dict() for d in (sanity.diagnostic(scorer.name,
                                                     earlier_block(scorer, backbone)),
                                   sinks.diagnostic()) if d is not None]
    numbers = {"map_sanity_rho": sanity.rho, "sink_tokens": list(sinks.tokens)}
    return found, numbers, sinks

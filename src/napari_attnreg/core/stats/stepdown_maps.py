"""Step-down families as token maps of a result, and significance from what a result stores.

:func:`stepdown_statistics` runs :func:`~.stepdown.step_down` on an image (one family) or
on the tiles of a tiled image (one family per tile) and returns the
:class:`~.stats.TokenStatistics` every result is made of:

- ``p``: the step p-value of each token; ``q`` (and ``lfdr``): its step-down adjusted p,
  for a tile never below the tile's Benjamini–Hochberg adjusted p; ``posterior``: the
  evidence ``1 − q``; ``z``: the pooled log-scale z-score (display and the optional z mask);
  ``pi0`` is 1 (no π0 is estimated).
- ``null_summary`` keeps the steps (``stepdown_*`` arrays, a few numbers per token), so a
  rule or level chosen later is applied by :func:`stepdown_mask` without the null maps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from napari_attnreg.core.stats.paper import TokenStatistics
from napari_attnreg.core.stats.stepdown import (
    BLOCK_ELEMENTS,
    StepDownFamilies,
    family_selection,
    significant_steps,
    step_down,
)

#: The ``null_summary`` keys of a step-down result (arrays saved with the result).
STEP_KEYS = ("stepdown_family", "stepdown_step_token", "stepdown_step_p",
             "stepdown_adjusted_p", "stepdown_group_end", "stepdown_tail")


def stepdown_statistics(observed: torch.Tensor, null_scores: torch.Tensor, *, tail: str = "none",
                        families: torch.Tensor | None = None,
                        owner: tuple[np.ndarray, np.ndarray] | None = None,
                        family_tokens: np.ndarray | None = None) -> TokenStatistics:
    """Step-down token statistics of one image or of the tiles of one image.

    Parameters
    ----------
    observed : tensor ``(T,)``
        The image's token attention (for a tiled image: its assembled map, used for ``z``).
    null_scores : tensor ``(B, T)``; tiled: ``(B, T_tile)`` or ``(B, F·T_tile)``
        Null attention at the tokens' positions (image-level null tiles, or per tile).
    tail : {"none", "gpd"}
    families : tensor ``(F, T_tile)``, optional
        Tiled images: every tile's own full attention map (each tile is a family).
    owner : (array, array), optional
        Tiled images: for each image token, its tile and its index inside that tile.
    family_tokens : array ``(F, T_tile)`` of int, optional
        Tiled images: the image token under each token of each tile. Where tiles overlap a
        token belongs to several families; it is significant if any of them keeps it, and its
        evidence is the largest it has in them.

    Returns
    -------
    TokenStatistics
    """
    if families is None:
        fam_obs, fam_null, family_of, local = observed.reshape(1, -1), null_scores, None, None
    else:
        n_fam, n_tok = families.shape
        fam_obs = families
        fam_null = (null_scores if null_scores.shape[1] == n_tok else
                    null_scores.reshape(null_scores.shape[0], n_fam, n_tok).permute(1, 0, 2))
        family_of, local = (np.asarray(v).reshape(-1) for v in owner)  # type: ignore[union-attr]
    fams = step_down(fam_obs, fam_null, tail=tail)
    maps = _token_maps(fams, family_of, local, family_tokens, observed.numel())
    pool = null_scores.reshape(null_scores.shape[0], -1)
    z_obs, mu0, sigma0 = _display_z(observed, pool)
    summary = {
        "B": fams.n_boot, "T": int(pool.shape[1]), "lfdr_fit": "stepdown",
        # the null maps as rows of a view (a per-tile null's permuted view would be copied)
        "empirical_null": None,
        "concentration_ratio": concentration_ratio(fam_obs, pool.reshape(-1, fam_obs.shape[1])),
        **maps["summary"],
    }
    return TokenStatistics(z=z_obs, p=maps["p"], pi0=1.0,
                           lfdr=maps["q"], posterior=1.0 - maps["q"], q=maps["q"], mu0=mu0,
                           sigma0=sigma0, null_summary=summary)


def _display_z(observed: torch.Tensor, pool: torch.Tensor) -> tuple[np.ndarray, float, float]:
    """``(log A − μ0)/σ0`` against the pooled log null, its moments read in blocks.

    Only for display and the optional z mask: the step-down itself never uses it, so it is
    computed without the float64 copy of the whole pool that the pooled presets need.
    """
    rows = pool.reshape(pool.shape[0], -1)
    step = max(1, BLOCK_ELEMENTS // rows.shape[1])
    blocks = range(0, rows.shape[0], step)
    def logs(i: int) -> torch.Tensor:  # a copy: a float64 input must not change
        return rows[i:i + step].to(torch.float64, copy=True).log_()

    mu0 = sum(float(logs(i).sum()) for i in blocks) / rows.numel()
    squares = sum(float(logs(i).sub_(mu0).square_().sum()) for i in blocks)
    sigma0 = (squares / rows.numel()) ** 0.5
    if not sigma0 > 1e-12 * max(1.0, abs(mu0)):
        raise ValueError("The null attention scores are all equal, so the null images carry no "
                         "information; use a null generator that varies the image.")
    log_obs = torch.log(observed.reshape(-1).double().cpu()).numpy()
    return (log_obs - mu0) / sigma0, mu0, sigma0


def _token_maps(fams: StepDownFamilies, family_of: np.ndarray | None, local: np.ndarray | None,
                family_tokens: np.ndarray | None, n_image: int) -> dict[str, Any]:
    """Per-token p and adjusted p (with the family's BH floor) and the stored steps."""
    family_adjusted, _ = family_selection(fams.family_p, 1.0)
    step_p = fams.in_token_order(fams.step_p)
    adjusted = np.maximum(fams.in_token_order(fams.adjusted_p), family_adjusted[:, None])
    if family_of is None:
        family_of = np.zeros(step_p.shape[1], dtype=np.int64)
        local = np.arange(step_p.shape[1])
    if family_tokens is None:
        family_tokens = np.arange(step_p.shape[1])[None]
    # every image token takes its smallest adjusted p over the tiles that hold it
    best = np.ones(n_image)
    np.minimum.at(best, np.asarray(family_tokens).reshape(-1), adjusted.reshape(-1))
    summary = {
        "stepdown_family": family_of.astype(np.int32),
        # the image token under each step of each family, so a rule marks what any tile keeps
        "stepdown_step_token": fams.in_step_order(
            np.asarray(family_tokens, dtype=np.int32)),
        "stepdown_step_p": fams.step_p,
        "stepdown_adjusted_p": fams.adjusted_p,
        "stepdown_group_end": fams.group_end,
        "stepdown_tail": fams.tail_used,
        "stepdown_family_p": fams.family_p.copy(),
        "stepdown_family_adjusted_p": family_adjusted,
        "p_map": float(family_adjusted.min()),
        "p_resolution": 1.0 / (fams.n_boot + 1),
        "n_families": int(fams.step_p.shape[0]),
        "tail": fams.tail.as_dict(),
    }
    return {"p": step_p[family_of, local], "q": best, "summary": summary}


def concentration_ratio(observed: torch.Tensor, null: torch.Tensor) -> float:
    """sd of log attention of the observed map(s) over that of the null maps (median ratio).

    Near 1 when the image's map is as concentrated as the null maps; far from it the
    null images do not look like the image to the model (§ diagnostics). The null maps are
    read in blocks, so this never holds more than a fraction of the null in float64.
    """
    if observed.shape[-1] < 2:  # one patch has no spread (torch would warn, then give NaN)
        return float("nan")

    def row_sd(maps: torch.Tensor) -> torch.Tensor:
        rows = maps.reshape(-1, maps.shape[-1])
        step = max(1, BLOCK_ELEMENTS // rows.shape[1])
        return torch.cat([rows[i:i + step].to(torch.float64, copy=True).log_().std(dim=1)
                          for i in range(0, rows.shape[0], step)])

    return float(row_sd(observed).median() / row_sd(null).median())


def is_stepdown(null_summary: dict[str, Any]) -> bool:
    """The result stores step-down steps (its rules can be re-applied)."""
    return all(k in null_summary for k in STEP_KEYS)


def stepdown_mask(null_summary: dict[str, Any], rule: str, alpha: float,
                  grid_shape: tuple[int, ...]) -> np.ndarray:
    """Boolean token map of a step-down rule at level ``alpha`` from a result's stored steps."""
    if not is_stepdown(null_summary):
        raise ValueError(f"rule={rule!r} needs the step-down steps, which this result does not "
                         "have (it was made by another preset); use that preset's rules.")
    steps = significant_steps(np.asarray(null_summary["stepdown_step_p"]),
                              np.asarray(null_summary["stepdown_adjusted_p"]),
                              np.asarray(null_summary["stepdown_group_end"], dtype=bool),
                              rule, float(alpha))
    tokens = np.asarray(null_summary["stepdown_step_token"])
    keep = np.zeros(int(np.prod(grid_shape)), dtype=bool)
    keep[tokens[steps]] = True
    return keep.reshape(grid_shape)

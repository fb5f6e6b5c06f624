"""Share step-down inference: the default statistics (``preset="stepdown"``; docs/method.md).

Attention is a softmax *share*: each map sums to one, and maps differ in how concentrated
they are, so a token's share cannot be compared with the shares of other maps directly.
Here the tokens are taken in order of decreasing attention and, at every step, the share
the next token would get among the tokens not yet taken is compared with the largest share
any null map gives to the *same* remaining positions:

- step statistic ``s_k = a[t_k] / Σ_{t ∈ R_k} a[t]`` with ``R_k = {t_k, …, t_T}``;
- null step statistic ``m[b, k] = max_{t ∈ R_k} ν[b, t] / Σ_{t ∈ R_k} ν[b, t]``;
- step p-value ``p_k = (1 + #{b : m[b, k] ≥ s_k}) / (1 + B)``;
- step-down adjusted p ``p̃_k = max_{j ≤ k} p_j`` (ties in attention share their group's
  largest), evidence ``1 − p̃_k``, map-level p ``p_1``;
- rules: ForwardStop (G'Sell et al. 2016) at α, or ``p̃ ≤ α`` (family-wise error).

One sort per family and reverse cumulative sums and maxima over the ``B × T`` null, on the
null's device, in blocks of null maps so the work space stays a fraction of the null.
A tiled image is one family per tile (:func:`combine_families` selects tiles by
Benjamini–Hochberg and applies the rule inside the selected ones at ``α·R/n``).

Example
-------
>>> import torch
>>> g = torch.Generator().manual_seed(0)
>>> null = torch.rand(99, 64, generator=g) + 0.1
>>> obs = torch.rand(64, generator=g) + 0.1
>>> fam = step_down(obs, null)
>>> fam.step_p.shape, bool((fam.adjusted_p >= fam.step_p).all())
((1, 64), True)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import false_discovery_control

from napari_attnreg.core.stats.paper import as_positive_tensor, compute_dtype
from napari_attnreg.core.stats.tail import (
    MAX_TAIL_STEPS,
    MIN_BOOT,
    TAIL_METHODS,
    TailFit,
    tail_pvalues,
    tail_size,
)

#: Rules of the step-down preset and the threshold each reads as its level α.
STEPDOWN_RULES = ("forwardstop", "fwer")
RULE_LEVEL = {"forwardstop": "q_th", "fwer": "p_th"}
#: Largest block of the vectorized pass, in null values (float64 work arrays of this size).
BLOCK_ELEMENTS = 1 << 18


@dataclass(frozen=True)
class StepDownFamilies:
    """Step-down statistics of ``F`` families of ``T`` tokens, every array in step order.

    Attributes
    ----------
    order : np.ndarray ``(F, T)`` int
        Token index of each step (decreasing attention, ties by token index).
    step_statistic : np.ndarray ``(F, T)``
        ``s_k``.
    step_p : np.ndarray ``(F, T)``
        ``p_k`` (the tail approximation where ``tail_used``).
    adjusted_p : np.ndarray ``(F, T)``
        ``p̃_k``, non-decreasing along each row; tokens tied in attention share the largest.
    group_end : np.ndarray ``(F, T)`` bool
        Step ``k`` is the last of its tie group (a rule never splits a tie group).
    tail_used : np.ndarray ``(F, T)`` bool
    n_boot : int
    tail : TailFit
        What the tail approximation did.
    """

    order: np.ndarray
    step_statistic: np.ndarray
    step_p: np.ndarray
    adjusted_p: np.ndarray
    group_end: np.ndarray
    tail_used: np.ndarray
    n_boot: int
    tail: TailFit

    @property
    def family_p(self) -> np.ndarray:
        """``p_map`` of each family: its first step's p-value."""
        return self.step_p[:, 0]

    def in_token_order(self, ordered: np.ndarray) -> np.ndarray:
        """``(F, T)`` values in step order → the same values at their token positions.

        A scatter in torch, on the host's threads: NumPy's ``put_along_axis`` took 0.85 s
        for the three calls of a 32768² field (30 M values), the largest host cost of its
        statistics.
        """
        values = torch.from_numpy(np.ascontiguousarray(ordered))
        return torch.empty_like(values).scatter_(1, self._order_tensor, values).numpy()

    def in_step_order(self, by_token: np.ndarray) -> np.ndarray:
        """``(F, T)`` (or ``(1, T)``, broadcast) values at token positions → in step order."""
        values = torch.from_numpy(np.ascontiguousarray(by_token))
        return torch.gather(values.expand(self.order.shape[0], -1), 1, self._order_tensor).numpy()

    @functools.cached_property
    def _order_tensor(self) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(self.order, dtype=np.int64))

    def ranks(self) -> np.ndarray:
        """``(F, T)`` step of each token (0 = largest attention)."""
        return self.in_token_order(np.broadcast_to(np.arange(self.order.shape[1]),
                                                   self.order.shape).copy())


def _ordered(observed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable decreasing order of each row and the rows in that order."""
    order = torch.argsort(-observed, dim=1, stable=True)
    return order, torch.gather(observed, 1, order)


def _suffix_sum(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1).cumsum(-1).flip(-1)


def _null_step_blocks(null: torch.Tensor, order: torch.Tensor, shared: bool, dtype: torch.dtype,
                      reverse: bool = False):
    """Yield ``(rows, m)`` blocks of the null step statistic ``m[b, f, k]``.

    ``null`` is ``(B, T)`` shared by every family, or ``(F, B, T)`` (one null per family).
    ``reverse``: the steps last to first (the order the reverse cumulative pass makes them
    in; the caller saves two copies of every block).
    """
    n_fam, n_tok = order.shape
    n_boot = null.shape[0] if shared else null.shape[1]
    rows = max(1, _block_budget(null) // (n_fam * n_tok))
    backwards = order.flip(-1)
    for start in range(0, n_boot, rows):
        stop = min(n_boot, start + rows)
        if shared:
            rev = null[start:stop].to(dtype)[:, backwards]  # (b, F, T)
        else:
            rev = torch.gather(null[:, start:stop].to(dtype), 2,
                               backwards[:, None, :].expand(-1, stop - start, -1)).transpose(0, 1)
        largest = rev.cummax(-1).values
        m = largest.div_(rev.cumsum_(-1))
        yield start, stop, (m if reverse else m.flip(-1))


#: Largest block on a GPU, in null values: there a block is a dozen kernel launches, and a
#: field of many tiles made one-map blocks (F·T above BLOCK_ELEMENTS), so the pass was bound
#: by launching (2,209 ViT-S/16 tiles: 200 blocks). 2**25 float64 values are 256 MB a copy.
GPU_BLOCK_ELEMENTS = 1 << 25


def _block_budget(null: torch.Tensor) -> int:
    """Null values per block: every family's null map at least.

    On a CPU the work arrays (about five float64 copies of a block) stay near the size of
    the float32 null itself and within the caches; on a GPU blocks are as large as a tenth
    of its free memory allows, up to :data:`GPU_BLOCK_ELEMENTS`. Every row of a block is
    made alone, so the block size never changes a value.
    """
    if null.device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(null.device)
        return min(GPU_BLOCK_ELEMENTS, free // (10 * 8 * 5))
    return min(BLOCK_ELEMENTS, null.numel() // 10)


_PENDING_ROWS = 8  # null maps gathered before the running top is merged again


class _RunningTop:
    """The ``k`` largest null statistics of the leading steps of every family, kept during the
    counting pass (so the tail needs no second pass over the null)."""

    def __init__(self, n_steps: int, k: int) -> None:
        self.n_steps, self.k = n_steps, k
        self.top: torch.Tensor | None = None
        self.pending: list[torch.Tensor] = []

    def add(self, reversed_m: torch.Tensor) -> None:
        # (b, F, T) last step first → (F, S, b) for the leading S steps
        lead = reversed_m[:, :, -self.n_steps:].flip(-1).permute(1, 2, 0)
        self.pending.append(lead)
        if sum(p.shape[-1] for p in self.pending) >= _PENDING_ROWS:
            self._merge()

    def _merge(self) -> None:
        parts = ([self.top] if self.top is not None else []) + self.pending
        joined = torch.cat(parts, dim=-1)
        self.top = joined.topk(min(self.k, joined.shape[-1]), dim=-1).values
        self.pending = []

    def columns(self, wanted: tuple[np.ndarray, np.ndarray]) -> torch.Tensor:
        if self.pending:
            self._merge()
        fam = torch.as_tensor(wanted[0], device=self.top.device)
        step = torch.as_tensor(wanted[1], device=self.top.device)
        return self.top[fam, step]


def _running_top(tail: str, n_boot: int, n_fam: int, n_tok: int) -> _RunningTop | None:
    """Tails kept in the counting pass when they fit in a few blocks' memory, else None."""
    if tail != "gpd" or n_boot < MIN_BOOT:
        return None
    n_steps, k = min(n_tok, MAX_TAIL_STEPS), tail_size(n_boot) + 1
    # about the size of the pass's own work arrays (a few of F·T), else a second pass over
    # the few wanted columns
    if n_fam * n_steps * (k + 2 * _PENDING_ROWS) > max(4 * BLOCK_ELEMENTS, 2 * n_fam * n_tok):
        return None
    return _RunningTop(n_steps, k)


def step_down(observed: torch.Tensor | np.ndarray, null_scores: torch.Tensor | np.ndarray, *,
              tail: str = "none") -> StepDownFamilies:
    """Step statistics, step p-values and step-down adjusted p of one or more families.

    Parameters
    ----------
    observed : tensor ``(T,)`` or ``(F, T)``
        Observed attention of each family's tokens (strictly positive).
    null_scores : tensor ``(B, T)`` or ``(F, B, T)``
        Null attention at the same token positions: one null for every family, or one per
        family. The work runs on its device.
    tail : {"none", "gpd"}
        Generalized Pareto tail approximation of small step p-values (:mod:`.tail`).

    Returns
    -------
    StepDownFamilies
    """
    if tail not in TAIL_METHODS:
        raise ValueError(f"tail={tail!r} is not supported; use one of {TAIL_METHODS}.")
    null_scores = as_positive_tensor(null_scores, "null_scores")
    observed = as_positive_tensor(observed, "observed")
    shared = null_scores.ndim == 2
    obs = observed.reshape(1, -1) if observed.ndim == 1 else observed
    n_fam, n_tok = obs.shape
    if (shared and null_scores.shape[1] != n_tok) or (
            not shared and tuple(null_scores.shape[::2]) != (n_fam, n_tok)):
        raise ValueError(f"observed {tuple(observed.shape)} and null_scores "
                         f"{tuple(null_scores.shape)} must cover the same tokens: (T,) with "
                         "(B, T), or (F, T) with (B, T) or (F, B, T).")
    n_boot = int(null_scores.shape[0] if shared else null_scores.shape[1])
    device = null_scores.device
    dtype = compute_dtype(device)
    order, a_sorted = _ordered(obs.to(device=device, dtype=dtype))
    s = a_sorted / _suffix_sum(a_sorted)
    s_reversed = s.flip(-1)
    exceed = torch.zeros((n_fam, n_tok), dtype=torch.int64, device=device)
    tops = _running_top(tail, n_boot, n_fam, n_tok)
    for _start, _stop, m in _null_step_blocks(null_scores, order, shared, dtype, reverse=True):
        beats = m >= s_reversed
        # many families make one-map blocks: an add, not a reduction over one row
        exceed += beats[0] if len(beats) == 1 else beats.sum(0)
        if tops is not None:
            tops.add(m)
    # on the device: for many tiles these (F, T) passes cost as much as the null pass
    work = device if device.type != "mps" else torch.device("cpu")  # no float64 on MPS
    counts_t = exceed.flip(-1).to(work)
    # NumPy's (1 + counts) / (1 + B), made where the counts are; the divisor is a tensor
    # because CUDA divides by a scalar through its reciprocal (not always the same bits)
    step_p_t = (counts_t.to(torch.float64) + 1.0).div_(
        torch.full((1,), 1.0 + n_boot, dtype=torch.float64, device=work))
    s_np = s.cpu().numpy()
    fit = TailFit.unused(tail)
    if tail == "gpd":
        step_p, tail_used, fit = tail_pvalues(
            step_p_t.cpu().numpy(), counts_t.cpu().numpy(), s_np, n_boot,
            (lambda wanted, k: tops.columns(wanted)) if tops is not None else
            (lambda wanted, k: _null_tops(null_scores, order, shared, dtype, wanted, k)),
            shared_first=shared)
        step_p_t = torch.as_tensor(step_p, device=work)
    else:
        step_p = step_p_t.cpu().numpy()
        tail_used = np.zeros(step_p.shape, dtype=bool)
    ends = torch.ones(a_sorted.shape, dtype=torch.bool, device=work)
    ends[:, :-1] = (a_sorted[:, :-1] != a_sorted[:, 1:]).to(work)
    running = step_p_t.cummax(dim=1).values
    adjusted, group_end = _tie_max(running, ends).cpu().numpy(), ends.cpu().numpy()
    return StepDownFamilies(order=order.cpu().numpy(), step_statistic=s_np, step_p=step_p,
                            adjusted_p=adjusted, group_end=group_end, tail_used=tail_used,
                            n_boot=n_boot, tail=fit)


def _null_tops(null: torch.Tensor, order: torch.Tensor, shared: bool, dtype: torch.dtype,
               wanted: tuple[np.ndarray, np.ndarray], k: int) -> torch.Tensor:
    """The ``k`` largest ``m[:, f, s]`` of each wanted ``(f, s)`` pair: ``(n_wanted, k)``.

    A second pass over the null that keeps a running top ``k`` per pair, so its memory is
    that of the tails, not of ``B`` values per pair. Only the families with a wanted pair
    are passed over (a sixth of them in a 4096² field of the demo model): every family's
    statistic is made from its own row alone, so the values are those of the whole pass.
    """
    families, local = np.unique(np.asarray(wanted[0]), return_inverse=True)
    if families.size < order.shape[0]:
        picked = torch.as_tensor(families, device=order.device)
        order = order[picked]
        null = null if shared else null[picked]
    fam = torch.as_tensor(local.reshape(-1), device=order.device)
    step = torch.as_tensor(wanted[1], device=order.device)
    top = None
    for _a, _b, m in _null_step_blocks(null, order, shared, dtype):
        block = m[:, fam, step].T
        top = block if top is None else torch.cat([top, block], dim=1)
        top = top.topk(min(k, top.shape[1]), dim=1).values
    return top


def _tie_max(adjusted: torch.Tensor, group_end: torch.Tensor) -> torch.Tensor:
    """Every step takes the adjusted p of the last step of its tie group."""
    n_tok = adjusted.shape[1]
    steps = torch.arange(n_tok, device=adjusted.device).expand_as(adjusted)
    ends = torch.where(group_end, steps, torch.full_like(steps, n_tok))
    # the next group end at or after each step: a reverse running minimum
    next_end = ends.flip(1).cummin(dim=1).values.flip(1)
    return torch.gather(adjusted, 1, next_end)


def forwardstop_count(step_p: np.ndarray, alpha: float | np.ndarray,
                      group_end: np.ndarray | None = None) -> np.ndarray:
    """ForwardStop's number of rejections per family (G'Sell et al. 2016).

    ``k̂ = max{k : (1/k) Σ_{j ≤ k} −log(1 − p_j) ≤ α}`` (0 when there is none), then moved
    down to the end of a tie group so that tokens with equal attention stay together.

    Parameters
    ----------
    step_p : array ``(F, T)`` or ``(T,)``
        Step p-values in step order.
    alpha : float or array ``(F,)``
    group_end : bool array like ``step_p``, optional

    Returns
    -------
    np.ndarray of int, one per family.
    """
    p = np.atleast_2d(np.asarray(step_p, dtype=np.float64))
    with np.errstate(divide="ignore"):
        cost = -np.log1p(-np.clip(p, 0.0, 1.0))
    mean = np.cumsum(cost, axis=1) / np.arange(1, p.shape[1] + 1)
    ok = mean <= np.reshape(np.asarray(alpha, dtype=np.float64), (-1, 1))
    k_hat = np.where(ok.any(axis=1), p.shape[1] - np.argmax(ok[:, ::-1], axis=1), 0)
    if group_end is not None:
        ends = np.atleast_2d(group_end)
        # the last k ≤ k̂ with step k − 1 ending a tie group
        last_end = np.maximum.accumulate(np.where(ends, np.arange(1, p.shape[1] + 1), 0), axis=1)
        k_hat = np.where(k_hat > 0, last_end[np.arange(p.shape[0]), np.maximum(k_hat - 1, 0)], 0)
    return k_hat.astype(np.int64)


def family_selection(family_p: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Benjamini–Hochberg over the families' map-level p-values.

    Returns
    -------
    adjusted : np.ndarray ``(F,)``
        BH-adjusted family p-values (a single family keeps its own p).
    selected : np.ndarray of bool ``(F,)``
    """
    family_p = np.asarray(family_p, dtype=np.float64).reshape(-1)
    adjusted = family_p.copy() if family_p.size == 1 else false_discovery_control(family_p)
    return adjusted, adjusted <= alpha


def significant_steps(step_p: np.ndarray, adjusted_p: np.ndarray, group_end: np.ndarray,
                      rule: str, alpha: float) -> np.ndarray:
    """Boolean ``(F, T)`` in step order: the steps the rule keeps.

    One family: the rule at ``α``. Several (tiles): families selected by Benjamini–Hochberg
    at ``α``, the rule at ``α·R/F`` inside each selected one (Benjamini & Bogomolov 2014),
    nothing in the others.
    """
    if rule not in STEPDOWN_RULES:
        raise ValueError(f"rule={rule!r} is not a step-down rule; use one of {STEPDOWN_RULES}.")
    step_p, adjusted_p = np.atleast_2d(step_p), np.atleast_2d(adjusted_p)
    n_fam, n_tok = step_p.shape
    if n_fam == 1:
        level = np.array([alpha])
    else:
        _, selected = family_selection(step_p[:, 0], alpha)
        level = np.where(selected, alpha * selected.sum() / n_fam, -1.0)
    if rule == "fwer":
        return adjusted_p <= level[:, None]
    k_hat = np.where(level >= 0, forwardstop_count(step_p, np.maximum(level, 0.0), group_end), 0)
    return np.arange(n_tok)[None, :] < k_hat[:, None]

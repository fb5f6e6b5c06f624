"""Two checks of what a map can mean: model randomization and attention sinks.

- Sanity check (Adebayo et al. 2018, model randomization): the map is recomputed with the
  last block's parameters re-drawn from the model's initialisation (seeded, on a copy of
  the model); Spearman's ρ between the two maps near 1 says the map barely depends on what
  that block learned.
- Attention sinks (Darcet et al. 2023, "Vision Transformers Need Registers"): a patch token
  whose last-block output norm is an outlier and that takes a large share of the CLS
  attention carries no image content; such tokens are named, and a run may leave them out
  of the step-down families (``exclude_sinks=True``).
"""

from __future__ import annotations

import copy
import math
import threading
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy import stats
from torch import nn

from napari_attnreg.core.models.attention import cls_attention, cls_attention_from
from napari_attnreg.core.models.base import Backbone, copy_module
from napari_attnreg.core.models.entering import Entering
from napari_attnreg.core.models.hf_attention import is_transformers_module
from napari_attnreg.core.models.scorers import Scorer
from napari_attnreg.core.models.scorers.parts import blocks
from napari_attnreg.core.models.scorers.target import final_cls
from napari_attnreg.core.stats.diagnostics import Diagnostic

#: Spearman's ρ at or above which a map counts as barely depending on the last block.
SANITY_RHO = 0.9
#: A sink's last-block output norm exceeds this multiple of the median patch-token norm ...
SINK_NORM_RATIO = 3.0
#: ... and its CLS attention exceeds this multiple of the uniform share 1/T.
SINK_SHARE_RATIO = 2.0


@dataclass(frozen=True)
class SanityCheck:
    """Spearman's ρ between a map and the same map with the last block re-drawn."""

    rho: float
    seed: int

    @property
    def failed(self) -> bool:
        return bool(np.isfinite(self.rho) and self.rho >= SANITY_RHO)

    def diagnostic(self, map_name: str, block: tuple[int, int] | None = None,
                   ) -> Diagnostic | None:
        """A warning when the check fails, else None.

        ``block``: ``(index, depth)`` of the block an earlier block's map is read from
        (:func:`earlier_block`); re-drawing the last block cannot reach such a map, and the
        warning says so rather than casting doubt on the map.
        """
        if not self.failed:
            return None
        if block is not None:
            index, depth = block
            return Diagnostic(
                "map_sanity", "warning",
                f"Sanity check: the {map_name} map barely depends on what the last block "
                f"learned (Spearman's rho {self.rho:.2f}) because it is read from block "
                f"{index + 1} of {depth}, before the last one, which the check re-draws: the "
                "check cannot judge this map (it judges maps of the last block).")
        return Diagnostic("map_sanity", "warning",
                          f"Sanity check: the {map_name} map barely depends on what the last "
                          f"block learned (Spearman's rho {self.rho:.2f} with that block "
                          "re-drawn from its initialisation); read it with care.")


def earlier_block(scorer: Scorer, backbone: Backbone) -> tuple[int, int] | None:
    """``(index, depth)`` when ``scorer``'s map is one block's CLS attention read before the
    last block (``layer=-2``, ``layer=0``), else None."""
    depth = backbone.depth
    if not scorer.needs.cls_heads or scorer.needs.all_layers:
        return None
    index = int(scorer.layer) % depth
    return (index, depth) if index < depth - 1 else None


def redraw_last_block(backbone: Backbone, seed: int) -> Backbone:
    """A backbone whose last block is re-drawn from the model's initialisation.

    Only that block is new: the other blocks are the given model's own modules and weights
    (a large model is never duplicated), and the given backbone is never changed: the
    modules on the path to the last block are shallow copies that hold the new block. The
    draw happens on the CPU with its own seeded generator state, so it is the same on every
    device; what the library's initialisation leaves alone (a layer scale without a reset)
    keeps the trained values.

    Nothing here waits for the device: the trained block is never read back to the host
    (its kept values are taken on the device), and the draw goes up from pinned memory, so
    on a GPU the host draws while the device still runs the work queued before. The draw is
    made once per block, seed and device (:func:`_drawn_block`): a folder of images run with
    one model pays for it once, not once per image.
    """
    # out of inference mode: a block drawn or moved to the GPU inside it would hold inference
    # tensors, which the backward pass of a gradient map cannot save (seen on an H100)
    with torch.inference_mode(False), torch.no_grad():
        last = blocks(backbone)[-1]
        drawn, partly = _drawn_block(backbone.model, last, seed, torch.device(backbone.device))
        # wholly drawn tensors are shared with the kept draw (the checks only read them);
        # the others take the trained values where nothing was drawn
        fresh = copy_module(drawn, lambda t: t)
        trained = {**dict(last.named_parameters()), **dict(last.named_buffers())}
        for name, tensor in [*fresh.named_parameters(), *fresh.named_buffers()]:
            if name in partly:  # new memory: the kept draw is never written
                kept = trained[name].detach()
                tensor.data = (torch.where(torch.isnan(tensor), kept, tensor)
                               if tensor.is_floating_point() else kept.clone())
        model = _with_module(backbone.model, last, fresh)
    return replace(backbone, model=model)


#: Trained last block → (what it was drawn for, its draw on the device, the names of the
#: tensors not wholly drawn). Weak keys: a model that is let go takes its draw with it.
_DRAWN: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, nn.Module, frozenset[str]]] = \
    weakref.WeakKeyDictionary()
_DRAWN_LOCK = threading.Lock()


def _drawn_block(model: nn.Module, last: nn.Module, seed: int,
                 device: torch.device) -> tuple[nn.Module, frozenset[str]]:
    """``last`` as the initialisation draws it with ``seed``, on ``device``, and the names of
    its tensors that are not wholly drawn: NaN marks a value the initialisation leaves alone
    (integer buffers are never drawn).

    Drawing a ViT-B block on the host takes 75–90 ms of a 2-core CPU (measured; ViT-L about
    150 ms), longer than the checks' forward passes, so the draw is kept and made again only
    for another seed, device or structure of the block (a tensor added, removed or reshaped).
    The trained values are never part of it: they are taken at each use.
    """
    drawn_for = (seed, str(device), tuple(
        (name, tuple(t.shape), t.dtype)
        for name, t in [*last.named_parameters(), *last.named_buffers()]))
    with _DRAWN_LOCK:
        known = _DRAWN.get(last)
    if known is not None and known[0] == drawn_for:
        return known[1], known[2]
    fresh = copy_module(last, _untouched)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for module in fresh.modules():
            _init_module(model, module)
    # found on the host, before the upload: asking the device would wait for it
    partly = frozenset(name for name, t in [*fresh.named_parameters(), *fresh.named_buffers()]
                       if not t.is_floating_point() or bool(torch.isnan(t).any()))
    if device.type == "cuda":
        fresh = copy_module(fresh, lambda t: t.pin_memory().to(device, non_blocking=True))
    else:
        fresh = fresh.to(device)
    with _DRAWN_LOCK:
        _DRAWN[last] = (drawn_for, fresh, partly)
    return fresh, partly


def _untouched(tensor: torch.Tensor) -> torch.Tensor:
    """A host tensor shaped like ``tensor`` that marks values no initialisation drew: NaN,
    or zeros for integer buffers (never re-drawn; the trained ones are always kept)."""
    if tensor.is_floating_point():
        return torch.full(tensor.shape, math.nan, dtype=tensor.dtype)
    return torch.zeros(tensor.shape, dtype=tensor.dtype)


def _with_module(root: nn.Module, old: nn.Module, new: nn.Module) -> nn.Module:
    """``root`` with its submodule ``old`` replaced by ``new``, ``root`` left as it was.

    Copying the whole module tree cost more than the check's forward pass (tens of ms of
    Python for a ViT-B); only the modules on the path to ``old`` are copied, shallowly.
    """
    path = next((name for name, module in root.named_modules() if module is old), None)
    if not path:
        raise ValueError(f"{type(old).__name__} is not a submodule of {type(root).__name__}.")
    *parents, leaf = path.split(".")
    top = node = _shallow(root)
    for name in parents:
        child = _shallow(node._modules[name])
        node._modules[name] = child
        node = child
    node._modules[leaf] = new
    return top


def _shallow(module: nn.Module) -> nn.Module:
    """A copy of ``module`` sharing its submodules, weights and hooks, with its own list
    of submodules (so replacing one never reaches ``module``)."""
    clone = copy.copy(module)
    clone.__dict__["_modules"] = dict(module._modules)
    return clone


def _init_module(model: nn.Module, module: nn.Module) -> None:
    """One submodule re-drawn as its library initialises it."""
    if is_transformers_module(model):
        model._init_weights(module)
        scale = getattr(module, "lambda1", None)  # DINOv2 layer scale
        if isinstance(scale, nn.Parameter):
            scale.fill_(float(getattr(model.config, "layerscale_value", 1.0)))
        return
    if isinstance(module, nn.Linear):  # timm ViTs: truncated normal 0.02, zero bias
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif hasattr(module, "reset_parameters") and module is not model:
        module.reset_parameters()


def sanity_check(scorer: Scorer, backbone: Backbone, image: torch.Tensor,
                 seed: int, original: torch.Tensor | None = None,
                 amp: Callable[[], AbstractContextManager] = nullcontext) -> SanityCheck:
    """Spearman's ρ between ``scorer``'s map of ``image`` and the map with the last block
    re-drawn (one extra forward, and backward for gradient maps).

    Parameters
    ----------
    scorer : Scorer
        Bound to the image's target already (:meth:`Scorer.bind`).
    backbone : Backbone
    image : tensor ``(C, H, W)``
        The model-ready image.
    seed : int
    original : tensor, optional
        ``scorer``'s map of ``image``, where the caller has it (saves a pass), computed
        under ``amp``.
    amp : callable, optional
        The autocast context both maps are computed in (default: none, float32).
    """
    return sanity_from_maps(*sanity_maps(scorer, backbone, image, seed, original, amp), seed)


def sanity_maps(scorer: Scorer, backbone: Backbone, image: torch.Tensor, seed: int,
                original: torch.Tensor | None = None,
                amp: Callable[[], AbstractContextManager] = nullcontext,
                entering: Entering | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The two maps :func:`sanity_check` compares, on the device (nothing read back yet).

    ``entering``: what entered the last block in the image's own pass (under ``amp``), where
    the caller has it. A map made of the last block's CLS attention then reads the re-drawn
    block from it, the trained blocks before it being the same: one block instead of a pass
    through the whole model, with the same numbers.
    """
    x = image[None].to(backbone.device)
    redrawn_backbone = redraw_last_block(backbone, seed)
    with torch.inference_mode(), amp():
        if original is None:
            original = scorer.score(backbone, x)
        if _reads_last_block_rows(scorer, backbone, entering):
            heads = cls_attention_from(redrawn_backbone, entering, head="all")
            redrawn = scorer.from_heads(heads.flatten(2).float())
        else:
            redrawn = scorer.score(redrawn_backbone, x)
    return original, redrawn


def _reads_last_block_rows(scorer: Scorer, backbone: Backbone,
                           entering: Entering | None) -> bool:
    """Whether ``scorer``'s map is the last block's CLS attention and ``entering`` is what
    entered that block."""
    last = backbone.depth - 1
    return (entering is not None and entering.idx == last and scorer.needs.cls_heads
            and int(scorer.layer) in (-1, last))


def sanity_from_maps(original: torch.Tensor, redrawn: torch.Tensor, seed: int) -> SanityCheck:
    """Spearman's ρ of the two maps of :func:`sanity_maps`."""
    a = original.reshape(-1).float().cpu().numpy()
    b = redrawn.reshape(-1).float().cpu().numpy()
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return SanityCheck(float("nan"), seed)
    return SanityCheck(float(stats.spearmanr(a, b).statistic), seed)


@dataclass(frozen=True)
class SinkReport:
    """The attention sinks of an image.

    Attributes
    ----------
    tokens : tuple of int
        Flat patch-token indices of the sinks (row-major on the grid).
    grid : (int, int)
    norm_ratio : np.ndarray
        Every patch token's last-block output norm over the median.
    share : np.ndarray
        Every patch token's head-mean CLS attention of the last block.
    """

    tokens: tuple[int, ...]
    grid: tuple[int, int]
    norm_ratio: np.ndarray
    share: np.ndarray

    def diagnostic(self) -> Diagnostic | None:
        """A warning naming every sink, else None."""
        if not self.tokens:
            return None
        named = "; ".join(
            f"row {t // self.grid[1]}, column {t % self.grid[1]} (norm "
            f"{self.norm_ratio[t]:.1f}x the median, {100 * self.share[t]:.1f} % of the CLS "
            "attention)" for t in self.tokens)
        word = "token" if len(self.tokens) == 1 else "tokens"
        return Diagnostic("attention_sink", "warning",
                          f"High-norm {word} at {named}: an attention sink, not image content. "
                          "exclude_sinks=True leaves it out of the test.")


def sink_tokens(norm_ratio: np.ndarray, share: np.ndarray,
                norm_limit: float = SINK_NORM_RATIO,
                share_limit: float = SINK_SHARE_RATIO) -> tuple[int, ...]:
    """Tokens whose norm ratio exceeds ``norm_limit`` and whose share exceeds
    ``share_limit / T``."""
    norm_ratio, share = np.ravel(norm_ratio), np.ravel(share)
    hit = (norm_ratio > norm_limit) & (share > share_limit / share.size)
    return tuple(int(t) for t in np.flatnonzero(hit))


def attention_sinks(backbone: Backbone, image: torch.Tensor,
                    share: torch.Tensor | None = None,
                    amp: Callable[[], AbstractContextManager] = nullcontext) -> SinkReport:
    """The sinks of one model-ready image ``(C, H, W)`` (one forward pass and the CLS row).

    ``share``: the image's head-mean CLS attention of the last block ``(gh, gw)``, where the
    caller has it (saves the CLS row's pass); ``amp``: the autocast context of the passes.
    """
    return sinks_from_tensors(*sink_tensors(backbone, image, share, amp))


def sink_tensors(backbone: Backbone, image: torch.Tensor, share: torch.Tensor | None = None,
                 amp: Callable[[], AbstractContextManager] = nullcontext,
                 entering: Entering | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every patch token's last-block output norm and CLS share, on the device.

    ``entering``: what entered the last block in the image's own pass, where the caller has
    it; the block then runs alone on it instead of the whole model.
    """
    x = image[None].to(backbone.device)
    last = blocks(backbone)[-1]
    with amp():
        if entering is not None and entering.idx == backbone.depth - 1:
            with torch.inference_mode():
                out = entering.output(last)
        else:
            out = _last_block_output(backbone, x)
        out = out[0, backbone.num_prefix_tokens:].float()
        if share is None:
            with torch.inference_mode():
                share = cls_attention(backbone, x, layer=-1, head="mean")[0]
    return out.norm(dim=-1), share


def sinks_from_tensors(norms: torch.Tensor, share: torch.Tensor) -> SinkReport:
    """The :class:`SinkReport` of :func:`sink_tensors`' norms and shares."""
    grid = (int(share.shape[0]), int(share.shape[1]))
    norms_np = norms.cpu().numpy().astype(np.float64)
    share_np = share.reshape(-1).float().cpu().numpy().astype(np.float64)
    ratio = norms_np / max(float(np.median(norms_np)), 1e-12)
    return SinkReport(sink_tokens(ratio, share_np), grid, ratio, share_np)


def _last_block_output(backbone: Backbone, x: torch.Tensor) -> torch.Tensor:
    """The tokens leaving the last block ``(N, L, D)``, before the final norm."""
    captured: dict[str, torch.Tensor] = {}
    owner = threading.get_ident()

    def grab(_module, _inputs, output):
        if threading.get_ident() == owner:
            captured["out"] = output[0] if isinstance(output, tuple) else output

    handle = blocks(backbone)[-1].register_forward_hook(grab)
    try:
        with torch.inference_mode():
            final_cls(backbone, x)
    finally:
        handle.remove()
    return captured["out"]

"""CLS-row attention for timm ViTs: classic ``Attention`` and EVA-style rotary attention.

The blocks before the chosen one run as timm wrote them (fused SDPA kernels, autocast);
for the chosen block only ``q_cls`` and the keys are projected and the single attention
row is formed in float32, so no T×T matrix is ever materialised and the rest of that
block (and every later block) is skipped. Modules neither path understands fall back to
capturing the full matrix once.
"""

from __future__ import annotations

import threading
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from napari_attnreg.core.models.entering import Entering

Grid = tuple[int, int]
_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_lock(model: nn.Module) -> threading.RLock:
    """One lock per model for the few steps that change its state during a forward pass
    (the rotary table's grid, the fallback's hook and kernel switch): runs sharing a model
    in several threads take turns there and run the rest side by side."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.RLock()
        return lock


def grid_of(model: nn.Module, tokens: torch.Tensor, x: torch.Tensor) -> Grid:
    if tokens.ndim == 4:  # NHWC from a dynamic-size patch embed
        return int(tokens.shape[1]), int(tokens.shape[2])
    gh, gw = model.patch_embed.dynamic_feat_size(x.shape[-2:])
    return int(gh), int(gw)


def _cls_row(q_cls: torch.Tensor, keys: torch.Tensor, scale: float,
             num_prefix: int) -> torch.Tensor:
    """Softmax over all tokens of the CLS query, patch columns only: (N, heads, patches)."""
    # float32 here even under bf16 autocast: low-precision logits tie ranks
    with torch.autocast(device_type=q_cls.device.type, enabled=False):
        logits = (q_cls.float() * scale) @ keys.float().transpose(-1, -2)
        return logits.softmax(dim=-1)[:, :, 0, num_prefix:]


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    n, length, width = x.shape
    return x.view(n, length, heads, width // heads).transpose(1, 2)


# ---------------------------------------------------------------- classic timm Attention
def classic_fast_path(model: nn.Module, block: nn.Module) -> bool:
    """The row-only computation is valid for timm's plain ``Attention`` in a pre-norm block."""
    attn = getattr(block, "attn", None)
    return (
        all(hasattr(model, a) for a in ("_pos_embed", "patch_drop", "norm_pre"))
        and hasattr(block, "norm1")
        and type(attn).__name__ == "Attention"
        and isinstance(getattr(attn, "qkv", None), nn.Linear)
        and getattr(attn, "gate", None) is None
    )


def classic_entering(model: nn.Module, x: torch.Tensor, idx: int) -> Entering | None:
    """What enters block ``idx`` of a ``VisionTransformer``; None without the fast path."""
    if not classic_fast_path(model, model.blocks[idx]):
        return None
    tokens = model.patch_embed(x)
    grid = grid_of(model, tokens, x)
    tokens = model.norm_pre(model.patch_drop(model._pos_embed(tokens)))
    for blk in model.blocks[:idx]:
        tokens = blk(tokens)
    return Entering(idx, tokens, grid, (tokens,))


def classic_row(model: nn.Module, entering: Entering, num_prefix: int) -> torch.Tensor:
    """CLS row (N, heads, patches) float32 of the block ``entering`` enters (this model's)."""
    attn = model.blocks[entering.idx].attn
    hidden = model.blocks[entering.idx].norm1(entering.tokens)
    width = attn.num_heads * attn.head_dim
    weight, bias = attn.qkv.weight, attn.qkv.bias
    q = F.linear(hidden[:, :1], weight[:width], None if bias is None else bias[:width])
    k = F.linear(hidden, weight[width:2 * width], None if bias is None else bias[width:2 * width])
    q = attn.q_norm(_split_heads(q, attn.num_heads))
    k = attn.k_norm(_split_heads(k, attn.num_heads))
    return _cls_row(q, k, attn.scale, num_prefix)


# ---------------------------------------------------------------- EVA / DINOv3 rotary attention
def rotary_fast_path(model: nn.Module, block: nn.Module) -> bool:
    """timm ``EvaAttention`` in an ``Eva`` model, with the CLS token among the rope-free prefix."""
    attn = getattr(block, "attn", None)
    return (
        type(attn).__name__ == "EvaAttention"
        and type(block).__name__ in ("EvaBlock", "EvaBlockPostNorm")
        and all(hasattr(model, a) for a in ("_pos_embed", "norm_pre", "rope"))
        and getattr(attn, "num_prefix_tokens", 0) >= 1
    )


def fit_rope_to_grid(model: nn.Module, grid: Grid) -> None:
    """A rope built for one fixed grid caches its table; rebuild it for this image's grid."""
    rope = getattr(model, "rope", None)
    shape = getattr(rope, "feat_shape", None) if rope is not None else None
    if shape is not None and list(shape) != list(grid):
        rope.update_feat_shape(list(grid))


def rotary_tokens_entering(model: nn.Module, x: torch.Tensor, idx: int):
    """Tokens entering block ``idx``, the rotary embedding of that block and the grid."""
    tokens = model.patch_embed(x)
    grid = grid_of(model, tokens, x)
    with model_lock(model):  # the rope table is per model; another thread may resize it
        fit_rope_to_grid(model, grid)
        tokens, rot = model._pos_embed(tokens)
    tokens = model.norm_pre(tokens)
    mixed = getattr(model, "rope_mixed", False) and rot is not None
    for i, blk in enumerate(model.blocks[:idx]):
        tokens = blk(tokens, rope=rot[i] if mixed else rot)
    return tokens, (rot[idx] if mixed else rot), grid


def _eva_q_k(attn: nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CLS query and all keys from EvaAttention's projections (fused or separate)."""
    if attn.qkv is not None:
        width = attn.num_heads * attn.head_dim
        weight = attn.qkv.weight
        q_bias = None if attn.q_bias is None else attn.q_bias
        k_bias = None if attn.q_bias is None else attn.k_bias
        q = F.linear(hidden[:, :1], weight[:width], q_bias)
        k = F.linear(hidden, weight[width:2 * width], k_bias)
    else:
        q = attn.q_proj(hidden[:, :1])
        k = attn.k_proj(hidden)
    return _split_heads(q, attn.num_heads), _split_heads(k, attn.num_heads)


def rotary_entering(model: nn.Module, x: torch.Tensor, idx: int) -> Entering | None:
    """What enters block ``idx`` of a timm ``Eva`` model; None without the fast path."""
    if not rotary_fast_path(model, model.blocks[idx]):
        return None
    tokens, rope, grid = rotary_tokens_entering(model, x, idx)
    return Entering(idx, tokens, grid, (tokens,), {"rope": rope})


def rotary_row(model: nn.Module, entering: Entering, num_prefix: int) -> torch.Tensor:
    """CLS row (N, heads, patches) float32 of the block ``entering`` enters, rope applied as
    timm does."""
    from timm.layers import apply_rot_embed_cat

    block = model.blocks[entering.idx]
    tokens, rope = entering.tokens, entering.kwargs["rope"]
    attn = block.attn
    # EvaBlockPostNorm normalises the attention *output*; its attention sees the raw tokens
    hidden = tokens if type(block).__name__ == "EvaBlockPostNorm" else block.norm1(tokens)
    q, k = _eva_q_k(attn, hidden)
    q, k = attn.q_norm(q), attn.k_norm(k)
    if rope is not None:
        # the prefix tokens (CLS, registers) carry no rotary position: q_cls stays as it is
        npt = attn.num_prefix_tokens
        rotated = apply_rot_embed_cat(k[:, :, npt:], rope, half=getattr(attn, "rotate_half", False))
        k = torch.cat([k[:, :, :npt], rotated], dim=2).type_as(q)
    return _cls_row(q, k, attn.scale, num_prefix)


# ---------------------------------------------------------------- explicit fallback
def explicit_cls_row(model: nn.Module, x: torch.Tensor, idx: int,
                     num_prefix: int) -> tuple[torch.Tensor, Grid]:
    """Fallback for attention modules without a fast path: capture the full matrix once."""
    attn = model.blocks[idx].attn
    captured: dict[str, torch.Tensor] = {}

    def grab(_mod, _inp, out):
        captured["row"] = out[:, :, 0, num_prefix:].float()

    with model_lock(model):  # the hook and the kernel switch must not meet another thread's
        previous = getattr(attn, "fused_attn", None)
        if previous is not None:
            attn.fused_attn = False
        handle = attn.attn_drop.register_forward_hook(grab)
        try:
            grid = grid_of(model, model.patch_embed(x), x)
            fit_rope_to_grid(model, grid)
            model.forward_features(x)
        finally:
            handle.remove()
            if previous is not None:
                attn.fused_attn = previous
    if "row" not in captured:
        raise RuntimeError(f"Could not capture attention from {type(attn).__name__}; "
                           "this architecture is not supported.")
    return captured["row"], grid


# ---------------------------------------------------------------- adapters
class TimmAdapter:
    """How a :class:`Backbone` reads a timm ViT: structure facts and the CLS-row functions."""

    def __init__(self, family: str, entering, row) -> None:
        self.family = family
        self._entering, self._row = entering, row

    def depth(self, model: nn.Module) -> int:
        return len(model.blocks)

    def num_heads(self, model: nn.Module) -> int:
        return int(model.blocks[-1].attn.num_heads)

    def embed_dim(self, model: nn.Module) -> int:
        return int(getattr(model, "embed_dim", 0) or model.blocks[-1].norm1.normalized_shape[0])

    def cls_row(self, model: nn.Module, x: torch.Tensor, idx: int,
                num_prefix: int) -> tuple[torch.Tensor, Grid]:
        """CLS row of block ``idx``: (N, heads, patches) float32, and the grid."""
        entering = self._entering(model, x, idx)
        if entering is None:
            return explicit_cls_row(model, x, idx, num_prefix)
        return self._row(model, entering, num_prefix), entering.grid

    def entering(self, model: nn.Module, x: torch.Tensor, idx: int) -> Entering | None:
        """What enters block ``idx`` (None where only the explicit fallback applies)."""
        return self._entering(model, x, idx)

    def row(self, model: nn.Module, entering: Entering, num_prefix: int) -> torch.Tensor:
        """The CLS row of ``model``'s block that ``entering`` enters."""
        return self._row(model, entering, num_prefix)

    def __repr__(self) -> str:
        return f"TimmAdapter({self.family!r})"


TIMM_CLASSIC = TimmAdapter("timm-classic", classic_entering, classic_row)
TIMM_ROTARY = TimmAdapter("timm-rotary", rotary_entering, rotary_row)


def timm_adapter_for(model: nn.Module) -> TimmAdapter:
    """Rotary adapter for EVA-style attention (EVA-02, DINOv3), classic otherwise."""
    attn = getattr(model.blocks[-1], "attn", None)
    return TIMM_ROTARY if type(attn).__name__ == "EvaAttention" else TIMM_CLASSIC

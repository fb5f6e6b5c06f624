"""CLS→patch attention of one transformer block, computed from the CLS query row only.

The blocks before the chosen one run as timm wrote them (fused SDPA kernels, autocast);
for the chosen block only ``q_cls`` and the keys are projected and the single attention
row is formed in float32, so no T×T matrix is ever materialised and the rest of that
block (and every later block) is skipped.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from .backbones import Backbone

HeadChoice = Literal["mean", "all"] | int


def _resolve_layer(model: nn.Module, layer: int) -> int:
    depth = len(model.blocks)
    idx = layer if layer >= 0 else depth + layer
    if not 0 <= idx < depth:
        raise ValueError(f"layer={layer} is out of range for a model with {depth} blocks "
                         f"(use -1 for the last block, or 0..{depth - 1}).")
    return idx


def _has_fast_path(model: nn.Module, block: nn.Module) -> bool:
    """The row-only computation is valid for timm's plain ``Attention`` in a pre-norm block."""
    attn = getattr(block, "attn", None)
    return (
        all(hasattr(model, a) for a in ("_pos_embed", "patch_drop", "norm_pre"))
        and hasattr(block, "norm1")
        and type(attn).__name__ == "Attention"
        and isinstance(getattr(attn, "qkv", None), nn.Linear)
        and getattr(attn, "gate", None) is None
    )


def _tokens_entering(model: nn.Module, x: torch.Tensor, block_idx: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """Token sequence entering block ``block_idx`` and the patch grid shape."""
    tokens = model.patch_embed(x)
    if tokens.ndim == 4:  # NHWC from a dynamic-size patch embed
        grid = (int(tokens.shape[1]), int(tokens.shape[2]))
    else:
        grid = tuple(int(g) for g in model.patch_embed.dynamic_feat_size(x.shape[-2:]))
    tokens = model._pos_embed(tokens)
    tokens = model.patch_drop(tokens)
    tokens = model.norm_pre(tokens)
    for blk in model.blocks[:block_idx]:
        tokens = blk(tokens)
    return tokens, grid


def _row_attention(block: nn.Module, tokens: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """Softmax row of the CLS query over all tokens, patch entries only: (N, heads, T), float32."""
    attn = block.attn
    hidden = block.norm1(tokens)
    n, length, _ = hidden.shape
    heads, dim_head = attn.num_heads, attn.head_dim
    width = heads * dim_head
    weight, bias = attn.qkv.weight, attn.qkv.bias
    q = F.linear(hidden[:, :1], weight[:width], None if bias is None else bias[:width])
    k = F.linear(hidden, weight[width:2 * width], None if bias is None else bias[width:2 * width])
    q = attn.q_norm(q.view(n, 1, heads, dim_head).transpose(1, 2))
    k = attn.k_norm(k.view(n, length, heads, dim_head).transpose(1, 2))
    # float32 here even under bf16 autocast: low-precision logits tie ranks (METHOD §2)
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        logits = (q.float() * attn.scale) @ k.float().transpose(-1, -2)
        row = logits.softmax(dim=-1)[:, :, 0, num_prefix:]
    return row


def _explicit_row_attention(model: nn.Module, block_idx: int, x: torch.Tensor,
                            num_prefix: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """Fallback for attention modules without the fast path: capture the full matrix once."""
    attn = model.blocks[block_idx].attn
    captured: dict[str, torch.Tensor] = {}

    def grab(_mod, _inp, out):
        captured["row"] = out[:, :, 0, num_prefix:].float()

    previous = getattr(attn, "fused_attn", None)
    if previous is not None:
        attn.fused_attn = False
    handle = attn.attn_drop.register_forward_hook(grab)
    try:
        tokens = model.patch_embed(x)
        grid = (int(tokens.shape[1]), int(tokens.shape[2])) if tokens.ndim == 4 else tuple(
            int(g) for g in model.patch_embed.dynamic_feat_size(x.shape[-2:]))
        model.forward_features(x)
    finally:
        handle.remove()
        if previous is not None:
            attn.fused_attn = previous
    if "row" not in captured:
        raise RuntimeError(f"Could not capture attention from {type(attn).__name__}; "
                           "this architecture is not supported.")
    return captured["row"], grid


def cls_attention(
    backbone: Backbone,
    images: torch.Tensor,
    *,
    layer: int = -1,
    head: HeadChoice = "mean",
) -> torch.Tensor:
    """CLS→patch attention maps of a batch of model-ready images.

    Parameters
    ----------
    backbone : Backbone
        From :func:`load_backbone`.
    images : torch.Tensor
        ``(N, C, H, W)`` normalised images, H and W multiples of the patch size.
    layer : int
        Block index (``-1`` = last, the paper's choice).
    head : "mean", "all" or int
        Average over heads (paper), keep every head, or one head.

    Returns
    -------
    torch.Tensor
        float32 ``(N, gh, gw)`` for ``"mean"`` or an int, ``(N, heads, gh, gw)`` for ``"all"``.
        The softmax runs over all tokens; prefix tokens are dropped afterwards.
    """
    model = backbone.model
    if images.ndim != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {tuple(images.shape)}")
    ph, pw = backbone.patch_size
    if images.shape[-2] % ph or images.shape[-1] % pw:
        raise ValueError(f"image size {tuple(images.shape[-2:])} is not a multiple of the patch size "
                         f"{backbone.patch_size}; prepare it with prepare_image().")
    idx = _resolve_layer(model, layer)
    block = model.blocks[idx]
    if _has_fast_path(model, block):
        tokens, grid = _tokens_entering(model, images, idx)
        row = _row_attention(block, tokens, backbone.num_prefix_tokens)
    else:
        row, grid = _explicit_row_attention(model, idx, images, backbone.num_prefix_tokens)
    maps = row.reshape(row.shape[0], row.shape[1], *grid)
    if head == "mean":
        return maps.mean(dim=1)
    if head == "all":
        return maps
    if isinstance(head, int) and 0 <= head < maps.shape[1]:
        return maps[:, head]
    raise ValueError(f"head must be 'mean', 'all' or an int in 0..{maps.shape[1] - 1}, got {head!r}")

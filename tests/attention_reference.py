"""Explicit full-matrix CLS attention, computed the slow library way (tests only)."""

from __future__ import annotations

import torch


def timm_explicit(model: torch.nn.Module, x: torch.Tensor, layer: int, npt: int) -> torch.Tensor:
    """Full T×T attention of timm block ``layer`` with fused attention off: CLS row, patch columns."""
    captured = {}
    for blk in model.blocks:
        blk.attn.fused_attn = False
    target = model.blocks[layer].attn
    handle = target.attn_drop.register_forward_hook(lambda m, i, o: captured.setdefault("a", o))
    try:
        with torch.no_grad():
            model.forward_features(x)
    finally:
        handle.remove()
        for blk in model.blocks:
            blk.attn.fused_attn = True
    full = captured["a"]  # (N, heads, L, L)
    assert full.shape[-1] == full.shape[-2]
    return full[:, :, 0, npt:].float()


def hf_explicit(model: torch.nn.Module, x: torch.Tensor, layer: int, npt: int) -> torch.Tensor:
    """``output_attentions=True`` of a transformers model built with ``attn_implementation="eager"``."""
    extra = {"interpolate_pos_encoding": True} if model.config.model_type == "vit" else {}
    with torch.no_grad():
        out = model(pixel_values=x, output_attentions=True, **extra)
    full = out.attentions[layer]
    assert full.shape[-1] == full.shape[-2]
    return full[:, :, 0, npt:].float()


def max_diff(fast: torch.Tensor, slow: torch.Tensor) -> float:
    return float((fast - slow.reshape(fast.shape)).abs().max())

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


def peaked(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Re-draw every parameter at unit scale so attention rows are far from uniform.

    Random-init ViTs (std 0.02 weights, layer scale 1e-5) attend almost uniformly, which would
    hide a wrong key, rotation or prefix offset below any tolerance; these weights do not.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2 and p.shape[0] > 1:  # weight matrices and convolutions: unit gain
                p.copy_(torch.randn(p.shape, generator=gen) * (1.5 / p[0].numel() ** 0.5))
            elif p.ndim >= 2:  # class / register tokens and position embeddings
                p.copy_(torch.randn(p.shape, generator=gen))
            else:  # norms, biases, layer scales
                centre = 1.0 if name.endswith(("weight", "gamma", "lambda1")) else 0.0
                p.copy_(centre + 0.3 * torch.randn(p.shape, generator=gen))
    return model


def assert_peaked(row: torch.Tensor) -> None:
    """``row`` (N, heads, patches or gh, gw) is informative: its largest entry is well above a uniform share."""
    flat = row.reshape(row.shape[0], row.shape[1], -1)  # (N, heads, patches)
    uniform = 1.0 / flat.shape[-1]
    assert float(flat.amax()) > 3 * uniform, "attention is nearly uniform: the test would be blind"

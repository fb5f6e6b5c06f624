"""The model parts maps read: the last block's ``norm1`` output and its gradient, and the
head-mean attention of every block.

Both work for timm ViTs and transformers ViT / DINOv2 models through forward hooks; the
model's own forward runs unchanged.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from napari_attnreg.core.models.base import Backbone
from napari_attnreg.core.models.hf_attention import (
    is_transformers_module,
    norm_and_projections,
    transformer_layers,
)
from napari_attnreg.core.models.scorers.target import Target, target_score
from napari_attnreg.core.models.timm_attention import classic_fast_path, model_lock


def blocks(backbone: Backbone) -> nn.ModuleList:
    """The transformer blocks (timm ``blocks``, transformers ``encoder.layer``)."""
    model = backbone.model
    return transformer_layers(model) if is_transformers_module(model) else model.blocks


def last_norm1(backbone: Backbone) -> nn.Module:
    """The layer norm in front of the last block's attention (what CDAM and Grad-CAM read)."""
    block = blocks(backbone)[-1]
    norm = getattr(block, "norm1", None) or getattr(block, "layernorm_before", None)
    if norm is None:
        raise ValueError(f"{backbone.name}'s last block has no norm1 in front of its attention, "
                         "so gradient maps cannot be read from it; use map='attention'.")
    return norm


def norm1_and_gradient(backbone: Backbone, batch: torch.Tensor,
                       target: Target) -> tuple[torch.Tensor, torch.Tensor]:
    """The last block's ``norm1`` output ``(N, L, D)`` and the gradient of the target score.

    Each image's score depends only on its own tokens (eval mode), so one backward pass of
    the summed scores gives every image's gradient. The blocks before the last one run
    without an autograd graph: the hook starts the graph at ``norm1``'s output. Works inside
    ``torch.inference_mode()``: the batch is copied out of it first.
    """
    captured: dict[str, torch.Tensor] = {}
    owner = threading.get_ident()

    def start_graph(_module, _inputs, output):
        if threading.get_ident() != owner:  # another run's forward on this shared model
            return None
        torch.set_grad_enabled(True)  # the outer no_grad restores the mode on exit
        captured["x"] = output.detach().requires_grad_(True)
        return captured["x"]

    with torch.inference_mode(False), torch.no_grad(), uncached_autocast(batch.device.type):
        x = batch.clone()
        handle = last_norm1(backbone).register_forward_hook(start_graph)
        try:
            score = target_score(target, backbone, x)
        finally:
            handle.remove()
        (grad,) = torch.autograd.grad(score.sum(), captured["x"])
    return captured["x"].detach(), grad.detach()


def uncached_autocast(device_type: str) -> contextlib.AbstractContextManager[Any]:
    """The caller's autocast, without its cache of low-precision weight copies.

    The engine's forward passes fill that cache inside ``inference_mode``; a backward pass
    through one of those cached copies fails ("Inference tensors cannot be saved for
    backward"), as seen with bf16 on a GPU. Off autocast, nothing changes.
    """
    try:
        enabled = torch.is_autocast_enabled(device_type)
        dtype = torch.get_autocast_dtype(device_type)
    except (TypeError, AttributeError, RuntimeError):  # torch < 2.4: no per-device query
        enabled, dtype = torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype, cache_enabled=False)


def _timm_classic_mean(block: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Head-mean attention ``(N, L, L)`` of a timm ``Attention`` block, one head at a time."""
    attn = block.attn
    hidden = block.norm1(tokens)
    width = attn.num_heads * attn.head_dim
    n, length, _ = hidden.shape
    qk = nn.functional.linear(hidden, attn.qkv.weight[:2 * width],
                              None if attn.qkv.bias is None else attn.qkv.bias[:2 * width])
    qk = qk.view(n, length, 2, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    return _mean_of_heads(attn.q_norm(qk[0]), attn.k_norm(qk[1]), attn.scale)


def _hf_mean(layer: nn.Module, tokens: torch.Tensor, heads: int) -> torch.Tensor:
    norm, q_proj, k_proj = norm_and_projections(layer)
    hidden = norm(tokens)
    n, length, _ = hidden.shape
    q = q_proj(hidden).view(n, length, heads, -1).transpose(1, 2)
    k = k_proj(hidden).view(n, length, heads, -1).transpose(1, 2)
    return _mean_of_heads(q, k, q.shape[-1] ** -0.5)


def _mean_of_heads(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Mean over heads of ``softmax(q kᵀ · scale)`` in float32, one ``(N, L, L)`` at a time."""
    with torch.autocast(device_type=q.device.type, enabled=False):
        total = None
        for h in range(q.shape[1]):
            a = ((q[:, h].float() * scale) @ k[:, h].float().transpose(-1, -2)).softmax(-1)
            total = a if total is None else total.add_(a)
        return total.div_(q.shape[1])


def each_block_attention(backbone: Backbone, batch: torch.Tensor,
                         visit: Callable[[int, torch.Tensor], None]) -> None:
    """Call ``visit(block index, head-mean attention (N, L, L))`` for every block, in order.

    One forward pass of the model; each block's attention is formed from the tokens entering
    it (timm ``Attention`` and transformers layers: one head at a time; other timm attention
    modules: their own full matrix, captured with the fused kernel off).
    """
    model = backbone.model
    if not is_transformers_module(model) and not all(
            classic_fast_path(model, b) for b in model.blocks):
        _explicit_blocks(backbone, batch, visit)
        return
    owner = threading.get_ident()
    handles = []
    heads = backbone.num_heads
    hf = is_transformers_module(model)

    def hook_for(i: int, block: nn.Module):
        def entering(_module, args, kwargs):
            if threading.get_ident() == owner:
                tokens = args[0] if args else kwargs["hidden_states"]
                visit(i, _hf_mean(block, tokens, heads) if hf
                      else _timm_classic_mean(block, tokens))
        return entering

    for i, block in enumerate(blocks(backbone)):
        handles.append(block.register_forward_pre_hook(hook_for(i, block), with_kwargs=True))
    try:
        if hf:
            extra = {"interpolate_pos_encoding": True} if model.config.model_type == "vit" else {}
            model(pixel_values=batch, **extra)
        else:
            model.forward_features(batch)
    finally:
        for handle in handles:
            handle.remove()


def _explicit_blocks(backbone: Backbone, batch: torch.Tensor,
                     visit: Callable[[int, torch.Tensor], None]) -> None:
    """Fallback for timm attention modules without a row-only path (rotary, gated)."""
    from napari_attnreg.core.models.timm_attention import fit_rope_to_grid, grid_of

    model = backbone.model
    owner = threading.get_ident()
    handles, previous = [], []

    def grab_for(i: int):
        def grab(_mod, _inp, out):
            if threading.get_ident() == owner:
                visit(i, out.float().mean(dim=1))
        return grab

    with model_lock(model):  # the hooks and the kernel switch must not meet another thread's
        for i, block in enumerate(model.blocks):
            previous.append(getattr(block.attn, "fused_attn", None))
            if previous[-1] is not None:
                block.attn.fused_attn = False
            handles.append(block.attn.attn_drop.register_forward_hook(grab_for(i)))
        try:
            fit_rope_to_grid(model, grid_of(model, model.patch_embed(batch), batch))
            model.forward_features(batch)
        finally:
            for handle, block, old in zip(handles, model.blocks, previous, strict=True):
                handle.remove()
                if old is not None:
                    block.attn.fused_attn = old

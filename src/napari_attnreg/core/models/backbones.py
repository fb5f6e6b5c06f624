"""Load a ViT backbone from whatever names it: the one entry point, :func:`load_backbone`.

The dispatcher sits on top of the models package and only chooses a route: a bundled test
article or catalogue id (:mod:`catalogue`), a transformers id or folder (:mod:`hf_backbones`),
a local weights file or a timm name (:mod:`timm_backbones`), or a module given as is. Errors
that need to know every route (an unknown name with close suggestions, a weights file
without its architecture) are made here. :class:`Backbone` itself lives in :mod:`base`;
it and the names callers have always imported from here are re-exported.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import torch
from torch import nn

from napari_attnreg.core.models import catalogue, hf_backbones
from napari_attnreg.core.models.base import Backbone, channel_stats, copy_module, resolve_device
from napari_attnreg.core.models.errors import BackboneError, UnknownModelError
from napari_attnreg.core.models.hf_attention import is_transformers_module
from napari_attnreg.core.models.timm_backbones import (
    DEMO_DIR,
    arch_of,
    create_timm,
    from_module,
    load_timm,
    load_timm_file,
)
from napari_attnreg.core.models.triton_guard import avoid_triton_llvm_clash
from napari_attnreg.core.models.weights import (
    WEIGHT_SUFFIXES,
    folder_error,
    load_timm_state,
    read_state_dict,
)

DEMO_NAME = "demo"

__all__ = [
    "DEMO_DIR", "Backbone", "BackboneError", "channel_stats", "create_timm", "load_backbone",
    "load_timm_state", "read_state_dict", "resolve_device", "unknown_model_error",
]


def load_backbone(
    model: str | nn.Module | Path = DEMO_NAME,
    *,
    arch: str | None = None,
    pretrained: bool = True,
    device: str | torch.device | None = None,
    weights: str | Path | None = None,
) -> Backbone:
    """Load a ViT from a name, a hub id, a local weights file or an ``nn.Module``.

    Parameters
    ----------
    model : str, Path or nn.Module
        ``"demo"`` or ``"phantom"`` (bundled test articles, offline); a catalogue id such as ``"uni"`` or its hub id
        (``attnreg models`` lists them); a timm name such as ``"vit_small_patch8_224.dino"``;
        an ``"hf-hub:org/name"`` timm id; an ``"hf:org/name"`` transformers id (ViT, DINOv2,
        DINOv2 with registers); a folder saved with ``save_pretrained``; a local weights file
        (``.safetensors``, ``.pth``, ``.pt``, Lightning ``.ckpt``; give ``arch``); or a timm
        or transformers ViT module.
    arch : str, optional
        timm architecture name or catalogue id of a local weights file.
    pretrained : bool
        Download pretrained weights (needs internet or the local hub cache). ``False`` gives
        a random-init model, useful for tests only.
    device : str or torch.device, optional
        Move the model there.
    weights : str or Path, optional
        Local weights file (or transformers folder) for the model named by ``model``:
        ``load_backbone("uni", weights="uni.bin")`` loads offline.

    Returns
    -------
    Backbone

    Examples
    --------
    >>> bb = load_backbone("vit_tiny_patch16_224", pretrained=False)
    >>> bb.patch_size, bb.num_prefix_tokens
    ((16, 16), 1)
    """
    # timm imports Triton; next to an open napari viewer on software OpenGL that segfaults
    avoid_triton_llvm_clash()
    if weights is not None:
        model, arch = _weights_for(model, weights), str(model)
    if isinstance(model, Backbone):
        # shared with its other users: never changed here, only copied to another device
        return model if device is None else model.on(resolve_device(device))
    if isinstance(model, nn.Module):
        bb = _wrap_module(model)
    elif isinstance(model, (str, Path)):
        bb = _load_named(str(model), arch, pretrained=pretrained)
    else:
        raise BackboneError(
            "model must be a model name, a weights file path or an nn.Module, got "
            f"{type(model).__name__}"
        )
    check_finite_weights(bb)
    bb.model.eval()
    if device is not None:
        bb.to(device)
    return bb


def check_finite_weights(bb: Backbone) -> None:
    """Refuse weights holding NaN or infinite values, naming their source (the file).

    Such weights make every attention map NaN; found here, at load, the message can say
    whose fault it is instead of a statistic failing later on NaN scores.

    Raises
    ------
    BackboneError
    """
    bad = [name for name, tensor in (*bb.model.named_parameters(), *bb.model.named_buffers())
           if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise BackboneError(
            f"The weights of {bb.name} ({bb.weights}) hold NaN or infinite values ({shown}); "
            "the file is damaged or was saved from a diverged training. Give weights whose "
            "values are all finite.")


def _weights_for(model: object, weights: str | Path) -> str | Path:
    """``load_backbone("uni", weights=FILE)``: the file is what loads, ``model`` its arch."""
    if not isinstance(model, (str, Path)):
        raise BackboneError("weights= goes with a catalogue id or timm name as model, "
                            f"not with a {type(model).__name__}.")
    return weights


def _wrap_module(model: nn.Module) -> Backbone:
    """A caller's module: it keeps its mode, flags and device, so wrap a copy sharing its
    weights."""
    own = copy_module(model, lambda t: t)
    name = type(model).__name__
    if is_transformers_module(model):
        return hf_backbones.from_transformers_module(own, name=name, weights="given module")
    return from_module(own, name=name, weights="given module")


def _load_named(source: str, arch: str | None, *, pretrained: bool) -> Backbone:
    """A name or path; one that no route knows gets close names suggested."""
    try:
        return _route(source, arch, pretrained=pretrained)
    except UnknownModelError as err:
        raise unknown_model_error(err.name) from err


def _route(source: str, arch: str | None, *, pretrained: bool) -> Backbone:
    """The first route that claims ``source``, in this order: bundled test article, local
    file or folder with a catalogue ``arch``, catalogue id or hub id, transformers id or
    folder, weights file, timm name."""
    path = Path(source)
    if catalogue.is_bundled(source):
        return catalogue.load_entry(catalogue.find(source))
    if arch is not None and path.is_dir() and not (path / "config.json").is_file():
        raise folder_error(path, arch)
    arch_entry = catalogue.find(arch) if arch is not None else None
    if arch_entry is not None and path.exists():
        return catalogue.load_entry(arch_entry, weights=path)
    entry = catalogue.find(source)
    if entry is not None:
        return catalogue.load_entry(entry, pretrained=pretrained)
    if arch is not None and path.is_dir() and _is_timm_arch(arch):
        # the folder's config.json builds the model: the timm architecture the user named
        # (--model NAME --weights FOLDER) was ignored without a word
        raise BackboneError(
            f"{path} is a transformers folder (it has a config.json), which names its own "
            f"architecture, so '{arch}' would not be used. Give the folder alone (command "
            f"line: --model {path}; Python: load_backbone('{path}')), or a weights file "
            f"saved from '{arch}'.")
    if source.startswith("hf:") or path.is_dir():
        return hf_backbones.load_transformers(source, pretrained=pretrained)
    if path.suffix.lower() in WEIGHT_SUFFIXES or path.is_file():
        return _load_weights_file(path, arch)
    return load_timm(source, pretrained=pretrained)


def _is_timm_arch(name: str) -> bool:
    """Whether ``name`` is a timm architecture (a tag or hf-hub: prefix allowed)."""
    import timm

    return bool(timm.is_model(arch_of(name)))


def _load_weights_file(path: Path, arch: str | None) -> Backbone:
    """A local weights file: its ``arch`` is a catalogue id or a timm architecture."""
    if not path.is_file():  # a mistyped path was told to add arch=, which cannot help
        raise BackboneError(f"Weights file not found: {path} (from {Path.cwd()}); check the "
                            "path, or give a catalogue id or timm name instead.")
    if arch is None:
        raise BackboneError(
            f"To load the weights file {path.name}, also give the timm architecture or catalogue "
            "id it belongs to, e.g. arch='vit_small_patch8_224' or arch='uni' (CLI: --arch)."
        )
    entry = catalogue.find(arch)
    if entry is not None:
        return catalogue.load_entry(entry, weights=path)
    return load_timm_file(path, arch)


def unknown_model_error(name: str) -> BackboneError:
    """No catalogue id, timm name, file or folder is called ``name``: suggest close names."""
    import timm

    ids = [e.id for e in catalogue.CATALOGUE]
    close = difflib.get_close_matches(name.lower(), ids, n=3, cutoff=0.6)
    close += [m for m in difflib.get_close_matches(arch_of(name), timm.list_models("*vit*"),
                                                   n=3, cutoff=0.8) if m not in close]
    hint = f" Did you mean {', '.join(repr(c) for c in close[:3])}?" if close else ""
    where = ""
    if "/" in name or "\\" in name or Path(name).suffix:
        where = f" There is no file or folder '{name}' either (from {Path.cwd()})."
    return BackboneError(
        f"timm does not know the model '{name}', and it is not a catalogue id or a weights "
        f"file.{where}{hint} "
        f"Catalogue ids: {', '.join(ids)} (`attnreg models`); timm names: "
        "timm.list_models('vit*'); a weights file needs arch=...")

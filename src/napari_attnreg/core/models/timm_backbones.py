"""timm ViTs: by name (hub download or random init), from a weights file, from a module,
and the test-article models bundled with the package.

These loaders give un-annotated backbones: naming one after its catalogue entry happens
in :mod:`catalogue`. ``timm`` is imported only inside functions, after
:func:`~napari_attnreg.core.models.backbones.load_backbone` has guarded against Triton.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from napari_attnreg.core.models.base import Backbone, channel_stats
from napari_attnreg.core.models.errors import BackboneError, UnknownModelError
from napari_attnreg.core.models.hub import call_hub, is_cached, offline_error, work_offline
from napari_attnreg.core.models.weights import load_timm_state, read_state_dict

DEMO_DIR = Path(__file__).resolve().parents[2] / "models"  # every bundled model lives here

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


def from_module(module: nn.Module, *, name: str, weights: str,
                cfg: dict | None = None) -> Backbone:
    """Wrap a timm ViT-family module; facts the module lacks come from ``cfg`` (or timm's
    ``pretrained_cfg``), else ImageNet statistics and the patch embed's image size."""
    for attr in ("patch_embed", "blocks"):
        if not hasattr(module, attr):
            raise BackboneError(
                f"{type(module).__name__} is not a timm ViT-family model (it has no '{attr}'); "
                "use a timm VisionTransformer such as 'vit_small_patch16_224', DeiT, DINOv2 or "
                "EVA, "
                "or a transformers ViTModel / Dinov2Model."
            )
    if getattr(module, "cls_token", None) is None:
        raise BackboneError(
            f"{name} has no class token, so it has no CLS attention to regularize; "
            "choose a ViT with a class token (class_token=True)."
        )
    cfg = dict(cfg or getattr(module, "pretrained_cfg", None) or {})
    ps = module.patch_embed.patch_size
    patch_size = (int(ps[0]), int(ps[1])) if isinstance(ps, (tuple, list)) else (int(ps), int(ps))
    in_chans = int(module.patch_embed.proj.in_channels)
    img_size = getattr(module.patch_embed, "img_size", None) or (224, 224)
    input_size = tuple(cfg.get("input_size") or (in_chans, img_size[0], img_size[1]))
    mean, std = channel_stats(cfg.get("mean", _IMAGENET_MEAN), cfg.get("std", _IMAGENET_STD),
                              in_chans)
    _enable_dynamic_size(module)
    return Backbone(
        model=module,
        name=name,
        weights=weights,
        patch_size=patch_size,
        num_prefix_tokens=int(getattr(module, "num_prefix_tokens", 1)),
        mean=mean,
        std=std,
        input_size=(in_chans, int(input_size[1]), int(input_size[2])),
    )


def _enable_dynamic_size(module: nn.Module) -> None:
    """Let the model take any H×W that is a multiple of the patch size.

    timm resamples the absolute position embedding per call when ``dynamic_img_size`` is on;
    the patch embed must then hand over an NHWC grid instead of a flat sequence.
    """
    from timm.layers import Format

    pe = module.patch_embed
    if hasattr(module, "dynamic_img_size"):
        module.dynamic_img_size = True
        pe.strict_img_size = False
        pe.flatten = False
        pe.output_fmt = Format.NHWC
    elif hasattr(pe, "strict_img_size"):
        pe.strict_img_size = False


def create_timm(name: str, *, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """``timm.create_model`` with an unknown name turned into :class:`UnknownModelError`."""
    import timm

    try:
        return timm.create_model(name, pretrained=pretrained, **kwargs)
    except (RuntimeError, ValueError) as err:
        # ValueError: timm's reading of a name with a '/' that is neither a hub id nor a path
        if isinstance(err, ValueError) or "Unknown model" in str(err) or (
                "Invalid pretrained tag" in str(err)):
            raise UnknownModelError(name) from err
        raise


def arch_of(name: str) -> str:
    """timm architecture of a model name: 'hf-hub:timm/vit_x.tag' and 'vit_x.tag' → 'vit_x'."""
    return name.removeprefix("hf-hub:").split("/")[-1].split(".")[0]


def _timm_hub_id(name: str) -> str:
    """Hub repository a timm name downloads from (for error messages)."""
    if name.startswith("hf-hub:"):
        return name.removeprefix("hf-hub:").split("@")[0]
    from timm.models import get_pretrained_cfg

    try:
        cfg = get_pretrained_cfg(name)
    except RuntimeError:  # an invalid tag is reported by create_timm
        cfg = None
    return getattr(cfg, "hf_hub_id", None) or f"timm/{name}"


def load_timm(name: str, *, pretrained: bool) -> Backbone:
    """A timm model by name or ``hf-hub:`` id: hub weights (or the local cache), else random.

    Offline and not cached fails at once, with the weights-file call to use instead.
    """
    if pretrained:
        import timm

        if not name.startswith("hf-hub:") and not timm.is_model(arch_of(name)):
            create_timm(name)  # raises the unknown-model error before any download
        alternative = (f"load_backbone('path/to/weights.safetensors', arch='{arch_of(name)}') "
                       f"(or --model FILE --arch {arch_of(name)} on the command line)")
        repo = _timm_hub_id(name)
        if work_offline() and not is_cached(repo, ("model.safetensors", "pytorch_model.bin",
                                                   "open_clip_pytorch_model.bin")):
            # fail before timm spends seconds building a large model it cannot fill
            raise offline_error(repo, alternative)
        module = call_hub(repo, lambda _local_only: create_timm(name, pretrained=True),
                          offline_alternative=alternative)
    else:
        module = create_timm(name, pretrained=False)
    return from_module(module, name=name, weights="pretrained" if pretrained else "random-init")


def load_timm_file(path: Path, arch: str) -> Backbone:
    """A timm ViT of architecture ``arch`` filled from a local weights file.

    The classifier width and the channel count come from the file (a 4-channel cell
    painting model loads as such); the position embedding is resampled to the model's grid.
    """
    state = read_state_dict(path)
    kwargs: dict[str, Any] = {}
    head = state.get("head.weight")
    kwargs["num_classes"] = int(head.shape[0]) if head is not None else 0
    proj = state.get("patch_embed.proj.weight")
    if proj is not None and proj.ndim == 4:  # 4-channel cell painting etc.: as the file says
        kwargs["in_chans"] = int(proj.shape[1])
    module = create_timm(arch, pretrained=False, **kwargs)
    _require_vit(module, arch, f"the weights file {path.name}")
    load_timm_state(module, state, path.name, arch)
    return from_module(module, name=arch, weights=str(path))


def _require_vit(module: nn.Module, arch: str, what: str) -> None:
    """An architecture that is not a ViT cannot take a ViT's weights: say so before loading."""
    for attr in ("patch_embed", "blocks"):
        if not hasattr(module, attr):
            raise BackboneError(
                f"'{arch}' is not a ViT-family architecture ({type(module).__name__} has no "
                f"'{attr}'), so it cannot be the architecture of {what}. Give the timm ViT name "
                "the weights were trained with, e.g. arch='vit_small_patch16_224' (CLI: --arch).")


def load_bundled(name: str) -> Backbone:
    """A test-article model shipped with the package: ``models/<name>_vit.{json,safetensors}``.

    The json holds the timm kwargs, normalisation, input size and classes written by its
    training script (``examples/train_<name>_model.py``); no network is needed.
    """
    cfg_path = DEMO_DIR / f"{name}_vit.json"
    weights_path = DEMO_DIR / f"{name}_vit.safetensors"
    if not (cfg_path.is_file() and weights_path.is_file()):
        raise BackboneError(
            f"The bundled {name} model is missing from {DEMO_DIR} (broken install?). "
            "Reinstall napari-attnreg, or pass a timm model name or a weights file."
        )
    from safetensors.torch import load_file
    from timm.models.vision_transformer import VisionTransformer

    cfg = json.loads(cfg_path.read_text())
    module = VisionTransformer(**cfg["timm_kwargs"])
    module.load_state_dict({k: v.float() for k, v in load_file(str(weights_path)).items()})
    pcfg = {"mean": cfg["mean"], "std": cfg["std"], "input_size": cfg["input_size"]}
    bb = from_module(module, name=name, weights=str(weights_path.name), cfg=pcfg)
    bb.extra = {"classes": cfg.get("classes"), "config": cfg}
    return bb

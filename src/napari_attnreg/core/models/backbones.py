"""Load a ViT backbone and describe what the rest of the pipeline needs from it.

Everything the statistics depend on (patch size, number of prefix tokens, normalisation,
default input size) is read from the model itself, never assumed. A small adapter per
family (timm classic, timm rotary, transformers) knows the model's structure; the rest of
the pipeline only sees :class:`Backbone`.
"""

from __future__ import annotations

import copy
import difflib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from napari_attnreg.core.models.errors import BackboneError
from napari_attnreg.core.models.hf_attention import is_transformers_module
from napari_attnreg.core.models.triton_guard import avoid_triton_llvm_clash
from napari_attnreg.core.models.weights import (
    WEIGHT_SUFFIXES,
    folder_error,
    load_timm_state,
    read_state_dict,
)

DEMO_DIR = Path(__file__).resolve().parents[2] / "models"  # every bundled model lives here
DEMO_NAME = "demo"


_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)

__all__ = ["Backbone", "BackboneError", "load_backbone", "load_timm_state", "read_state_dict",
           "resolve_device"]

DEVICE_CHOICES = "use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` → cuda → mps → cpu; an explicit device that is not available is an error.

    Only compute devices are accepted: ``"meta"`` and other tensor types would leave a model
    without data, so they are refused before anything is moved.
    """
    if not isinstance(device, (str, torch.device)):
        raise ValueError(f"device={device!r} is not a compute device; {DEVICE_CHOICES}.")
    name = str(device).strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"device={device!r} is not a compute device; {DEVICE_CHOICES}.") from err
    if dev.type not in ("cpu", "cuda", "mps") or (dev.type == "cpu" and dev.index not in (None, 0)):
        raise ValueError(f"device={device!r} is not a compute device; {DEVICE_CHOICES}.")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} was asked for but no CUDA GPU is available; "
                             "use device='auto' or 'cpu'.")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"device={device!r} was asked for but this machine has {count} CUDA "
                             f"GPU(s) (cuda:0..cuda:{count - 1}); use one of those or 'auto'.")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None)
                                  and torch.backends.mps.is_available()):
        raise ValueError(f"device={device!r} was asked for but Apple MPS is not available; "
                         "use 'auto' or 'cpu'.")
    return torch.device("cpu") if dev.type == "cpu" else dev


def _device_key(device: torch.device | str) -> str:
    """One name per physical device: 'cuda' and 'cuda:0' (when 0 is current) are the same."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type in ("mps", "cpu") and dev.index is None:
        dev = torch.device(dev.type, 0)
    return str(dev)


def copy_module(module: nn.Module, convert: Callable[[torch.Tensor], torch.Tensor]) -> nn.Module:
    """A structural copy of ``module`` whose parameters and buffers are ``convert(tensor)``.

    Submodules, flags and attributes are new objects, so changing them (eval mode, dynamic
    image size, a device move) never reaches ``module``. ``convert=lambda t: t`` shares the
    tensors' memory (no copy of the weights); ``lambda t: t.to(device)`` copies them straight
    to ``device`` without a second copy in host memory.
    """
    with torch.inference_mode(False), torch.no_grad():
        memo: dict[int, Any] = {}
        for param in module.parameters():
            memo[id(param)] = nn.Parameter(convert(param.detach()),
                                           requires_grad=param.requires_grad)
        for buffer in module.buffers():
            memo[id(buffer)] = convert(buffer.detach())
        try:
            return copy.deepcopy(module, memo)
        except (TypeError, RuntimeError, AttributeError, copy.Error) as err:
            raise BackboneError(
                f"{type(module).__name__} cannot be copied ({err}), and napari-attnreg does not "
                "change a module it was given; pass a timm or transformers model, or a weights "
                "file with arch=...") from err


@dataclass
class Backbone:
    """A ViT plus the facts about it that attention extraction needs.

    Attributes
    ----------
    model : nn.Module
        The timm or transformers ViT-family model, in eval mode.
    name : str
        Architecture name (timm name, ``"demo"``, or the class name of a given module).
    weights : str
        Where the weights came from (``"pretrained"``, a file path, ``"random-init"``, ...).
    patch_size : tuple of int
        Patch height and width in model pixels.
    num_prefix_tokens : int
        Class, distillation and register tokens that precede the patch tokens.
    mean, std : tuple of float
        Per-channel normalisation the model was trained with.
    input_size : tuple of int
        Default ``(C, H, W)`` from the model's pretrained config.
    domain : str or None
        Declared domain of a catalogue model (pathology, radiology, microscopy, natural, demo).
    description : str
        One line about the model, from the catalogue (empty when unknown).
    adapter : object
        Reads the model's structure and computes the CLS row; chosen from the model.
    """

    model: nn.Module
    name: str
    weights: str
    patch_size: tuple[int, int]
    num_prefix_tokens: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    input_size: tuple[int, int, int]
    extra: dict[str, Any] = field(default_factory=dict)
    domain: str | None = None
    description: str = ""
    adapter: Any = None
    _copies: dict[str, nn.Module] = field(default_factory=dict, init=False, repr=False,
                                          compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False,
                                  compare=False)

    def __post_init__(self) -> None:
        if self.adapter is None:
            from napari_attnreg.core.models.hf_attention import TRANSFORMERS, is_transformers_module
            from napari_attnreg.core.models.timm_attention import timm_adapter_for

            is_hf = is_transformers_module(self.model)
            self.adapter = TRANSFORMERS if is_hf else timm_adapter_for(self.model)

    @property
    def in_chans(self) -> int:
        return int(self.input_size[0])

    @property
    def num_heads(self) -> int:
        return self.adapter.num_heads(self.model)

    @property
    def depth(self) -> int:
        return self.adapter.depth(self.model)

    @property
    def embed_dim(self) -> int:
        """Token width, for memory estimates."""
        return self.adapter.embed_dim(self.model)

    @property
    def is_random_init(self) -> bool:
        return self.weights == "random-init"

    def to(self, device: torch.device | str) -> Backbone:
        """Move this backbone's own model to ``device`` in place (at load time).

        Runs never call this: a backbone may be shared by several runs, so a run takes
        :meth:`on` its device instead.
        """
        dev = resolve_device(device)
        with self._lock:
            self.model.to(dev)
            self._copies.pop(_device_key(dev), None)
        return self

    def on(self, device: torch.device | str) -> Backbone:
        """This backbone with its model on ``device``, without moving the model itself.

        On the model's own device this is the backbone itself. For another device a copy of
        the model is made there once (under a lock, so concurrent runs share one copy) and
        kept with this backbone; the returned backbone shares every other fact. Two runs on
        different devices therefore never move the model out from under each other.
        """
        key = _device_key(device)
        if key == _device_key(self.device):
            return self
        with self._lock:
            model = self._copies.get(key)
            if model is None:
                target = torch.device(device)
                model = copy_module(self.model, lambda t: t.to(target))
                model.to(target)  # tensors a module keeps outside parameters and buffers
                self._copies[key] = model
        return replace(self, model=model)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_lock")
        state["_copies"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def describe(self) -> str:
        gh, gw = self.patch_size
        domain = f"{self.domain} model, " if self.domain else ""
        return (
            f"{self.name} ({domain}{self.weights}; patch {gh}x{gw}, {self.depth} blocks, "
            f"{self.num_heads} heads, {self.num_prefix_tokens} prefix tokens)"
        )


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
    from napari_attnreg.core.models import catalogue, hf_backbones
    if weights is not None:
        if not isinstance(model, (str, Path)):
            raise BackboneError("weights= goes with a catalogue id or timm name as model, "
                                f"not with a {type(model).__name__}.")
        model, arch = weights, str(model)
    if isinstance(model, Backbone):
        # shared with its other users: never changed here, only copied to another device
        return model if device is None else model.on(resolve_device(device))
    if isinstance(model, nn.Module):
        # the caller's module keeps its mode, flags and device: wrap a copy sharing its weights
        own = copy_module(model, lambda t: t)
        if is_transformers_module(model):
            bb = hf_backbones.from_transformers_module(own, name=type(model).__name__,
                                                       weights="given module")
        else:
            bb = _from_module(own, name=type(model).__name__, weights="given module")
    elif not isinstance(model, (str, Path)):
        raise BackboneError(
            "model must be a model name, a weights file path or an nn.Module, got "
            f"{type(model).__name__}"
        )
    elif catalogue.is_bundled(str(model)):
        bb = _load_bundled(str(model))
    elif (arch is not None and Path(str(model)).is_dir()
          and not (Path(str(model)) / "config.json").is_file()):
        raise folder_error(Path(str(model)), arch)
    elif arch is not None and catalogue.find(arch) is not None and Path(str(model)).exists():
        bb = catalogue.load_entry(catalogue.find(arch), weights=Path(str(model)))
    elif catalogue.find(str(model)) is not None:
        bb = catalogue.load_entry(catalogue.find(str(model)), pretrained=pretrained)
    elif str(model).startswith("hf:") or Path(str(model)).is_dir():
        bb = hf_backbones.load_transformers(str(model), pretrained=pretrained)
    elif Path(str(model)).suffix.lower() in WEIGHT_SUFFIXES or Path(str(model)).is_file():
        bb = _load_weights_file(Path(model), arch)
    else:
        bb = _load_timm(str(model), pretrained=pretrained)
    bb.model.eval()
    if device is not None:
        bb.to(device)
    return bb


def _require_vit(module: nn.Module, arch: str, what: str) -> None:
    """An architecture that is not a ViT cannot take a ViT's weights: say so before loading."""
    for attr in ("patch_embed", "blocks"):
        if not hasattr(module, attr):
            raise BackboneError(
                f"'{arch}' is not a ViT-family architecture ({type(module).__name__} has no "
                f"'{attr}'), so it cannot be the architecture of {what}. Give the timm ViT name "
                "the weights were trained with, e.g. arch='vit_small_patch16_224' (CLI: --arch).")


def _from_module(module: nn.Module, *, name: str, weights: str,
                 cfg: dict | None = None) -> Backbone:
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


def channel_stats(mean: Any, std: Any,
                  in_chans: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean/std of length ``in_chans``.

    A model whose config declares statistics for another channel count (an RGB default on a
    4-channel model) gets the average of the declared values on every channel.
    """
    mean = tuple(float(v) for v in mean)
    std = tuple(float(v) for v in std)
    if len(mean) != in_chans:
        mean = (sum(mean) / len(mean),) * in_chans
    if len(std) != in_chans:
        std = (sum(std) / len(std),) * in_chans
    return mean, std


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
    """``timm.create_model`` with an unknown name turned into a BackboneError."""
    import timm

    try:
        return timm.create_model(name, pretrained=pretrained, **kwargs)
    except (RuntimeError, ValueError) as err:
        # ValueError: timm's reading of a name with a '/' that is neither a hub id nor a path
        if isinstance(err, ValueError) or "Unknown model" in str(err) or (
                "Invalid pretrained tag" in str(err)):
            raise unknown_model_error(name) from err
        raise


def unknown_model_error(name: str) -> BackboneError:
    """No catalogue id, timm name, file or folder is called ``name``: suggest close names."""
    import timm

    from napari_attnreg.core.models.catalogue import CATALOGUE

    ids = [e.id for e in CATALOGUE]
    close = difflib.get_close_matches(name.lower(), ids, n=3, cutoff=0.6)
    close += [m for m in difflib.get_close_matches(_arch_of(name), timm.list_models("*vit*"),
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


def _arch_of(name: str) -> str:
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


def _load_timm(name: str, *, pretrained: bool) -> Backbone:
    from napari_attnreg.core.models.hub import call_hub, is_cached, offline_error, work_offline

    if pretrained:
        import timm

        if not name.startswith("hf-hub:") and not timm.is_model(_arch_of(name)):
            create_timm(name)  # raises the unknown-model error before any download
        alternative = (f"load_backbone('path/to/weights.safetensors', arch='{_arch_of(name)}') "
                       f"(or --model FILE --arch {_arch_of(name)} on the command line)")
        repo = _timm_hub_id(name)
        if work_offline() and not is_cached(repo, ("model.safetensors", "pytorch_model.bin",
                                                   "open_clip_pytorch_model.bin")):
            # fail before timm spends seconds building a large model it cannot fill
            raise offline_error(repo, alternative)
        module = call_hub(repo, lambda _local_only: create_timm(name, pretrained=True),
                          offline_alternative=alternative)
    else:
        module = create_timm(name, pretrained=False)
    return _from_module(module, name=name, weights="pretrained" if pretrained else "random-init")


def _load_bundled(name: str) -> Backbone:
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

    from napari_attnreg.core.models.catalogue import annotate, find

    cfg = json.loads(cfg_path.read_text())
    module = VisionTransformer(**cfg["timm_kwargs"])
    module.load_state_dict({k: v.float() for k, v in load_file(str(weights_path)).items()})
    pcfg = {"mean": cfg["mean"], "std": cfg["std"], "input_size": cfg["input_size"]}
    bb = _from_module(module, name=name, weights=str(weights_path.name), cfg=pcfg)
    bb.extra = {"classes": cfg.get("classes"), "config": cfg}
    return annotate(bb, find(name))


def _load_weights_file(path: Path, arch: str | None) -> Backbone:
    from napari_attnreg.core.models import catalogue
    if arch is None:
        raise BackboneError(
            f"To load the weights file {path.name}, also give the timm architecture or catalogue "
            "id it belongs to, e.g. arch='vit_small_patch8_224' or arch='uni' (CLI: --arch)."
        )
    entry = catalogue.find(arch)
    if entry is not None:
        return catalogue.load_entry(entry, weights=path)
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
    return _from_module(module, name=arch, weights=str(path))

"""What every loaded ViT is: a :class:`Backbone`, plus the device and copy helpers it uses.

Everything the statistics depend on (patch size, number of prefix tokens, normalisation,
default input size) is read from the model itself, never assumed. A small adapter per
family (timm classic, timm rotary, transformers) knows the model's structure; the rest of
the pipeline only sees :class:`Backbone`. The loaders live above this module
(:mod:`timm_backbones`, :mod:`hf_backbones`, and the dispatcher in :mod:`backbones`).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from napari_attnreg.core.models.errors import BackboneError
from napari_attnreg.core.models.hf_attention import TRANSFORMERS, is_transformers_module
from napari_attnreg.core.models.timm_attention import timm_adapter_for

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

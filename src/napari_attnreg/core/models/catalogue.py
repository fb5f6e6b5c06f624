"""Known domain models: the data front ends list and ``load_backbone("<id>")`` builds.

Architecture facts follow each model's hub config and model card (timm kwargs for timm
checkpoints, config values for transformers ones). Values such as ``"timm.layers.SwiGLUPacked"``
name a class and are resolved when the model is built, so this table stays plain data.

Above the loaders (:mod:`timm_backbones`, :mod:`hf_backbones`, :mod:`weights`), below the
dispatcher (:mod:`backbones`). The loaders are imported inside functions so that front ends
can list the table without importing torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from napari_attnreg.core.models.errors import BackboneError

DOMAINS = ("pathology", "radiology", "microscopy", "natural", "demo")
_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
_SWIGLU = {"mlp_layer": "timm.layers.SwiGLUPacked", "act_layer": "torch.nn.SiLU"}


@dataclass(frozen=True)
class CatalogueEntry:
    """One known model.

    Attributes
    ----------
    id : str
        Short name for ``load_backbone`` and ``--model`` (e.g. ``"uni"``).
    name : str
        Display name.
    domain : str
        One of pathology, radiology, microscopy, natural, demo.
    hub_id : str
        Hugging Face repository (``""`` for the bundled test articles).
    loader : str
        ``"timm"``, ``"transformers"`` or ``"demo"`` (bundled with the package: ``demo``,
        ``phantom``).
    arch : str
        timm architecture, or the transformers ``model_type``.
    kwargs : tuple of (str, value)
        timm constructor kwargs, or transformers config values.
    patch_size, prefix_tokens : int
        Patch side in pixels; CLS + register tokens before the patches.
    input_size : tuple of int
        ``(C, H, W)`` the model was trained at.
    licence : str
        Licence of the weights.
    gated : bool
        The hub asks users to request access (and log in) before downloading.
    description : str
        One line for pickers and tables.
    mean, std : tuple of float, optional
        Normalisation, where the model card gives its own.
    """

    id: str
    name: str
    domain: str
    hub_id: str
    loader: str
    arch: str
    kwargs: tuple[tuple[str, Any], ...]
    patch_size: int
    prefix_tokens: int
    input_size: tuple[int, int, int]
    licence: str
    gated: bool
    description: str
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @property
    def page(self) -> str:
        """Hub page (where gated models are requested)."""
        return f"https://huggingface.co/{self.hub_id}" if self.hub_id else ""

    @property
    def access(self) -> str:
        """Licence and gating in one line, for pickers."""
        gate = f"gated: request access on {self.page} and log in" if self.gated else "open download"
        return f"{self.licence}; {gate}"

    def build_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """Constructor kwargs with named classes resolved; ``overrides`` replace values (tests)."""
        kwargs = dict(self.kwargs, **overrides)
        return {k: _resolve(v) for k, v in kwargs.items()}


def _resolve(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(("timm.", "torch.")):
        module, _, attr = value.rpartition(".")
        return getattr(importlib.import_module(module), attr)
    return value


def _timm(id: str, name: str, domain: str, hub_id: str, arch: str, patch: int, prefix: int,
          size: int, licence: str, gated: bool, description: str, stats=_IMAGENET,
          **kwargs: Any) -> CatalogueEntry:
    return CatalogueEntry(id, name, domain, hub_id, "timm", arch, tuple(kwargs.items()), patch,
                          prefix, (3, size, size), licence, gated, description, *stats)


def _hf(id: str, name: str, domain: str, hub_id: str, model_type: str, patch: int, prefix: int,
        size: int, licence: str, gated: bool, description: str, **config: Any) -> CatalogueEntry:
    return CatalogueEntry(id, name, domain, hub_id, "transformers", model_type,
                          tuple(config.items()), patch, prefix, (3, size, size), licence, gated,
                          description)


CATALOGUE: tuple[CatalogueEntry, ...] = (
    CatalogueEntry("demo", "Demo ViT (bundled)", "demo", "", "demo", "vit_demo", (), 8, 1,
                   (3, 128, 128), "BSD-3-Clause", False,
                   "Tiny ViT trained on synthetic fluorescence nuclei (mitotic vs normal); "
                   "a test article, not for real data."),
    CatalogueEntry("phantom", "Phantom ViT (bundled)", "demo", "", "demo", "vit_phantom", (), 16, 1,
                   (3, 224, 224), "BSD-3-Clause", False,
                   "Tiny ViT trained on synthetic CT-like phantom slices (lesion vs normal); "
                   "a test article, not a radiology model."),
    _timm("uni", "UNI", "pathology", "MahmoodLab/UNI", "vit_large_patch16_224", 16, 1, 224,
          "CC-BY-NC-ND-4.0", True,
          "ViT-L/16 trained with DINOv2 on 100k H&E slides (Mass General Brigham).",
          img_size=224, init_values=1e-5, num_classes=0, dynamic_img_size=True),
    _timm("uni2-h", "UNI2-h", "pathology", "MahmoodLab/UNI2-h", "vit_giant_patch14_224", 14, 9, 224,
          "CC-BY-NC-ND-4.0", True, "ViT-H/14 with 8 registers, DINOv2 on 350k H&E and IHC slides.",
          img_size=224, patch_size=14, depth=24, num_heads=24, init_values=1e-5, embed_dim=1536,
          mlp_ratio=2.66667 * 2, num_classes=0, no_embed_class=True, reg_tokens=8,
          dynamic_img_size=True, **_SWIGLU),
    _timm("virchow2", "Virchow2", "pathology", "paige-ai/Virchow2", "vit_huge_patch14_224", 14, 5,
          224, "CC-BY-NC-ND-4.0", True, "ViT-H/14 with 4 registers, DINOv2 on 3.1M slides (Paige).",
          img_size=224, init_values=1e-5, num_classes=0, mlp_ratio=5.3375, reg_tokens=4,
          global_pool="", dynamic_img_size=True, **_SWIGLU),
    _timm("h-optimus-0", "H-optimus-0", "pathology", "bioptimus/H-optimus-0",
          "vit_giant_patch14_reg4_dinov2", 14, 5, 224, "Apache-2.0", False,
          "ViT-g/14 with 4 registers, 1.1B parameters, on 500k H&E slides (Bioptimus).",
          stats=((0.707223, 0.578729, 0.703617), (0.211883, 0.230117, 0.177517)),
          img_size=224, init_values=1e-5, num_classes=0, dynamic_img_size=True),
    _timm("prov-gigapath", "Prov-GigaPath tile encoder", "pathology", "prov-gigapath/prov-gigapath",
          "vit_giant_patch14_dinov2", 16, 1, 224, "Apache-2.0", True,
          "ViT-g/16 tile encoder, DINOv2 on 1.3B tiles from 171k slides (Providence).",
          img_size=224, patch_size=16, embed_dim=1536, depth=40, num_heads=24, init_values=1e-5,
          mlp_ratio=5.33334, num_classes=0, dynamic_img_size=True),
    _hf("phikon", "Phikon", "pathology", "owkin/phikon", "vit", 16, 1, 224, "Owkin non-commercial",
        False, "ViT-B/16 trained with iBOT on 40M TCGA tiles (Owkin).",
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        patch_size=16, image_size=224),
    _hf("phikon-v2", "Phikon-v2", "pathology", "owkin/phikon-v2", "dinov2", 16, 1, 224,
        "Owkin non-commercial", False,
        "ViT-L/16 trained with DINOv2 on 460M public-cohort tiles (Owkin).",
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, patch_size=16,
        image_size=224, layerscale_value=1e-5),
    _hf("rad-dino", "RAD-DINO", "radiology", "microsoft/rad-dino", "dinov2", 14, 1, 518, "MSRLA",
        False, "ViT-B/14 trained with DINOv2 on chest X-rays (Microsoft).",
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, patch_size=14,
        image_size=518),
    _timm("dinov2-s-reg", "DINOv2 ViT-S/14 + registers", "natural",
          "timm/vit_small_patch14_reg4_dinov2.lvd142m", "vit_small_patch14_reg4_dinov2", 14, 5, 518,
          "Apache-2.0", False, "General-purpose self-supervised ViT-S/14 with 4 registers (Meta)."),
    _timm("dinov2-b-reg", "DINOv2 ViT-B/14 + registers", "natural",
          "timm/vit_base_patch14_reg4_dinov2.lvd142m", "vit_base_patch14_reg4_dinov2", 14, 5, 518,
          "Apache-2.0", False, "General-purpose self-supervised ViT-B/14 with 4 registers (Meta)."),
    _timm("dinov2-l-reg", "DINOv2 ViT-L/14 + registers", "natural",
          "timm/vit_large_patch14_reg4_dinov2.lvd142m", "vit_large_patch14_reg4_dinov2", 14, 5, 518,
          "Apache-2.0", False, "General-purpose self-supervised ViT-L/14 with 4 registers (Meta)."),
    _timm("dinov3-s", "DINOv3 ViT-S/16", "natural", "timm/vit_small_patch16_dinov3.lvd1689m",
          "vit_small_patch16_dinov3", 16, 5, 256, "DINOv3 License", False,
          "Self-supervised ViT-S/16 with rotary positions and 4 registers (Meta)."),
    _timm("dinov3-b", "DINOv3 ViT-B/16", "natural", "timm/vit_base_patch16_dinov3.lvd1689m",
          "vit_base_patch16_dinov3", 16, 5, 256, "DINOv3 License", False,
          "Self-supervised ViT-B/16 with rotary positions and 4 registers (Meta)."),
    _timm("dino-vits8", "DINO ViT-S/8", "natural", "timm/vit_small_patch8_224.dino",
          "vit_small_patch8_224", 8, 1, 224, "Apache-2.0", False,
          "Self-supervised DINO ViT-S/8 on ImageNet (Meta); the attention regularization "
          "paper's model."),
)


def find(key: str) -> CatalogueEntry | None:
    """The entry whose id (case-insensitive) or hub id (with or without a prefix) is ``key``."""
    k = key.strip().lower()
    for prefix in ("hf-hub:", "hf_hub:", "hf:"):
        k = k.removeprefix(prefix)
    for entry in CATALOGUE:
        if k == entry.id or (entry.hub_id and k == entry.hub_id.lower()):
            return entry
    return None


def is_bundled(key: str) -> bool:
    """Whether ``key`` names a model shipped with the package (the ``demo`` loader)."""
    entry = next((e for e in CATALOGUE if e.id == key), None)
    return entry is not None and entry.loader == "demo"


def by_domain() -> dict[str, list[CatalogueEntry]]:
    """Entries grouped by domain, domains in :data:`DOMAINS` order (for pickers)."""
    groups: dict[str, list[CatalogueEntry]] = {d: [] for d in DOMAINS}
    for entry in CATALOGUE:
        groups[entry.domain].append(entry)
    return {d: e for d, e in groups.items() if e}


def build_module(entry: CatalogueEntry, **overrides: Any):
    """The entry's architecture with random weights (``overrides`` shrink it for tests)."""
    if entry.loader == "timm":
        from napari_attnreg.core.models.timm_backbones import create_timm

        return create_timm(entry.arch, pretrained=False, **entry.build_kwargs(**overrides))
    if entry.loader == "transformers":
        from napari_attnreg.core.models.hf_backbones import random_init

        return random_init(entry.arch, **entry.build_kwargs(**overrides))
    raise BackboneError(f"'{entry.id}' is bundled; load it with load_backbone('{entry.id}').")


def load_entry(entry: CatalogueEntry, *, pretrained: bool = True,
               weights: str | Path | None = None):
    """Build a catalogue model with hub weights, a local file, or random weights (tests)."""
    from napari_attnreg.core.models import timm_backbones

    if entry.loader == "demo":
        bb = timm_backbones.load_bundled(entry.id)
        if weights is not None:  # the user's file, never the bundled weights in its name
            bb = _with_user_weights(bb, entry, Path(weights))
    elif entry.loader == "transformers":
        bb = _load_transformers_entry(entry, pretrained=pretrained, weights=weights)
    elif weights is None and pretrained and entry.hub_id.startswith("timm/"):
        bb = timm_backbones.load_timm(entry.hub_id.removeprefix("timm/"), pretrained=True)
    else:
        bb = _load_timm_entry(entry, pretrained=pretrained, weights=weights)
    return annotate(bb, entry)


def _with_user_weights(bb, entry: CatalogueEntry, path: Path):
    """A bundled architecture holding a user's weights file: every tensor replaced, or a
    :class:`BackboneError` naming the file (wrong tensors or shapes, empty, truncated, NaN)."""
    from napari_attnreg.core.models.weights import load_state_strict, read_state_dict

    state = read_state_dict(path)
    load_state_strict(bb.model, state, str(path), entry.id)
    bb.weights = str(path)
    return bb


def _load_timm_entry(entry: CatalogueEntry, *, pretrained: bool, weights: str | Path | None):
    """The entry's timm architecture filled from a local file, the hub's file, or nothing."""
    from napari_attnreg.core.models import timm_backbones
    from napari_attnreg.core.models.weights import load_timm_state, read_state_dict

    # weights first: a missing download fails before seconds of building a giant ViT
    if weights is not None:
        path, source = Path(weights), str(weights)
        state = read_state_dict(path)
    elif pretrained:
        path, source = download_weights(entry), "pretrained"
        state = read_state_dict(path)
    else:
        state, source = None, "random-init"
    module = build_module(entry)
    if state is not None:
        load_timm_state(module, state, Path(source).name, entry.id)
    return timm_backbones.from_module(module, name=entry.id, weights=source, cfg=_cfg(entry))


def _cfg(entry: CatalogueEntry) -> dict[str, Any]:
    mean, std = (entry.mean, entry.std) if entry.mean else _IMAGENET
    return {"mean": mean, "std": std, "input_size": entry.input_size}


def annotate(bb, entry: CatalogueEntry):
    """Name the backbone after the entry and attach its domain and description."""
    bb.name, bb.domain, bb.description = entry.id, entry.domain, entry.description
    return bb


def _load_transformers_entry(entry: CatalogueEntry, *, pretrained: bool,
                             weights: str | Path | None):
    from napari_attnreg.core.models import hf_backbones

    if weights is not None:
        folder = Path(weights)
        folder = folder.parent if folder.is_file() else folder
        if not (folder / "config.json").is_file():
            raise BackboneError(
                f"{entry.name} is a transformers model: give the folder holding its config.json "
                f"and model.safetensors (downloaded from {entry.page}), not a single file.",
                gui_hint="Pick the model.safetensors inside the downloaded model folder.")
        bb = hf_backbones.load_transformers(str(folder))
        if bb.model.config.model_type != entry.arch:
            raise BackboneError(f"{folder} holds a '{bb.model.config.model_type}' model, but "
                                f"{entry.name} is '{entry.arch}'; check the folder.")
        return bb
    if not pretrained:
        module = build_module(entry)
        return hf_backbones.from_transformers_module(module, name=entry.id, weights="random-init")
    return hf_backbones.load_hub(entry.hub_id, name=entry.id)


def download_weights(entry: CatalogueEntry) -> Path:
    """The entry's timm weights file from the hub (or its cache), safetensors first."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    from napari_attnreg.core.models.hub import call_hub

    def fetch(local_only: bool) -> Path:
        last: Exception | None = None
        for filename in ("model.safetensors", "pytorch_model.bin"):
            try:
                return Path(hf_hub_download(entry.hub_id, filename, local_files_only=local_only))
            except EntryNotFoundError as err:  # includes "not in the local cache"
                last = err
        raise last  # type: ignore[misc]

    alternative = (f"load_backbone('{entry.id}', weights='path/to/pytorch_model.bin') "
                   f"(or --model {entry.id} --weights FILE on the command line)")
    return call_hub(entry.hub_id, fetch, offline_alternative=alternative)


def catalogue_table() -> str:
    """The catalogue as a plain-text table (``attnreg models``)."""
    header = ("id", "name", "domain", "loader", "patch", "input", "licence", "gated")
    rows = [header] + [
        (e.id, e.name, e.domain, e.loader, str(e.patch_size),
         f"{e.input_size[1]}x{e.input_size[2]}", e.licence, "yes" if e.gated else "no")
        for group in by_domain().values() for e in group
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)

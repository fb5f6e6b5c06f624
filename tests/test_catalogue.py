"""Every catalogue entry's architecture, built offline with random weights."""

from __future__ import annotations

import pytest
import torch
from attention_reference import assert_peaked, hf_explicit, max_diff, peaked, timm_explicit
from safetensors.torch import save_file

from napari_attnreg.core.models import catalogue
from napari_attnreg.core.models.attention import cls_attention
from napari_attnreg.core.models.backbones import BackboneError, load_backbone

ENTRIES = [e for e in catalogue.CATALOGUE if e.loader != "demo"]
# published parameter counts (millions) of the full-size models, from their model cards
PARAMS_M = {"uni": 303, "uni2-h": 681, "virchow2": 632, "h-optimus-0": 1135, "prov-gigapath": 1135,
            "phikon": 86, "phikon-v2": 303, "rad-dino": 87, "dinov2-s-reg": 22, "dinov2-b-reg": 87,
            "dinov2-l-reg": 304, "dinov3-s": 22, "dinov3-b": 86, "dino-vits8": 22}


def small_overrides(entry) -> dict:
    """Same kwargs, less depth and width: fast on two CPU cores."""
    if entry.loader == "transformers":
        return {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 64, "image_size": entry.patch_size * 4}
    # width 96 keeps SwiGLU hidden sizes even for the 5.33x MLP ratios
    return {"depth": 2, "embed_dim": 96, "num_heads": 4, "img_size": entry.patch_size * 4}


def test_catalogue_is_complete_data():
    ids = [e.id for e in catalogue.CATALOGUE]
    assert len(ids) == len(set(ids))
    assert set(PARAMS_M) | {"demo", "phantom"} == set(ids)
    for e in catalogue.CATALOGUE:
        assert e.domain in catalogue.DOMAINS
        assert e.loader in ("timm", "transformers", "demo")
        assert e.description and "\n" not in e.description and e.licence
        assert (e.hub_id == "") == (e.loader == "demo")
    assert {e.id for e in catalogue.CATALOGUE if e.gated} == {"uni", "uni2-h", "virchow2", "prov-gigapath"}
    assert catalogue.find("MahmoodLab/UNI2-h").id == "uni2-h"
    assert catalogue.find("hf-hub:paige-ai/Virchow2").id == "virchow2"
    assert catalogue.find("hf:microsoft/rad-dino").id == "rad-dino"
    assert catalogue.find("vit_small_patch16_224") is None
    assert list(catalogue.by_domain())[:3] == ["pathology", "radiology", "natural"]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.id)
def test_full_size_architecture_matches_the_model_card(entry):
    with torch.device("meta"):  # shapes only: no memory, no time
        module = catalogue.build_module(entry)
    params = sum(p.numel() for p in module.parameters()) / 1e6
    assert abs(params - PARAMS_M[entry.id]) / PARAMS_M[entry.id] < 0.02, params


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.id)
def test_reduced_architecture_fast_path_and_prefix_tokens(entry):
    torch.manual_seed(0)
    module = peaked(catalogue.build_module(entry, **small_overrides(entry)).eval())
    bb = catalogue.annotate(load_backbone(module), entry)
    assert bb.num_prefix_tokens == entry.prefix_tokens
    assert bb.patch_size == (entry.patch_size, entry.patch_size)
    assert bb.domain == entry.domain and bb.description == entry.description
    p = entry.patch_size
    x = torch.randn(1, 3, p * 5, p * 3)
    with torch.inference_mode():
        fast = cls_attention(bb, x, head="all")
    if entry.loader == "transformers":
        from transformers import AutoModel

        eager = AutoModel.from_config(module.config, attn_implementation="eager").eval()
        eager.load_state_dict(module.state_dict())
        slow = hf_explicit(eager, x, -1, entry.prefix_tokens)
    else:
        slow = timm_explicit(bb.model, x, -1, entry.prefix_tokens)  # dynamic size is on the copy
    assert_peaked(slow)
    assert max_diff(fast, slow) <= 1e-5


def test_catalogue_id_builds_its_architecture_and_declares_its_domain():
    bb = load_backbone("dinov3-s", pretrained=False)
    assert bb.name == "dinov3-s" and bb.domain == "natural" and bb.is_random_init
    assert bb.num_prefix_tokens == 5 and bb.input_size == (3, 256, 256)
    assert "natural model" in bb.describe()
    by_hub_id = load_backbone("hf-hub:timm/vit_small_patch16_dinov3.lvd1689m", pretrained=False)
    assert by_hub_id.name == "dinov3-s" and by_hub_id.adapter.family == "timm-rotary"
    rad = load_backbone("hf:microsoft/rad-dino", pretrained=False)
    assert (rad.name, rad.domain, rad.adapter.family) == ("rad-dino", "radiology", "transformers")
    assert rad.patch_size == (14, 14) and rad.depth == 12 and rad.embed_dim == 768
    demo = load_backbone("demo")
    assert demo.domain == "demo" and "synthetic fluorescence" in demo.description
    phantom = load_backbone("phantom")
    assert phantom.domain == "demo" and "synthetic CT-like phantom" in phantom.description
    models = catalogue.Path(__file__).parents[1] / "src/napari_attnreg/models"
    for card in ("MODEL_CARD.md", "PHANTOM_MODEL_CARD.md"):
        assert "synthetic" in (models / card).read_text().lower()


def test_catalogue_entry_loads_a_local_weights_file_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(1)
    source = catalogue.build_module(catalogue.find("dino-vits8"))
    path = tmp_path / "dino.safetensors"
    save_file(source.state_dict(), str(path))
    bb = load_backbone("dino-vits8", weights=path)
    same = load_backbone(str(path), arch="dino-vits8")
    assert bb.weights == str(path) and bb.domain == "natural"
    x = torch.randn(1, 3, 64, 48)
    with torch.inference_mode():
        torch.testing.assert_close(cls_attention(bb, x), cls_attention(load_backbone(source), x))
        torch.testing.assert_close(cls_attention(same, x), cls_attention(bb, x))
    with pytest.raises(BackboneError, match="does not match"):
        load_backbone("dinov3-s", weights=path)


def test_transformers_entry_loads_a_saved_folder(tmp_path):
    entry = catalogue.find("rad-dino")
    catalogue.build_module(entry, **small_overrides(entry)).save_pretrained(tmp_path)
    bb = load_backbone("rad-dino", weights=tmp_path / "model.safetensors")
    assert bb.name == "rad-dino" and bb.domain == "radiology" and bb.num_prefix_tokens == 1
    with pytest.raises(BackboneError, match="'dinov2'"):
        load_backbone("phikon", weights=tmp_path)
    single = tmp_path / "elsewhere" / "w.safetensors"
    single.parent.mkdir()
    single.write_bytes(b"")
    with pytest.raises(BackboneError, match="config.json") as info:
        load_backbone("rad-dino", weights=single)
    assert info.value.gui_hint


def _phantom_state() -> dict:
    from safetensors.torch import load_file

    from napari_attnreg.core.models.backbones import DEMO_DIR

    return load_file(str(DEMO_DIR / "phantom_vit.safetensors"))


def _bad_weights(tmp_path, kind: str):
    """A user's weights file for the phantom architecture, damaged as ``kind`` says."""
    from napari_attnreg.core.models.backbones import DEMO_DIR

    path = tmp_path / f"{kind}.safetensors"
    state = _phantom_state()
    if kind == "junk":
        path.write_bytes(b"junk" * 10)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        raw = (DEMO_DIR / "phantom_vit.safetensors").read_bytes()
        path.write_bytes(raw[: len(raw) // 2])
    elif kind == "wrong-shape":
        save_file({**state, "blocks.0.attn.qkv.weight": torch.zeros(3, 3)}, str(path))
    elif kind == "nan":
        qkv = state["blocks.0.attn.qkv.weight"].clone()
        qkv[0, 0] = float("nan")
        save_file({**state, "blocks.0.attn.qkv.weight": qkv}, str(path))
    elif kind == "missing-tensor":
        save_file({k: v for k, v in state.items() if not k.startswith("head.")}, str(path))
    return path


@pytest.mark.parametrize("kind", ["junk", "empty", "truncated", "wrong-shape", "nan",
                                  "missing-tensor"])
def test_a_users_weights_for_a_bundled_architecture_are_loaded_strictly_or_refused(tmp_path, kind):
    path = _bad_weights(tmp_path, kind)
    with pytest.raises(BackboneError, match=str(path).replace("\\", "\\\\")):
        load_backbone(str(path), arch="phantom")
    with pytest.raises(BackboneError, match="phantom|safetensors|empty"):
        load_backbone("phantom", weights=path)


def test_a_device_file_is_not_weights_for_the_demo():
    with pytest.raises(BackboneError, match="/dev/zero is not a regular file"):
        load_backbone("/dev/zero", arch="demo")


def test_a_users_weights_for_a_bundled_architecture_are_what_runs(tmp_path):
    state = {k: v * 1.5 for k, v in _phantom_state().items()}
    path = tmp_path / "mine.safetensors"
    save_file(state, str(path))
    bb = load_backbone(str(path), arch="phantom")
    assert bb.weights == str(path) and not bb.is_random_init
    for key, value in bb.model.state_dict().items():
        assert torch.equal(value, state[key].to(value.dtype)), key

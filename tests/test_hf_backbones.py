"""transformers ViT / DINOv2 / DINOv2-with-registers: fast CLS row against output_attentions."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from attention_reference import assert_peaked, hf_explicit, max_diff, peaked

from napari_attnreg.core.models.attention import cls_attention
from napari_attnreg.core.models.backbones import BackboneError, load_backbone

transformers = pytest.importorskip("transformers")

TINY = {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 64}
FAMILIES = {  # model_type: (config values, prefix tokens)
    "vit": ({"patch_size": 8, "image_size": 64}, 1),
    "dinov2": ({"patch_size": 14, "image_size": 56}, 1),
    "dinov2_with_registers": ({"patch_size": 14, "image_size": 56, "num_register_tokens": 4}, 5),
}


def tiny_model(model_type: str, **extra):
    values, _ = FAMILIES[model_type]
    config = transformers.AutoConfig.for_model(model_type, **TINY, **values, **extra)
    torch.manual_seed(0)
    return peaked(transformers.AutoModel.from_config(config, attn_implementation="eager").eval())


@pytest.mark.parametrize("model_type", list(FAMILIES))
@pytest.mark.parametrize("grid", [(4, 4), (5, 3)])
@pytest.mark.parametrize("layer", [-1, 1])
def test_fast_row_matches_output_attentions(model_type, grid, layer):
    model = tiny_model(model_type)
    bb = load_backbone(model)
    assert bb.adapter.family == "transformers"
    assert bb.num_prefix_tokens == FAMILIES[model_type][1]
    assert (bb.depth, bb.num_heads, bb.embed_dim) == (3, 4, 32)
    ph, pw = bb.patch_size
    x = torch.randn(2, 3, ph * grid[0], pw * grid[1])
    with torch.inference_mode():
        every = cls_attention(bb, x, layer=layer, head="all")
        mean = cls_attention(bb, x, layer=layer, head="mean")
        one = cls_attention(bb, x, layer=layer, head=3)
    slow = hf_explicit(model, x, layer, bb.num_prefix_tokens).reshape(every.shape)
    assert every.shape == (2, 4, *grid)
    assert_peaked(slow)
    assert max_diff(every, slow) <= 1e-5
    assert max_diff(mean, slow.mean(1)) <= 1e-5
    assert max_diff(one, slow[:, 3]) <= 1e-5


def test_task_model_is_reduced_to_its_base_model():
    config = transformers.AutoConfig.for_model("vit", **TINY, **FAMILIES["vit"][0], num_labels=3)
    model = transformers.ViTForImageClassification(config)
    bb = load_backbone(model)
    # the base model of a copy that shares the weights (the caller's model is left as it is)
    assert type(bb.model) is type(model.vit) and bb.model is not model.vit
    own = dict(bb.model.named_parameters())
    assert all(own[n].data_ptr() == p.data_ptr() for n, p in model.vit.named_parameters())
    with torch.inference_mode():
        assert cls_attention(bb, torch.randn(1, 3, 64, 64)).shape == (1, 8, 8)


def test_saved_folder_loads_offline_with_its_image_processor(tmp_path):
    model = tiny_model("dinov2_with_registers")
    model.save_pretrained(tmp_path)
    pre = {"image_mean": [0.53, 0.53, 0.53], "image_std": [0.26, 0.26, 0.26],
           "crop_size": {"height": 42, "width": 42}, "do_center_crop": True}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(pre))
    bb = load_backbone(str(tmp_path))
    assert bb.mean == (0.53, 0.53, 0.53) and bb.std == (0.26, 0.26, 0.26)
    assert bb.input_size == (3, 42, 42)
    assert bb.num_prefix_tokens == 5 and bb.patch_size == (14, 14)
    x = torch.randn(1, 3, 42, 56)
    with torch.inference_mode():
        torch.testing.assert_close(cls_attention(bb, x), cls_attention(load_backbone(model), x))


def test_family_defaults_without_image_processor(tmp_path):
    tiny_model("vit").save_pretrained(tmp_path / "vit")
    tiny_model("dinov2").save_pretrained(tmp_path / "dino")
    assert load_backbone(tmp_path / "vit").mean == (0.5, 0.5, 0.5)
    dino = load_backbone(tmp_path / "dino")
    assert dino.std == (0.229, 0.224, 0.225) and dino.input_size == (3, 56, 56)


def test_unsupported_transformers_model_is_named():
    config = transformers.AutoConfig.for_model("deit", **TINY, patch_size=8, image_size=32)
    with pytest.raises(BackboneError, match="not supported"):
        load_backbone(transformers.AutoModel.from_config(config))


def test_missing_transformers_says_how_to_install(monkeypatch):
    import sys

    from napari_attnreg.core.models import hf_backbones
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails as if not installed
    with pytest.raises(BackboneError, match=r"napari-attnreg\[hf\]"):
        load_backbone("hf:owkin/phikon")
    with pytest.raises(BackboneError, match="transformers"):
        hf_backbones.random_init("vit")


def test_a_folder_with_a_pickled_weights_file_is_refused_in_our_words(tmp_path):
    """Issue #27 item 7: torch's UnpicklingError (which suggests weights_only=False) came out
    as a traceback; the refusal names the folder and file and points to safetensors."""
    import fractions

    from safetensors.torch import load_file

    tiny_model("vit").save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    state["note"] = fractions.Fraction(1, 3)  # not a tensor: weights-only loading refuses it
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(BackboneError) as caught:
        load_backbone(str(tmp_path))
    text = str(caught.value)
    assert str(tmp_path) in text and "pytorch_model.bin" in text and "safetensors" in text
    assert "weights_only" not in text


@pytest.mark.parametrize("model_type", ["vit", "dinov2"])
def test_a_tiled_cpu_run_sizes_its_chunks_for_a_hugging_face_model(model_type):
    """The chunk size of a tiled CPU run came from timm's ``patch_embed``: a Hugging Face
    model (the real DINOv2 article, UNI and the like through transformers) crashed with
    AttributeError unless chunk_size was given."""
    from napari_attnreg.core.run.api import regularize

    bb = load_backbone(tiny_model(model_type))
    image = np.random.default_rng(0).random((150, 150)).astype(np.float32)
    result = regularize(image, bb, tiled=True, n_boot=4, device="cpu")
    assert result.metadata["n_tiles"] > 1 and np.isfinite(result.attention).all()


def test_a_result_of_a_saved_folder_records_the_checksum_of_its_weights(tmp_path):
    """A DINOv2-family encoder given as a save_pretrained folder: its results named the
    folder but held no checksum, so a folder replaced later could not be told apart."""
    import hashlib

    from napari_attnreg import regularize

    tiny_model("dinov2").save_pretrained(tmp_path / "encoder")
    weights = (tmp_path / "encoder" / "model.safetensors").read_bytes()
    image = np.random.default_rng(0).random((56, 56)).astype(np.float32)
    result = regularize(image, load_backbone(str(tmp_path / "encoder")), n_boot=4,
                        device="cpu")
    assert result.metadata["weights"] == str(tmp_path / "encoder")
    assert result.metadata["weights_sha256"] == hashlib.sha256(weights).hexdigest()


def test_a_timm_architecture_named_with_a_transformers_folder_is_not_ignored(tmp_path):
    """--model vit_base_patch16_224 --weights FOLDER loaded the folder's own (ViT-S/14)
    model without a word about the architecture the user named."""
    tiny_model("dinov2").save_pretrained(tmp_path / "encoder")
    folder = str(tmp_path / "encoder")
    for call in (lambda: load_backbone("vit_base_patch16_224", weights=folder),
                 lambda: load_backbone(folder, arch="vit_base_patch16_224")):
        with pytest.raises(BackboneError, match="names its own architecture") as info:
            call()
        assert f"--model {folder}" in str(info.value)
    assert load_backbone(folder).patch_size == (14, 14)  # the folder alone loads

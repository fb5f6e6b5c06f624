"""Loading backbones from every supported source, offline."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import timm
import torch
from safetensors.torch import save_file

from napari_attnreg.core.attention import cls_attention
from napari_attnreg.core.backbones import BackboneError, load_backbone


@pytest.fixture(scope="module")
def reference_module():
    torch.manual_seed(3)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=5).eval()


def _attention(bb, x):
    with torch.inference_mode():
        return cls_attention(bb, x)


@pytest.mark.parametrize("kind", ["safetensors", "pth", "pt", "ckpt-lightning", "ckpt-statedict"])
def test_weights_files_load_offline(tmp_path, reference_module, kind):
    state = {k: v.clone() for k, v in reference_module.state_dict().items()}
    if kind == "safetensors":
        path = tmp_path / "w.safetensors"
        save_file(state, str(path))
    elif kind in ("pth", "pt"):
        path = tmp_path / f"w.{kind}"
        torch.save(state, path)
    elif kind == "ckpt-lightning":  # the paper's checkpoint format: state_dict with a model. prefix
        path = tmp_path / "w.ckpt"
        torch.save({"epoch": 3, "state_dict": {f"model.{k}": v for k, v in state.items()}}, path)
    else:
        path = tmp_path / "w.ckpt"
        torch.save({"state_dict": state}, path)
    bb = load_backbone(str(path), arch="vit_tiny_patch16_224")
    assert bb.weights == str(path)
    x = torch.randn(2, 3, 48, 80)
    torch.testing.assert_close(_attention(bb, x), _attention(load_backbone(reference_module), x))


def test_weights_file_errors(tmp_path, reference_module):
    path = tmp_path / "w.safetensors"
    save_file(reference_module.state_dict(), str(path))
    with pytest.raises(BackboneError, match="arch="):
        load_backbone(path)
    with pytest.raises(BackboneError, match="does not match architecture"):
        load_backbone(path, arch="vit_small_patch16_224")
    with pytest.raises(BackboneError, match="not found"):
        load_backbone(tmp_path / "missing.pth", arch="vit_tiny_patch16_224")


def test_module_facts_come_from_the_model():
    bb = load_backbone("vit_small_patch14_reg4_dinov2", pretrained=False)
    assert bb.patch_size == (14, 14)
    assert bb.num_prefix_tokens == 5
    assert bb.input_size == (3, 518, 518)
    assert bb.is_random_init
    deit = load_backbone("deit_tiny_distilled_patch16_224", pretrained=False)
    assert deit.num_prefix_tokens == 2


def test_rejects_non_vit_and_no_class_token():
    with pytest.raises(BackboneError, match="not a timm ViT"):
        load_backbone(torch.nn.Linear(3, 3))
    module = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1,
                               class_token=False, global_pool="avg")
    with pytest.raises(BackboneError, match="class token"):
        load_backbone(module)
    with pytest.raises(BackboneError, match="does not know"):
        load_backbone("definitely_not_a_model", pretrained=False)


def test_failed_download_names_the_offline_alternative():
    code = (
        "from napari_attnreg.core.backbones import load_backbone, BackboneError\n"
        "try:\n    load_backbone('vit_tiny_patch16_224.augreg_in21k', pretrained=True)\n"
        "except BackboneError as e:\n    print('MSG', e)\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "MSG Could not download" in out.stdout, out.stdout + out.stderr
    assert "arch='vit_tiny_patch16_224'" in out.stdout
    assert "Traceback" not in out.stdout

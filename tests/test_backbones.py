"""Loading backbones from every supported source, offline."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

from napari_attnreg.core.models.attention import cls_attention
from napari_attnreg.core.models.backbones import BackboneError, load_backbone


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
    # a mistyped path without arch: said missing, not "also give arch=", which cannot help
    for name in ("missing.pt", "missing.safetensors"):
        with pytest.raises(BackboneError, match=f"Weights file not found: .*{name}") as err:
            load_backbone(tmp_path / name)
        assert "arch=" not in str(err.value)


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
        "from napari_attnreg.core.models.backbones import load_backbone, BackboneError\n"
        "try:\n    load_backbone('vit_tiny_patch16_224.augreg_in21k', pretrained=True)\n"
        "except BackboneError as e:\n    print('MSG', e)\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "MSG Could not download" in out.stdout, out.stdout + out.stderr
    assert "arch='vit_tiny_patch16_224'" in out.stdout
    assert "Traceback" not in out.stdout


# ---------------------------------------------------------------- shared state (issue 12)
def _state_of(module):
    return {
        "training": module.training,
        "dynamic": getattr(module, "dynamic_img_size", None),
        "flatten": module.patch_embed.flatten,
        "strict": getattr(module.patch_embed, "strict_img_size", None),
        "devices": {p.device.type for p in module.parameters()},
        "values": {k: v.clone() for k, v in module.state_dict().items()},
    }


def _assert_same_state(module, before):
    after = _state_of(module)
    for key in ("training", "dynamic", "flatten", "strict", "devices"):
        assert after[key] == before[key], key
    for name, value in before["values"].items():
        assert torch.equal(after["values"][name], value), name


def test_a_users_module_is_never_changed_by_a_run():
    from napari_attnreg import regularize
    torch.manual_seed(0)
    module = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2).train()
    before = _state_of(module)
    assert before["training"] and not before["dynamic"] and before["flatten"]
    image = torch.rand(40, 56).numpy()
    result = regularize(image, module, n_boot=4, chunk_size=4, device="cpu", target_size=(48, 64))
    assert result.attention.shape == (3, 4)
    _assert_same_state(module, before)
    load_backbone(module)  # the Backbone wraps a copy that shares the weights' memory
    _assert_same_state(module, before)
    with pytest.raises(ValueError, match="not a compute device"):
        regularize(image, module, n_boot=4, device="meta")
    _assert_same_state(module, before)


def test_meta_device_is_refused_and_the_backbone_stays_usable(blob_image, fresh_tiny_backbone):
    from napari_attnreg import regularize
    bb = fresh_tiny_backbone
    for device in ("meta", "bogus", "cpu:3", "cuda:99", 7):
        with pytest.raises(ValueError, match="device"):
            regularize(blob_image, bb, n_boot=4, device=device)
        assert bb.device.type == "cpu"
    assert np.isfinite(regularize(blob_image, bb, n_boot=4, device="cpu").z).all()
    from napari_attnreg.core.models.backbones import resolve_device

    for device in ("meta", "cpu:3", "xla", "", None):  # the core refuses them too
        with pytest.raises(ValueError, match="not a compute device"):
            resolve_device(device)
    assert resolve_device("CPU") == torch.device("cpu")


def test_another_device_gets_one_copy_and_the_model_never_moves(fresh_tiny_backbone):
    import threading

    bb = fresh_tiny_backbone
    original = {k: v.clone() for k, v in bb.model.state_dict().items()}
    assert bb.on("cpu") is bb
    views = []
    threads = [threading.Thread(target=lambda: views.append(bb.on("meta"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(v.model) for v in views}) == 1  # made once, shared by every caller
    assert views[0].device.type == "meta" and views[0].patch_size == bb.patch_size
    assert bb.device.type == "cpu"
    for name, value in bb.model.state_dict().items():
        assert torch.equal(value, original[name])


def test_two_threads_share_one_backbone(blob_image, fresh_tiny_backbone):
    import threading

    from napari_attnreg import regularize
    bb = fresh_tiny_backbone
    expected = regularize(blob_image, bb, n_boot=6, chunk_size=3, device="cpu")
    results, errors = {}, []

    def run(name, image):
        try:
            results[name] = regularize(image, bb, n_boot=6, chunk_size=3, device="cpu")
        except Exception as err:  # noqa: BLE001  reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i, blob_image)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for result in results.values():
        np.testing.assert_array_equal(result.attention, expected.attention)
        np.testing.assert_array_equal(result.p, expected.p)


# ---------------------------------------------------------------- weight files (issue 12)
def test_unreadable_weight_files_say_what_they_are(tmp_path, reference_module):
    good = tmp_path / "good.safetensors"
    save_file(reference_module.state_dict(), str(good))
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    renamed = tmp_path / "notes.safetensors"
    renamed.write_text("these are my notes, not weights")
    renamed_pth = tmp_path / "notes.pth"
    renamed_pth.write_text("these are my notes, not weights")
    for path in (truncated, renamed):
        with pytest.raises(BackboneError, match=r"not a readable \.safetensors file.*truncated"):
            load_backbone(path, arch="vit_tiny_patch16_224")
    with pytest.raises(BackboneError, match="not a readable PyTorch checkpoint"):
        load_backbone(renamed_pth, arch="vit_tiny_patch16_224")
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(good.read_bytes())
    with pytest.raises(BackboneError, match="is a folder.*model.safetensors"):
        load_backbone("vit_tiny_patch16_224", weights=folder)
    with pytest.raises(BackboneError, match="is a folder"):
        load_backbone("uni", weights=folder)
    with pytest.raises(BackboneError, match="'resnet18' is not a ViT-family architecture"):
        load_backbone(good, arch="resnet18")
    with pytest.raises(BackboneError, match="Did you mean 'uni'"):
        load_backbone("unii")


def test_a_pickle_with_code_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    for suffix in (".pth", ".pt", ".ckpt", ".bin"):
        path = tmp_path / f"evil{suffix}"
        torch.save({"state_dict": {"w": torch.zeros(1)}, "x": Payload()}, path)
        with pytest.raises(BackboneError, match="refused"):
            load_backbone(path, arch="vit_tiny_patch16_224")
    assert not marker.exists()


def test_position_embedding_of_a_non_square_grid(tmp_path):
    torch.manual_seed(0)
    trained = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1,
                                img_size=(96, 128), num_classes=0)  # a 6x8 grid
    path = tmp_path / "wide.safetensors"
    save_file(trained.state_dict(), str(path))
    # the default 14x14 model cannot tell 6x8 from 8x6 or 4x12: a clear error
    with pytest.raises(BackboneError, match="48 patch positions.*not a square grid"):
        load_backbone(path, arch="vit_tiny_patch16_224")
    # a model whose grid has the same aspect ratio (12x16) reads it unambiguously
    module = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1,
                               img_size=(192, 256), num_classes=0)
    from napari_attnreg.core.models.backbones import load_timm_state

    state = {k: v.clone() for k, v in trained.state_dict().items()}
    load_timm_state(module, state, path.name, "vit_tiny_patch16_224")
    assert module.pos_embed.shape[1] == 1 + 12 * 16


def test_weights_stored_as_ints_bools_or_float8_load_with_a_warning(tmp_path):
    from safetensors.torch import save_file

    from napari_attnreg.core.models.backbones import read_state_dict

    good = tmp_path / "good.safetensors"
    save_file({"blocks.0.attn.qkv.weight": torch.ones(4, 4),
               "embeddings.position_ids": torch.arange(4)}, str(good))  # an int buffer is fine
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_state_dict(good)
    for dtype in (torch.int64, torch.bool, torch.float8_e4m3fn):
        path = tmp_path / f"{str(dtype).split('.')[-1]}.safetensors"
        save_file({"blocks.0.attn.qkv.weight": torch.ones(4, 4).to(dtype)}, str(path))
        with pytest.warns(UserWarning, match=f"{path.name}.*blocks.0.attn.qkv.weight.*"
                                             f"{str(dtype).split('.')[-1]}"):
            read_state_dict(path)


@pytest.mark.parametrize("arch", ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2"])
def test_a_dinov2_checkpoint_as_meta_releases_it_loads_into_its_timm_arch(tmp_path, arch):
    """Meta's DINOv2 release layout (a training-only mask_token; with registers,
    register_tokens and a class-token row in the position embedding) loads into the timm
    architecture it is, to the same weights, instead of "does not match ... Check --arch"."""
    torch.manual_seed(0)
    timm_state = timm.create_model(arch, pretrained=False).state_dict()
    release = {k: v.clone() for k, v in timm_state.items()}
    release["mask_token"] = torch.zeros(1, release["cls_token"].shape[-1])
    if "reg_token" in release:
        cls_position = torch.randn(1, 1, release["cls_token"].shape[-1])
        release["register_tokens"] = release.pop("reg_token")
        release["pos_embed"] = torch.cat([cls_position, release["pos_embed"]], dim=1)
        release["cls_token"] = release["cls_token"] - cls_position
    path = tmp_path / "dinov2_release.pth"
    torch.save(release, path)
    loaded = load_backbone(str(path), arch=arch).model.state_dict()
    assert sorted(loaded) == sorted(timm_state)
    for key, value in timm_state.items():
        torch.testing.assert_close(loaded[key], value, msg=key)


def test_a_module_prefixed_checkpoint_with_an_epoch_entry_loads(tmp_path, reference_module):
    """torch.save({**model.module.state_dict() named "module.*", "epoch": 7}) as DDP
    training scripts write it: the "epoch" entry kept the "module." prefix on every key and
    the file was refused as the wrong architecture."""
    state = {f"module.{k}": v for k, v in reference_module.state_dict().items()}
    path = tmp_path / "ddp_epoch.pth"
    torch.save({**state, "epoch": 7, "arch": "vit_tiny_patch16_224"}, path)
    loaded = load_backbone(str(path), arch="vit_tiny_patch16_224").model.state_dict()
    for key, value in reference_module.state_dict().items():
        torch.testing.assert_close(loaded[key], value, msg=key)
    torch.save({"epoch": 7, "arch": "vit"}, tmp_path / "no_weights.pth")
    with pytest.raises(BackboneError, match="holds no tensors"):
        load_backbone(str(tmp_path / "no_weights.pth"), arch="vit_tiny_patch16_224")


def test_prefixed_weights_beside_other_tensors_say_what_to_re_save(tmp_path, reference_module):
    """'model.'-named weights beside an extra tensor ("step"): the prefix cannot be
    removed safely; the error said only "Check --arch", though the architecture was right."""
    state = {f"model.{k}": v for k, v in reference_module.state_dict().items()}
    path = tmp_path / "with_step.pth"
    torch.save({**state, "step": torch.tensor(1200)}, path)
    with pytest.raises(BackboneError, match=r"tensors with the prefix 'model\.'") as info:
        load_backbone(str(path), arch="vit_tiny_patch16_224")
    assert "step" in str(info.value) and "Check --arch" not in str(info.value)

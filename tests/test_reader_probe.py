"""napari's question to our reader (``get_reader(path)``, asked of every file dropped on the
viewer) and the file handles a slide holds.

The probe reads a file's tags and description only: before, any ``.tif`` went through the
slide module, which imported torch (1.6 s and some 500 MB) to say "not ours" of a plain
TIFF napari opens itself. A slide's file stays open while its layer or image reads it and
is closed when the last of them is gone; before, every slide opened left an unclosed file
to the garbage collector (a ResourceWarning under ``python -X dev``).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

tifffile = pytest.importorskip("tifffile")
pytest.importorskip("tiffslide")

HEAVY = ("torch", "timm", "matplotlib", "scipy", "skimage", "safetensors")


def _tissue(size: int = 512) -> np.ndarray:
    rng = np.random.default_rng(3)
    img = np.full((size, size, 3), 236, np.uint8)
    img[: size // 2, : size // 2] = (rng.random((size // 2, size // 2, 3)) * 90
                                     + [130, 40, 120]).astype(np.uint8)
    return img


def _svs(path: Path) -> Path:
    img = _tissue()
    description = ("Aperio Image Library v10.0.50\n512x512 [0,0 512x512] (256x256) RAW/RGB"
                   "|AppMag = 40|MPP = 0.25")
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), description=description, photometric="rgb",
                  metadata=None)
        tif.write(img[::8, ::8].copy(), description="Aperio Image Library v10.0.50\nthumb",
                  photometric="rgb", metadata=None)
        tif.write(img[::2, ::2].copy(), tile=(256, 256), photometric="rgb", metadata=None,
                  description=description.replace("512x512", "256x256"))
    return path


def _pyramid(path: Path) -> Path:
    img = _tissue()
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), subifds=1, photometric="rgb", metadata=None)
        tif.write(img[::2, ::2].copy(), tile=(256, 256), subfiletype=1, photometric="rgb",
                  metadata=None)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """{kind: path} of every kind of file napari may ask our reader about."""
    folder = tmp_path_factory.mktemp("probe")
    paths = {"plain tiff": folder / "plain.tif", "tiled tiff": folder / "export.tif",
             "svs": _svs(folder / "slide.svs"), "pyramid": _pyramid(folder / "pyramid.tif"),
             "ome": folder / "cells.ome.tif"}
    tifffile.imwrite(paths["plain tiff"], np.arange(64 * 64, dtype=np.uint16).reshape(64, 64))
    tifffile.imwrite(paths["tiled tiff"], _tissue(), tile=(128, 128), photometric="rgb")
    tifffile.imwrite(paths["ome"], np.zeros((2, 32, 32), np.uint16),
                     metadata={"axes": "CYX"})
    paths["ome pyramid"] = folder / "pyramid.ome.tif"
    with tifffile.TiffWriter(paths["ome pyramid"], ome=True) as tif:
        tif.write(_tissue(), tile=(128, 128), subifds=1, photometric="rgb",
                  metadata={"axes": "YXS", "PhysicalSizeX": 0.5, "PhysicalSizeY": 0.5})
        tif.write(_tissue()[::2, ::2].copy(), tile=(128, 128), subfiletype=1,
                  photometric="rgb")
    if _has_pydicom():
        from test_dicom_wsi import write_level
        from test_io_readers import write_ct_slice

        paths["dicom"] = folder / "ct.dcm"
        write_ct_slice(paths["dicom"], 0.0, 1, np.zeros((8, 8)))
        wsi = folder / "wsi"
        wsi.mkdir()
        write_level(wsi / "level0.dcm", _tissue(), 0.00025, series="1.2.826.0.1.9")
        paths["dicom wsi"] = wsi
    return paths


def _has_pydicom() -> bool:
    try:
        import pydicom
    except ImportError:
        return False
    return int(pydicom.__version__.split(".")[0]) >= 3


#: The reader napari gets for each file: None leaves it to napari's own TIFF reader.
EXPECTED = {"plain tiff": None, "tiled tiff": None, "svs": "read_slide_layers",
            "pyramid": "read_slide_layers", "ome": "read_ome_tiff_layers",
            "ome pyramid": "read_ome_tiff_layers",
            "dicom": "read_dicom_layers", "dicom wsi": "read_dicom_wsi_layers"}


def test_asking_the_reader_about_a_file_imports_no_model_stack(files):
    """The probes in a fresh interpreter, as napari's: which reader each file gets, and what
    had been imported once it was asked."""
    code = ("import json, sys\n"
            "from napari_attnreg._napari.io import get_reader\n"
            "seen = {}\n"
            "for kind, path in json.loads(sys.argv[1]).items():\n"
            "    reader = get_reader(path)\n"
            f"    heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
            "    seen[kind] = [getattr(reader, '__name__', None), heavy]\n"
            "print(json.dumps(seen))\n")
    done = _python(code, json.dumps({kind: str(path) for kind, path in files.items()}))
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {kind: [EXPECTED[kind], []] for kind in files}


def _python(code: str, *args: str, dev: bool = False) -> subprocess.CompletedProcess:
    """``code`` run by a new interpreter that imports this package from where the tests do."""
    import napari_attnreg

    src = str(Path(napari_attnreg.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, *(["-X", "dev"] if dev else []), "-c", code, *args],
                          capture_output=True, text=True, env=env)


def _open_paths() -> list[str]:
    """The files this process holds open (Linux: /proc/self/fd)."""
    fds = Path("/proc/self/fd")
    if not fds.is_dir():
        pytest.skip("needs /proc to list the open files")
    opened = []
    for fd in os.listdir(fds):
        try:
            opened.append(os.readlink(fds / fd))
        except OSError:  # the listing's own descriptor, closed meanwhile
            pass
    return opened


def _held(path: Path) -> int:
    return sum(Path(p) == path.resolve() for p in _open_paths())


@pytest.fixture
def left_to_gc(monkeypatch) -> list[str]:
    """What the garbage collector warned of while the test ran: a file it had to close
    warns from a finalizer, where ``warnings`` filters cannot make it an error."""
    said: list[str] = []
    warnings.simplefilter("always", ResourceWarning)  # pytest restores the filters after

    def hook(unraisable) -> None:
        said.append(f"{unraisable.exc_type.__name__}: {unraisable.exc_value}")

    monkeypatch.setattr(sys, "unraisablehook", hook)
    return said


@pytest.mark.parametrize("kind", ["svs", "pyramid"])
def test_a_slide_closes_its_file_when_nothing_reads_it(files, kind, left_to_gc):
    from napari_attnreg._napari.io import read_slide_layers
    from napari_attnreg.io.slides import open_slide

    path = files[kind]
    want = tifffile.imread(path)
    gc.collect()
    before = _held(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        image = open_slide(path)
        assert _held(path) == before + 1
        np.testing.assert_array_equal(image.read(slice(0, 9), slice(3, 20)), want[:9, 3:20])
        del image
        gc.collect()
        assert _held(path) == before  # closed, not left to the garbage collector

        # napari's layer keeps the arrays alone: they read the file until they are dropped
        [(data, _kwargs, _kind)] = read_slide_layers(str(path))
        gc.collect()
        np.testing.assert_array_equal(np.asarray(data[0][100:110, 200:230]),
                                      want[100:110, 200:230])
        np.testing.assert_array_equal(np.asarray(data[1][5:9, 7:8]), want[::2, ::2][5:9, 7:8])
        assert _held(path) > before
        del data
        gc.collect()
        assert _held(path) == before

        # a level the slide lacks is refused, and its file closed at once
        with pytest.raises(ValueError, match="level 7 does not exist"):
            open_slide(path, level=7)
        assert _held(path) == before
    assert left_to_gc == []


@pytest.mark.parametrize("how", ["open_lazy", "ome layers", "ome level"])
def test_a_tiff_read_on_demand_closes_its_file_when_nothing_reads_it(files, how,
                                                                    left_to_gc):
    """Read through tifffile's zarr store: an image a tiled run reads (``open_lazy``), an
    OME pyramid's napari layers and the level a run of one reads."""
    pytest.importorskip("zarr")
    pytest.importorskip("dask")
    from napari_attnreg._napari.io import read_ome_tiff_layers
    from napari_attnreg.core.run.lazy import open_lazy
    from napari_attnreg.io.ometiff import open_ome_level

    path = files["tiled tiff" if how == "open_lazy" else "ome pyramid"]
    want = tifffile.imread(path)
    gc.collect()
    before = _held(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        if how == "open_lazy":
            image = open_lazy(path)
            array = image.array
        elif how == "ome layers":
            [(levels, _kwargs, _kind)] = read_ome_tiff_layers(str(path))
            image, array = None, levels[0]
        else:
            image = open_ome_level(path, level=0)
            array = image.array
        del image
        gc.collect()
        np.testing.assert_array_equal(np.asarray(array[40:50, 100:120]), want[40:50, 100:120])
        assert _held(path) > before
        del array
        if how == "ome layers":
            del levels
        gc.collect()
        assert _held(path) == before
    assert left_to_gc == []  # closed by us, not by the garbage collector


def test_opening_a_slide_leaves_no_unclosed_file_to_the_garbage_collector(files):
    """As a user saw it: ``python -X dev`` printed 'ResourceWarning: unclosed file' once per
    slide level opened (napari opens each level of a slide)."""
    code = ("import gc, warnings\n"
            "warnings.simplefilter('error', ResourceWarning)\n"
            "from napari_attnreg._napari.io import get_reader\n"
            "from napari_attnreg.io.slides import open_slide\n"
            "import sys\n"
            "for path in sys.argv[1:]:\n"
            "    layers = get_reader(path)(path)\n"
            "    image = open_slide(path)\n"
            "    image.read(slice(0, 4), slice(0, 4))\n"
            "    del layers, image\n"
            "    gc.collect()\n"
            "print('done')\n")
    done = _python(code, str(files["svs"]), str(files["pyramid"]), dev=True)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]
    assert "ResourceWarning" not in done.stderr, done.stderr[-2000:]

"""The intensity window: a CT is analysed through the window a radiologist reads it in.

The stored DICOM window (WindowCenter/WindowWidth) is the default for DICOM files, a CT
preset or an explicit centre/width can be given, percentiles stay what every other image
gets, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.run.config import RunConfig
from napari_attnreg.core.run.engine import prepare_for
from napari_attnreg.core.run.images import scale_intensity
from napari_attnreg.core.run.options import validate_options

pydicom = pytest.importorskip("pydicom")
from test_io_readers import write_ct_slice  # noqa: E402  (needs pydicom)

LUNG = (-600.0, 1500.0)


@pytest.fixture(scope="module")
def demo():
    return load_backbone("demo")


def _hu_slice(seed: int = 0, size: int = 64) -> np.ndarray:
    """Stored values (HU + 1024) of a chest-like slice: air, lung, soft tissue and bone."""
    rng = np.random.default_rng(seed)
    hu = rng.normal(40.0, 20.0, (size, size))
    hu[:, : size // 3] = rng.normal(-850.0, 60.0, (size, size // 3))  # lung
    hu[: size // 8] = -1000.0  # air
    hu[size // 2: size // 2 + 6, size // 2: size // 2 + 6] = 1200.0  # bone
    return np.clip(np.rint(hu + 1024), 0, 4095).astype(np.uint16)


def _windowed(hu: np.ndarray, centre: float, width: float) -> np.ndarray:
    low = centre - width / 2
    return np.clip((hu.astype(np.float64) - low) / width, 0, 1).astype(np.float32)


def _prepared(path, backbone, **options):
    from napari_attnreg.io.readers import read_source

    stack, info = read_source(path)
    config = RunConfig(device="cpu", target_size="native", extra=info.run_extra(),
                       **options).validate()
    plane, _ = stack.read(next(iter(stack.planes())))
    return prepare_for(plane, backbone, config), np.asarray(plane)


def test_a_ct_with_a_stored_lung_window_is_analysed_through_it(tmp_path, demo):
    path = tmp_path / "chest.dcm"
    stored = _hu_slice()
    write_ct_slice(path, 0.0, 1, stored, window=LUNG)
    prepared, hu = _prepared(path, demo)
    np.testing.assert_array_equal(hu, stored.astype(np.int64) - 1024)
    # the model sees the lung window napari shows: lung detail spread out, bone clipped
    np.testing.assert_array_equal(prepared.display, _windowed(hu, *LUNG))
    assert prepared.display[hu > 150].min() == 1.0
    assert not any("window" in n for n in prepared.notes)


def test_the_result_records_and_describes_the_window_used(tmp_path):
    from napari_attnreg import regularize
    from napari_attnreg.core.results.display import run_caption

    path = tmp_path / "chest.dcm"
    write_ct_slice(path, 0.0, 1, _hu_slice(), window=LUNG)
    result = regularize(str(path), model="demo", n_boot=8, seed=0, device="cpu")
    md = result.metadata
    assert md["intensity_window"] == "auto"
    assert md["intensity_scaling"] == {"method": "window", "source": "stored",
                                       "centre": -600.0, "width": 1500.0,
                                       "low": -1350.0, "high": 150.0, "explanation": ""}
    assert "window C -600 W 1500 (the file's)" in run_caption(result)
    assert "window C -600 W 1500 (the file's)" in result.summary()  # the command line's line
    reopened = type(result).load(result.save(tmp_path / "chest.attnreg.npz"))
    assert reopened.metadata["intensity_scaling"] == md["intensity_scaling"]
    # a preset wins over the file's window, and says so
    bone = regularize(str(path), model="demo", n_boot=8, seed=0, device="cpu",
                      intensity_window="bone")
    assert bone.metadata["intensity_scaling"]["source"] == "bone"
    assert "window C 400 W 1800 (bone)" in run_caption(bone)


def test_a_dicom_without_a_window_falls_back_to_percentiles_with_a_note(tmp_path, demo):
    path = tmp_path / "nowindow.dcm"
    stored = _hu_slice()
    write_ct_slice(path, 0.0, 1, stored)
    ds = pydicom.dcmread(path)
    del ds.WindowCenter, ds.WindowWidth
    ds.save_as(path, enforce_file_format=True)
    prepared, hu = _prepared(path, demo)
    np.testing.assert_array_equal(prepared.display, scale_intensity(hu))
    assert any("states no display window" in n for n in prepared.notes)
    from napari_attnreg.core.run.images import IntensityScaling

    assert IntensityScaling.of("auto", {"stored_window": None}).record()["method"] == \
        "percentiles"


def test_an_explicit_window_is_applied_and_values_outside_clip(demo):
    hu = _hu_slice().astype(np.int64) - 1024
    config = RunConfig(device="cpu", target_size="native", intensity_window="40,400").validate()
    assert config.intensity_window == (40.0, 400.0)
    prepared = prepare_for(hu, demo, config)
    np.testing.assert_array_equal(prepared.display, _windowed(hu, 40.0, 400.0))
    assert prepared.display[hu < -160].max() == 0.0 and prepared.display[hu > 240].min() == 1.0
    preset = prepare_for(hu, demo, RunConfig(device="cpu", target_size="native",
                                             intensity_window="Soft-Tissue").validate())
    np.testing.assert_array_equal(preset.display, prepared.display)


def test_images_without_a_stored_window_are_scaled_exactly_as_before(demo):
    rng = np.random.default_rng(3)
    image = rng.integers(0, 4096, (70, 90)).astype(np.uint16)
    config = RunConfig(device="cpu").validate()
    assert config.intensity_window == "auto"
    prepared = prepare_for(image, demo, config)
    explicit = prepare_for(image, demo, RunConfig(device="cpu",
                                                  intensity_window="percentiles").validate())
    np.testing.assert_array_equal(prepared.display, scale_intensity(image, (0.5, 99.8)))
    assert torch_equal(prepared.tensor, explicit.tensor) and not prepared.notes


def torch_equal(a, b) -> bool:
    return bool((a == b).all())


@pytest.mark.parametrize("bad", ["lungs", "-600", "600,0", "600,-5", "a,b", (1.0, float("nan")),
                                 (True, 5), [1, 2, 3]])
def test_a_bad_window_is_refused_with_what_to_give(bad):
    with pytest.raises(ValueError, match=r"intensity_window=.*centre and a width > 0.*-600,1500"):
        validate_options({"intensity_window": bad})


def test_a_window_that_holds_none_of_the_image_says_so():
    # stored values, not Hounsfield units: a CT preset holds none or nearly none of them
    with pytest.raises(ValueError, match="constant through the window.*Hounsfield"):
        scale_intensity(np.arange(3000, 3064).reshape(8, 8), window=(-1350.0, 150.0))
    with pytest.raises(ValueError, match=r"^The image is constant \(every pixel"):
        scale_intensity(np.full((8, 8), 76), window=(-160.0, 240.0))  # a blank scout
    stored = np.full((20, 20), 3000)
    stored[0, :10] = np.arange(10) * 10  # 2.5 % of the pixels inside the window
    with pytest.warns(UserWarning, match="97.5% of the image's pixels lie outside the window"):
        scale_intensity(stored, window=(-1350.0, 150.0))


def test_monochrome1_stored_window_is_the_one_napari_shows(tmp_path, demo):
    from test_io_readers import _monochrome1

    from napari_attnreg.io.dicom import read_dicom

    stored = np.random.default_rng(1).integers(0, 4096, (40, 48)).astype(np.uint16)
    path = tmp_path / "cr.dcm"
    _monochrome1(path, stored, window=(1000.0, 800.0))
    (_, kwargs), = read_dicom(path)
    prepared, values = _prepared(path, demo)
    low, high = kwargs["contrast_limits"]  # the stored window, turned round with the values
    assert (low, high) == pytest.approx((4095 - 1400, 4095 - 600))
    np.testing.assert_array_equal(prepared.display, _windowed(values, (low + high) / 2,
                                                              high - low))


def test_every_slice_of_a_ct_volume_is_windowed_alike(tmp_path):
    from napari_attnreg import regularize_stack
    from napari_attnreg.io.readers import read_source

    folder = tmp_path / "ct"
    folder.mkdir()
    for k in range(3):
        write_ct_slice(folder / f"s{k}.dcm", 2.5 * k, k + 1, _hu_slice(seed=k, size=48),
                       window=LUNG)
    results = regularize_stack(str(folder), model="demo", n_boot=4, seed=0, device="cpu")
    assert len(results) == 3
    assert all(r.metadata["intensity_scaling"]["low"] == -1350.0 for r in results)
    # a region of one value looks alike in every slice (percentiles would follow each
    # slice's own content); the same volume given as an array, without its file, and the
    # window given explicitly, is analysed the same
    stack, _ = read_source(folder)
    again = regularize_stack(np.asarray(stack.data), model="demo", n_boot=4, seed=0,
                             device="cpu", intensity_window=LUNG)
    for mine, theirs in zip(results, again):
        np.testing.assert_array_equal(mine.attention, theirs.attention)


def test_a_tiled_run_is_windowed_as_an_untiled_one(demo):
    from napari_attnreg.core.run.tiled_engine import prepare_tiled

    hu = np.tile(_hu_slice(size=64).astype(np.int64) - 1024, (4, 4))
    config = RunConfig(device="cpu", tiled=True, intensity_window=LUNG).validate()
    tiled = prepare_tiled(hu, demo, config)
    np.testing.assert_array_equal(tiled.display, _windowed(hu, *LUNG))


def test_the_option_reaches_the_command_line_help(capsys):
    from napari_attnreg.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--intensity-window" in out and "WindowCenter" in out


@pytest.mark.parametrize("given", ["stored", "display"])
def test_the_figure_draws_the_image_through_the_window_the_model_saw(tmp_path, demo, given):
    from napari_attnreg import regularize
    from napari_attnreg.core.results.figure import _display

    hu = _hu_slice(size=48).astype(np.int64) - 1024
    result = regularize(hu, model=demo, n_boot=4, seed=0, device="cpu",
                        intensity_window="lung")
    expected = _windowed(hu, *LUNG)
    image = hu if given == "stored" else expected  # napari's layer / the batch's prepared image
    drawn = _display(image, result.metadata["intensity_scaling"])
    np.testing.assert_allclose(drawn, expected, atol=1e-6)


def test_a_ct_storing_several_windows_is_analysed_through_the_one_chosen(tmp_path, demo):
    from napari_attnreg import regularize
    from napari_attnreg.io.dicom import read_dicom

    path = tmp_path / "chest.dcm"
    stored = _hu_slice()
    write_ct_slice(path, 0.0, 1, stored)
    ds = pydicom.dcmread(path)
    ds.WindowCenter, ds.WindowWidth = [40, -600], [400, 1500]
    ds.WindowCenterWidthExplanation = ["MEDIASTINUM", "LUNG"]
    ds.save_as(path, enforce_file_format=True)
    (_, kwargs), = read_dicom(path)
    assert kwargs["contrast_limits"] == pytest.approx((-160.0, 240.0))  # napari: the first
    assert kwargs["metadata"]["dicom"]["windows"] == [[-160.0, 240.0, "MEDIASTINUM"],
                                                      [-1350.0, 150.0, "LUNG"]]
    first, hu = _prepared(path, demo)
    np.testing.assert_array_equal(first.display, _windowed(hu, 40.0, 400.0))
    second, _ = _prepared(path, demo, intensity_window="stored:2")
    np.testing.assert_array_equal(second.display, _windowed(hu, *LUNG))
    result = regularize(str(path), model=demo, n_boot=4, seed=0, device="cpu",
                        intensity_window="stored 2")
    assert result.metadata["intensity_scaling"]["explanation"] == "LUNG"
    assert "window C -600 W 1500 (the file's no. 2: LUNG)" in result.summary()
    with pytest.raises(ValueError, match=r"states 2 display windows \(stored 1: centre 40, "
                                         r"width 400 \(MEDIASTINUM\); stored 2: .*LUNG"):
        _prepared(path, demo, intensity_window="stored 3")


def test_a_negative_centre_is_taken_on_the_command_line_without_an_equals_sign(tmp_path):
    # argparse read '-600,1500' as a flag: "expected one argument"
    from napari_attnreg import AttentionResult
    from napari_attnreg.cli import main

    path = tmp_path / "chest.dcm"
    write_ct_slice(path, 0.0, 1, _hu_slice(size=32))
    out = tmp_path / "out"
    assert main(["run", str(path), "--intensity-window", "-600,1500", "--out", str(out),
                 "--model", "demo", "--n-boot", "4", "--device", "cpu", "--quiet"]) == 0
    result = AttentionResult.load(next(out.glob("*.attnreg.npz")))
    assert result.metadata["intensity_scaling"]["low"] == -1350.0


def test_the_saved_figure_keeps_the_windowed_grey_levels(tmp_path, demo):
    # matplotlib stretched the darkest pixel to black: a lung window's air (0.23) was drawn
    # as black as a bone window's
    import imageio.v3 as iio

    from napari_attnreg import regularize
    from napari_attnreg.core.results.figure import publication_figure

    hu = np.full((48, 48), -1000)
    hu[:, 24:] = 40  # air | soft tissue: 0.233 | 0.927 through a lung window
    hu[10:14, 30:34] = 300
    result = regularize(hu, model=demo, n_boot=4, seed=0, device="cpu", intensity_window="lung",
                        target_size="native")
    # nothing kept: the regularized map is 0 everywhere, one even tint over the image
    path = publication_figure(result, hu, tmp_path / "fig.png", scale=4,
                              thresholds={"rule": "fwer", "p_th": 0.0})
    picture = iio.imread(path)[..., :3].astype(float)
    air, tissue = picture[100, 40].mean(), picture[100, 150].mean()
    assert air > 0.15 * tissue  # never black: the window keeps air a dark grey

"""A fast subset of the validation harness (benchmarks/validate.py).

The harness reads a diagnostic variant of the directional preset (another π0 estimate) from
the directional run's null maps; the first test checks that this equals an engine run with
that option. The others repeat the harness's measurements on a few images with a small B.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from napari_attnreg.core.backbones import load_backbone
from napari_attnreg.core.engine import RunConfig, drain, run_engine
from napari_attnreg.synthetic import make_cell_image

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def validate():
    return _load("validate")


@pytest.fixture(scope="module")
def bb():
    return load_backbone("demo")


def _args(validate, *extra: str):
    return validate.parse_args(["--n-boot", "30", *extra])


def test_a_reading_equals_an_engine_run_with_its_option(validate, bb):
    common = _load("validation_common")
    preset, options = common.READINGS[common.VARIANT]
    sample = make_cell_image([0, 7, 0], size=256, scale=1.0, abnormal=True, hard_negatives=False)
    base = drain(run_engine(sample.image, bb, RunConfig(preset=preset, n_boot=16, seed=3,
                                                        device="cpu", keep_nulls=True)))
    read = common.with_preset(base, preset, **options)
    direct = drain(run_engine(sample.image, bb, RunConfig(preset=preset, n_boot=16, seed=3,
                                                          device="cpu", **options)))
    assert read.preset == preset
    for name in ("attention", "z", "p", "q", "lfdr", "posterior"):
        np.testing.assert_array_equal(getattr(read, name), getattr(direct, name), err_msg=name)
    assert read.pi0 == direct.pi0 and read.thresholds == direct.thresholds
    for rule in ("q", "p", "lfdr", "pi0", "soft", "base"):
        np.testing.assert_array_equal(read.significant(rule), direct.significant(rule))


def test_grey_null_images_are_calibrated_and_model_channel_nulls_are_not(validate, bb):
    cal = validate.calibration(bb, _args(validate, "--n-cal", "4", "--cal-methods", "normal"),
                               cases=("grey",))
    right = cal[("grey", "normal", "directional")]
    wrong = cal[(validate.WRONG, "normal", "directional")]
    assert right["n"] == 4
    assert right["ks"] < 0.1, right
    assert wrong["ks"] > right["ks"] + 0.1, (wrong, right)


def test_directional_default_is_quiet_on_crops_without_decisive_objects(validate, bb):
    crops = validate.crops_without_objects(bb, _args(validate, "--n-crop", "1"))
    for name in validate.CROPS:
        frac_significant = crops[(name, "directional")][0]
        assert frac_significant <= 0.05, (name, crops[(name, "directional")])


@pytest.mark.xfail(strict=True, reason=(
    "known: on this empty crop the white-noise null maps are far more dispersed than the crop's "
    "map, every p+ is small and q+ <= 0.1 keeps 99 % of the tokens (docs/validation.md, 3a)"))
def test_directional_default_is_quiet_on_the_worst_empty_crop(validate, bb):
    image = validate.crop_without_objects(0, 5, "300x300")
    result = drain(run_engine(image, bb, RunConfig(n_boot=30, seed=5, device="cpu")))
    assert result.significant().mean() <= 0.05


def test_localization_better_than_chance(validate, bb):
    loc, _diag = validate.localization(bb, _args(validate, "--n-loc", "2"))
    chance = loc[("chance", "all tokens")][0]
    for preset in ("directional", "paper"):
        assert loc[(preset, "p")][0] > 3 * chance, (preset, loc[(preset, "p")], chance)


def test_report_has_every_section(validate, tmp_path):
    out = tmp_path / "v.md"
    text = validate.main(["--quick", "--out", str(out)])
    assert out.read_text() == text
    assert "`python benchmarks/validate.py --quick --out" in text
    for heading in ("## 1. Null calibration", "## 2. Localization", "## 3. Robustness",
                    "## 4. The paper's noise-ROI simulation", "## 5. Runtime"):
        assert heading in text

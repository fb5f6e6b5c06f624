"""A fast subset of the validation harness (benchmarks/validate.py)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def validate():
    return _load("validate")


@pytest.fixture(scope="module")
def articles():
    return _load("validation_articles")


def test_structured_noise_keeps_grey_levels_and_loses_objects(articles):
    field = articles.ARTICLES["demo"].field(articles.HELD_OUT["fields"], 0, True)
    texture = articles.texture_like(field.image, np.random.default_rng(0))
    np.testing.assert_array_equal(np.sort(texture, axis=None),
                                  np.sort(field.image.astype(np.float32), axis=None))
    # the pixels of the objects are not where they were
    assert np.corrcoef(texture.ravel(), field.image.ravel())[0, 1] < 0.2


def test_mosaic_truth_lies_where_the_objects_were_planted(articles):
    art = articles.ARTICLES["demo"]
    m = articles.mosaic(art, 0, 1024, 2, np.random.default_rng(1))
    assert m.image.shape == m.decisive.shape == (1024, 1024)
    cells = m.decisive.reshape(2, 512, 2, 512).any(axis=(1, 3))
    assert cells.sum() == 2  # two of the four fields hold objects


def test_counting_p_randomized_within_its_step_is_uniform(validate):
    rng = np.random.default_rng(2)
    counts = rng.integers(0, 21, 400)  # exact null: the count is uniform on 0..B
    p = (1 + counts) / 21
    assert validate._ks(p.tolist(), 20) > 0.01
    assert validate._ks((p * 0.2).tolist(), 20) < 1e-6  # a pile-up at small p is caught


def test_noise_inputs_run_every_preset(validate, articles):
    from napari_attnreg.core.models.backbones import load_backbone

    args = validate.parse_args(["--article", "demo", "--n-noise", "2", "--n-boot", "10"])
    bb = load_backbone("demo")
    out = validate.noise_inputs(articles.ARTICLES["demo"], bb, args)
    stepdown = out["all noise inputs|stepdown"]
    assert stepdown["n"] == 4 * 2 and stepdown["ks_map_p"] is not None
    assert all(0 < p <= 1 for p in stepdown["map_p"])
    assert out["grey, resized|paper"]["ks_map_p"] is None  # no map-level p there


def _article_result(report) -> dict:
    """A complete per-article results file of validate.py (every section, every preset)."""
    noise = {"n": 80, "map_p": [], "ks_map_p": 0.4, "ks_tokens": 0.01, "any_sig": 0.05,
             "frac_sig": 0.001}
    crops = {"n": 20, "mean_sig": 0.002, "worst_sig": 0.01, "evidence_half": 0.004,
             "worst_evidence_half": 0.02}
    loc = {"n": 48, "precision": 0.5, "recall": 0.3, "f1": 0.37, "delta_f1": 0.07,
           "delta_ci": [0.02, 0.12]}
    planted = {"objects": 4, "found": 4, "n_tiles": 441, "sig_tokens": 9, "seconds": 3.0,
               "object_tiles": 18, "object_tiles_sig": 4, "empty_tiles": 423,
               "empty_tiles_sig": 2, "under_top_patch": 4, "mosaics": 1, "recall": 1.0,
               "recall_ci": [0.4, 1.0]}
    tnoise = {"n": 10, "any_sig": 0.0, "tile_p_ks": 0.3, "n_tile_p": 4410, "tile_p_min": 0.004}
    presets = ("stepdown", "directional", "paper")
    result = {
        "article": "demo", "description": "test", "model": "demo", "n_boot": 100,
        "n_boot_tiled": 200, "seconds": 60.0, "source": "abc", "argv": ["--article", "demo"],
        "noise": {f"{case}|{p}": noise for case in report.CASES for p in presets},
        "texture": {p: noise for p in presets}, "crops": {p: crops for p in presets},
        "localization": {**{p: loc for p in presets}, "otsu": {"precision": 0.8, "recall": 0.2,
                                                               "f1": 0.3}},
        "tiled": {**{f"planted|{p}": planted for p in presets},
                  **{f"noise|{p}": tnoise for p in presets}},
        "simulation": {p: {"d": 0.2, "d_err": 0.1, "n": 8} for p in presets},
        "runtime_median_s": {p: 1.0 for p in presets},
    }
    return result


def test_requirements_and_report_from_results(tmp_path):
    report = _load("validation_report")
    result = _article_result(report)
    assert all(ok for _what, ok, _numbers in report.requirements(result))
    worse = json.loads(json.dumps(result))
    worse["crops"]["stepdown"]["worst_sig"] = 0.2
    failed = [what for what, ok, _ in report.requirements(worse) if not ok]
    assert failed == ["empty crops: ≤ 5 % in the worst crop"]
    missed = json.loads(json.dumps(result))
    missed["tiled"]["planted|stepdown"]["found"] = 3  # one of four planted objects missed
    failed = [(what, numbers) for what, ok, numbers in report.requirements(missed) if not ok]
    assert failed == [("tiled mosaics: every planted object found",
                       "3/4 objects in 1 mosaic (recall 100.0 %, 95 % CI 40.0 %–100.0 %); 4 lie "
                       "under the most attended patch of one of their tiles")]
    (tmp_path / "validation_demo.json").write_text(json.dumps(result))
    text = report.write_report(tmp_path, tmp_path / "v.md", explanations="Why: because.")
    for heading in ("## The three presets on the attention map: summary", "Why: because.", "### Step-down requirements",
                    "### Noise inputs given as images", "### Structured noise",
                    "### Crops without decisive objects", "### Planted objects: localization",
                    "### Tiled mosaics", "### The paper's noise-ROI simulation"):
        assert heading in text, heading
    assert "**not met**" not in text


def test_report_renders_a_dinov2_result_without_tiled_or_simulation_sections(tmp_path):
    """validate.py --article dinov2 runs noise, texture, crops and localization only."""
    report = _load("validation_report")
    demo = _article_result(report)
    dinov2 = {k: v for k, v in _article_result(report).items()
              if k not in ("tiled", "simulation", "n_boot_tiled")}
    dinov2.update(article="dinov2", description="real", argv=["--article", "dinov2"])
    checked = [what for what, _ok, _numbers in report.requirements(dinov2)]
    assert checked and not any(what.startswith("tiled") for what in checked)
    (tmp_path / "validation_demo.json").write_text(json.dumps(demo))
    (tmp_path / "validation_dinov2.json").write_text(json.dumps(dinov2))
    text = report.write_report(tmp_path, tmp_path / "v.md", explanations="")
    section = text[text.index("## Article `dinov2`"):]
    assert "### Planted objects: localization" in section
    assert "### Tiled mosaics" not in section and "noise-ROI simulation" not in section
    assert "| dinov2 | stepdown |" in text and "not run (no tiled section)" in text
    assert text.count("### Tiled mosaics") == 1  # the demo article keeps its own


def _maps_row(noise_hits: int, n_noise: int, crops: list, loc: list) -> dict:
    """A row of validate_maps.py's results made by its own summary of per-image records."""
    maps = _load("validate_maps")
    raw = {"noise": [[k % 4, k // 4, k < noise_hits, (k + 0.5) / n_noise]
                     for k in range(n_noise)],
           "crops": crops, "localization": loc}
    return {**maps.summarize(raw, 100), "raw": raw, "seconds": 1.0}


def test_maps_table_gives_every_row_its_verdict_or_why_it_was_not_run(tmp_path):
    report = _load("validation_report")
    quiet = _maps_row(2, 80, [[0, 0.0, 0.0], [1, 0.004, 0.0]],
                      [[i, 0.5, 0.2, True, True, 1, 1] for i in range(6)])
    noisy = _maps_row(40, 80, [[0, 0.2, 0.3]], [[0, 0.1, 0.4, False, True, 0, 1]])
    assert quiet["noise"]["all"]["any_sig"]["k"] == 2 and quiet["crops"]["n"] == 2
    assert quiet["localization"]["delta_ci"][0] > 0  # F1 0.5 against Otsu's 0.2 every time
    data = {"articles": {"demo": {
        "description": "test", "model": "demo", "n_boot": 100, "class_target": "predicted",
        "planned": {"noise": 80, "crops": 2, "localization": 6}, "source": "abc",
        "argv": ["--article", "demo"],
        "rows": {"attention|stepdown": quiet, "cdam|stepdown": noisy,
                 "heads|stepdown": {"not_run": "out of time"}}}}}
    (tmp_path / "validation_maps_cpu.json").write_text(json.dumps(data))
    text = report.write_report(tmp_path, tmp_path / "v.md", maps_notes="Maps: why.")
    table = text[:text.index("Noise inputs by case")]
    lines = {tuple(line.split(" | ")[1:3]): line for line in table.splitlines()
             if line.startswith("| demo |")}
    assert lines[("attention", "stepdown")].endswith("| all met |")
    assert "2/80 = 2.5 % [0.3 %–8.7 %]" in lines[("attention", "stepdown")]
    assert "**not met:** noise 50 % > 10 %" in lines[("cdam", "stepdown")]
    assert "F1 below Otsu" not in lines[("cdam", "stepdown")]  # one image: no interval
    assert "1 images: too few for an interval" in lines[("cdam", "stepdown")]
    assert "not run (out of time)" in lines[("heads", "stepdown")]
    assert "not run" in lines[("rollout", "stepdown")]  # a row the file lacks
    assert "Maps: why." in text and "| dinov2 | attention | stepdown | not run" in text


class _TiledResult:
    """What the tiled section reads of a result: a 4 × 4 patch grid of 2 px patches, 2 tiles."""

    def __init__(self, step_tokens, significant):
        self.null_summary = {"stepdown_step_token": np.asarray(step_tokens)}
        self._sig = np.asarray(significant, bool).reshape(4, 4)

    def significant(self):
        return self._sig

    def to_pixels(self, grid):
        return np.kron(np.asarray(grid), np.ones((2, 2), int)).astype(bool)


def test_objects_under_a_tiles_most_attended_patch_are_counted(validate):
    labels = np.zeros((8, 8), int)
    labels[0:2, 0:2] = 1  # under patch 0
    labels[6:8, 6:8] = 2  # under patch 15
    labels[4:6, 0:2] = 3  # under patch 8
    # tile 0 attends most to patch 0, tile 1 to patch 9: objects 2 and 3 are never first
    r = _TiledResult([[0, 15, 1], [9, 8, 10]], np.zeros(16))
    assert validate._under_top_patch(r, labels, 3) == 1
    r = _TiledResult([[0, 15, 1], [8, 9, 10]], np.zeros(16))
    assert validate._under_top_patch(r, labels, 3) == 2


def test_planted_mosaic_totals_carry_the_recall_interval(validate):
    rows = [{"objects": 4, "found": 1, "n_tiles": 441, "sig_tokens": 30, "seconds": 5.0,
             "under_top_patch": 3},
            {"objects": 5, "found": 4, "n_tiles": 441, "sig_tokens": 40, "seconds": 6.0,
             "under_top_patch": 5}]
    total = validate._sum_rows(rows)
    assert (total["objects"], total["found"], total["under_top_patch"]) == (9, 5, 8)
    assert total["mosaics"] == 2 and total["n_tiles"] == 441 and total["per_mosaic"] == rows
    lo, hi = total["recall_ci"]
    assert total["recall"] == 5 / 9 and lo < 5 / 9 < hi
    # Clopper–Pearson for 5 of 9
    assert abs(lo - 0.2120) < 1e-3 and abs(hi - 0.8630) < 1e-3


def test_phantom_patch_kinds_tell_anatomy_edges_from_organ_interiors(articles):
    # labels: 0 air, 2 abdomen, 3 liver; four patches side by side
    coverage = {0: np.array([[1.0, 0.5, 0.0, 0.01]]),
                2: np.array([[0.0, 0.5, 0.6, 0.99]]),
                3: np.array([[0.0, 0.0, 0.4, 0.0]])}
    kinds = articles.ARTICLES["phantom"].kinds(coverage)
    # a 1 % sliver of air is resampling, not the body outline
    assert kinds.tolist() == [["air", "body outline", "boundary of two tissues",
                               "inside one tissue"]]


def test_empty_crop_regions_match_the_crop(articles):
    art = articles.ARTICLES["phantom"]
    crop, labels = art.empty_crop(3, 200), art.empty_crop_regions(3, 200)
    assert crop.shape == labels.shape == (200, 200)
    assert np.all(crop[labels == 0] < -500)  # air is air in Hounsfield units


def test_report_says_where_significant_crop_patches_lie():
    report = _load("validation_report")
    crops = {"patch_kinds": {"air": 50, "inside one tissue": 30, "boundary of two tissues": 20},
             "significant_kinds": {"boundary of two tissues": 3, "inside one tissue": 1}}
    line = report._kinds(crops)
    assert line.startswith("Where the step-down's 4 significant patches")
    assert line.index("boundary of two tissues 3 (75.0 %; 20.0 % of all patches)") < line.index(
        "inside one tissue 1") < line.index("air 0 (0.0 %; 50.0 % of all patches)")
    assert report._kinds({**crops, "significant_kinds": {}}).endswith("no significant patch "
                                                                      "on any empty crop.")
    assert report._kinds({}) is None  # results from before the kinds were recorded


def test_first_step_ranks_count_every_input_once():
    ranks = _load("noise_ranks").first_step_ranks("demo", "grey", n=3, n_boot=4, stream=999)
    assert sum(ranks["rank_counts"]) == 3 and len(ranks["rank_counts"]) == 5
    # at B = 4 no counting p reaches 1 - e^-0.1: nothing can be significant at step one
    assert ranks["first_step_expected"] == 0.0 and ranks["first_step_rate"] == 0.0
    assert 0.0 <= ranks["chi2_p"] <= 1.0


def test_dinov2_composites_and_crops_are_real_images_with_their_masks(articles):
    """The dinov2 article's generators need no model: shapes, dtypes and ground truth."""
    real = _load("validation_real")
    art = articles.ARTICLES["dinov2"]
    for i in range(len(real.HOSTS)):
        with_object = art.field(articles.HELD_OUT["fields"], i, True)
        host = art.field(articles.HELD_OUT["fields"], i, False)
        assert with_object.image.dtype == np.uint8
        assert with_object.image.shape == host.image.shape
        assert with_object.decisive.shape == with_object.image.shape[:2]
        assert not host.decisive.any() and 0.02 < with_object.decisive.mean() < 0.25
        # the image differs from its host only where the object was pasted
        changed = np.any(np.atleast_3d(with_object.image != host.image), axis=-1)
        assert changed.any() and not changed[~with_object.decisive].any()
    assert {kind[0][0].split()[0] for kind in real.objects()} == {"coin", "cell", "cat's"}
    for i in range(len(real.EMPTY) + 3):  # every hand-picked region, then sub-crops
        crop, labels = art.empty_crop(i, 0), art.empty_crop_regions(i, 0)
        assert labels.shape == crop.shape[:2] and crop.size and np.unique(labels).size == 1
        assert art.kinds({int(labels[0, 0]): np.ones((2, 3))})[0, 0] == \
            real.EMPTY[i % len(real.EMPTY)].name
    assert art.sections == ("noise", "texture", "crops", "localization")


def test_structured_noise_of_an_rgb_image_keeps_each_channel(articles):
    rgb = articles.ARTICLES["dinov2"].field(articles.HELD_OUT["texture"], 0, False).image
    texture = articles.texture_like(rgb, np.random.default_rng(0))
    assert texture.shape == rgb.shape
    for c in range(3):
        np.testing.assert_array_equal(np.sort(texture[..., c], axis=None),
                                      np.sort(rgb[..., c].astype(np.float32), axis=None))


def test_pointing_game_takes_the_most_significant_patch(validate):
    common = _load("validation_common")

    class Result:  # the three things the pointing game reads of a result
        p = np.array([[0.01, 0.01], [0.5, 0.02]])
        attention = np.array([[0.1, 0.3], [0.4, 0.2]])

        def __init__(self, sig):
            self._sig = np.array(sig)

        def significant(self):
            return self._sig

        def to_pixels(self, tokens):
            return np.kron(tokens, np.ones((2, 2), bool))

    # equal p: the more attended patch wins; a patch that is not significant never does
    top = common.most_significant(Result([[True, True], [True, True]]))
    assert top.tolist() == [[False, True], [False, False]]
    assert common.most_significant(Result([[False, False], [False, False]])) is None
    on_right = np.zeros((4, 4), bool)
    on_right[:2, 2:] = True
    r = Result([[True, True], [False, False]])
    assert validate._on_object(r, common.most_significant(r), on_right)
    assert validate._objects_found(r, on_right) == (1, 1)
    assert not validate._on_object(r, None, on_right)


@pytest.mark.real_model
def test_dinov2_localization_runs_on_the_real_article(validate, articles):
    """A one-composite localization on the real model (skips without the article)."""
    from napari_attnreg.testing import real_article

    try:
        bb = real_article.load(device="cpu")
    except (real_article.ArticleUnavailable, ImportError) as err:
        pytest.skip(f"the real test article cannot be built here: {err}")
    args = validate.parse_args(["--article", "dinov2", "--n-loc", "1", "--n-boot", "10",
                                "--presets", "stepdown"])
    out = validate.localization(articles.ARTICLES["dinov2"], bb, args)
    assert out["stepdown"]["n"] == 1 and 0 <= out["stepdown"]["pointing"] <= 1
    assert out["stepdown"]["objects"] == 1
    assert 0 <= out["otsu"]["pointing_top_attention"] <= 1

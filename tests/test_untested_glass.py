"""Glass a tiled run's tissue mask leaves out is "not measured" (NaN), never "p = 1".

A tiled run with a tissue mask runs and tests only its tissue tiles. The tokens no tissue
tile holds were never run: their p, q, lfdr and posterior (step-down: step p, adjusted p,
evidence) are NaN in memory, in the result file and in every map a front end shows or saves,
so no reader counts them as tested and not significant; attention and z hold 0 there as a
fill. Files of earlier versions (glass p = 1) open and show as they did.

Small images, the demo model and four bootstrap draws: each run is about a second on a CPU.
"""

from __future__ import annotations

import functools
import json
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

from napari_attnreg import regularize
from napari_attnreg.core.results.display import (
    MAPS_BY_KEY,
    describe_pixel,
    significance_caption,
    tissue_tokens,
)
from napari_attnreg.core.results.patch_report import patch_report
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.results.result_file import ResultFileError

LEGACY = Path(__file__).parent / "data" / "legacy_results"
PRESETS = ("stepdown", "directional", "paper")
FAST = {"n_boot": 4, "seed": 0, "device": "cpu"}


def _image() -> tuple[np.ndarray, np.ndarray]:
    """A 256² grey image and its tissue: the top-left quarter (three of nine tiles run)."""
    rng = np.random.default_rng(0)
    image = rng.random((256, 256)).astype(np.float32)
    mask = np.zeros((256, 256), bool)
    mask[:128, :128] = True
    return image, mask


@functools.cache
def _run(preset: str) -> AttentionResult:
    image, mask = _image()
    return regularize(image, "demo", tiled=True, tissue_mask=mask, preset=preset, **FAST)


def _probabilities(result: AttentionResult) -> list[str]:
    return list(result.procedure.probability_maps())


@pytest.mark.parametrize("preset", PRESETS)
def test_glass_statistics_are_nan_and_the_tissue_is_tested(preset):
    result = _run(preset)
    tested = tissue_tokens(result)
    assert tested is not None and 0 < tested.sum() < tested.size
    for name in _probabilities(result):
        values = result.maps[name]
        assert np.isnan(values[~tested]).all(), name  # glass: not measured
        assert np.isfinite(values[tested]).all(), name  # tissue: every token tested
    # attention and z are a fill of 0 there (documented), never NaN
    assert (result.attention[~tested] == 0).all() and (result.z[~tested] == 0).all()


@pytest.mark.parametrize("preset", PRESETS)
def test_no_rule_keeps_glass_and_counts_are_of_tissue_patches(preset):
    result = _run(preset)
    tested = tissue_tokens(result)
    for rule in result.procedure.rules:
        assert not result.significant(rule)[~tested].any(), rule
        assert (result.regularized(rule)[~tested] == 0).all(), rule
    n = int(tested.sum())
    assert f"/{n} tissue patches significant" in significance_caption(result)
    # the one-line summary counts as the captions do (it said /1024 patches)
    assert f"/{n} tissue patches significant" in result.summary(diagnostics=False)


def test_the_paper_base_rule_keeps_no_glass():
    """Glass held z = 0 and p = 1: the z ≥ 0 "base" rule called it significant."""
    result = _run("paper")
    tested = tissue_tokens(result)
    kept = result.significant("base")
    assert kept.sum() <= tested.sum() and not kept[~tested].any()


@pytest.mark.parametrize("preset", ["stepdown", "paper"])
def test_a_saved_masked_result_reopens_with_its_nan_glass(preset, tmp_path):
    result = _run(preset)
    loaded = AttentionResult.load(result.save(tmp_path / "r.npz"))
    assert loaded == result  # NaN where the original has NaN
    tested = tissue_tokens(loaded)
    for name in _probabilities(loaded):
        assert np.isnan(loaded.maps[name][~tested]).all()


def _edited(path: Path, out: Path, *, maps: dict | None = None,
            summary: dict | None = None) -> Path:
    """A copy of result file ``path`` with members replaced (a damaged or edited file)."""
    with zipfile.ZipFile(path) as src:
        members = {n[:-4]: np.load(src.open(n)) for n in src.namelist()}
    for name, value in {**(maps or {}),
                        **{f"null_summary__{k}": v for k, v in (summary or {}).items()}}.items():
        members[name] = value
    np.savez_compressed(out, **members)
    return out


def test_the_file_reader_accepts_nan_on_glass_only(tmp_path):
    result = _run("paper")
    saved = result.save(tmp_path / "r.npz")
    tested = tissue_tokens(result)
    i, j = np.argwhere(tested)[0]
    # NaN at a tested tissue token: a damaged file
    p = np.array(result.maps["p"])
    p[i, j] = np.nan
    with pytest.raises(ResultFileError, match="the p map has 1 values outside"):
        AttentionResult.load(_edited(saved, tmp_path / "nan_tissue.npz", maps={"p": p}))
    # the records say every tile was run: the glass NaNs are no longer accounted for
    everything = np.ones_like(result.null_summary["tissue_tiles"])
    with pytest.raises(ResultFileError, match="outside \\[0, 1\\] or NaN"):
        AttentionResult.load(_edited(saved, tmp_path / "all_tiles.npz",
                                     summary={"tissue_tiles": everything}))


def test_the_file_reader_refuses_nan_when_the_tile_records_are_gone(tmp_path):
    result = _run("stepdown")
    saved = result.save(tmp_path / "r.npz")
    with zipfile.ZipFile(saved) as src:
        members = {n[:-4]: np.load(src.open(n)) for n in src.namelist()}
    header = json.loads(members["metadata_json"].tobytes().decode())
    del header["metadata"]["tile_origins_y"]  # an edited header: glass cannot be derived
    members["metadata_json"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    np.savez_compressed(tmp_path / "edited.npz", **members)
    with pytest.raises(ResultFileError, match="NaN; the file is damaged"):
        AttentionResult.load(tmp_path / "edited.npz")


def test_significance_and_evidence_maps_leave_glass_empty_with_sane_limits():
    for preset in ("stepdown", "directional"):
        result = _run(preset)
        tested = tissue_tokens(result)
        shown = MAPS_BY_KEY["pvalue"].values(result)
        assert np.isnan(shown[~tested]).all() and np.isfinite(shown[tested]).all()
        low, high = MAPS_BY_KEY["pvalue"].limits(result)
        # the top of the scale is the most significant tissue patch (NaN made it 1)
        assert (low, high) == (0.0, max(1.0, float(shown[tested].max())))
        assert np.isnan(MAPS_BY_KEY["posterior"].values(result)[~tested]).all()


def test_the_pvalue_limits_follow_the_tissue_not_the_nan():
    result = _run("directional")
    tested = tissue_tokens(result)
    top = float(MAPS_BY_KEY["pvalue"].values(result)[tested].max())
    assert top > 1.0  # this run has a patch below p = 0.1: the scale must reach it
    assert MAPS_BY_KEY["pvalue"].limits(result)[1] == top


def test_inspectors_say_glass_was_not_tested():
    for preset in ("stepdown", "paper"):
        result = _run(preset)
        tested = tissue_tokens(result)
        sy, sx = result.token_scale
        i, j = np.argwhere(~tested)[-1]
        row, col = (i + 0.5) * sy, (j + 0.5) * sx
        assert "not tested: glass outside the tissue mask" in describe_pixel(result, row, col)
        report = patch_report(result, row, col)
        assert not report.tested and not report.significant and report.values == ()
        assert "not tested" in report.headline and "glass" in report.text()
        ti, tj = np.argwhere(tested)[0]
        inside = patch_report(result, (ti + 0.5) * sy, (tj + 0.5) * sx)
        assert inside.tested and "nan" not in inside.text()


def test_roi_mean_evidence_is_over_the_tested_patches():
    from napari_attnreg.core.stats.roi import roi_table

    result = _run("paper")
    tested = tissue_tokens(result)
    labels = np.ones(result.image_shape, np.int32)  # one ROI: the whole image, glass too
    [row] = roi_table(result, labels)
    assert row["mean_posterior"] == pytest.approx(float(result.evidence[tested].mean()))


def test_the_batch_summary_counts_the_share_of_tissue_patches(tmp_path):
    from napari_attnreg.batch.items import BatchItem
    from napari_attnreg.batch.summary import result_row

    result = _run("paper")
    tested = tissue_tokens(result)
    row = result_row(BatchItem(Path("slide.tif"), Path("slide.tif")), None,
                     tmp_path / "r.npz", result, 1.0, "done")
    sig = result.significant()
    assert int(row["tokens_significant"]) == int(sig.sum()) > 0
    assert float(row["fraction_significant"]) == pytest.approx(sig.sum() / tested.sum())


def test_saved_map_layers_hold_nan_on_glass(tmp_path):
    pytest.importorskip("tifffile")
    import tifffile

    from napari_attnreg._napari.io import read_result_layers
    from napari_attnreg.io.export import save_outputs

    result = _run("directional")
    tested = tissue_tokens(result)
    layers = read_result_layers(str(result.save(tmp_path / "r.attnreg.npz")))
    by_kind = {kwargs["metadata"]["attnreg"]["kind"]: (data, kwargs)
               for data, kwargs, _ in layers if "attnreg" in kwargs.get("metadata", {})}
    for kind in ("pvalue", "posterior"):
        data, kwargs = by_kind[kind]
        assert np.isnan(data[~tested]).all() and np.isfinite(data[tested]).all()
        low, high = kwargs["contrast_limits"]
        assert np.isfinite([low, high]).all() and high > low
    written = save_outputs(tmp_path / "maps", [lay for lay in layers if lay[2] == "image"])
    [ptif] = [p for p in written if "log10" in p.name]
    on_disk = tifffile.imread(ptif)
    assert np.isnan(on_disk[~tested]).all() and np.isfinite(on_disk[tested]).all()


@pytest.mark.gui
def test_napari_shows_a_nan_significance_layer_without_warnings(tmp_path, make_napari_viewer):
    from napari_attnreg._napari.io import read_result_layers

    result = _run("directional")
    layers = read_result_layers(str(result.save(tmp_path / "r.attnreg.npz")))
    viewer = make_napari_viewer()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for data, kwargs, kind in layers:
            getattr(viewer, f"add_{kind}")(data, **kwargs)
    [layer] = [lay for lay in viewer.layers if "log10" in lay.name]
    assert np.isfinite(layer.contrast_limits).all() and layer.contrast_limits[1] > 1.0


# ---- files of earlier versions: glass p = 1, read as not measured -----------------------------

@pytest.mark.parametrize("preset", ["stepdown", "paper"])
def test_a_file_with_glass_p1_reads_its_glass_as_not_measured(preset):
    """tests/data/legacy_results/glass_p1_*.npz were written at commit 3a55ee3
    (make_glass_p1_results.py), when glass held p = q = lfdr = 1 and posterior 0: reopened
    then, the paper preset's ``base`` rule marked all that glass significant. Glass now reads
    as not measured; the tissue's values and selections are those the file holds."""
    result = AttentionResult.load(LEGACY / f"glass_p1_{preset}.npz")
    expected = np.load(LEGACY / "glass_p1_expected.npz")
    tested = tissue_tokens(result)
    assert 0 < tested.sum() < tested.size
    for name in result.procedure.probability_maps():
        values = result.maps[name]
        assert np.isnan(values[~tested]).all() and np.isfinite(values[tested]).all()
    with np.load(LEGACY / f"glass_p1_{preset}.npz") as raw:  # the tissue as written
        stored = {k: raw[k] for k in raw.files}
    for name in result.procedure.probability_maps():
        np.testing.assert_array_equal(result.maps[name][tested], stored[name][tested])
    for rule in result.procedure.rules:
        got = result.significant(rule)
        assert not got[~tested].any(), rule  # glass is never significant
        if rule != "pi0":  # its percentile is now of the tissue alone (as a new run's)
            np.testing.assert_array_equal(
                got[tested], expected[f"{preset}__significant__{rule}"][tested])
    if preset == "paper":  # the fault this fixes: base kept every glass token
        assert expected["paper__significant__base"][~tested].all()
    assert "tissue patches" in significance_caption(result)


def test_the_broad_outline_warning_weighs_the_tissue_patches():
    """An outline over all the tissue of a slide that is mostly glass is broad: its share was
    taken over every token, glass included, and the warning did not fire."""
    from dataclasses import replace

    from napari_attnreg.core.results.display import diagnostics_lines

    image, _ = _image()
    mask = np.zeros((256, 256), bool)
    mask[:60, :60] = True  # one tile of nine: three quarters of the grid is glass
    result = regularize(image, "demo", tiled=True, tissue_mask=mask, preset="directional",
                        **FAST)
    tested = tissue_tokens(result)
    assert tested.mean() < 0.5
    q = np.where(tested, 0.0, np.nan)  # every tissue patch significant at q ≤ 0.1
    everywhere = replace(result, maps={**result.maps, "q": q})
    assert everywhere.significant()[tested].all()
    assert any("significant outline covers 100 % of the patches" in line
               for line in diagnostics_lines(everywhere))


def test_the_broad_posterior_diagnostic_weighs_the_tested_patches():
    """A run's posterior ≥ 0.5 on all its tissue of a mostly-glass slide: the share counted
    the glass (NaN) as patches below 0.5, and the warning did not fire."""
    from napari_attnreg.core.stats.diagnostics import diagnose

    posterior = np.full(100, np.nan)
    posterior[:30] = 0.9  # 30 tissue patches, 70 glass
    # (a map with some spread: a flat one is named flat_map instead, not by its symptoms)
    found = diagnose(np.linspace(0.005, 0.015, 100), pi0=0.5, lfdr_fit="grenander",
                     posterior=posterior, random_init=False, model_name="demo")
    [broad] = [d for d in found if d.code == "broad_posterior"]
    assert "on 100 % of the patches" in broad.message


def test_roi_measures_leave_glass_out_inside_and_outside():
    """Glass counted outside an ROI (attention 0, never significant) inflated the attention
    enrichment (3.16 instead of 1.89 on this image) and moved the odds ratio."""
    from napari_attnreg.core.stats.roi import NOT_TESTED, roi_table, roi_tokens

    result = _run("paper")
    tested = tissue_tokens(result)
    labels = np.zeros(result.image_shape, np.int32)
    labels[:64, :64] = 1  # on the tissue
    labels[-40:, -40:] = 2  # on the glass alone
    tissue_roi, glass_roi = roi_table(result, labels)
    member = roi_tokens(result, labels == 1)
    inside, outside = result.attention[member], result.attention[tested & ~member]
    assert tissue_roi["n_tokens"] == int(member.sum())
    assert tissue_roi["attention_enrichment"] == pytest.approx(inside.mean() / outside.mean())
    sig = result.significant()
    assert tissue_roi["frac_significant"] == pytest.approx(sig[member].mean())
    assert glass_roi["n_tokens"] == 0 and glass_roi["enrichment_test_note"] == NOT_TESTED
    assert np.isnan(glass_roi["mean_attention"]) and np.isnan(glass_roi["odds_ratio"])


def test_the_tested_tokens_are_the_union_of_the_run_tiles():
    from napari_attnreg.core.results.tissue_grid import tissue_token_grid

    rng = np.random.default_rng(3)
    ys, xs = [0, 12, 24, 30], [0, 12, 20]  # overlapping, the last tiles flush with the edge
    md = {"tile_origins_y": [8 * y for y in ys], "tile_origins_x": [8 * x for x in xs],
          "tile_shape": [128, 128]}
    for _ in range(20):
        tiles = rng.random(12) < 0.4
        union = np.zeros((46, 36), bool)
        for k in np.flatnonzero(tiles):
            y, x = ys[k // 3], xs[k % 3]
            union[y:y + 16, x:x + 16] = True
        np.testing.assert_array_equal(tissue_token_grid(tiles, md, (8, 8), (46, 36)), union)
    tiles = np.ones(12, bool)
    # records that are not this grid's describe no tested tokens (the reader refuses NaN)
    assert tissue_token_grid(tiles[:11], md, (8, 8), (46, 36)) is None
    assert tissue_token_grid(tiles, {**md, "tile_origins_y": [0, 96, 96, 240]}, (8, 8),
                             (46, 36)) is None
    assert tissue_token_grid(tiles, md, (8, 8), (20, 36)) is None


def test_diagnostics_read_the_tissue_tokens_only(monkeypatch):
    """Glass (attention and z 0, a fill) counted as patches in the diagnostics: more patches
    (a larger smallest reachable q), a less uniform attention and a narrower z."""
    from napari_attnreg.core.run import passes

    seen = {}
    real = passes.diagnose

    def spy(attention, **kw):
        seen.update(attention=np.asarray(attention), z_sd=kw["z_sd"])
        return real(attention, **kw)

    monkeypatch.setattr(passes, "diagnose", spy)
    image, mask = _image()
    result = regularize(image, "demo", tiled=True, tissue_mask=mask, preset="directional",
                        **FAST)
    tested = tissue_tokens(result)
    np.testing.assert_array_equal(seen["attention"], result.attention[tested])
    assert seen["z_sd"] == pytest.approx(float(np.std(result.z[tested])))


def test_the_tested_tokens_are_derived_once_per_result_and_cannot_be_changed():
    """Every caption, figure and status redraw asks which tokens were tested; a slide's grid
    took some 15 ms to derive each time. It is now kept, read-only, while the result lives,
    and a result with other tiles gets its own."""
    import gc
    from dataclasses import replace

    from napari_attnreg.core.results import display

    result = _run("stepdown")
    tested = tissue_tokens(result)
    assert tissue_tokens(result) is tested  # kept, not derived again
    assert tissue_tokens(replace(result, metadata=dict(result.metadata))) is tested
    with pytest.raises(ValueError):
        tested[0, 0] = not tested[0, 0]  # shared: no caller may change it
    other_tiles = result.null_summary["tissue_tiles"].copy()
    other_tiles[np.flatnonzero(other_tiles)[0]] = False
    other = replace(result, null_summary={**result.null_summary, "tissue_tiles": other_tiles})
    assert tissue_tokens(other).sum() < tested.sum()  # its own tiles, not the cached grid
    del other, other_tiles
    gc.collect()
    tissue_tokens(result)
    assert all(ref() is not None for ref, _ in display._TISSUE_TOKENS.values())  # dropped

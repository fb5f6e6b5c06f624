"""Glass inside a tissue tile is reported as not measured, never marked significant.

A tiled run with a tissue mask runs the tiles that hold tissue; a tile at the section's edge
is tested whole, and the patches of bare glass in it were tested and some marked significant
(round 12's slide validation: 3-12 glass tokens marked over 12-16 slides). The tokens of a
run tile that are glass by the mask (their footprint, grown by one mask pixel each side,
holds no tissue) are now reported as "not measured", as the tiles the mask left out are:
NaN p, q, lfdr and evidence, attention and z 0, never marked by any rule or level, counted
in the metadata, and kept so in a saved file.

Small images, the demo model and four bootstrap draws: each run is a second or two on a CPU.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tifffile

from napari_attnreg import regularize
from napari_attnreg.core.results.display import significance_caption, tissue_tokens
from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.results.tissue_grid import tissue_token_grid
from napari_attnreg.core.run import tiled_engine
from napari_attnreg.core.run.tiling import make_layout, run_tiles
from napari_attnreg.core.run.tissue import glass_tokens, tissue_for
from napari_attnreg.core.stats.stepdown_maps import stepdown_mask

FAST = {"n_boot": 4, "seed": 0, "device": "cpu"}
PRESETS = ("stepdown", "directional", "paper")
TISSUE_COLUMNS = 80  # the tissue: columns 0..79; the first column of tiles (0..127) is run
#: Levels at which every rule marks nearly every tested token (so glass would be marked)
LOOSE = {"p_th": 1.0, "q_th": 1.0, "l_th": 1.0, "z_th": None}


def _image() -> tuple[np.ndarray, np.ndarray]:
    """A 256² grey image and its tissue mask: the left 80 columns. The run tiles are the
    three of the first column, each 128 wide and so 48 columns of glass."""
    rng = np.random.default_rng(0)
    image = rng.random((256, 256)).astype(np.float32)
    mask = np.zeros((256, 256), bool)
    mask[:, :TISSUE_COLUMNS] = True
    return image, mask


@functools.cache
def _run(preset: str, tissue: str = "mask") -> AttentionResult:
    image, mask = _image()
    spec = {"mask": mask, "all": np.ones_like(mask), "none": "none"}[tissue]
    return regularize(image, "demo", tiled=True, tissue_mask=spec, preset=preset, **FAST)


@functools.cache
def _run_without_leaving_out(preset: str) -> AttentionResult:
    """The run as it was before: the glass of the run tiles tested and reported."""
    image, mask = _image()
    patch = pytest.MonkeyPatch()
    patch.setattr(tiled_engine, "_glass_of", lambda tiled, owned: None)
    try:
        return regularize(image, "demo", tiled=True, tissue_mask=mask, preset=preset, **FAST)
    finally:
        patch.undo()


def _expected_glass(result: AttentionResult) -> np.ndarray:
    """Tokens of run tiles whose footprint grown by one mask pixel holds no tissue."""
    gh, gw = result.grid_shape
    in_tiles = np.zeros((gh, gw), bool)
    in_tiles[:, :128 // 8] = True  # the first column of 128² tiles
    glass = np.zeros((gh, gw), bool)
    glass[:, (TISSUE_COLUMNS + 1) // 8 + 1:] = True  # 8j - 1 >= 80: from column 11
    return in_tiles & glass


def _every_mask(result: AttentionResult):
    """Every rule's significance mask at its defaults and at loose levels."""
    for rule in result.procedure.rules:
        yield rule, result.significant(rule)
        if rule != "soft":
            yield f"{rule} (loose)", result.significant(rule, **LOOSE)


# -- the criterion ----------------------------------------------------------------------------

def _glass_by_loops(mask: np.ndarray, layout, covers) -> np.ndarray:
    """The criterion written out token by token (the reference for small grids)."""
    mh, mw = mask.shape
    h, w = covers
    (ph, pw), (gh, gw) = layout.patch, layout.grid_shape
    out = np.zeros((gh, gw), bool)
    for i in range(gh):
        for j in range(gw):
            y0 = max(0, min(i * ph * mh // h, mh - 1) - 1)
            y1 = min(mh, max(-(-(i + 1) * ph * mh // h), min(i * ph * mh // h, mh - 1) + 1) + 1)
            x0 = max(0, min(j * pw * mw // w, mw - 1) - 1)
            x1 = min(mw, max(-(-(j + 1) * pw * mw // w), min(j * pw * mw // w, mw - 1) + 1) + 1)
            out[i, j] = not mask[y0:y1, x0:x1].any()
    return out


@pytest.mark.parametrize("mask_shape, covers", [((256, 320), (256, 320)),  # one pixel a pixel
                                                ((37, 45), (256, 320)),  # coarser than a token
                                                ((19, 23), (260, 327)),  # a crop's thumbnail
                                                ((64, 80), (256, 320))])
def test_a_token_is_glass_only_when_its_grown_footprint_holds_no_tissue(mask_shape, covers):
    rng = np.random.default_rng(1)
    mask = rng.random(mask_shape) < 0.02
    mask[: mask_shape[0] // 3, : mask_shape[1] // 4] = True
    layout = make_layout((256, 320), tile=(64, 64), patch=(8, 8), overlap=16)
    found = glass_tokens(mask, layout, covers, grow=1)
    np.testing.assert_array_equal(found, _glass_by_loops(mask, layout, covers))
    assert found.any() and not found.all()


def test_the_criterion_reads_a_large_mask_in_bands_with_the_same_answer(monkeypatch):
    from napari_attnreg.core.run import tissue

    rng = np.random.default_rng(2)
    mask = rng.random((300, 410)) < 0.001
    layout = make_layout((240, 328), tile=(64, 64), patch=(8, 8))
    whole = glass_tokens(mask, layout, grow=1)
    for rows in (1, 3, 7):  # spans starting and ending in different bands, or the same
        monkeypatch.setattr(tissue, "GLASS_BLOCK_PIXELS", (411 + 4 * 41) * rows)  # 41 columns
        np.testing.assert_array_equal(glass_tokens(mask, layout, grow=1), whole)
    np.testing.assert_array_equal(whole, _glass_by_loops(mask, layout, (240, 328)))


def test_a_coarse_mask_never_calls_a_token_beside_its_edge_glass():
    """A thumbnail pixel wider than a token: the tokens up to a mask pixel beyond the
    mask's edge are tissue (the true edge may lie anywhere in that pixel)."""
    layout = make_layout((256, 256), tile=(128, 128), patch=(8, 8))
    mask = np.zeros((16, 16), bool)  # 16 image pixels (two tokens) a mask pixel
    mask[:, :5] = True  # tissue up to image column 80
    glass = glass_tokens(mask, layout, grow=1)
    # mask pixel 5 (columns 80..95) is the grown border: tokens 10, 11 stay tissue
    assert not glass[:, :12].any() and glass[:, 12:].all()
    # by default four mask pixels (to column 144): tokens up to 17 stay tissue
    glass = glass_tokens(mask, layout)
    assert not glass[:, :18].any() and glass[:, 18:].all()


def test_pale_stroma_between_stained_nuclei_is_not_glass():
    """The automatic mask keeps the stained nuclei of pale stroma and calls the stroma
    between them glass; the tokens there stay measured, the glass beyond the section not."""
    layout = make_layout((512, 512), tile=(128, 128), patch=(8, 8))
    mask = np.zeros((128, 128), bool)  # 4 image pixels a mask pixel
    mask[2:80:7, 2:80:7] = True  # nuclei every 7 mask pixels over the stroma
    mask[:80, :20] = True  # a gland
    glass = glass_tokens(mask, layout)
    assert not glass[:40, :40].any()  # the section (80 mask px = 320 px = 40 tokens)
    assert glass[:, 46:].all() and glass[46:, :].all()  # glass well beyond it


# -- a run ------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", PRESETS)
def test_no_rule_marks_the_glass_of_a_tissue_tile(preset):
    result = _run(preset)
    glass = _expected_glass(result)
    assert glass.sum() == 32 * 5  # the run tiles span the 32 token rows: five columns of glass
    for name, kept in _every_mask(result):
        assert not kept[glass].any(), name
    assert not (result.regularized("soft")[glass]).any()
    # the loose levels mark tissue: the test could see marked glass
    assert result.significant(result.procedure.rules[0], **LOOSE)[~glass & tissue_tokens(
        result)].any()


def test_the_glass_of_a_tissue_tile_was_marked_before():
    """What the validation saw: tested whole, the glass of an edge tile is marked."""
    before = _run_without_leaving_out("stepdown")
    glass = _expected_glass(before)
    assert np.isfinite(before.maps["step_p"][glass]).all()
    assert before.significant("fwer", p_th=1.0)[glass].any()


@pytest.mark.parametrize("preset", PRESETS)
def test_glass_is_not_measured_and_counted_in_the_metadata(preset):
    result = _run(preset)
    glass = _expected_glass(result)
    tested = tissue_tokens(result)
    assert not tested[glass].any() and tested[:, :11].all() and not tested[:, 16:].any()
    for name in result.procedure.probability_maps():
        assert np.isnan(result.maps[name][glass]).all(), name
        assert np.isfinite(result.maps[name][tested]).all(), name
    # the fills of the tokens of tiles left out
    assert (result.attention[glass] == 0).all() and (result.z[glass] == 0).all()
    md = result.metadata
    assert md["n_glass_tokens"] == int(glass.sum()) == 160
    assert md["n_tissue_tokens"] == int(tested.sum()) == 32 * 11
    assert (md["n_tissue_tiles"], md["n_tiles_total"]) == (3, 9)
    np.testing.assert_array_equal(result.null_summary["tissue_glass_tokens"],
                                  np.flatnonzero(glass))
    assert f"/{32 * 11} tissue patches significant" in significance_caption(result)
    assert f"/{32 * 11} tissue patches significant" in result.summary(diagnostics=False)


def test_the_stepdown_tests_the_tile_whole_and_the_tissue_keeps_its_p_values():
    """The test is unchanged: every map on the tissue is bit-identical to before, and the
    stored steps still name the glass (a rule applied later must not mark it)."""
    before, after = _run_without_leaving_out("stepdown"), _run("stepdown")
    glass = _expected_glass(after)
    tissue = tissue_tokens(after)
    for name in after.maps:
        np.testing.assert_array_equal(after.maps[name][tissue], before.maps[name][tissue])
    np.testing.assert_array_equal(after.attention[tissue], before.attention[tissue])
    for key in ("stepdown_step_p", "stepdown_adjusted_p", "stepdown_step_token",
                "stepdown_family_p"):
        np.testing.assert_array_equal(after.null_summary[key], before.null_summary[key])
    # the steps alone would mark the glass at this level; the result never does
    steps = stepdown_mask(after.null_summary, "fwer", 1.0, after.grid_shape)
    assert steps[glass].any() and not after.significant("fwer", p_th=1.0)[glass].any()


@pytest.mark.parametrize("preset", ["directional", "paper"])
def test_pooled_presets_leave_glass_out_before_pooling(preset):
    """π0, q and lfdr are of the tissue alone. z is each token's own (bit-identical), and so
    is the directional p; the paper's pooled p ranks a token among the observed tokens too,
    which are now the tissue's alone."""
    before, after = _run_without_leaving_out(preset), _run(preset)
    tissue = tissue_tokens(after)
    np.testing.assert_array_equal(after.z[tissue], before.z[tissue])
    if preset == "directional":
        np.testing.assert_array_equal(after.p[tissue], before.p[tissue])
    else:
        assert not np.array_equal(after.p[tissue], before.p[tissue])
    from napari_attnreg.core.stats.paper import qvalues

    np.testing.assert_allclose(after.maps["q"][tissue], qvalues(after.p[tissue], after.pi0),
                               rtol=1e-12)
    assert not np.array_equal(after.maps["q"][tissue], before.maps["q"][tissue])


@pytest.mark.parametrize("preset", ["stepdown", "paper"])
def test_a_saved_result_reopens_with_its_glass_unmarked(preset, tmp_path):
    result = _run(preset)
    loaded = AttentionResult.load(result.save(tmp_path / "r.npz"))
    assert loaded == result
    glass = _expected_glass(result)
    np.testing.assert_array_equal(tissue_tokens(loaded), tissue_tokens(result))
    for name, kept in _every_mask(loaded):
        assert not kept[glass].any(), name
    assert loaded.metadata["n_glass_tokens"] == 160


def test_runs_without_glass_in_their_tiles_are_unchanged(tmp_path):
    """No mask, or a mask of all tissue: every tile run, nothing left out, the same maps."""
    plain, everything = _run("stepdown", "none"), _run("stepdown", "all")
    assert "tissue_glass_tokens" not in plain.null_summary
    assert everything.metadata["n_glass_tokens"] == 0
    assert everything.null_summary["tissue_glass_tokens"].size == 0
    assert tissue_tokens(everything).all()
    for name in plain.maps:
        np.testing.assert_array_equal(everything.maps[name], plain.maps[name])
    np.testing.assert_array_equal(everything.attention, plain.attention)
    assert AttentionResult.load(everything.save(tmp_path / "r.npz")) == everything


# -- a slide and its automatic mask -----------------------------------------------------------

def _aperio(w: int, h: int) -> str:
    return (f"Aperio Image Library v10.0.50\n{w}x{h} [0,0 {w}x{h}] (256x256) RAW/RGB"
            "|AppMag = 40|MPP = 0.25")


@pytest.fixture(scope="module")
def edge_slide(tmp_path_factory):
    """An SVS of 768² whose stained tissue ends at column 300 (inside a tile), its coarser
    level 1/16: the automatic mask's pixel is two tokens wide."""
    rng = np.random.default_rng(0)
    img = np.full((768, 768, 3), 236, np.uint8)
    stain = rng.random((768, 300, 3)) * 90 + np.array([130, 40, 120])
    img[:, :300] = stain.clip(0, 255).astype(np.uint8)
    img += rng.integers(0, 3, img.shape, dtype=np.uint8)  # the glass's grain
    path = tmp_path_factory.mktemp("slides") / "edge.svs"
    with tifffile.TiffWriter(path) as tif:
        tif.write(img, tile=(256, 256), description=_aperio(768, 768), photometric="rgb",
                  metadata=None)
        tif.write(img[::16, ::16].copy(), description="Aperio Image Library v10.0.50\nthumb",
                  photometric="rgb", metadata=None)
        tif.write(img[::16, ::16].copy(), tile=(16, 16), description=_aperio(48, 48),
                  photometric="rgb", metadata=None)
    return path


def test_an_automatic_mask_leaves_out_glass_but_never_the_tissue_at_its_edge(edge_slide):
    from napari_attnreg.io.slides import open_slide

    image = open_slide(edge_slide, level=0)
    result = regularize(image, "demo", tiled=True, preset="stepdown", **FAST)
    assert result.null_summary["tissue_mask"].shape == (48, 48)
    tested = tissue_tokens(result)
    gh, gw = result.grid_shape
    tissue = np.zeros((gh, gw), bool)
    tissue[:, :300 // 8 + 1] = True  # every token holding a stained pixel
    assert tested[tissue].all()  # no tissue token is called glass
    in_tiles = tissue_token_grid(result.null_summary["tissue_tiles"], result.metadata,
                                 result.patch_size, result.grid_shape)
    glass = in_tiles & ~tested  # the glass of the run tiles
    assert result.metadata["n_glass_tokens"] == int(glass.sum()) > 0
    assert glass[:, :300 // 8 + 3].sum() == 0  # a mask pixel (two tokens) of margin kept
    for name, kept in _every_mask(result):
        assert not kept[~tested].any(), name


def test_a_users_mask_in_the_layout_of_a_crop_is_placed_over_the_whole_image(monkeypatch):
    """A mask covering a whole image the layout tiles a crop of (its last pixels short of a
    patch): the tokens are placed in the mask's extent, as the tiles are."""
    from napari_attnreg.core.run import tissue

    monkeypatch.setattr(tissue, "GLASS_MARGIN", 1)  # the reference's margin: one mask pixel
    layout = make_layout((96, 128), tile=(64, 64), patch=(8, 8))
    mask = np.zeros((100, 133), bool)
    mask[:, :40] = True  # tissue up to pixel 40 of the image
    found = tissue_for(mask, None, layout, covers=(100, 133))
    owned = run_tiles(layout, found.tiles)
    glass = found.glass(layout)
    np.testing.assert_array_equal(glass, _glass_by_loops(mask, layout, (100, 133)))
    assert glass.reshape(-1)[owned.tested].any()
    # token column 5 (pixels 40..47) touches the tissue's last mask column: not glass; read
    # as if the mask spanned the crop alone, it would be
    assert not glass[:, 5].any() and glass[:, 6:].all()
    assert glass_tokens(mask, layout)[:, 5].all()


def test_the_inspectors_say_the_glass_of_a_run_tile_was_left_out_not_never_run():
    from napari_attnreg.core.results.display import describe_pixel
    from napari_attnreg.core.results.patch_report import patch_report

    result = _run("stepdown")
    sy, sx = result.token_scale
    inside = ((5 + 0.5) * sy, (13 + 0.5) * sx)  # glass of a run tile (token column 13)
    outside = ((5 + 0.5) * sy, (25 + 0.5) * sx)  # glass no run tile holds
    assert "left out of its tissue tile" in describe_pixel(result, *inside)
    assert "never run" in describe_pixel(result, *outside)
    report = patch_report(result, *inside)
    assert not report.tested and not report.significant and report.values == ()
    assert "its tile was run" in report.text() and "no tissue tile holds" not in report.text()
    assert "no tissue tile holds" in patch_report(result, *outside).text()

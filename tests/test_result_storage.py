"""A result stores the maps its procedure declares, by the procedure's names, in memory and in
its file; files of format version 1 (the paper's five names whatever the preset) still load."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from napari_attnreg import regularize
from napari_attnreg.core.results.result import FORMAT_VERSION, AttentionResult
from napari_attnreg.core.stats.procedures import get_procedure, procedure_names

LEGACY = Path(__file__).parent / "data" / "legacy_results"
FAST = {"n_boot": 8, "chunk_size": 4, "device": "cpu", "seed": 0}


@pytest.fixture(scope="module")
def results(tiny_backbone):
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:64, 0:64]
    image = 400 + 50 * rng.standard_normal((64, 64))
    image += 3000 * np.exp(-((yy - 20) ** 2 + (xx - 24) ** 2) / 60)
    image = image.astype(np.uint16)
    return {name: regularize(image, tiny_backbone, preset=name, **FAST)
            for name in procedure_names()}


def _members(path: Path) -> tuple[set[str], dict]:
    with zipfile.ZipFile(path) as archive:
        names = {n[:-4] for n in archive.namelist()}
        raw = np.lib.format.read_array(io.BytesIO(archive.read("metadata_json.npy")))
    return names, json.loads(raw.astype(np.uint8).tobytes().decode())


@pytest.mark.parametrize("name", ["stepdown", "directional", "paper"])
def test_each_preset_holds_exactly_its_declared_maps(results, name):
    res = results[name]
    assert list(res.maps) == list(get_procedure(name).stored_maps)
    assert all(m.shape == res.grid_shape for m in res.maps.values())
    with pytest.raises(TypeError):
        res.maps["z"] = res.attention  # read-only: the result's own arrays


def test_step_down_names_its_maps_and_has_no_lfdr(results):
    res = results["stepdown"]
    assert list(res.maps) == ["z", "step_p", "adjusted_p", "evidence"]
    np.testing.assert_allclose(res.maps["evidence"], 1 - res.maps["adjusted_p"])
    assert np.all(res.maps["adjusted_p"] >= res.maps["step_p"] - 1e-12)  # a running maximum
    with pytest.raises(AttributeError, match="no 'lfdr' map; its maps are z, step_p, "
                                             "adjusted_p, evidence"):
        res.lfdr  # noqa: B018
    assert not hasattr(res, "lfdr")
    # the roles front ends ask for resolve through the declaration: the same arrays
    assert res.q is res.maps["adjusted_p"] and res.p is res.maps["step_p"]
    assert res.posterior is res.evidence is res.maps["evidence"]
    assert results["paper"].lfdr is results["paper"].maps["lfdr"]
    np.testing.assert_array_equal(res.regularized("soft"),
                                  res.attention * res.maps["evidence"])


def test_a_result_with_other_maps_than_its_procedure_declares_is_refused(results):
    res = results["stepdown"]
    paper_maps = {k: res.z for k in ("z", "p", "q", "lfdr", "posterior")}
    with pytest.raises(ValueError, match="step-down result holds the maps z, step_p, "
                                         "adjusted_p, evidence; got z, p, q, lfdr, posterior"):
        AttentionResult(attention=res.attention, maps=paper_maps, pi0=1.0, thresholds={},
                        image_shape=res.image_shape, model_shape=res.model_shape,
                        patch_size=res.patch_size, metadata={"preset": "stepdown"})


@pytest.mark.parametrize("name", ["stepdown", "directional", "paper"])
def test_save_and_load_keep_the_maps_by_name(results, tmp_path, name):
    res = results[name]
    path = res.save(tmp_path / f"{name}.attnreg.npz")
    members, header = _members(path)
    declared = list(get_procedure(name).stored_maps)
    assert header["format_version"] == FORMAT_VERSION == 2
    assert header["procedure"] == name and header["maps"] == declared
    assert set(declared) <= members and "attention" in members
    if name == "stepdown":
        assert not {"p", "q", "lfdr", "posterior"} & members  # no paper names in its file
    back = AttentionResult.load(path)
    assert back == res and list(back.maps) == declared
    for key in declared:
        np.testing.assert_array_equal(back.maps[key], res.maps[key])
    np.testing.assert_array_equal(back.significant(), res.significant())


def test_a_header_that_disagrees_with_its_maps_is_refused(results, tmp_path):
    path = results["stepdown"].save(tmp_path / "r.npz")
    with zipfile.ZipFile(path) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    raw = np.lib.format.read_array(io.BytesIO(members["metadata_json.npy"]))
    for change, match in (({"maps": ["z", "p", "q", "lfdr", "posterior"]}, "lists the maps"),
                          ({"procedure": "paper"}, "names the procedure 'paper'")):
        header = {**json.loads(raw.astype(np.uint8).tobytes().decode()), **change}
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.frombuffer(json.dumps(header).encode(), np.uint8))
        bad = tmp_path / "bad.npz"
        with zipfile.ZipFile(bad, "w") as archive:
            for name, data in {**members, "metadata_json.npy": buf.getvalue()}.items():
                archive.writestr(name, data)
        with pytest.raises(ValueError, match=match):
            AttentionResult.load(bad)


@pytest.mark.parametrize("preset", ["stepdown", "paper"])
def test_a_format_version_1_file_loads_as_it_did(preset):
    """The files of tests/data/legacy_results were written by the version-1 writer; every
    rule of the loaded result gives what that version computed."""
    path = LEGACY / f"legacy_v1_{preset}.npz"
    members, header = _members(path)
    assert header["format_version"] == 1 and {"z", "p", "q", "lfdr", "posterior"} <= members
    res = AttentionResult.load(path)
    procedure = get_procedure(preset)
    assert res.preset == preset and list(res.maps) == list(procedure.stored_maps)
    with np.load(path) as raw:
        for name, field in procedure.stored_maps.items():
            np.testing.assert_array_equal(res.maps[name], raw[field])
    expected = np.load(LEGACY / "legacy_v1_expected.npz")
    for rule in procedure.rules:
        kw = {"q_th": 0.5, "p_th": 0.5} if rule in ("forwardstop", "fwer") else {}
        np.testing.assert_array_equal(res.significant(rule, **kw),
                                      expected[f"{preset}__significant__{rule}"])
        np.testing.assert_array_equal(res.regularized(rule, **kw),
                                      expected[f"{preset}__regularized__{rule}"])
    if preset == "stepdown":  # the version-1 lfdr member only repeated the adjusted p
        assert "lfdr" not in res.maps
        np.testing.assert_array_equal(res.maps["adjusted_p"], np.load(path)["lfdr"])


def test_a_legacy_file_saved_again_is_written_by_its_procedures_names(tmp_path):
    res = AttentionResult.load(LEGACY / "legacy_v1_stepdown.npz")
    back = AttentionResult.load(res.save(tmp_path / "again.npz"))
    assert back == res and _members(tmp_path / "again.npz")[1]["format_version"] == 2


def test_a_token_left_out_of_the_test_is_saved_and_read_back_as_nan(results, tmp_path):
    """``exclude_sinks`` leaves tokens untested (NaN in every map but z); the file keeps them,
    and a NaN anywhere else is still damage."""
    res = results["stepdown"]
    maps = {k: v.copy() for k, v in res.maps.items()}
    for name in ("step_p", "adjusted_p", "evidence"):
        maps[name][0, 1] = np.nan
    metadata = {**res.metadata, "excluded_tokens": [1]}
    left_out = AttentionResult(attention=res.attention, maps=maps, pi0=res.pi0,
                               thresholds=res.thresholds, image_shape=res.image_shape,
                               model_shape=res.model_shape, patch_size=res.patch_size,
                               null_summary=res.null_summary, metadata=metadata)
    back = AttentionResult.load(left_out.save(tmp_path / "sinks.npz"))
    assert np.isnan(back.maps["evidence"][0, 1]) and back == left_out
    assert back.regularized("soft")[0, 1] == 0
    elsewhere = {**metadata, "excluded_tokens": [2]}
    path = AttentionResult(attention=res.attention, maps=maps, pi0=res.pi0, thresholds={},
                           image_shape=res.image_shape, model_shape=res.model_shape,
                           patch_size=res.patch_size, metadata=elsewhere).save(tmp_path / "x")
    with pytest.raises(ValueError, match="step_p map has 1 values outside"):
        AttentionResult.load(path)


def test_a_tiled_result_whose_summary_outgrows_the_fixed_bound_reopens(tiny_backbone, tmp_path,
                                                                        monkeypatch):
    """A slide's step-down summary holds per-token arrays (39 M values for a 50,000² slide),
    above the fixed bound on summaries; the bound follows the grid, so it reopens."""
    from napari_attnreg.core.results import result_file

    rng = np.random.default_rng(1)
    image = (400 + 50 * rng.standard_normal((256, 256))).astype(np.uint16)
    res = regularize(image, tiny_backbone, tiled=True, **FAST)
    largest = max(np.asarray(v).size for k, v in res.null_summary.items()
                  if k.startswith("stepdown_"))
    assert largest > res.grid_shape[0] * res.grid_shape[1]  # steps of overlapping tiles
    monkeypatch.setattr(result_file, "MAX_SUMMARY_ELEMENTS", 64)  # a slide, scaled down
    path = res.save(tmp_path / "tiled.attnreg.npz")
    back = AttentionResult.load(path)
    np.testing.assert_array_equal(back.null_summary["stepdown_step_token"],
                                  res.null_summary["stepdown_step_token"])
    np.testing.assert_array_equal(back.significant(), res.significant())
    # a member beyond what any grid of this size can hold is still refused
    monkeypatch.setattr(result_file, "SUMMARY_ELEMENTS_PER_TOKEN", 1)
    with pytest.raises(ValueError, match="expected a summary of at most 256 values"):
        AttentionResult.load(path)

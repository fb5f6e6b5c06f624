"""Plain-sentence diagnostics: computed by the engine, stored in results, shown in summaries."""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg import AttentionResult, regularize
from napari_attnreg.core.stats.diagnostics import diagnose, normalized_entropy


def codes(found):
    return [d.code for d in found]


def test_each_finding_by_hand():
    peaked = np.full(100, 1e-3)
    peaked[0] = 1.0
    assert normalized_entropy(np.ones(50)) == pytest.approx(1.0) and normalized_entropy(peaked) < 0.5
    clean = diagnose(peaked, pi0=0.8, lfdr_fit="grenander", random_init=False, model_name="m")
    assert clean == []
    found = diagnose(np.linspace(1.0, 1.01, 30), pi0=0.0, lfdr_fit="gaussian", random_init=True,
                     model_name="vit", domain="pathology", domain_note="H&E tiles",
                     warnings_seen=["fit warned", "fit warned"])
    assert codes(found) == ["random_init", "uniform_attention", "few_tokens", "pi0_zero",
                            "fit_fallback", "statistics_warning", "model_domain"]
    assert found[-1].severity == "info" and "pathology (H&E tiles)" in found[-1].message
    assert all(d.severity == "warning" for d in found[:-1])
    capped = diagnose(peaked, pi0=1.0, lfdr_fit="lindsey-deg7", random_init=False, model_name="m")
    assert codes(capped) == ["pi0_one"]
    fixed = diagnose(peaked, pi0=1.0, lfdr_fit="grenander", random_init=False, model_name="m",
                     pi0_estimated=False)
    assert fixed == []
    broad = diagnose(peaked, pi0=1.0, lfdr_fit="grenander", random_init=False, model_name="m",
                     pi0_estimated=False, z_sd=0.5, posterior=np.r_[np.ones(6), np.zeros(4)])
    assert codes(broad) == ["broad_posterior"] and "60 %" in broad[0].message
    assert "sd of z 0.50" in broad[0].message
    assert diagnose(peaked, pi0=1.0, lfdr_fit="grenander", random_init=False, model_name="m",
                    pi0_estimated=False, posterior=np.r_[np.ones(5), np.zeros(5)]) == []
    # 100 tokens, 999 null values: a lone token at p = 1/1000 reaches q = 0.1 exactly
    kw = {"pi0": 1.0, "lfdr_fit": "grenander", "random_init": False, "model_name": "m",
          "pi0_estimated": False, "q_th": 0.1}
    assert diagnose(peaked, smallest_p=1 / 1000, **kw) == []
    coarse = diagnose(peaked, smallest_p=1 / 500, **kw)
    assert codes(coarse) == ["p_resolution"] and "2-fold" in coarse[0].message


def test_a_random_init_model_is_named_in_the_result_and_its_summary(tiny_backbone, blob_image,
                                                                    tmp_path):
    tiny_backbone.weights = "random-init"  # what load_backbone records without trained weights
    try:
        res = regularize(blob_image, tiny_backbone, n_boot=8, device="cpu")
    finally:
        tiny_backbone.weights = "given module"
    assert "random_init" in codes(res.diagnostics)
    assert "random weights" in res.summary()
    back = AttentionResult.load(res.save(tmp_path / "r.npz"))
    assert codes(back.diagnostics) == codes(res.diagnostics)
    assert res.summary(diagnostics=False).count("\n") == 0


def test_a_uniform_attention_model_is_flagged(tiny_backbone, blob_image):
    import torch

    qkv = tiny_backbone.model.blocks[-1].attn.qkv
    dim = qkv.in_features
    saved = qkv.weight.detach().clone(), qkv.bias.detach().clone()
    try:
        with torch.no_grad():  # tiny queries: nearly the same logit for every token
            qkv.weight[:dim] *= 1e-4
            qkv.bias[:dim] *= 1e-4
        res = regularize(blob_image, tiny_backbone, n_boot=8, device="cpu")
    finally:
        with torch.no_grad():
            qkv.weight.copy_(saved[0])
            qkv.bias.copy_(saved[1])
    assert "uniform_attention" in codes(res.diagnostics)
    assert "nearly uniform" in res.summary()


def test_stepdown_findings_by_hand():
    peaked = np.r_[0.9, np.full(63, 0.1 / 63)]
    common = {"pi0": 1.0, "lfdr_fit": "stepdown", "pi0_estimated": False, "random_init": False,
              "model_name": "m"}
    codes = {d.code: d for d in diagnose(peaked, concentration=0.5, **common)}
    assert codes["concentration"].severity == "info" and "more even" in codes[
        "concentration"].message
    assert "concentration" not in {d.code for d in diagnose(peaked, concentration=1.0, **common)}
    assert "more concentrated" in {d.code: d for d in diagnose(
        peaked, concentration=2.0, **common)}["concentration"].message
    # B = 9: the smallest step p is 0.1, above what ForwardStop at 0.1 needs at the first step
    too_few = {d.code: d for d in diagnose(peaked, step_level=(0.1, 0.095, 1), **common)}
    assert too_few["p_resolution"].severity == "warning" and "raise the number" in too_few[
        "p_resolution"].message
    tiles = {d.code: d for d in diagnose(peaked, step_level=(0.005, 0.0002, 400), **common)}
    assert "over 400 tiles" in tiles["p_resolution"].message and "tail='gpd'" in tiles[
        "p_resolution"].message
    # BH selects tiles that share the smallest p when enough of them do: not "nothing"
    assert "at least 25 of them reach that p together" in tiles["p_resolution"].message
    assert "anything" not in tiles["p_resolution"].message
    assert "call anything significant" in too_few["p_resolution"].message  # one map: nothing
    with_tail = {d.code: d for d in diagnose(peaked, step_level=(0.0002, 1.4e-5, 7225, True),
                                             **common)}["p_resolution"].message
    assert "raise the number" in with_tail and "tail='gpd'" not in with_tail  # it is on
    assert "p_resolution" not in {d.code for d in diagnose(peaked, step_level=(0.005, 0.09, 1),
                                                           **common)}
    # the tail refused for some tiles: information, with the count's resolution
    refused = {"first_wanted": 12, "first_rejected": 12, "null_maps": 200}
    note = {d.code: d for d in diagnose(peaked, tail_fit=refused, **common)}["tail_rejected"]
    assert note.severity == "info" and "12 of the 12 tiles" in note.message
    assert "1/(B + 1) = 0.005" in note.message and "more null images" in note.message
    one = {d.code: d for d in diagnose(peaked, tail_fit={**refused, "first_wanted": 1,
                                                         "first_rejected": 1}, **common)}
    assert "the map's p-value" in one["tail_rejected"].message
    for fine in ({**refused, "first_rejected": 0}, {"method": "none"}, None):
        assert "tail_rejected" not in {d.code for d in diagnose(peaked, tail_fit=fine, **common)}


def test_a_flat_map_is_named_once_not_through_its_symptoms():
    # a class with no evidence in the image: Grad-CAM is zero on every patch (its ReLU)
    zero = np.zeros(64)
    assert normalized_entropy(zero) == 1.0  # flat, and no division by zero
    found = diagnose(zero, pi0=0.0, lfdr_fit="constant", random_init=False, model_name="m",
                     posterior=np.ones(64), concentration=float("nan"), z_sd=0.0)
    assert codes(found) == ["flat_map", "fit_fallback"]
    assert "same value (0) on every patch" in found[0].message
    assert "choose another class or map" in found[0].message
    assert "nan" not in " ".join(d.message for d in found)
    # a constant map of another value, with NaN where glass was left out: flat too
    glass = np.r_[np.full(40, 0.02), np.full(24, np.nan)]
    assert codes(diagnose(glass, pi0=0.5, lfdr_fit="stepdown", random_init=False,
                          model_name="m"))[0] == "flat_map"
    # a map with any spread is not flat; a concentration that is not a number is not reported
    peaked = np.r_[0.9, np.full(63, 0.1 / 63)]
    assert diagnose(peaked, pi0=0.5, lfdr_fit="stepdown", random_init=False, model_name="m",
                    concentration=float("nan")) == []


def test_a_grad_cam_of_a_class_absent_from_the_image_says_so(tiny_classifier_and_field):
    bb, image, flat_target = tiny_classifier_and_field
    for preset in ("stepdown", "paper"):
        result = regularize(image, bb, map="gradcam", target=flat_target, preset=preset,
                            n_boot=12, device="cpu", chunk_size=6, seed=1)
        assert not result.attention.any()
        found = result.metadata["diagnostics"]
        assert found[0]["code"] == "flat_map", preset
        assert not {"concentration", "pi0_zero", "broad_posterior", "uniform_attention"} & {
            d["code"] for d in found}


@pytest.fixture(scope="module")
def tiny_classifier_and_field():
    """The presets test's tiny 4-class classifier and field, and a class whose Grad-CAM is
    zero on every patch of that field."""
    from test_maps_presets import tiny_classifier

    rng = np.random.default_rng(0)
    image = rng.random((64, 64)).astype(np.float32)
    image[8:24, 40:56] += 2.0
    return tiny_classifier(), image, 2


# ---- issue #17: the model's domain against the image's kind ------------------------------------
def test_off_domain_rule_by_hand():
    from napari_attnreg.core.stats.diagnostics import kind_of_modality, off_domain

    assert kind_of_modality("CT") == kind_of_modality(" mr ") == kind_of_modality("DX") == "radiology"
    assert kind_of_modality("SM") == "pathology" and kind_of_modality("XYZ") is None
    assert kind_of_modality(None) is None
    uni_on_ct = off_domain("radiology", "pathology", model_name="uni", source="DICOM Modality CT")
    assert uni_on_ct.code == "off_domain" and uni_on_ct.severity == "warning"
    assert "uni is a pathology model" in uni_on_ct.message and "(DICOM Modality CT)" in \
        uni_on_ct.message
    demo_on_ct = off_domain("radiology", "demo", model_name="demo")
    assert demo_on_ct.severity == "warning" and "test article" in demo_on_ct.message
    assert off_domain("radiology", "natural").severity == "info"  # general-purpose: a word only
    assert off_domain("radiology", "radiology") is None
    assert off_domain("pathology", "microscopy") is None and off_domain("microscopy", "pathology") is None
    for unknown in ((None, "pathology"), ("radiology", None), ("ultrasound?", "pathology"),
                    ("radiology", ""), (3, "pathology")):
        assert off_domain(*unknown) is None


def test_a_result_that_states_its_image_kind_carries_the_off_domain_warning(tiny_backbone,
                                                                            blob_image, tmp_path):
    """What napari and the notebook pass to the service (``RunConfig.extra``) is all it takes;
    the finding survives a reload."""
    from napari_attnreg.core.run.config import RunConfig
    from napari_attnreg.core.run.planes import PlaneStack
    from napari_attnreg.core.run.service import Job, ModelSpec, run_job_sync
    from napari_attnreg.core.stats.diagnostics import from_metadata

    def run(extra):
        job = Job(ModelSpec.from_model(tiny_backbone), PlaneStack.from_array(blob_image), [()],
                  RunConfig(n_boot=8, device="cpu", extra=extra))
        return run_job_sync(job).results[()]

    tiny_backbone.domain = "pathology"
    try:
        res = run({"image_kind": "radiology", "image_kind_source": "--image-kind"})
        plain = run({})
    finally:
        tiny_backbone.domain = None
    assert "off_domain" in codes(res.diagnostics) and "off_domain" not in codes(plain.diagnostics)
    assert "is a pathology model" in res.summary()  # a warning: in every summary line
    back = AttentionResult.load(res.save(tmp_path / "r.npz"))
    assert codes(back.diagnostics).count("off_domain") == 1
    stored = {"diagnostics": [{"code": "off_domain", "severity": "warning", "message": "x"}],
              "image_kind": "radiology", "model_domain": "pathology"}
    assert codes(from_metadata(stored)) == ["off_domain"]  # stored once, never twice
    odd = {"image_kind": ["radiology"], "model_domain": 7, "image_kind_source": 3}
    assert from_metadata(odd) == []  # a file's odd values are not findings


def test_the_image_kind_option_is_stated_in_every_route_and_wins_over_the_file(
        tiny_backbone, blob_image):
    """``image_kind=`` (API, notebook run option, napari's advanced control, ``--image-kind``)
    is recorded as stated and wins over what a file said (``RunConfig.extra``)."""
    from napari_attnreg import regularize
    from napari_attnreg.core.run.config import RunConfig
    from napari_attnreg.core.run.options import validate_options
    from napari_attnreg.core.run.planes import PlaneStack
    from napari_attnreg.core.run.service import Job, ModelSpec, run_job_sync

    tiny_backbone.domain = "pathology"
    try:
        api = regularize(blob_image, tiny_backbone, n_boot=8, device="cpu",
                         image_kind="radiology")
        from_file = {"image_kind": "radiology", "image_kind_source": "DICOM Modality CT"}
        job = Job(ModelSpec.from_model(tiny_backbone), PlaneStack.from_array(blob_image), [()],
                  RunConfig(n_boot=8, device="cpu", image_kind="pathology", extra=from_file))
        stated = run_job_sync(job).results[()]
    finally:
        tiny_backbone.domain = None
    assert (api.metadata["image_kind"], api.metadata["image_kind_source"]) == ("radiology",
                                                                               "stated")
    assert "off_domain" in codes(api.diagnostics)
    assert (stated.metadata["image_kind"], stated.metadata["image_kind_source"]) == (
        "pathology", "stated")
    assert "off_domain" not in codes(stated.diagnostics)  # a pathology model on pathology
    with pytest.raises(ValueError, match="image_kind"):
        validate_options({"image_kind": "x-ray"})

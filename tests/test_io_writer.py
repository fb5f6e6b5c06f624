"""Provenance of saved results and the OME-TIFF/CSV/JSON writer (napari_attnreg.io.export)."""

from __future__ import annotations

import hashlib

import pytest

from napari_attnreg.io.export import PROVENANCE_FIELDS, file_sha256, provenance


@pytest.fixture(scope="module")
def tiny_result(tiny_backbone):
    import numpy as np

    from napari_attnreg import regularize

    image = np.random.default_rng(3).random((48, 48))
    return regularize(image, tiny_backbone, n_boot=5, seed=7, device="cpu", q_th=0.2)


def test_provenance_of_a_result_states_every_run_choice(tiny_result):
    row = provenance(tiny_result.metadata, source="cells.tif")
    assert tuple(row) == PROVENANCE_FIELDS
    assert row["source_image"] == "cells.tif"
    assert (row["n_boot"], row["seed"], row["q_th"]) == (5, 7, 0.2)
    assert row["preset"] == tiny_result.preset and row["rule"] == tiny_result.thresholds["rule"]
    assert row["model"] == tiny_result.metadata["model"] and row["device"] == "cpu"
    assert row["package_version"] == tiny_result.metadata["package_version"]
    assert row["weights_sha256"] is None  # random-init weights: no file to hash


def test_provenance_of_a_napari_layer_uses_the_run_and_the_live_thresholds():
    layer_meta = {"attnreg": {
        "kind": "regularized", "preset": "directional", "source": "CT head",
        "run": {"model": "vit_small", "n_boot": 50, "seed": 3, "device": "auto",
                "device_used": "cuda:0", "rule": "q", "q_th": 0.1, "method": "normal"},
        "thresholds": {"rule": "lfdr", "l_th": 0.25, "q_th": 0.1, "z_th": None, "p_th": 0.05},
    }}
    row = provenance(layer_meta, thresholds={"q_th": 0.05})
    assert row["source_image"] == "CT head" and row["preset"] == "directional"
    assert (row["rule"], row["l_th"], row["q_th"]) == ("lfdr", 0.25, 0.05)
    assert row["device"] == "cuda:0" and row["n_boot"] == 50 and row["method"] == "normal"
    assert row["package_version"]  # filled with the installed version when not recorded


def test_provenance_hashes_a_weights_file(tmp_path):
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"not really weights" * 1000)
    row = provenance({"model": "vit_tiny", "weights": str(weights)})
    assert row["weights_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    weights.write_bytes(b"changed")  # a new file at the same path gets a new hash
    assert file_sha256(weights) == hashlib.sha256(b"changed").hexdigest()


def test_provenance_hashes_the_bundled_demo_weights():
    row = provenance({"model": "demo", "weights": "demo_vit.safetensors"})
    assert row["weights_sha256"] is not None and len(row["weights_sha256"]) == 64


def test_provenance_rejects_what_is_not_metadata():
    with pytest.raises(ValueError, match="metadata dict"):
        provenance({"attnreg": "oops"})

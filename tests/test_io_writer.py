"""Provenance of saved results and the OME-TIFF/CSV/JSON writer (napari_attnreg.io.export)."""

from __future__ import annotations

import hashlib

import pytest

from napari_attnreg.io.export import PROVENANCE_FIELDS, file_sha256, provenance, save_outputs


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
    row = provenance({"model": "vit_tiny", "weights": str(weights)}, own_weights=weights)
    assert row["weights_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    weights.write_bytes(b"changed")  # a new file at the same path gets a new hash
    assert file_sha256(weights) == hashlib.sha256(b"changed").hexdigest()


def test_provenance_hashes_the_bundled_demo_weights():
    row = provenance({"model": "demo", "weights": "demo_vit.safetensors"})
    assert row["weights_sha256"] is not None and len(row["weights_sha256"]) == 64


def test_provenance_rejects_what_is_not_metadata():
    with pytest.raises(ValueError, match="metadata dict"):
        provenance({"attnreg": "oops"})


def _output_layers():
    """Layer data tuples shaped like the widget's outputs (map + significant labels)."""
    import numpy as np

    meta = {"attnreg": {"kind": "posterior", "preset": "directional", "source": "cells",
                        "run": {"model": "demo", "weights": "demo_vit.safetensors",
                                "n_boot": 20, "seed": 4, "rule": "q", "q_th": 0.1},
                        "thresholds": {"rule": "q", "q_th": 0.05, "p_th": 0.05, "l_th": 0.2,
                                       "z_th": None}}}
    posterior = np.linspace(0, 1, 3 * 4 * 5, dtype=np.float64).reshape(3, 4, 5)
    labels = (posterior > 0.5).astype(np.int32)
    return [
        (posterior, {"name": "cells · P(above null)", "scale": (2.0, 16.0, 8.0),
                     "translate": (0.0, 7.5, 3.5), "metadata": meta}, "image"),
        (labels, {"name": "cells · significant", "scale": (2.0, 4.0, 2.0),
                  "translate": (0.0, 1.5, 0.5),
                  "metadata": {"attnreg": {**meta["attnreg"], "kind": "significant"}}}, "labels"),
    ]


def test_save_outputs_writes_ome_tiff_with_scale_roi_csv_and_provenance(tmp_path):
    import csv
    import json

    import numpy as np
    import tifffile

    from napari_attnreg.io.ometiff import read_ome_tiff

    rows = [{"roi": 1, "area_px": 40, "mean_posterior": 0.7}, {"roi": 2, "area_px": 12,
                                                              "mean_posterior": 0.1}]
    layers = _output_layers()
    files = save_outputs(tmp_path / "out", layers, roi_rows=rows)
    names = sorted(f.name for f in files)
    assert names == ["cells_P_above_null.ome.tif", "cells_significant.ome.tif",
                     "provenance.json", "roi_table.csv"]
    (data, kwargs), = read_ome_tiff(tmp_path / "out" / "cells_P_above_null.ome.tif")
    assert data.dtype == np.float32 and data.shape == (3, 4, 5)
    np.testing.assert_allclose(data, layers[0][0], rtol=1e-6)
    assert kwargs["scale"] == pytest.approx((2.0, 16.0, 8.0))
    with tifffile.TiffFile(tmp_path / "out" / "cells_significant.ome.tif") as tif:
        assert tif.series[0].dtype == np.uint8
        np.testing.assert_array_equal(tif.asarray(), layers[1][0])
    with open(tmp_path / "out" / "roi_table.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert [r["roi"] for r in table] == ["1", "2"]
    assert {r["n_boot"] for r in table} == {"20"} and {r["q_th"] for r in table} == {"0.05"}
    assert {r["source_image"] for r in table} == {"cells"}
    record = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert record["provenance"]["seed"] == 4 and record["provenance"]["weights_sha256"]
    assert [e["kind"] for e in record["layers"]] == ["posterior", "significant"]
    assert record["layers"][0]["translate"] == [0.0, 7.5, 3.5]
    assert record["roi_table"] == "roi_table.csv" and record["saved_with"]


def test_run_provenance_takes_the_thresholds_of_a_threshold_layer(tmp_path):
    """After a slider move only regularized/significant layers carry the new thresholds."""
    import copy
    import json

    posterior, labels = copy.deepcopy(_output_layers())
    labels[1]["metadata"]["attnreg"]["thresholds"] = {"rule": "q", "q_th": 0.01}
    save_outputs(tmp_path, [posterior, labels])
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["provenance"]["q_th"] == 0.01
    assert record["layers"][0]["provenance"]["q_th"] == 0.05  # the layer's own record stays


def test_same_layer_names_do_not_overwrite_each_other(tmp_path):
    data, attrs, kind = _output_layers()[0]
    files = save_outputs(tmp_path, [(data, attrs, kind), (data * 2, attrs, kind)])
    assert len({f.name for f in files if f.suffix == ".tif"}) == 2


def test_save_layer_writes_one_file_and_its_sidecar(tmp_path):
    import json

    from napari_attnreg.io.export import save_layer

    tiff, sidecar = save_layer(tmp_path / "post.ome.tif", _output_layers()[0])
    assert tiff.is_file() and sidecar.name == "post.provenance.json"
    assert json.loads(sidecar.read_text())["provenance"]["n_boot"] == 20
    with pytest.raises(ValueError, match="OME-TIFF name"):
        save_layer(tmp_path / "post.png", _output_layers()[0])


def test_writer_refuses_what_ome_tiff_cannot_hold(tmp_path):
    import numpy as np

    with pytest.raises(ValueError, match="2 to 5 axes"):
        save_outputs(tmp_path, [(np.zeros((2,) * 6), {"name": "x"}, "image")])
    with pytest.raises(ValueError, match="image and labels"):
        save_outputs(tmp_path, [(np.zeros((3, 2)), {"name": "pts"}, "points")])
    with pytest.raises(ValueError, match="Nothing to save"):
        save_outputs(tmp_path, [])


def test_provenance_never_opens_weights_paths_named_by_metadata(tmp_path, monkeypatch):
    import threading

    secret = tmp_path / "secret"
    secret.write_bytes(b"not yours")
    monkeypatch.chdir(tmp_path)
    for model, weights in (("vit_tiny", str(secret)), ("vit_tiny", "secret"),
                           ("vit_tiny", "/proc/self/pagemap"), ("demo", "../../etc/shadow"),
                           ("demo", str(secret))):
        assert provenance({"model": model, "weights": weights})["weights_sha256"] is None
    # the run's own file (the caller says which) is hashed
    row = provenance({"model": "vit_tiny", "weights": str(secret)}, own_weights=secret)
    assert row["weights_sha256"] == hashlib.sha256(b"not yours").hexdigest()
    with pytest.raises(ValueError, match="not a regular file"):
        file_sha256(tmp_path)
    outcome = []

    def pagemap():  # endless on a /proc file, whose size says 0
        try:
            file_sha256("/proc/self/pagemap")
        except ValueError as err:
            outcome.append(str(err))

    worker = threading.Thread(target=pagemap, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and outcome and "pagemap" in outcome[0]


def test_a_full_disk_never_destroys_the_files_being_replaced(tmp_path, monkeypatch):
    import csv
    import errno
    import os
    from pathlib import Path

    import tifffile

    layers = _output_layers()
    folder = tmp_path / "out"
    rows = [{"roi": 1, "area_px": 40}]
    save_outputs(folder, layers, roi_rows=rows)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    real_imwrite, real_write_text = tifffile.imwrite, Path.write_text

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def half_tiff(path, *args, **kwargs):  # writes part of the file, then the disk is full
        Path(path).write_bytes(b"II*\x00partial")
        full()

    def half_text(self, text, *args, **kwargs):
        real_write_text(self, text[: len(text) // 2], *args, **kwargs)
        full()

    for target, name, fake in ((tifffile, "imwrite", half_tiff), (Path, "write_text", half_text),
                               (csv.DictWriter, "writerow", full)):
        with monkeypatch.context() as m:
            m.setattr(target, name, fake)
            with pytest.raises(OSError, match="No space left"):
                save_outputs(folder, layers, roi_rows=rows)
        # files are replaced one by one: the one being written when the disk filled is intact
        failed = {"imwrite": "cells_P_above_null.ome.tif", "write_text": "provenance.json",
                  "writerow": "roi_table.csv"}[name]
        assert (folder / failed).read_bytes() == before[failed], name
        assert sorted(os.listdir(folder)) == sorted(before)  # no partial files left either
    assert real_imwrite is tifffile.imwrite


def test_labels_above_two_to_the_32_are_refused_not_wrapped(tmp_path):
    import numpy as np
    import tifffile

    from napari_attnreg.io.export import write_ome_tiff

    top = np.array([[0, 1], [7, 2**32 - 1]], dtype=np.int64)
    write_ome_tiff(tmp_path / "l.ome.tif", top, {"name": "l"}, "labels")
    back = tifffile.imread(tmp_path / "l.ome.tif")
    assert back.dtype == np.uint32
    np.testing.assert_array_equal(back, top)
    for labels in (np.array([[0, 1], [2**32, 2]]), np.array([[-1, 0], [2**31, 2]])):
        with pytest.raises(ValueError, match="do not fit the 32-bit integers.*relabel"):
            write_ome_tiff(tmp_path / "big.ome.tif", labels, {"name": "big"}, "labels")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.ome.tif"]


def test_float_labels_are_saved_only_when_they_are_whole_numbers(tmp_path):
    """Issue #27 item 13: a float labels layer was truncated to integers without a word."""
    import numpy as np
    import tifffile

    from napari_attnreg.io.export import write_ome_tiff

    whole = np.array([[0.0, 1.0], [2.0, 3.0]], dtype=np.float32)
    write_ome_tiff(tmp_path / "whole.ome.tif", whole, {"name": "whole"}, "labels")
    np.testing.assert_array_equal(tifffile.imread(tmp_path / "whole.ome.tif"), [[0, 1], [2, 3]])
    for bad in (np.array([[0.0, 1.0], [2.5, 3.0]]), np.array([[0.0, np.nan], [2.0, 3.0]])):
        with pytest.raises(ValueError, match="labels layer 'cells'.*not whole numbers"):
            write_ome_tiff(tmp_path / "cells.ome.tif", bad, {"name": "cells"}, "labels")
    assert not (tmp_path / "cells.ome.tif").exists()


def test_a_layer_that_cannot_be_saved_stops_the_save_before_any_file_is_written(tmp_path):
    """Issue #27 item 13: labels above 2**32 were refused only after the layers before them
    had been written (a half-saved folder)."""
    import numpy as np

    image = (np.arange(16, dtype=np.float32).reshape(4, 4), {"name": "map"}, "image")
    big = (np.array([[0, 2**32], [1, 2]], dtype=np.int64), {"name": "regions"}, "labels")
    with pytest.raises(ValueError, match="labels layer 'regions'.*do not fit"):
        save_outputs(tmp_path / "out", [image, big])
    assert list((tmp_path / "out").iterdir()) == []

"""Saved layers come back as they were: type, name, shape, placement and units (no viewer).

The writer (``io.export``) states a layer's napari placement in its OME-XML; the reader
(``io.ometiff.read_ome_tiff_layers``) puts it back. Files saved before that take it from the
``provenance.json`` beside them; an edited placement is set aside with a warning.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tifffile

from napari_attnreg.io.export import save_layer, save_outputs, write_ome_tiff
from napari_attnreg.io.ometiff import read_ome_tiff, read_ome_tiff_layers

MM = ("millimeter",) * 3


def _ct_outputs():
    """Layer data tuples like the dock's outputs over a CT in mm: a map and the labels."""
    meta = {"attnreg": {"kind": "regularized", "run_id": "r1", "preset": "directional",
                        "source": "head axial", "token_scale": [6.0, 6.0],
                        "provenance": {"model": "demo", "n_boot": 8, "null": "theoretical",
                                       "precision": "float32"}}}
    regularized = np.zeros((1, 4, 5), np.float32)  # one plane of a stack: a length-1 axis
    regularized[0, 1:3, 2:4] = [[0.5, 0.25], [0.125, 1.0]]
    labels = np.kron((regularized > 0).astype(np.int32), np.ones((1, 4, 4), np.int32))
    return [
        (regularized, {"name": "head axial · regularized", "scale": (2.5, 4.2, 3.0),
                       "translate": (-30.0, 1.75, 1.25), "units": MM,
                       "contrast_limits": (0.0, 0.8), "metadata": meta}, "image"),
        (labels, {"name": "head axial · significant", "scale": (2.5, 1.05, 0.75),
                  "translate": (-30.0, 0.175, 0.125), "units": MM,
                  "metadata": {"attnreg": {**meta["attnreg"], "kind": "significant"}}},
         "labels"),
    ]


def _token_corners(shape, scale, translate):
    """World coordinates of the first and last cell corners (napari: scale·i + translate)."""
    lo = np.array([0.0] * (len(shape) - 2) + [-0.5, -0.5])
    hi = np.array([0.0] * (len(shape) - 2) + [shape[-2] - 0.5, shape[-1] - 0.5])
    return [np.asarray(scale) * c + np.asarray(translate) for c in (lo, hi)]


def test_saved_layers_come_back_with_their_type_name_shape_placement_and_units(tmp_path):
    layers = _ct_outputs()
    files = save_outputs(tmp_path / "out", layers)
    for (data, attrs, layer_type), path in zip(layers, files):
        (back, kwargs, back_type), = read_ome_tiff_layers(path)
        assert back_type == layer_type
        assert kwargs["name"] == attrs["name"]  # not the file stem
        assert back.shape == data.shape  # the length-1 plane axis is kept
        np.testing.assert_array_equal(back, data)
        assert kwargs["units"] == MM
        for got, want in zip(_token_corners(back.shape, kwargs["scale"], kwargs["translate"]),
                             _token_corners(data.shape, attrs["scale"], attrs["translate"])):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        assert kwargs["metadata"]["attnreg"] == json.loads(json.dumps(attrs["metadata"]
                                                                      ["attnreg"]))
    (_, kwargs, _), = read_ome_tiff_layers(files[0])
    assert kwargs["contrast_limits"] == (0.0, 0.8) and kwargs["rgb"] is False
    (_, labels_kwargs, _), = read_ome_tiff_layers(files[1])
    assert "rgb" not in labels_kwargs and "contrast_limits" not in labels_kwargs
    # the pair form says the same
    (_, kwargs), = read_ome_tiff(files[1])
    assert kwargs["name"] == "head axial · significant"


@pytest.mark.parametrize(("units", "ome_unit"), [(("millimeter", "millimeter"), "mm"),
                                                 (("micrometer", "micrometer"), "µm"),
                                                 (None, None), (("pixel", "pixel"), "pixel")])
def test_ome_tiff_states_the_layer_unit(tmp_path, units, ome_unit):
    """5.29 mm is written as 5.29 mm (a layer in pixels keeps saying pixels)."""
    attrs = {"name": "m", "scale": (5.29, 5.29), **({"units": units} if units else {})}
    path = write_ome_tiff(tmp_path / "m.ome.tif", np.ones((3, 4)), attrs, "image")
    with tifffile.TiffFile(path) as tif:
        pixels = tifffile.xml2dict(tif.ome_metadata)["OME"]["Image"]["Pixels"]
    assert pixels["PhysicalSizeX"] == pytest.approx(5.29)
    assert pixels.get("PhysicalSizeXUnit") == ome_unit
    assert pixels.get("PhysicalSizeYUnit") == ome_unit


def test_files_saved_without_the_annotation_take_the_placement_from_provenance_json(tmp_path):
    layers = _ct_outputs()
    files = save_outputs(tmp_path, layers)
    labels_file = files[1]
    data = layers[1][0].astype(np.uint8)
    # as the writer did before the placement went into the OME-XML: scale only, in pixels
    tifffile.imwrite(labels_file, data, ome=True, metadata={
        "axes": "ZYX", "PhysicalSizeX": 0.75, "PhysicalSizeXUnit": "pixel",
        "PhysicalSizeY": 1.05, "PhysicalSizeYUnit": "pixel"})
    (back, kwargs, layer_type), = read_ome_tiff_layers(labels_file)
    assert layer_type == "labels" and kwargs["name"] == "head axial · significant"
    assert back.shape == (1, 16, 20)
    assert kwargs["translate"] == [-30.0, 0.175, 0.125] and kwargs["units"] == MM
    assert kwargs["metadata"]["attnreg"]["kind"] == "significant"
    # a lone file with no record anywhere is read from its OME metadata alone
    (tmp_path / "provenance.json").unlink()
    (back, kwargs, layer_type), = read_ome_tiff_layers(labels_file)
    assert layer_type == "image" and "translate" not in kwargs


@pytest.mark.parametrize("edit", [{"shape": "[2, 3]"}, {"scale": "[NaN, 1, 1]"},
                                  {"layer_type": "\"points\""}, {"translate": "[1, 2]"},
                                  {"scale": "not json"}, {"scale": "[0, 1, 1]"}])
def test_an_edited_placement_is_set_aside_with_a_warning(tmp_path, edit):
    from xml.etree import ElementTree

    data, attrs, layer_type = _ct_outputs()[0]
    path = write_ome_tiff(tmp_path / "edited.ome.tif", data, attrs, layer_type)
    with tifffile.TiffFile(path) as tif:
        root = ElementTree.fromstring(tif.ome_metadata)
    values = {m.get("K"): m.text for m in root.iter() if m.tag.endswith("}M")}
    assert json.loads(values["units"]) == list(MM)  # what the writer states
    values.update(edit)
    tifffile.imwrite(path, data, ome=True, metadata={
        "axes": "ZYX", "MapAnnotation": {"Namespace": "napari-attnreg/layer", "Value": values}})
    with pytest.warns(UserWarning, match="saved napari placement is not usable"):
        (back, kwargs, layer_type), = read_ome_tiff_layers(path)
    assert layer_type == "image" and kwargs["name"] == "edited"


def test_unknown_saved_units_read_as_pixels(tmp_path):
    data, attrs, layer_type = _ct_outputs()[0]
    path = write_ome_tiff(tmp_path / "u.ome.tif", data,
                          {**attrs, "units": ("furlong",) * 3}, layer_type)
    with pytest.warns(UserWarning, match="not lengths or times napari knows"):
        (_, kwargs, _), = read_ome_tiff_layers(path)
    assert "units" not in kwargs and kwargs["translate"] == [-30.0, 1.75, 1.25]


def test_writing_one_layer_into_a_missing_folder_creates_it(tmp_path):
    from napari_attnreg._napari.io import write_outputs

    target = tmp_path / "new" / "deeper" / "reg.ome.tif"
    tiff, sidecar = save_layer(target, _ct_outputs()[0])
    assert tiff == target and tiff.is_file() and sidecar.is_file()
    # the npe2 writer (one layer under an OME-TIFF name) as well
    written = write_outputs(str(tmp_path / "other" / "lab.ome.tif"), [_ct_outputs()[1]])
    assert [p.rsplit("/", 1)[1] for p in written] == ["lab.ome.tif", "lab.provenance.json"]
    (_, kwargs, layer_type), = read_ome_tiff_layers(written[0])
    assert layer_type == "labels" and kwargs["scale"] == [2.5, 1.05, 0.75]


def test_a_result_records_where_its_image_lay(tiny_backbone):
    from napari_attnreg import regularize

    result = regularize(np.random.default_rng(0).random((64, 48)), tiny_backbone, n_boot=3,
                        device="cpu")
    assert result.spatial == {"scale": (1.0, 1.0), "translate": (0.0, 0.0),
                              "units": ("pixel", "pixel")}  # a plain array: pixels
    result.metadata["spatial"] = {"scale": [0.7, 0.5], "translate": [-120, -100],
                                  "units": ["mm", "mm"]}
    assert result.spatial == {"scale": (0.7, 0.5), "translate": (-120.0, -100.0),
                              "units": ("mm", "mm")}
    result.metadata["spatial"] = {"scale": [0.0, float("nan")], "translate": "x", "units": [1]}
    assert result.spatial["scale"] == (1.0, 1.0) and result.spatial["units"] == ("pixel",) * 2


def test_a_saved_folder_opens_as_its_layers_and_nothing_outside_it(tmp_path):
    from napari_attnreg._napari.io import get_reader

    folder = tmp_path / "saved"
    save_outputs(folder, _ct_outputs())
    reader = get_reader(str(folder))
    layers = reader(str(folder))
    assert [(kwargs["name"], kind) for _, kwargs, kind in layers] == [
        ("head axial · regularized", "image"), ("head axial · significant", "labels"),
        ("head axial · significant outline", "shapes")]  # the labels are drawn by their outline
    outside = tmp_path / "outside.ome.tif"
    write_ome_tiff(outside, np.ones((2, 2)), {"name": "outside"}, "image")
    record = json.loads((folder / "provenance.json").read_text())
    record["layers"] = [{"file": "../outside.ome.tif"}, {"file": 3}]  # an edited record
    (folder / "provenance.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="None of the layers"):
        reader(str(folder))
    (folder / "provenance.json").write_text("{")
    with pytest.raises(ValueError, match="does not list saved layers"):
        reader(str(folder))

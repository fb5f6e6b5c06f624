"""A slide linked into a case folder under another name is named as the analyst sees it.

Before, ``attnreg run cases/`` with ``cases/patient 12.svs -> /archive/S-0001.svs`` (links
that give scans pseudonymous names, or gather them from an archive) wrote
``OUT/archive/S-0001.svs.attnreg.npz``: the result named after the link's target, and the
other inputs moved down to ``OUT/<path>/cases/...`` because the common parent was taken
over the targets. Nothing was named "patient 12".
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

tifffile = pytest.importorskip("tifffile")

from napari_attnreg.batch.items import collect_inputs, output_path  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="symbolic links")


def _image(path, seed: int) -> None:
    tifffile.imwrite(path, (np.random.default_rng(seed).random((96, 80)) * 255).astype(np.uint8))


def test_a_linked_input_keeps_its_own_name_and_the_folder_layout(tmp_path):
    archive, cases = tmp_path / "archive", tmp_path / "study" / "cases"
    archive.mkdir()
    cases.mkdir(parents=True)
    _image(archive / "S-0001.tif", 1)
    _image(cases / "local.tif", 2)
    os.symlink(archive / "S-0001.tif", cases / "patient 12.tif")
    items = collect_inputs([cases])
    outputs = sorted(str(output_path(tmp_path / "out", i, None).relative_to(tmp_path / "out"))
                     for i in items)
    assert outputs == ["local.tif.attnreg.npz", "patient 12.tif.attnreg.npz"]
    linked = next(i for i in items if i.relative.name == "patient 12.tif")
    assert linked.source == cases / "patient 12.tif"


def test_one_file_under_two_names_is_run_once(tmp_path):
    _image(tmp_path / "b_scan.tif", 3)
    os.symlink(tmp_path / "b_scan.tif", tmp_path / "a_alias.tif")
    items = collect_inputs([tmp_path])
    assert [i.relative.name for i in items] == ["a_alias.tif"]  # the first name found


def test_the_command_line_writes_the_links_result_under_its_name(tmp_path):
    from napari_attnreg.cli import main

    archive, cases = tmp_path / "archive", tmp_path / "cases"
    archive.mkdir()
    cases.mkdir()
    _image(archive / "S-0002.tif", 4)
    os.symlink(archive / "S-0002.tif", cases / "patient 7.tif")
    out = tmp_path / "out"
    assert main(["run", str(cases), "--out", str(out), "--n-boot", "4", "--device", "cpu",
                 "--quiet"]) == 0
    assert (out / "patient 7.tif.attnreg.npz").is_file()
    assert "patient 7.tif" in (out / "summary.csv").read_text(encoding="utf-8")

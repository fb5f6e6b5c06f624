"""``attnreg models`` and catalogue ids / --weights on the command line."""

from __future__ import annotations

import numpy as np
import tifffile
import torch
from safetensors.torch import save_file

from napari_attnreg.cli import main
from napari_attnreg.core.models import catalogue, hub


def test_models_lists_the_catalogue(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["id", "name", "domain", "loader", "patch", "input", "licence", "gated"]
    for entry in catalogue.CATALOGUE:
        row = next(line for line in lines if line.split()[0] == entry.id)
        assert entry.domain in row and entry.licence in row
        assert row.split()[-1] == ("yes" if entry.gated else "no")
    assert "MahmoodLab" not in out  # hub ids live in the docs and pickers, the table stays narrow


def test_run_with_catalogue_id_and_local_weights(tmp_path, blob_image, capsys):
    torch.manual_seed(0)
    module = catalogue.build_module(catalogue.find("dino-vits8"))
    weights = tmp_path / "dino.safetensors"
    save_file(module.state_dict(), str(weights))
    tifffile.imwrite(tmp_path / "cells.tif", blob_image)
    code = main(["run", str(tmp_path / "cells.tif"), "--model", "dino-vits8", "--weights", str(weights),
                 "--n-boot", "4", "--out", str(tmp_path / "out"), "--quiet", "--device", "cpu",
                 "--target-size", "64"])
    assert code == 0, capsys.readouterr().err
    assert "dino-vits8 (natural model" in capsys.readouterr().err
    assert (tmp_path / "out" / "cells.tif.attnreg.npz").is_file()  # outputs keep the extension


def test_gated_model_offline_is_a_clean_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    tifffile.imwrite(tmp_path / "x.tif", np.zeros((32, 32), np.uint16))
    assert main(["run", str(tmp_path / "x.tif"), "--model", "uni", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnreg: error: Could not download 'MahmoodLab/UNI'")
    assert "--model uni --weights FILE" in err and "Traceback" not in err


def test_run_with_junk_weights_for_the_demo_is_refused_never_run_with_the_bundled(
        tmp_path, blob_image, capsys):
    image = tmp_path / "img.tif"
    tifffile.imwrite(image, blob_image)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not weights at all")
    out = tmp_path / "out"
    rc = main(["run", str(image), "--model", "demo", "--weights", str(junk), "--out", str(out),
               "--n-boot", "4", "--device", "cpu", "--quiet"])
    err = capsys.readouterr().err
    assert rc != 0 and str(junk) in err and "Traceback" not in err
    assert not list(out.rglob("*.attnreg.npz"))  # nothing computed with the bundled weights


def test_run_with_a_users_weights_for_the_phantom_records_that_file(tmp_path, blob_image):
    import csv
    import hashlib

    from safetensors.torch import load_file

    from napari_attnreg.core.models.backbones import DEMO_DIR

    state = {k: v * 1.01 for k, v in load_file(str(DEMO_DIR / "phantom_vit.safetensors")).items()}
    mine = tmp_path / "mine.safetensors"
    save_file(state, str(mine))
    image = tmp_path / "img.tif"
    tifffile.imwrite(image, blob_image)
    out = tmp_path / "out"
    assert main(["run", str(image), "--model", "phantom", "--weights", str(mine), "--out",
                 str(out), "--n-boot", "4", "--device", "cpu", "--quiet"]) == 0
    (row,) = csv.DictReader(open(out / "summary.csv", newline="", encoding="utf-8"))
    assert row["weights"] == str(mine)
    assert row["weights_sha256"] == hashlib.sha256(mine.read_bytes()).hexdigest()

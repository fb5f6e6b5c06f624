"""Writes the format-version-1 result files of this folder and what that version computed.

They were written by napari-attnreg at commit 098d473 (the last writer of format version 1:
every map under the paper's names ``z``, ``p``, ``q``, ``lfdr``, ``posterior``, whatever the
preset). ``legacy_v1_expected.npz`` holds that version's significance masks and regularized
maps of every rule, which tests/test_result_storage.py checks a reader of today against.
Usage (with that version installed): ``python make_legacy_results.py FOLDER``.
"""

import sys

import numpy as np

from napari_attnreg import regularize
from napari_attnreg.core.models.backbones import load_backbone

out = sys.argv[1]
rng = np.random.default_rng(7)
image = (rng.random((32, 40)) * 200).astype(np.uint8)
image[8:16, 16:24] = 255
backbone = load_backbone("demo")
expected = {}
for preset in ("stepdown", "paper"):
    res = regularize(image, backbone, preset=preset, n_boot=8, device="cpu", seed=0)
    res.head_attention = None  # keeps the file small
    res.save(f"{out}/legacy_v1_{preset}.npz")
    for rule in res.procedure.rules:
        kw = {"q_th": 0.5, "p_th": 0.5} if rule in ("forwardstop", "fwer") else {}
        expected[f"{preset}__significant__{rule}"] = res.significant(rule, **kw)
        expected[f"{preset}__regularized__{rule}"] = res.regularized(rule, **kw)
np.savez_compressed(f"{out}/legacy_v1_expected.npz", **expected)

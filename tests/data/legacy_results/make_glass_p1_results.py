"""Writes the tiled, tissue-masked result files of this folder and what their version showed.

They were written by napari-attnreg at commit 3a55ee3, the last version that filled the
tokens no tissue tile holds (glass, never run) with p = q = lfdr = 1 and posterior 0, as if
tested; later versions write NaN there ("not measured"). ``glass_p1_expected.npz`` holds that
version's significance masks and regularized maps of every rule and its shown maps, which
tests/test_untested_glass.py checks a reader of today against.
Usage (with that version on the path): ``python make_glass_p1_results.py FOLDER``.
"""

import sys

import numpy as np

from napari_attnreg import regularize
from napari_attnreg.core.results.display import MAPS_BY_KEY, significance_caption

out = sys.argv[1]
rng = np.random.default_rng(0)
image = rng.random((256, 256)).astype(np.float32)
mask = np.zeros((256, 256), bool)
mask[:128, :128] = True  # the tissue: three of the nine tiles are run
expected = {}
for preset in ("stepdown", "paper"):
    res = regularize(image, "demo", tiled=True, tissue_mask=mask, preset=preset, n_boot=4,
                     seed=0, device="cpu")
    res.head_attention = None  # keeps the file small
    res.null_summary.pop("tissue_mask")
    res.save(f"{out}/glass_p1_{preset}.npz")
    for rule in res.procedure.rules:
        expected[f"{preset}__significant__{rule}"] = res.significant(rule)
        expected[f"{preset}__regularized__{rule}"] = res.regularized(rule)
    for key, view in MAPS_BY_KEY.items():
        expected[f"{preset}__shown__{key}"] = view.values(res, res.thresholds)
        expected[f"{preset}__limits__{key}"] = np.array(view.limits(res))
    expected[f"{preset}__caption"] = np.array(significance_caption(res))
np.savez_compressed(f"{out}/glass_p1_expected.npz", **expected)

"""The map checks run the last block alone from what entered it in the image's own pass.

The sanity check's re-drawn map and the sink check's last-block output need only the tokens
entering the last block; a run keeps them from its observed pass, so the checks run one block
each instead of the whole model twice. The numbers must be those of the whole passes, bit for
bit in float32, for every adapter (timm classic and rotary, transformers).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_scorers import images, peaked_timm, rotary_dinov3, tiny_dinov2, with_sink

from napari_attnreg.core.models.attention import cls_attention, cls_attention_entering
from napari_attnreg.core.models.scorers import make_scorer
from napari_attnreg.core.models.scorers.parts import blocks
from napari_attnreg.core.run.maps import map_checks

pytest.importorskip("transformers")


BACKBONES = {
    "timm with a sink": lambda: with_sink(peaked_timm(), token=6),
    "transformers DINOv2": tiny_dinov2,
    "timm DINOv3 (rotary, registers)": rotary_dinov3,
}


class _PassCounter:
    """Counts the calls of the first block: a check that runs the whole model calls it."""

    def __init__(self, backbone) -> None:
        self.calls = 0
        self.handle = blocks(backbone)[0].register_forward_hook(self._seen)

    def _seen(self, *_args) -> None:
        self.calls += 1


@pytest.mark.parametrize("family", list(BACKBONES))
@pytest.mark.parametrize("name", ["attention", "heads"])
def test_checks_from_the_entering_tokens_are_those_of_whole_passes(family, name):
    bb = BACKBONES[family]()
    x = images(bb, n=1)
    scorer = make_scorer(name)
    with torch.inference_mode():
        heads, entering = cls_attention_entering(bb, x, layer=-1, head="all")
        whole = cls_attention(bb, x, layer=-1, head="all")
    assert entering is not None and entering.idx == bb.depth - 1
    assert torch.equal(heads, whole)  # the observed pass itself is unchanged
    original = scorer.from_heads(heads.flatten(2))
    kwargs = {"seed": 3, "original": original, "share": heads[0].mean(0)}

    counter = _PassCounter(bb)
    try:
        found, numbers, sinks = map_checks(scorer, bb, x[0], entering=entering, **kwargs)
        reused_calls = counter.calls
        found_whole, numbers_whole, sinks_whole = map_checks(scorer, bb, x[0], **kwargs)
    finally:
        counter.handle.remove()
    assert reused_calls == 0, "a check ran the whole model although the block's input was kept"
    assert counter.calls == 2  # the whole passes: the re-drawn map and the sink norms
    assert np.isfinite(numbers["map_sanity_rho"]) and numbers["map_sanity_rho"] < 1
    assert numbers == numbers_whole and found == found_whole
    np.testing.assert_array_equal(sinks.norm_ratio, sinks_whole.norm_ratio)
    np.testing.assert_array_equal(sinks.share, sinks_whole.share)
    if family == "timm with a sink":
        assert sinks.tokens == (6,)  # a sink is found through the kept tokens too


def test_checks_of_an_earlier_block_or_a_gradient_map_still_run_whole_passes():
    # the kept tokens enter block 0 (layer=0), or the map reads more than the CLS rows
    # (CDAM's gradients): the sanity check must run the re-drawn model as a whole
    bb = peaked_timm()
    x = images(bb, n=1)
    with torch.inference_mode():
        _, first = cls_attention_entering(bb, x, layer=0, head="all")
        _, last = cls_attention_entering(bb, x, layer=-1, head="all")
    cases = [(make_scorer("attention", layer=0), first), (make_scorer("cdam", target=1), last)]
    for scorer, entering in cases:
        counter = _PassCounter(bb)
        try:
            _, numbers, _ = map_checks(scorer, bb, x[0], seed=3, entering=entering)
            _, numbers_whole, _ = map_checks(scorer, bb, x[0], seed=3)
        finally:
            counter.handle.remove()
        assert numbers == numbers_whole
        assert counter.calls > 2

"""Fuzz: regularize_stack keeps every finished plane whatever fails or is cancelled."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from napari_attnreg import regularize, regularize_stack
from napari_attnreg.core.run.api import PartialStackWarning, StackResults
from napari_attnreg.core.run.engine import CancelToken

FAST = dict(n_boot=3, chunk_size=3, device="cpu", target_size=(64, 64))
H, W = 40, 48


def _plane(kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "constant":
        return np.full((H, W), 5.0, np.float32)
    plane = rng.random((H, W)).astype(np.float32)
    if kind == "nan":
        plane[3:9, 4:7] = np.nan
    if kind == "inf":
        plane[0, 0] = np.inf
    return plane


@settings(max_examples=8, deadline=None)
@given(kinds=st.lists(st.sampled_from(["ok", "ok", "constant", "nan", "inf"]), min_size=1,
                      max_size=4))
def test_bad_planes_are_marked_and_good_planes_kept(tiny_backbone, kinds):
    stack = np.stack([_plane(k, i) for i, k in enumerate(kinds)])
    good = [i for i, k in enumerate(kinds) if k == "ok"]
    # a plane the engine refuses on its own (NaN/inf may be refused or analysed, as regularize does)
    alone = {}
    for i in range(len(kinds)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                alone[i] = regularize(stack[i], tiny_backbone, **FAST)
        except ValueError as err:
            alone[i] = str(err)
    analysable = [i for i, r in alone.items() if not isinstance(r, str)]
    assert set(good) <= set(analysable)
    if not analysable:
        with pytest.raises(ValueError) as info:
            regularize_stack(stack, tiny_backbone, **FAST)
        assert isinstance(info.value.partial, StackResults)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = regularize_stack(stack, tiny_backbone, **FAST)
    assert len(results) == len(kinds) and results.finished == analysable
    assert sorted(results.errors) == [i for i in alone if i not in analysable]
    for i, outcome in alone.items():
        if isinstance(outcome, str):
            assert results[i] is None and results.errors[i] == outcome
        else:
            np.testing.assert_array_equal(results[i].attention, outcome.attention)
    partial = [w for w in caught if issubclass(w.category, PartialStackWarning)]
    assert bool(partial) == (not results.complete)


@settings(max_examples=5, deadline=None)
@given(n=st.integers(1, 4), cancel_at=st.integers(0, 4),
       stage=st.sampled_from(["observed", "nulls"]))
def test_a_cancel_keeps_the_planes_before_it(tiny_backbone, n, cancel_at, stage):
    stack = np.stack([_plane("ok", i) for i in range(n)])
    token = CancelToken()

    def progress(index, total, event):
        if index == cancel_at and event.stage == stage:
            token.cancel()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PartialStackWarning)
        results = regularize_stack(stack, tiny_backbone, progress=progress, cancel=token, **FAST)
    if cancel_at >= n:
        assert results.complete and not results.cancelled
    else:
        assert results.cancelled and results.finished == list(range(cancel_at))
        assert all(r is None for r in results[cancel_at:]) and not results.errors


def test_a_cancel_before_the_first_plane(tiny_backbone):
    token = CancelToken()
    token.cancel()
    with pytest.warns(PartialStackWarning, match="0 of 2 planes"):
        results = regularize_stack(np.stack([_plane("ok", 0)] * 2), tiny_backbone, cancel=token,
                                   **FAST)
    assert results.cancelled and results == [None, None]


@pytest.mark.parametrize("shape,kwargs,match", [
    ((0, H, W), {}, "empty"),
    ((2, 0, W), {}, "empty"),
    ((3, H, W, 3), {}, "rgb=True|channel_last"),
    ((2, 2, H, W, 4), {}, "rgb=True|channel_last"),
    ((H,), {}, "at least 2 axes"),
    ((2, H, W), {"head": 7}, "3 attention heads"),
    ((2, H, W), {"layer": 9}, "2 blocks"),
    ((2, H, W), {"device": "meta"}, "compute device"),
    ((2, H, W), {"n_boot": 0}, "n_boot"),
])
def test_a_bad_stack_or_option_fails_before_the_first_plane(tiny_backbone, shape, kwargs, match):
    calls = []
    with pytest.raises(ValueError, match=match):
        regularize_stack(np.ones(shape, np.float32), tiny_backbone,
                         progress=lambda *a: calls.append(a), **{**FAST, **kwargs})
    assert not calls


def test_a_colour_stack_with_channel_last(tiny_backbone):
    rng = np.random.default_rng(0)
    results = regularize_stack(rng.random((2, H, W, 3)).astype(np.float32), tiny_backbone,
                               channel_last=True, **FAST)
    assert results.complete and results[0].attention.shape == (4, 4)


def test_stack_results_behave_as_a_list():
    results = StackResults(["a", None, "c"], errors={1: "The image is constant"})
    assert list(results) == ["a", None, "c"] and results[2] == "c" and len(results) == 3
    assert results.finished == [0, 2] and not results.complete and not results.cancelled
    assert "2 of 3 planes finished" in results.summary() and "plane 1 failed" in results.summary()

"""The generator engine and AttentionResult: determinism, chunks, cancel, OOM backoff, I/O."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import napari_attnreg.core.run.engine as engine_mod
from napari_attnreg import AttentionResult, regularize
from napari_attnreg.core.run.engine import CancelToken, RunCancelled, RunConfig, run_engine

FAST = dict(n_boot=12, chunk_size=5, device="cpu", preset="paper")


def assert_close_result(a, b):
    """Equal up to float32 batch-blocking noise: z to 1e-5, p within a few pool ranks."""
    np.testing.assert_allclose(a.z, b.z, rtol=0, atol=1e-5)
    m0 = a.attention.size * (1 + a.metadata["n_boot"])
    np.testing.assert_allclose(a.p, b.p, rtol=0, atol=3 / m0)


def test_regularize_end_to_end(tiny_backbone, blob_image):
    events = []
    res = regularize(blob_image, tiny_backbone, progress=events.append, **FAST)
    gh, gw = res.grid_shape
    assert (gh, gw) == (14, 12)  # 96x80 → long side 224 → 224x192 model pixels → 14x12 tokens
    for name in ("attention", "z", "p", "lfdr", "posterior", "q"):
        arr = getattr(res, name)
        assert arr.shape == (gh, gw) and np.all(np.isfinite(arr)), name
    assert np.all((res.p >= 0) & (res.p <= 1)) and 0 <= res.pi0 <= 1
    np.testing.assert_allclose(res.posterior, 1 - res.lfdr)
    assert res.head_attention.shape == (3, gh, gw)
    np.testing.assert_allclose(res.head_attention.mean(0), res.attention, rtol=1e-6)
    assert [e.stage for e in events] == ["observed", "nulls", "nulls", "nulls", "statistics"]
    assert [e.done for e in events if e.stage == "nulls"] == [5, 10, 12]
    md = res.metadata
    assert md["n_boot"] == 12 and md["seed"] == 0 and md["device"] == "cpu" and md["method"] == "normal"
    assert md["timings"]["total_s"] > 0 and md["random_init"] is False  # a given module
    assert res.null_summary["sigma0"] > 0


def test_same_seed_same_result_and_chunk_invariance(tiny_backbone, blob_image):
    a = regularize(blob_image, tiny_backbone, **FAST)
    again = regularize(blob_image, tiny_backbone, **FAST)
    b = regularize(blob_image, tiny_backbone, **{**FAST, "chunk_size": 12})
    c = regularize(blob_image, tiny_backbone, **{**FAST, "seed": 1})
    for name in ("attention", "z", "p", "lfdr", "q"):
        np.testing.assert_array_equal(getattr(a, name), getattr(again, name))
    # other chunk sizes draw the same null images; only GEMM blocking of the batch differs (~1e-7)
    assert_close_result(a, b)
    assert not np.array_equal(a.z, c.z)


@pytest.mark.parametrize("method", ["uniform", "pixel", "patch"])
def test_every_null_method_runs(tiny_backbone, blob_image, method):
    res = regularize(blob_image, tiny_backbone, method=method, **FAST)
    assert res.metadata["method"] == method and np.isfinite(res.z).all()


def test_cancel_token_stops_within_one_chunk(tiny_backbone, blob_image):
    token = CancelToken()
    gen = run_engine(blob_image, tiny_backbone, RunConfig(n_boot=50, chunk_size=5, device="cpu"), token)
    seen = []
    with pytest.raises(RunCancelled):
        for ev in gen:
            seen.append(ev)
            if ev.stage == "nulls" and ev.done >= 10:
                token.cancel()
    assert max(e.done for e in seen) == 10


def test_closing_the_generator_stops_it(tiny_backbone, blob_image):
    gen = run_engine(blob_image, tiny_backbone, RunConfig(n_boot=50, chunk_size=5, device="cpu"))
    next(gen), next(gen)
    gen.close()
    with pytest.raises(StopIteration):
        next(gen)


def test_out_of_memory_halves_the_chunk_and_gives_the_same_result(tiny_backbone, blob_image, monkeypatch):
    real = engine_mod.cls_attention
    calls = []

    def flaky(bb, images, **kw):
        calls.append(images.shape[0])
        if images.shape[0] > 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(bb, images, **kw)

    expected = regularize(blob_image, tiny_backbone, **FAST)
    monkeypatch.setattr(engine_mod, "cls_attention", flaky)
    events = []
    res = regularize(blob_image, tiny_backbone, progress=events.append, **{**FAST, "chunk_size": 12})
    assert any("halved" in e.message for e in events)
    assert res.metadata["chunk_size"] == 3
    assert_close_result(res, expected)


def test_out_of_memory_at_one_image_is_a_clear_error(tiny_backbone, blob_image, monkeypatch):
    def always(bb, images, **kw):  # null chunks fail; the observed image (its own pass) fits
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(engine_mod, "cls_attention", always)
    with pytest.raises(MemoryError, match="single null image"):
        regularize(blob_image, tiny_backbone, **FAST)


def test_other_errors_are_not_swallowed(tiny_backbone, blob_image, monkeypatch):
    def broken(bb, images, **kw):
        raise RuntimeError("shape mismatch somewhere")

    monkeypatch.setattr(engine_mod, "cls_attention", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        regularize(blob_image, tiny_backbone, **FAST)


def test_bad_options(tiny_backbone, blob_image):
    with pytest.raises(TypeError, match="unknown options"):
        regularize(blob_image, tiny_backbone, nboot=3)
    with pytest.raises(ValueError, match="n_boot"):
        regularize(blob_image, tiny_backbone, n_boot=0)
    with pytest.raises(ValueError, match="method=.gauss. is not supported"):
        regularize(blob_image, tiny_backbone, method="gauss")
    with pytest.raises(ValueError, match="no CUDA"):
        if torch.cuda.is_available():
            raise ValueError("no CUDA (skipped: a GPU is present)")
        regularize(blob_image, tiny_backbone, device="cuda")
    with pytest.raises(ValueError, match="constant"):
        regularize(np.ones((64, 64)), tiny_backbone, **FAST)


def test_thresholds_reapply_without_recomputing(tiny_backbone, blob_image):
    res = regularize(blob_image, tiny_backbone, **FAST)
    loose = res.regularized("p", p_th=1.0)
    strict = res.regularized("p", p_th=0.0)
    assert np.count_nonzero(strict) <= np.count_nonzero(loose)
    np.testing.assert_array_equal(loose, np.where(res.z >= 0, res.attention, 0))
    assert set(res.regularized_maps()) == {"base", "q", "p", "lfdr", "pi0", "soft"}
    assert res.significant("lfdr", l_th=1.0).sum() == (res.z >= 0).sum()
    other = res.with_thresholds(rule="p", p_th=0.05)
    assert other.thresholds["rule"] == "p" and res.thresholds["rule"] == "lfdr"
    with pytest.raises(ValueError, match="Unknown rule"):
        res.regularized("bogus")


def test_pixel_geometry_is_exact(tiny_backbone, blob_image):
    res = regularize(blob_image, tiny_backbone, **FAST)
    assert res.image_shape == (96, 80) and res.model_shape == (224, 192)
    sy, sx = res.token_scale
    assert np.isclose(sy, 16 * 96 / 224) and np.isclose(sx, 16 * 80 / 192)
    up = res.to_pixels(res.attention)
    assert up.shape == (96, 80)
    # every pixel takes the value of the token whose footprint holds its centre
    for r, c in [(0, 0), (95, 79), (50, 33), (6, 6), (7, 7)]:
        i, j = int((r + 0.5) / sy), int((c + 0.5) / sx)
        assert up[r, c] == res.attention[i, j]
    cover = res.token_coverage(np.ones((96, 80), bool))
    np.testing.assert_allclose(cover, 1.0)
    half = np.zeros((96, 80), bool)
    half[:48] = True
    assert np.isclose(res.token_coverage(half).mean(), 0.5, atol=0.05)


def test_save_load_round_trip(tiny_backbone, blob_image, tmp_path):
    res = regularize(blob_image, tiny_backbone, keep_nulls=True, **FAST)
    assert res.null_scores.shape == (12, *res.grid_shape)
    path = res.save(tmp_path / "out" / "result")
    assert path.name == "result.npz"
    back = AttentionResult.load(path)
    assert back == res
    assert back.metadata["timings"] == res.metadata["timings"] and back.metadata["n_boot"] == 12
    np.testing.assert_array_equal(back.regularized(), res.regularized())
    assert set(back.null_summary) == set(res.null_summary)
    for key, value in res.null_summary.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_allclose(back.null_summary[key], value)
        else:
            assert back.null_summary[key] == value
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros(3))
    with pytest.raises(ValueError, match="not a napari-attnreg result"):
        AttentionResult.load(bad)


def test_regularize_stack_maps_over_leading_axes(tiny_backbone, blob_image):
    from napari_attnreg import regularize_stack
    stack = np.stack([blob_image, blob_image[::-1], blob_image[:, ::-1]])[None]  # (1, 3, H, W)
    seen = []
    results = regularize_stack(stack, tiny_backbone, progress=lambda i, n, ev: seen.append((i, n)),
                               n_boot=6, chunk_size=6, device="cpu")
    assert len(results) == 3 and {i for i, _ in seen} == {0, 1, 2} and seen[0][1] == 3
    assert not np.allclose(results[0].attention, results[1].attention)


# ---------------------------------------------------------------- issue 12 regressions
def test_a_head_the_model_lacks_fails_before_any_work(tiny_backbone, blob_image, monkeypatch):
    drawn, real = [], engine_mod.prepared_nulls
    monkeypatch.setattr(engine_mod, "prepared_nulls",
                        lambda *a, **k: drawn.append(1) or real(*a, **k))
    for head in (99, 3):
        gen = run_engine(blob_image, tiny_backbone, RunConfig(head=head, **FAST))
        with pytest.raises(ValueError, match="has 3 attention heads.*0..2"):
            next(gen)
    with pytest.raises(ValueError, match="has 2 blocks"):
        next(run_engine(blob_image, tiny_backbone, RunConfig(layer=5, **FAST)))
    assert not drawn
    assert regularize(blob_image, tiny_backbone, head=np.int64(2), **FAST).metadata["head"] == 2


def test_a_constant_plane_keeps_the_other_planes(tiny_backbone, blob_image):
    from napari_attnreg import regularize_stack
    from napari_attnreg.core.run.api import PartialStackWarning

    stack = np.stack([blob_image, np.full_like(blob_image, 7), blob_image[::-1]])
    with pytest.warns(PartialStackWarning, match="plane 1 failed"):
        results = regularize_stack(stack, tiny_backbone, **FAST)
    assert len(results) == 3 and results[1] is None
    assert results[0] is not None and results[2] is not None
    assert "constant" in results.errors[1] and list(results.errors) == [1]
    assert not results.complete and not results.cancelled and results.finished == [0, 2]
    with pytest.raises(ValueError, match="No plane of the stack could be analysed") as info:
        regularize_stack(np.zeros((2, 40, 40)), tiny_backbone, **FAST)
    assert set(info.value.partial.errors) == {0, 1}


def test_cancelling_a_stack_keeps_the_finished_planes(tiny_backbone, blob_image):
    from napari_attnreg import regularize_stack
    from napari_attnreg.core.run.api import PartialStackWarning

    token = CancelToken()

    def progress(index, n, event):
        if index == 1 and event.stage == "nulls":
            token.cancel()

    stack = np.stack([blob_image, blob_image[::-1], blob_image[:, ::-1]])
    with pytest.warns(PartialStackWarning, match="cancelled"):
        results = regularize_stack(stack, tiny_backbone, progress=progress, cancel=token, **FAST)
    assert results.cancelled and results.finished == [0] and results[1] is None
    np.testing.assert_array_equal(results[0].attention,
                                  regularize(blob_image, tiny_backbone, **FAST).attention)


def test_other_errors_in_a_stack_carry_the_finished_planes(tiny_backbone, blob_image, monkeypatch):
    from napari_attnreg import regularize_stack
    real, calls = engine_mod.cls_attention_entering, []

    def broken_on_second_plane(bb, images, **kw):  # each plane's observed pass
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("driver crashed")
        return real(bb, images, **kw)

    monkeypatch.setattr(engine_mod, "cls_attention_entering", broken_on_second_plane)
    with pytest.raises(RuntimeError, match="driver crashed") as info:
        regularize_stack(np.stack([blob_image, blob_image]), tiny_backbone, **FAST)
    assert info.value.partial.finished == [0]


@pytest.mark.parametrize("chunk", [1, 3, 7, None])
def test_what_the_chunk_size_can_change(tiny_backbone, blob_image, chunk):
    """The promise of the engine's Reproducibility paragraph, exactly."""
    options = dict(n_boot=14, seed=5, device="cpu", preset="paper", keep_nulls=True)
    ref = regularize(blob_image, tiny_backbone, chunk_size=14, **options)
    res = regularize(blob_image, tiny_backbone, chunk_size=chunk, **options)
    np.testing.assert_array_equal(res.attention, ref.attention)
    np.testing.assert_array_equal(res.head_attention, ref.head_attention)
    np.testing.assert_allclose(res.null_scores, ref.null_scores, rtol=1e-5, atol=0)
    np.testing.assert_allclose(res.z, ref.z, rtol=0, atol=1e-5)
    np.testing.assert_allclose(res.posterior, ref.posterior, rtol=0, atol=1e-5)
    step = 1 / (options["n_boot"] * res.attention.size)  # one rank of the pooled null
    assert np.abs(res.p - ref.p).max() <= 2 * step


def test_a_large_upscale_is_a_diagnostic_too(tiny_backbone, rng):
    from napari_attnreg.core.run.images import ImageSizeWarning

    small = rng.random((20, 24)).astype(np.float32)
    with pytest.warns(ImageSizeWarning):
        res = regularize(small, tiny_backbone, n_boot=4, device="cpu", target_size=160)
    assert any("enlarge" in d.message.lower() or "upscal" in d.message.lower()
               for d in res.diagnostics if d.severity == "warning"), res.diagnostics


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on a lent GPU)")
def test_on_a_gpu_chunks_queued_ahead_give_the_result_of_chunks_waited_for(
        tiny_backbone, blob_image, monkeypatch):
    # the host queues up to two chunks ahead of the device and runs the map checks while
    # the last ones finish: the result must be that of a run that waits for every chunk,
    # the progress must still count every chunk, and the CPU must agree to rounding
    from napari_attnreg.core.run import passes

    opts = dict(n_boot=48, chunk_size=4, preset="stepdown", precision="float32")
    events = []
    ahead = regularize(blob_image, tiny_backbone, device="cuda", progress=events.append, **opts)
    monkeypatch.setattr(passes._QueuedChunks, "AHEAD", 1)
    monkeypatch.setattr(engine_mod, "_queues_ahead", lambda run: False)
    waited = regularize(blob_image, tiny_backbone, device="cuda", **opts)
    assert [e.done for e in events if e.stage == "nulls"] == list(range(4, 49, 4))
    for name, values in waited.maps.items():
        np.testing.assert_array_equal(ahead.maps[name], values, err_msg=name)
    assert ahead.metadata["map_sanity_rho"] == waited.metadata["map_sanity_rho"]
    cpu = regularize(blob_image, tiny_backbone, device="cpu", **opts)
    np.testing.assert_allclose(ahead.maps["z"], cpu.maps["z"], rtol=1e-2, atol=1e-3)
    assert ahead.metadata["sink_tokens"] == cpu.metadata["sink_tokens"]
    assert ahead.metadata["map_sanity_rho"] == pytest.approx(cpu.metadata["map_sanity_rho"],
                                                             abs=0.02)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on a lent GPU)")
def test_on_a_gpu_nothing_waits_for_the_device_from_the_first_chunk_to_the_checks_read_back(
        tiny_backbone, blob_image, monkeypatch):
    # the host must queue the nulls, the observed pass and the checks' passes without once
    # waiting for the device, or the device idles while the host works (the H100 figures)
    from napari_attnreg.core.run import maps as maps_mod

    real_first, real_read = engine_mod._queue_first_chunk, maps_mod.sanity_from_maps

    def strict_first(*args):
        torch.cuda.set_sync_debug_mode("error")
        return real_first(*args)

    def relaxed_read(*args):
        torch.cuda.set_sync_debug_mode("default")
        return real_read(*args)

    monkeypatch.setattr(engine_mod, "_queue_first_chunk", strict_first)
    monkeypatch.setattr(maps_mod, "sanity_from_maps", relaxed_read)
    try:
        result = regularize(blob_image, tiny_backbone, device="cuda", n_boot=16, chunk_size=8,
                            precision="bfloat16")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert np.isfinite(result.maps["z"]).all()

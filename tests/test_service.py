"""The pipeline service every front end drives: model cache, planes, outcome, messages."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from napari_attnreg.core.models.backbones import BackboneError
from napari_attnreg.core.run import service
from napari_attnreg.core.run.engine import CancelToken, RunConfig
from napari_attnreg.core.run.planes import PlaneStack, plane_label
from napari_attnreg.core.run.service import Job, ModelSpec, run_job, run_job_sync, user_message

CONFIG = RunConfig(n_boot=4, device="cpu", target_size=32, chunk_size=2)


@pytest.fixture
def spec(tiny_backbone):
    return ModelSpec("module", "tiny", module=tiny_backbone)


def _stack(rng, n=3, constant=None):
    data = rng.random((n, 40, 48)).astype(np.float32)
    if constant is not None:
        data[constant] = 0.5
    return PlaneStack.from_array(data, stack=True)


def test_all_planes_done(spec, rng):
    stack = _stack(rng)
    events = []
    outcome = run_job_sync(Job(spec, stack, stack.planes(), CONFIG, task_id=7),
                           on_progress=events.append)
    assert outcome.status == "done" and outcome.ok and outcome.task_id == 7
    assert sorted(outcome.results) == [(0,), (1,), (2,)] and not outcome.errors
    assert outcome.results[(1,)].metadata["plane"] == [1]
    assert events[0].message.startswith("loading model") and events[-1].fraction <= 1.0
    assert all(e.task_id == 7 for e in events)
    assert np.diff([e.fraction for e in events]).min() >= 0  # progress never goes back


def test_a_failing_plane_keeps_the_others(spec, rng):
    stack = _stack(rng, constant=1)
    outcome = run_job_sync(Job(spec, stack, stack.planes(), CONFIG))
    assert outcome.status == "partial"
    assert sorted(outcome.results) == [(0,), (2,)]
    assert "constant" in outcome.errors[(1,)]
    assert "2 of 3 planes done" in outcome.message and "plane 1: " in outcome.message
    assert "(1,)" not in outcome.message  # a plane is never named as a Python tuple


def test_progress_and_failures_name_planes_by_their_axes(spec, rng):
    # the dock hands the stack axes' names ("z"): progress said "plane (2,) (3/3)"
    stack = _stack(rng, constant=1)
    events = []
    outcome = run_job_sync(Job(spec, stack, stack.planes(), CONFIG, plane_names=("z",)),
                           on_progress=events.append)
    said = {e.message.split(":")[0] for e in events if "(" in e.message.split(":")[0]}
    assert said == {"z = 0 (1/3)", "z = 2 (3/3)"}  # z = 1 (constant) fails before its run
    assert "z = 1: " in outcome.message
    unnamed = run_job_sync(Job(spec, stack, stack.planes()[:1], CONFIG), on_progress=events.append)
    assert unnamed.ok and any(e.message.startswith("plane 0 (1/1): ") for e in events)
    assert plane_label((2, 0)) == "plane 2, 0" and plane_label((2, 0), ("t", "z")) == "t = 2, z = 0"


def test_cancel_keeps_the_finished_planes(spec, rng):
    stack = _stack(rng)
    cancel = CancelToken()
    gen = run_job(Job(spec, stack, stack.planes(), CONFIG), cancel)
    for item in gen:
        if item.plane_number == 1:  # the second plane started: the first is finished
            cancel.cancel()
            break
    with pytest.raises(StopIteration) as stop:
        next(gen)
    outcome = stop.value.value
    assert outcome.status == "cancelled" and list(outcome.results) == [(0,)]
    assert "1 of 3 planes finished and are kept" in outcome.message


def test_model_errors_become_a_failed_outcome_with_the_core_message(rng):
    stack = _stack(rng, n=1)
    outcome = run_job_sync(Job(ModelSpec("file", "/no/such/weights.safetensors"), stack,
                               stack.planes(), CONFIG))
    assert outcome.status == "failed" and not outcome.results
    assert isinstance(outcome.error, BackboneError)
    assert outcome.message == user_message(outcome.error)
    empty = run_job_sync(Job(ModelSpec("timm", "  "), stack, stack.planes(), CONFIG))
    assert "Type a timm model name" in empty.message


def test_an_option_error_comes_before_the_model_loads(monkeypatch, rng):
    def boom(spec):  # pragma: no cover - must not be reached
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(service, "load_model", boom)
    stack = _stack(rng, n=1)
    bad = RunConfig(n_boot=4, p_th=2.0)
    outcome = run_job_sync(Job(ModelSpec(), stack, stack.planes(), bad))
    assert outcome.status == "failed" and "p_th" in outcome.message


def test_fingerprints_notice_replaced_pixels(spec, rng):
    stack = _stack(rng, n=1)
    outcome = run_job_sync(Job(spec, stack, stack.planes(), CONFIG))
    plane = stack.read((0,))[0]
    assert outcome.fingerprints[(0,)] == service.plane_fingerprint(plane)
    changed = plane.copy()
    changed[3, 3] += 1
    assert service.plane_fingerprint(changed) != outcome.fingerprints[(0,)]


def test_the_cache_keeps_one_model(monkeypatch):
    loads = []
    monkeypatch.setattr(service, "_load", lambda spec: loads.append(spec.name) or object())
    service.clear_model_cache()
    a = service.load_model(ModelSpec("timm", "a"))
    assert service.load_model(ModelSpec("timm", " a ")) is a
    service.load_model(ModelSpec("timm", "b"))
    service.load_model(ModelSpec("timm", "a"))
    assert loads == ["a", "b", "a"]
    service.clear_model_cache()


def test_user_messages():
    assert user_message(ValueError("Choose a file.")) == "Choose a file."
    assert user_message(BackboneError("x. call load_backbone(...)", gui_hint="Use the file option.")
                        ) == "x. Use the file option."
    assert user_message(RuntimeError("CUDA out of memory. Tried")).startswith("Out of memory")
    assert "Unexpected KeyError" in user_message(KeyError("k"))


def test_a_cached_module_stays_alive_so_its_id_names_no_other_model():
    """A given module is cached by id(); were it freed, a new module could get its id and
    the cache would hand back the old model (regularize(image, module) uses the cache)."""
    import gc
    import weakref

    import timm

    module = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1)
    alive = weakref.ref(module)
    service.load_model(ModelSpec.from_model(module))
    del module
    gc.collect()
    assert alive() is not None  # held by the cache entry keyed by its id
    service.clear_model_cache()
    gc.collect()
    assert alive() is None


def test_devices_start_with_auto_and_cpu():
    assert service.available_devices()[:2] == ["auto", "cpu"]


def test_display_names_every_roi_column_and_summarises(spec, rng):
    from napari_attnreg.core.results import display
    from napari_attnreg.core.run.thresholds import Thresholds
    from napari_attnreg.core.stats import roi

    assert set(roi.ROI_COLUMNS) <= set(display.ROI_COLUMNS)
    stack = _stack(rng, n=1)
    config = replace(CONFIG, preset="directional")  # the q rule and its threshold
    result = run_job_sync(Job(spec, stack, stack.planes(), config)).results[(0,)]
    text = display.summary_text([result], Thresholds.from_preset("directional").replace(q_th=1.0))
    assert "q ≤ 1" in text and "B = 4" in text
    assert text.startswith(f"{result.significant(q_th=1.0).sum()}/")


def test_pixel_lookup_matches_to_pixels(spec, rng):
    from napari_attnreg.core.results import display
    stack = _stack(rng, n=1)
    result = run_job_sync(Job(spec, stack, stack.planes(), CONFIG)).results[(0,)]
    tokens = result.to_pixels(np.arange(result.attention.size).reshape(result.grid_shape))
    for row, col in [(0, 0), (39, 47), (17, 30)]:
        i, j = display.token_at(result, row, col)
        assert i * result.grid_shape[1] + j == tokens[row, col]
    assert display.token_at(result, 40, 0) is None and display.describe_pixel(result, -1, 0) == ""
    assert display.describe_pixel(result, 5, 6).startswith("x=6 y=5 · patch (")


def test_help_links_point_at_the_docs_that_exist():
    from pathlib import Path
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    from napari_attnreg.core.docs import docs_url

    url = docs_url("method")
    assert url is not None and url.startswith("file:")  # a source checkout has docs/
    assert Path(url2pathname(urlparse(url).path)).read_text().startswith("#")
    assert docs_url("no-such-page") is None


def test_model_spec_from_what_scripts_pass(tmp_path, tiny_backbone):
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    assert ModelSpec.from_model("demo") == ModelSpec("demo", "demo")
    assert ModelSpec.from_model("vit_small_patch16_224").source == "timm"
    assert ModelSpec.from_model(str(weights)).source == "file"
    assert ModelSpec.from_model("uni", arch="vit_large_patch16_224").source == "file"
    given = ModelSpec.from_model(tiny_backbone)
    assert given.source == "module" and given.module is tiny_backbone


def test_masks_are_computed_once_per_maps_and_thresholds(spec, rng, monkeypatch):
    from dataclasses import replace

    from napari_attnreg.core.results import result as result_mod
    stack = _stack(rng, n=1)
    config = replace(CONFIG, preset="directional")  # the q rule and its threshold
    result = run_job_sync(Job(spec, stack, stack.planes(), config)).results[(0,)]
    calls = []
    real = result_mod.AttentionResult._compute_mask
    monkeypatch.setattr(result_mod.AttentionResult, "_compute_mask",
                        lambda self, t: calls.append(t["rule"]) or real(self, t))
    first = result.significant(q_th=0.5)
    first[:] = True  # the caller's copy: the cached mask is not changed
    shown = result.with_thresholds(q_th=0.5)
    np.testing.assert_array_equal(shown.significant(), result.significant(q_th=0.5))
    np.testing.assert_array_equal(shown.regularized(),
                                  np.where(shown.significant(), result.attention, 0.0))
    assert calls == ["q"]
    other = replace(result, maps={**result.maps, "p": result.p.copy()})  # never stale
    other.significant(q_th=0.5)
    assert calls == ["q", "q"]


# ---- issue #16: one run path ------------------------------------------------------------------
def test_regularize_and_regularize_stack_run_through_the_service(monkeypatch, tiny_backbone, rng):
    import warnings

    from napari_attnreg import regularize, regularize_stack
    from napari_attnreg.core.run.api import PartialStackWarning

    jobs = []
    real = service.run_job
    monkeypatch.setattr(service, "run_job",
                        lambda job, cancel=None: jobs.append(job) or real(job, cancel))
    options = dict(n_boot=4, device="cpu", target_size=32, chunk_size=2)
    data = rng.random((3, 40, 48)).astype(np.float32)
    data[1] = 0.5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = regularize_stack(data, tiny_backbone, **options)
    assert [job.planes for job in jobs] == [[(0,), (1,), (2,)]]
    assert results.finished == [0, 2] and "constant" in results.errors[1]
    assert any(issubclass(w.category, PartialStackWarning) for w in caught)
    one = regularize(data[2], tiny_backbone, **options)
    assert len(jobs) == 2 and jobs[1].planes == [()]
    np.testing.assert_array_equal(one.attention, results[2].attention)
    with pytest.raises(ValueError, match="constant"):  # the plane's own error, raised again
        regularize(data[1], tiny_backbone, **options)
    assert len(jobs) == 3


def test_a_lazy_image_runs_tiled_and_hands_back_its_display(spec, tmp_path, rng):
    import tifffile

    from napari_attnreg.core.run.lazy import open_lazy

    pixels = (rng.random((240, 272)) * 4000).astype(np.uint16)
    tifffile.imwrite(tmp_path / "big.tif", pixels, tile=(64, 64))
    lazy = open_lazy(tmp_path / "big.tif")
    config = RunConfig(n_boot=4, device="cpu", chunk_size=2, tiled=True, tile_overlap=16)
    outcome = run_job_sync(Job(spec, lazy, [()], config, keep_display=True))
    assert outcome.ok, outcome.message
    result = outcome.results[()]
    assert result.metadata["read_on_demand"] and result.image_shape == (240, 272)
    assert outcome.displays[()].shape[:2] == result.image_shape
    assert not outcome.fingerprints  # its pixels were never all in memory to hash
    plain = run_job_sync(Job(spec, _stack(rng, n=1), [(0,)], CONFIG))
    assert not plain.displays and (0,) in plain.fingerprints  # displays only when asked


def test_user_messages_for_files_name_the_file_and_promise_no_log():
    assert user_message(PermissionError(13, "Permission denied", "/out/a.npz")) == (
        "Cannot write or read a file (Permission denied: /out/a.npz)")
    assert user_message(OSError(28, "No space left on device")) == (
        "Cannot write or read a file (No space left on device)")
    assert "Unexpected ConnectionError" in user_message(ConnectionError("reset by peer"))


def test_a_job_that_keeps_the_display_keeps_the_size_warning_among_diagnostics(spec, rng):
    """Preparing early for the figure must not lose what the engine would have noted."""
    small = PlaneStack.from_array(rng.random((16, 16)).astype(np.float32))
    config = replace(CONFIG, target_size=96)  # enlarges the 16 px image 6x per side
    texts = {}
    for keep in (False, True):
        with pytest.warns(UserWarning, match="enlarg|larger"):
            outcome = run_job_sync(Job(spec, small, small.planes(), config, keep_display=keep))
        texts[keep] = " ".join(d.message for d in outcome.results[()].diagnostics)
    assert texts[True] == texts[False] and "enlarges this 16x16 image" in texts[True]
    assert outcome.displays[()].shape == (16, 16)

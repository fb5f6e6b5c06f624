"""The one chunk loop (core/run/passes.py), through both engines and on its own.

The untiled and the tiled engine must behave alike where they share the loop: a chunk that
runs out of memory is halved and retried with nothing lost or repeated, a Progress comes
once per chunk, and a cancel between chunks stops the run before the next forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

import napari_attnreg.core.run.engine as engine_mod
import napari_attnreg.core.run.tiled_engine as tiled_mod
from napari_attnreg.core.models.backbones import Backbone, load_backbone
from napari_attnreg.core.run.config import RunConfig
from napari_attnreg.core.run.engine import drain, run_engine
from napari_attnreg.core.run.passes import (
    CancelToken,
    Progress,
    Run,
    RunCancelled,
    is_oom,
    statistics,
)
from napari_attnreg.core.stats.directional import directional_statistics
from napari_attnreg.core.stats.paper import compute_statistics
from napari_attnreg.core.stats.stepdown_maps import stepdown_statistics
from napari_attnreg.testing.synthetic import TRAINING_SCALE, make_cell_image

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

MAPS = ("attention", "head_attention", "null_scores")  # and every map in result.maps


@dataclass
class Case:
    """One engine: its module (whose ``cls_attention`` and, untiled, ``cls_attention_entering``
    do the forward passes) and a run."""

    name: str
    module: ModuleType
    image: np.ndarray
    backbone: Backbone
    options: dict[str, Any]
    calls: list[int] = field(default_factory=list)

    def run(self, cancel: CancelToken | None = None, **options: Any):
        events: list[Progress] = []
        gen = run_engine(self.image, self.backbone, RunConfig(**{**self.options, **options}),
                         cancel)
        return drain(gen, events.append), events

    def wrap_forward(self, monkeypatch: pytest.MonkeyPatch, fail: Any = None) -> None:
        """Count the images of every forward pass; ``fail(x, kw)`` may return an error to raise."""
        def counted(real):
            def forward(backbone, x, **kw):
                error = fail(x, kw) if fail is not None else None
                if error is not None:
                    raise error
                self.calls.append(int(x.shape[0]))
                return real(backbone, x, **kw)
            return forward

        # the untiled engine's observed pass keeps what entered the block (for the checks)
        for name in ("cls_attention", "cls_attention_entering"):
            if hasattr(self.module, name):
                monkeypatch.setattr(self.module, name, counted(getattr(self.module, name)))


@pytest.fixture(scope="module")
def demo():
    return load_backbone("demo")


@pytest.fixture(params=["untiled", "tiled"])
def case(request, tiny_backbone, blob_image, demo) -> Case:
    if request.param == "untiled":
        return Case("untiled", engine_mod, blob_image, tiny_backbone,
                    dict(n_boot=12, device="cpu", preset="paper", keep_nulls=True))
    image = make_cell_image(1, size=(300, 260), scale=TRAINING_SCALE).image  # 6 tiles of 128
    return Case("tiled", tiled_mod, image, demo,
                dict(n_boot=7, device="cpu", tiled=True, tile_overlap=0, keep_nulls=True))


def _is_null_chunk(case: Case, kw: dict[str, Any]) -> bool:
    # the untiled observed image goes through alone (head="all") and is never chunked
    return case.name == "tiled" or kw.get("head") != "all"


def _oom(kind: str) -> BaseException:
    if kind == "OutOfMemoryError":
        return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return RuntimeError("CUDA out of memory (simulated)")


# ---------------------------------------------------------------- through both engines
@pytest.mark.parametrize("kind", ["OutOfMemoryError", "RuntimeError"])
def test_out_of_memory_is_halved_and_retried_to_the_same_result(case, monkeypatch, kind):
    """12 images fit 3 at a time: the run halves 12 → 6 → 3 (tiled: 6 tiles → 3) and then
    is exactly the run asked for chunks of 3, maps, metadata and progress alike."""
    case.wrap_forward(monkeypatch, lambda x, kw: _oom(kind) if x.shape[0] > 3 else None)
    clean, clean_events = case.run(chunk_size=3)  # never more than 3: never out of memory
    clean_calls = list(case.calls)
    case.calls.clear()
    res, events = case.run(chunk_size=12)
    assert case.calls == clean_calls  # the same chunks went through, none twice

    for name in MAPS:
        np.testing.assert_array_equal(getattr(res, name), getattr(clean, name), err_msg=name)
    assert list(res.maps) == list(clean.maps)
    for name in res.maps:
        np.testing.assert_array_equal(res.maps[name], clean.maps[name], err_msg=name)
    assert res.pi0 == clean.pi0
    skip = ("timings", "chunk_size_requested")
    assert {k: v for k, v in res.metadata.items() if k not in skip} == {
        k: v for k, v in clean.metadata.items() if k not in skip}
    assert res.metadata["chunk_size"] == 3 and res.metadata["chunk_size_requested"] == 12

    halved = [e for e in events if "out of memory" in e.message]
    first_stage = "nulls" if case.name == "untiled" else "observed"
    expected = [6, 3] if case.name == "untiled" else [3]
    assert [e.message for e in halved] == [f"out of memory: chunk size halved to {n}"
                                           for n in expected]
    assert all(e.stage == first_stage and e.done == 0 for e in halved)  # nothing was counted
    rest = [e for e in events if e not in halved]
    assert [(e.stage, e.done, e.total, e.message) for e in rest] == [
        (e.stage, e.done, e.total, e.message) for e in clean_events]
    assert all(e.chunk_size == 3 for e in rest if e.stage != "observed")



@pytest.mark.parametrize("kind", ["OutOfMemoryError", "RuntimeError"])
def test_out_of_memory_at_one_image_is_a_memory_error_in_both_engines(case, monkeypatch, kind):
    case.wrap_forward(monkeypatch, lambda x, kw: _oom(kind) if _is_null_chunk(case, kw) else None)
    events: list[Progress] = []
    gen = run_engine(case.image, case.backbone, RunConfig(**case.options, chunk_size=12))
    with pytest.raises(MemoryError, match="Out of memory with a single (null )?image per chunk"):
        drain(gen, events.append)
    sizes = [int(e.message.rsplit(" ", 1)[1]) for e in events if "halved" in e.message]
    assert sizes == ([6, 3, 1] if case.name == "untiled" else [3, 1])


def test_other_errors_go_through_the_loop_unchanged(case, monkeypatch):
    case.wrap_forward(monkeypatch, lambda x, kw: RuntimeError("shape mismatch somewhere")
                      if _is_null_chunk(case, kw) else None)
    with pytest.raises(RuntimeError, match="shape mismatch somewhere"):
        case.run(chunk_size=4)


def test_progress_comes_once_per_chunk(case, monkeypatch):
    """Between two yields exactly one forward pass of one chunk: every yield is a
    cancellation point at a chunk boundary."""
    case.wrap_forward(monkeypatch)
    gen = run_engine(case.image, case.backbone, RunConfig(**case.options, chunk_size=4))
    per_event: list[tuple[Progress, list[int]]] = []
    seen = 0
    result = None
    while True:
        try:
            event = next(gen)
        except StopIteration as stop:
            result = stop.value
            break
        per_event.append((event, case.calls[seen:]))
        seen = len(case.calls)
    assert result is not None and per_event[-1][0].stage == "statistics"
    assert per_event[-1][1] == []  # statistics: no forward pass
    n_boot = case.options["n_boot"]
    if case.name == "untiled":
        assert per_event[0][0].stage == "observed" and per_event[0][1] == [1]
        chunks = [calls for event, calls in per_event if event.stage == "nulls"]
        assert chunks == [[4], [4], [4]]  # 12 null images in chunks of 4
    else:
        n_tiles = result.metadata["n_tiles"]
        chunks = [calls for event, calls in per_event[:-1]]
        assert chunks == [[4], [2]] + [[4], [3]]  # 6 tiles, then 7 nulls, in chunks of 4
        assert [e.done for e, _ in per_event[:-1]] == [4, 6, 10, 13] == [
            4, n_tiles, n_tiles + 4, n_tiles + n_boot]


@pytest.mark.parametrize("after", [1, 2])
def test_a_cancel_between_chunks_stops_both_engines(case, monkeypatch, after):
    """Cancelled after the ``after``-th chunk event: no further forward pass, RunCancelled."""
    case.wrap_forward(monkeypatch)
    token = CancelToken()
    gen = run_engine(case.image, case.backbone, RunConfig(**case.options, chunk_size=2), token)
    chunk_events = 0
    with pytest.raises(RunCancelled):
        for event in gen:
            if event.stage != "observed" or case.name == "tiled":
                chunk_events += 1
            if chunk_events == after:
                token.cancel()
                calls_at_cancel = list(case.calls)
    assert case.calls == calls_at_cancel
    observed = 1 if case.name == "untiled" else 0
    assert len(case.calls) == observed + after and case.calls[observed:] == [2] * after


def test_closing_the_generator_at_a_chunk_stops_both_engines(case, monkeypatch):
    case.wrap_forward(monkeypatch)
    gen = run_engine(case.image, case.backbone, RunConfig(**case.options, chunk_size=2))
    next(gen), next(gen)
    done = list(case.calls)
    gen.close()
    with pytest.raises(StopIteration):
        next(gen)
    assert case.calls == done


# ---------------------------------------------------------------- the loop on its own
def _loop(total: int, chunk: int, fits: int | None = None, **kw: Any):
    """Run.chunks over a fake step; ``fits``: larger chunks raise an out-of-memory error."""
    run = Run(torch.device("cpu"), None)
    done: list[tuple[int, int]] = []

    def step(start: int, size: int) -> None:
        if fits is not None and size > fits:
            raise torch.OutOfMemoryError("CUDA out of memory")
        done.append((start, size))

    gen = run.chunks(step, total, chunk, stage="nulls", label="null images",
                     oom_message="too big", **kw)
    events = []
    while True:
        try:
            events.append(next(gen))
        except StopIteration as stop:
            return done, events, stop.value


def test_the_loop_covers_every_image_once_in_order():
    done, events, after = _loop(10, 4)
    assert done == [(0, 4), (4, 4), (8, 2)]
    assert [(e.done, e.total, e.chunk_size, e.message) for e in events] == [
        (4, 10, 4, "4/10 null images"), (8, 10, 4, "8/10 null images"),
        (10, 10, 4, "10/10 null images")]
    assert after == 4


def test_a_pass_shorter_than_the_chunk_keeps_the_chunk_for_the_next():
    done, events, after = _loop(3, 8)
    assert done == [(0, 3)] and events[0].chunk_size == 3 and after == 8


def test_the_loop_halves_and_retries_the_same_images():
    done, events, after = _loop(10, 8, fits=3)
    assert done == [(0, 2), (2, 2), (4, 2), (6, 2), (8, 2)]  # 8 → 4 → 2, then all at 2
    assert [e.message for e in events[:2]] == ["out of memory: chunk size halved to 4",
                                               "out of memory: chunk size halved to 2"]
    assert [e.done for e in events] == [0, 0, 2, 4, 6, 8, 10] and after == 2


def test_a_later_pass_counts_on_from_the_earlier_ones():
    _, events, _ = _loop(5, 2, offset=6, grand_total=11)
    assert [(e.done, e.total, e.message) for e in events] == [
        (8, 11, "2/5 null images"), (10, 11, "4/5 null images"), (11, 11, "5/5 null images")]


def test_one_image_that_does_not_fit_is_the_callers_memory_error():
    with pytest.raises(MemoryError, match="too big"):
        _loop(4, 4, fits=0)


def test_the_loop_checks_the_cancel_token_before_every_chunk():
    token = CancelToken()
    run = Run(torch.device("cpu"), None, token)
    done: list[int] = []
    gen = run.chunks(lambda start, size: done.append(start), 10, 2, stage="nulls",
                     label="null images", oom_message="")
    next(gen)
    token.cancel()
    with pytest.raises(RunCancelled):
        next(gen)
    assert done == [0]


@pytest.mark.parametrize("err,expected", [
    (torch.OutOfMemoryError("CUDA out of memory"), True),
    (torch.cuda.OutOfMemoryError("CUDA out of memory"), True),
    (RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"), True),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
    (ValueError("out of memory"), False),
])
def test_which_errors_are_out_of_memory(err, expected):
    assert is_oom(err) is expected


@pytest.mark.parametrize("preset,reference", [
    ("paper", lambda o, n, c: compute_statistics(o, n, p_method=c.p_method,
                                                 alternative=c.alternative,
                                                 pi0_method=c.pi0_method, null=c.null)),
    ("directional", lambda o, n, c: directional_statistics(o, n, null_pool=c.null_pool,
                                                           pi0_method=c.pi0_method)),
    ("stepdown", lambda o, n, c: stepdown_statistics(o, n, tail=c.tail)),
])
def test_statistics_dispatch_by_preset(preset, reference):
    gen = torch.Generator().manual_seed(3)
    observed = torch.rand(48, generator=gen)
    observed[:4] += 0.5
    nulls = torch.rand(30, 48, generator=gen)
    config = RunConfig(preset=preset).resolved()
    stats, _ = statistics(observed, nulls, config)
    expected = reference(observed, nulls, config)
    np.testing.assert_array_equal(np.asarray(stats.z), np.asarray(expected.z))
    np.testing.assert_array_equal(np.asarray(stats.p), np.asarray(expected.p))

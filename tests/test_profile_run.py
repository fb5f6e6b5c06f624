"""The trace summary of benchmarks/profile_run.py: device idle gaps and who kept the device waiting."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def profile_run():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module("profile_run")


def _x(cat: str, name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


PKG = "/x/site-packages/napari_attnreg/core/"


def test_busy_idle_and_gap_attribution(profile_run):
    trace = {"traceEvents": [
        _x("user_annotation", profile_run.RUN_ANNOTATION, 1000.0, 10_000.0),
        _x("python_function", PKG + "run/passes.py(187): chunks", 1000.0, 6000.0),
        _x("python_function", PKG + "run/engine.py(300): __call__", 1400.0, 1100.0),
        _x("python_function", PKG + "stats/stepdown.py(218): step_down", 7000.0, 3000.0),
        _x("python_function", PKG + "stats/tail.py(230): fit_tails", 8000.0, 1500.0),
        # device: busy 2000-5000 (two overlapping kernels), 6000-7000 (a copy), 9600-9900
        _x("kernel", "gemm", 2000.0, 2000.0),
        _x("kernel", "softmax", 3500.0, 1500.0),
        _x("gpu_memcpy", "Memcpy DtoH", 6000.0, 1000.0),
        _x("kernel", "sort", 9600.0, 300.0),
        _x("kernel", "outside the window", 20_000.0, 50.0),
    ]}
    out = profile_run.summarize_trace(trace, min_gap_us=0.0)
    assert out["wall_ms"] == pytest.approx(10.0)
    assert out["device_busy_ms"] == pytest.approx(3.0 + 1.0 + 0.3)
    assert out["device_idle_ms"] == pytest.approx(10.0 - 4.3)
    gaps = {round(g["start_ms"], 3): g for g in out["gaps"]}
    # 1000-2000: the host spent 0.6 ms of it in a chunk's __call__ inside chunks
    assert gaps[0.0]["length_ms"] == pytest.approx(1.0)
    assert gaps[0.0]["host"] == ["run/passes.py:chunks", "run/engine.py:__call__"]
    assert gaps[0.0]["host_share"] == pytest.approx(0.6)
    # 7000-9600: mostly the tail fit inside step_down
    assert gaps[6.0]["host"] == ["stats/stepdown.py:step_down", "stats/tail.py:fit_tails"]
    assert gaps[6.0]["host_share"] == pytest.approx(1.5 / 2.6)
    assert gaps[8.9]["host"] == []  # 9900-11000: mostly after the package's last frame
    idle = out["idle_by_host_function_ms"]
    assert idle == pytest.approx({"run/passes.py:chunks": 1.4, "run/engine.py:__call__": 0.6,
                                  "stats/stepdown.py:step_down": 1.2,
                                  "stats/tail.py:fit_tails": 1.5,
                                  "(outside this package)": 1.0})
    assert sum(idle.values()) == pytest.approx(out["device_idle_ms"])
    assert out["kernels_ms"]["gemm"] == pytest.approx(2.0)
    assert "outside the window" in out["kernels_ms"]  # listed, but not in the busy time


def test_short_gaps_are_counted_not_listed(profile_run):
    trace = {"traceEvents": [
        _x("user_annotation", profile_run.RUN_ANNOTATION, 0.0, 1000.0),
        _x("kernel", "a", 0.0, 400.0), _x("kernel", "b", 450.0, 550.0)]}
    out = profile_run.summarize_trace(trace, min_gap_us=100.0)
    assert out["device_idle_ms"] == pytest.approx(0.05)
    assert out["gaps"] == []


def test_a_cpu_trace_reports_host_functions(profile_run):
    trace = {"traceEvents": [
        _x("user_annotation", profile_run.RUN_ANNOTATION, 0.0, 1000.0),
        _x("python_function", PKG + "run/engine.py(10): run_engine", 0.0, 900.0),
        # a recursive call is not counted twice
        _x("python_function", PKG + "run/engine.py(10): run_engine", 100.0, 500.0),
        _x("python_function", PKG + "stats/tail.py(230): fit_tails", 600.0, 200.0),
        _x("python_function", "/usr/lib/python3/json/decoder.py(1): decode", 0.0, 10.0)]}
    out = profile_run.summarize_trace(trace)
    assert "device_busy_ms" not in out and "CPU" in out["note"]
    assert out["host_functions_ms"] == {"run/engine.py:run_engine": pytest.approx(0.9),
                                        "stats/tail.py:fit_tails": pytest.approx(0.2)}


def test_frames_of_other_threads_are_not_the_hosts(profile_run):
    trace = {"traceEvents": [
        _x("user_annotation", profile_run.RUN_ANNOTATION, 0.0, 1000.0),
        {**_x("python_function", PKG + "run/tiles.py(1): read", 0.0, 1000.0), "tid": 2},
        _x("python_function", PKG + "run/engine.py(10): run_engine", 0.0, 1000.0),
        _x("kernel", "a", 500.0, 500.0)]}
    out = profile_run.summarize_trace(trace, min_gap_us=0.0)
    assert out["gaps"][0]["host"] == ["run/engine.py:run_engine"]


class _Avg:
    """One row of ``key_averages()`` (times in µs)."""

    def __init__(self, key: str, cpu: float, device: float = 0.0):
        self.key, self.self_cpu_time_total, self.self_device_time_total = key, cpu, device


def test_the_run_is_set_against_the_bare_forward_operator_by_operator(profile_run):
    run = [_Avg("aten::addmm", 9000, 900), _Avg("aten::gather", 500, 300),
           _Avg("aten::copy_", 200, 100), _Avg(profile_run.RUN_ANNOTATION, 99_000, 0),
           _Avg("aten::empty", 5, 0)]
    bare = [_Avg("aten::addmm", 10_000, 1000), _Avg("aten::copy_", 100, 50),
            _Avg(profile_run.BARE_ANNOTATION, 99_000, 0)]
    # device time on a GPU, host time on a CPU; the script's own windows are not operators
    on_gpu = profile_run.operator_ms(run, on_device=True)
    assert on_gpu == pytest.approx({"aten::addmm": 0.9, "aten::gather": 0.3, "aten::copy_": 0.1})
    on_cpu = profile_run.operator_ms(run, on_device=False)
    assert set(on_cpu) == {"aten::addmm", "aten::gather", "aten::copy_", "aten::empty"}
    out = profile_run.excess_over_bare(on_gpu, profile_run.operator_ms(bare, True), top=1)
    assert out["run_ms"] == pytest.approx(1.3) and out["bare_ms"] == pytest.approx(1.05)
    assert out["excess_ms"] == pytest.approx(0.25)
    # the gather is work the bare forward does not do; the run skips some of the matmuls
    assert out["more_ms"] == pytest.approx({"aten::gather": 0.3})  # top 1 of two
    assert out["less_ms"] == pytest.approx({"aten::addmm": -0.1})
    lines = profile_run.beyond_bare_lines(
        {"device_busy_ms": 2.0, "bare": {"images": 1001, "wall_ms": 3.0, "device_busy_ms": 1.5},
         "beyond_bare": out})
    assert "1001 images" in lines[0] and "device time" in lines[0] and "+0.2 ms" in lines[0]
    assert lines[1].endswith("aten::gather +0.30")


def test_a_cpu_profile_compares_with_the_bare_forward(profile_run, tmp_path):
    out = profile_run.main(["--model", "demo", "--n-boot", "8", "--device", "cpu",
                            "--json", str(tmp_path / "p.json")])
    assert out["bare"]["images"] == 9 and out["bare"]["wall_ms"] > 0
    extra = out["beyond_bare"]
    assert extra["run_ms"] > 0 and extra["bare_ms"] > 0
    assert any("addmm" in k or "linear" in k or "mm" in k
               for k in [*extra["more_ms"], *extra["less_ms"]])

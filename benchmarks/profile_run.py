"""Where a run's time goes on a GPU: device busy and idle time, and what the host did meanwhile.

    PYTHONPATH=src python benchmarks/profile_run.py --model vit_base_patch16_224 --n-boot 1000 \
        --device cuda --precision bfloat16 --json OUT/profile_vitb.json
    PYTHONPATH=src python benchmarks/profile_run.py --tiled --model vit_small_patch16_224 \
        --size 8192 --n-boot 200 --device cuda --json OUT/profile_vits_tiles.json

The same run as ``bench_pipeline.py`` (untiled: a random image at the model's size) or
``bench_tiled.py`` (``--tiled``: the synthetic field), once to warm up at the timed shapes and
once under ``torch.profiler`` with Python stacks. From the profiler's trace it reports:

* the run's wall time under the profiler, the device's busy time (the union of its kernels,
  copies and fills) and its idle time;
* the longest idle gaps of the device, each with the innermost functions of this package
  that the host thread ran for most of the gap (what kept the device waiting);
* the idle time summed by the innermost host function, and the kernels that took the most
  device time;
* the same number of images through timm's bare ``forward_features`` at the run's chunk size,
  profiled alike, and the operators the run spent more time in than that bare forward (device
  time on a GPU, host time on a CPU): the work beyond the forward passes, by name.

The profiler slows the host, so its wall time is not the benchmark's figure: the gaps say
*where* the device waits, ``bench_pipeline.py`` and ``bench_tiled.py`` say *how long* a run
takes. On a CPU there is no device trace; the host functions are still reported.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pipeline import bare_forward_seconds

from napari_attnreg.core.models.backbones import load_backbone
from napari_attnreg.core.run.engine import (
    RunConfig,
    autocast_dtype,
    drain,
    resolve_device,
    run_engine,
)
from napari_attnreg.core.run.images import prepare_image

#: Trace categories of work on the device.
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
#: The annotation around the profiled run (the window the figures cover).
RUN_ANNOTATION = "attnreg.profiled_run"
#: The annotation around the profiled bare forward it is compared with.
BARE_ANNOTATION = "attnreg.profiled_bare_forward"
PACKAGE = "napari_attnreg"


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of ``(start, end)`` intervals, as sorted disjoint intervals."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _short(name: str) -> str:
    """``…/napari_attnreg/core/run/passes.py(182): synchronize`` → ``run/passes.py:synchronize``."""
    path, _, func = name.partition(": ")
    path = path.split(f"{PACKAGE}/", 1)[-1].split("(")[0]
    path = path.removeprefix("core/")
    return f"{path}:{func}" if func else path


def _host_timeline(frames: list[dict], lo: float, hi: float,
                   depth: int) -> list[tuple[float, float, tuple[str, ...]]]:
    """Disjoint ``(start, end, chain)`` segments of ``[lo, hi]``: the innermost ``depth``
    package functions the host thread was running (``()`` outside the package).

    Python frames of one thread nest, so one sweep with a stack gives the innermost frame.
    """
    segments: list[tuple[float, float, tuple[str, ...]]] = []
    stack: list[dict] = []
    now = lo

    def emit(until: float) -> None:
        nonlocal now
        until = min(max(until, lo), hi)
        if until > now:
            chain = tuple(_short(e["name"]) for e in stack[-depth:])
            segments.append((now, until, chain))
            now = until

    for frame in sorted(frames, key=lambda e: (e["ts"], -e["dur"])):
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= frame["ts"]:
            emit(stack[-1]["ts"] + stack[-1]["dur"])
            stack.pop()
        emit(frame["ts"])
        stack.append(frame)
    while stack:
        emit(stack[-1]["ts"] + stack[-1]["dur"])
        stack.pop()
    emit(hi)
    return segments


def summarize_trace(trace: dict[str, Any], *, top: int = 12, min_gap_us: float = 200.0,
                    depth: int = 3, annotation: str = RUN_ANNOTATION) -> dict[str, Any]:
    """Device busy/idle time and the host's functions in the idle gaps of a profiler trace.

    Parameters
    ----------
    trace : dict
        A Chrome trace as ``torch.profiler`` exports it (``traceEvents``, times in µs).
    top : int
        How many gaps, host functions and kernels to list.
    min_gap_us : float
        Idle gaps shorter than this are counted in the idle time but not listed.
    depth : int
        Host functions listed per gap (the innermost of this package).
    annotation : str
        The ``record_function`` name whose span is the window (default: the run's).

    Returns
    -------
    dict
        ``wall_ms``, ``device_busy_ms``, ``device_idle_ms``, ``gaps`` (start offset, length,
        the host's innermost functions for most of the gap and that share of it),
        ``idle_by_host_function_ms`` (every gap, split by the host's innermost function),
        ``kernels_ms`` and, with no device events, ``host_functions_ms`` (the package's
        functions by inclusive time).
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    window = [e for e in events if e.get("name") == annotation
              and e.get("cat") in ("user_annotation", "cpu_op")]
    if window:
        lo, hi = window[0]["ts"], window[0]["ts"] + window[0]["dur"]
    else:
        lo = min(e["ts"] for e in events)
        hi = max(e["ts"] + e["dur"] for e in events)
    frames = [e for e in events if e.get("cat") == "python_function"
              and PACKAGE in e.get("name", "") and lo <= e["ts"] <= hi]
    # the run's own thread, not a tile reader's (if the trace names threads alike)
    thread = window[0].get("tid") if window else None
    frames = [e for e in frames if e.get("tid") == thread] or frames
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
    busy = _merged([(max(lo, e["ts"]), min(hi, e["ts"] + e["dur"])) for e in device
                    if e["ts"] < hi and e["ts"] + e["dur"] > lo])
    out: dict[str, Any] = {"wall_ms": (hi - lo) / 1e3}
    if not busy:
        inclusive: dict[str, float] = defaultdict(float)
        for e in _outermost_per_name(frames):
            inclusive[_short(e["name"])] += e["dur"] / 1e3
        out["host_functions_ms"] = dict(sorted(inclusive.items(), key=lambda kv: -kv[1])[:top])
        out["note"] = "no device events in the trace (a CPU run): host functions only"
        return out
    busy_us = sum(b - a for a, b in busy)
    edges = [lo] + [v for interval in busy for v in interval] + [hi]
    gaps = [(edges[i], edges[i + 1]) for i in range(0, len(edges), 2) if edges[i + 1] > edges[i]]
    idle_by: dict[str, float] = defaultdict(float)
    listed = []
    segments = _host_timeline(frames, lo, hi, depth)
    k = 0
    for start, end in gaps:  # both sorted: one merge
        while k < len(segments) and segments[k][1] <= start:
            k += 1
        spent: dict[tuple[str, ...], float] = defaultdict(float)
        j = k
        while j < len(segments) and segments[j][0] < end:
            a, b, chain = segments[j]
            spent[chain] += min(b, end) - max(a, start)
            j += 1
        for chain, us in spent.items():
            idle_by[chain[-1] if chain else "(outside this package)"] += us / 1e3
        if end - start >= min_gap_us:
            chain = max(spent, key=spent.get) if spent else ()
            listed.append({"start_ms": (start - lo) / 1e3, "length_ms": (end - start) / 1e3,
                           "host": list(chain),
                           "host_share": spent[chain] / (end - start) if spent else 0.0})
    listed.sort(key=lambda g: -g["length_ms"])
    kernels: dict[str, float] = defaultdict(float)
    for e in device:
        kernels[e["name"][:80]] += e["dur"] / 1e3
    out.update(device_busy_ms=busy_us / 1e3, device_idle_ms=(hi - lo - busy_us) / 1e3,
               device_busy_share=busy_us / (hi - lo), gaps=listed[:top],
               idle_by_host_function_ms=dict(sorted(idle_by.items(),
                                                    key=lambda kv: -kv[1])[:top]),
               kernels_ms=dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:top]))
    return out


def operator_ms(averages: Any, on_device: bool) -> dict[str, float]:
    """Self time of each operator in ``torch.profiler``'s ``key_averages()``, in ms: its
    kernels' device time on a GPU, its host time on a CPU. The profiler's own annotations
    (this script's windows) are left out."""
    out: dict[str, float] = {}
    for avg in averages:
        if avg.key in (RUN_ANNOTATION, BARE_ANNOTATION):
            continue
        us = (getattr(avg, "self_device_time_total", None) if on_device
              else avg.self_cpu_time_total)
        if on_device and us is None:  # older torch
            us = getattr(avg, "self_cuda_time_total", 0.0)
        if us and us > 0:
            out[avg.key] = out.get(avg.key, 0.0) + us / 1e3
    return out


def excess_over_bare(run: dict[str, float], bare: dict[str, float],
                     top: int = 12) -> dict[str, Any]:
    """What the run spent beyond the bare forward, operator by operator.

    Parameters
    ----------
    run, bare : dict
        :func:`operator_ms` of the profiled run and of the bare forward of as many images.
    top : int
        How many operators to list.

    Returns
    -------
    dict
        ``run_ms`` and ``bare_ms`` (all operators' time), ``excess_ms`` (their difference),
        ``more_ms`` (the operators the run spent more in, largest first: work beyond the
        forward passes, or forward work done more slowly) and ``less_ms`` (those it spent
        less in, most first: e.g. the blocks after the chosen one, which a run skips).
    """
    diff = {name: run.get(name, 0.0) - bare.get(name, 0.0) for name in set(run) | set(bare)}
    more = sorted(((k, v) for k, v in diff.items() if v > 0), key=lambda kv: -kv[1])
    less = sorted(((k, v) for k, v in diff.items() if v < 0), key=lambda kv: kv[1])
    return {"run_ms": sum(run.values()), "bare_ms": sum(bare.values()),
            "excess_ms": sum(run.values()) - sum(bare.values()),
            "more_ms": dict(more[:top]), "less_ms": dict(less[:top])}


def _outermost_per_name(frames: list[dict]) -> list[dict]:
    """Each function's calls, without the calls nested in another call of the same function."""
    by_name: dict[str, list[dict]] = defaultdict(list)
    for e in sorted(frames, key=lambda e: (e["ts"], -e["dur"])):
        calls = by_name[e["name"]]
        if not calls or e["ts"] >= calls[-1]["ts"] + calls[-1]["dur"]:
            calls.append(e)
    return [e for calls in by_name.values() for e in calls]


def _workload(args: argparse.Namespace, device: torch.device):
    bb = (load_backbone("demo") if args.model == "demo"
          else load_backbone(args.model, pretrained=False)).to(device)
    if args.tiled:
        from bench_tiled import field

        tail = {} if args.tail is None else {"tail": args.tail}
        config = RunConfig(tiled=True, n_boot=args.n_boot, device=str(device),
                           precision=args.precision, chunk_size=args.chunk_size, **tail)
        return bb, field(args.size), config
    size = args.size or int(bb.input_size[1])
    image = np.random.default_rng(0).random((size, size, 3)).astype(np.float32)
    prepared = prepare_image(image, patch_size=bb.patch_size, mean=bb.mean, std=bb.std,
                             default_size=bb.input_size[1:], target_size="native")
    config = RunConfig(n_boot=args.n_boot, device=str(device), precision=args.precision,
                       chunk_size=args.chunk_size, method=args.method)
    return bb, prepared, config


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_base_patch16_224", help="'demo' or a timm name")
    ap.add_argument("--tiled", action="store_true", help="a tiled run of bench_tiled's field")
    ap.add_argument("--size", type=int, default=None,
                    help="input side (untiled; default the model's) or field side (tiled)")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--chunk-size", type=int, default=None)
    ap.add_argument("--method", default="patch")
    ap.add_argument("--tail", default=None, choices=["none", "gpd"])
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--trace", default=None, help="also keep the trace here (.json.gz)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.tiled and args.size is None:
        args.size = 8192
    device = resolve_device(args.device)
    bb, image, config = _workload(args, device)
    drain(run_engine(image, bb, config))  # warm up at the profiled shapes
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with torch.profiler.profile(activities=activities, with_stack=True) as prof:
        t0 = time.perf_counter()
        with torch.profiler.record_function(RUN_ANNOTATION):
            result = drain(run_engine(image, bb, config))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        profiled_s = time.perf_counter() - t0
    trace = _trace(prof, args.trace)
    on_device = device.type == "cuda"
    run_ops = operator_ms(prof.key_averages(), on_device)
    # the bare forward of as many images at the run's chunk size, profiled alike
    md = result.metadata
    chunk = int(md["chunk_size"])
    n_images = (int(md["n_tiles"]) if args.tiled else 1) + args.n_boot
    x = torch.randn(3, *bb.input_size[1:], device=device)
    dtype = autocast_dtype(device, args.precision)
    bare_forward_seconds(bb, x, chunk, chunk, device, dtype)  # warm up at the chunk's shape
    with torch.profiler.profile(activities=activities) as bare_prof:
        with torch.profiler.record_function(BARE_ANNOTATION):
            bare_s = bare_forward_seconds(bb, x, n_images, chunk, device, dtype)
    bare_trace = _trace(bare_prof, None)
    bare = summarize_trace(bare_trace, top=args.top, annotation=BARE_ANNOTATION)
    out = {"model": args.model, "tiled": args.tiled, "size": args.size, "n_boot": args.n_boot,
           "device": str(device), "precision": args.precision,
           "chunk_size": chunk, "profiled_s": profiled_s,
           "timings": md.get("timings"), **summarize_trace(trace, top=args.top),
           "bare": {"images": n_images, "profiled_s": bare_s, "wall_ms": bare["wall_ms"],
                    **({"device_busy_ms": bare["device_busy_ms"]}
                       if "device_busy_ms" in bare else {})},
           "beyond_bare": excess_over_bare(run_ops, operator_ms(bare_prof.key_averages(),
                                                                on_device), args.top)}
    _print(out)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


def _trace(prof: Any, keep: str | None) -> dict[str, Any]:
    """A profile's Chrome trace (kept gzipped at ``keep`` when given)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    if keep:
        with gzip.open(keep, "wt") as fh:
            json.dump(trace, fh)
    return trace


def beyond_bare_lines(out: dict[str, Any]) -> list[str]:
    """The comparison with the bare forward, as printed and as ``gpu_round4`` writes it."""
    bare, extra = out.get("bare"), out.get("beyond_bare")
    if not bare or not extra:
        return []
    kind = "device" if "device_busy_ms" in out else "host"
    busy = (f", device busy {bare['device_busy_ms']:.1f} ms" if "device_busy_ms" in bare
            else "")
    return [f"bare forward of {bare['images']} images: {bare['wall_ms']:.1f} ms under the "
            f"profiler{busy}; operators' {kind} time: run {extra['run_ms']:.1f} ms, bare "
            f"{extra['bare_ms']:.1f} ms, beyond it {extra['excess_ms']:+.1f} ms",
            "run spent more than the bare forward in (ms): " + ", ".join(
                f"{k} +{v:.2f}" for k, v in extra["more_ms"].items()),
            "and less in (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in extra["less_ms"].items())]


def _print(out: dict[str, Any]) -> None:
    print(f"{out['model']} {'tiled ' if out['tiled'] else ''}B={out['n_boot']} on "
          f"{out['device']}: {out['wall_ms']:.1f} ms under the profiler")
    if "device_busy_ms" in out:
        print(f"device busy {out['device_busy_ms']:.1f} ms, idle {out['device_idle_ms']:.1f} ms "
              f"({100 * out['device_busy_share']:.1f} % busy)")
        for gap in out["gaps"]:
            print(f"  idle {gap['length_ms']:7.2f} ms at {gap['start_ms']:8.2f} ms, "
                  f"{100 * gap['host_share']:.0f} % in: " + " > ".join(gap["host"]))
        print("idle time by host function (ms): " + ", ".join(
            f"{k} {v:.2f}" for k, v in out["idle_by_host_function_ms"].items()))
        print("kernels (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in out["kernels_ms"].items()))
    else:
        print(out["note"])
        print("host functions (ms): " + ", ".join(
            f"{k} {v:.1f}" for k, v in out["host_functions_ms"].items()))
    for line in beyond_bare_lines(out):
        print(line)


if __name__ == "__main__":
    main()

"""One script for the figures of a GPU round: pipeline/bare-forward ratios and tiled fields.

    PYTHONPATH=src python benchmarks/gpu_round4.py --out /tmp/round4          # a lent H100
    PYTHONPATH=src python benchmarks/gpu_round4.py --cpu-small --out benchmarks/results/cpu_small

Figures (each one measured by ``bench_pipeline.py`` / ``bench_tiled.py`` in this process):

* pipeline / bare-forward throughput at B = 1000, bf16, ``--method patch`` (the step-down
  default), timm random-init weights: ViT-B/16@224, ViT-L/16@224, DINOv2-S/14 with four
  registers @518 and ViT-S/8@480;
* tiled 8192² and 32768² synthetic fields with the demo model, B = 200, with the tail
  approximation (``tail="gpd"``, the tiled default) and without it (``tail="none"``);
* a tiled 8192² field in ViT-S/16 tiles (random init), B = 200, against the bare forward of
  the same tiles; and the same field with ``free-vits16`` (ViT-S/16's tokens, a forward that
  costs next to nothing), whose pipeline time is the tiled path's own work;
* preparing an in-memory 8192² field for a tiled run (uint16 grey and uint8 RGB) on the
  device, against the host's way (``bench_tiled_prepare.py``);
* profiles (``profile_run.py``) of ViT-B/16 at B = 1000 and of the ViT-S/16 tiles: the
  device's idle gaps and the host functions that ran in them.

``--cpu-small`` measures the same kinds of figure at sizes a CPU finishes in minutes. Every
figure runs in its own ``try``: an error is recorded in the output and the next one runs; a
global time budget (``--budget-s``) skips what is left once it is spent. Writes
``<out>.json`` and ``<out>.md`` (a markdown table) and prints progress as it goes.
Needs only ``PYTHONPATH=src`` (the package need not be installed) and no internet.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: (label, timm model, input side, B) of the pipeline ratios.
GPU_MODELS = [
    ("ViT-B/16 @224", "vit_base_patch16_224", 224, 1000),
    ("ViT-L/16 @224", "vit_large_patch16_224", 224, 1000),
    ("DINOv2-S/14 reg4 @518", "vit_small_patch14_reg4_dinov2", 518, 1000),
    ("ViT-S/8 @480", "vit_small_patch8_224", 480, 1000),
]
CPU_MODELS = [
    ("ViT-S/16 @224", "vit_small_patch16_224", 224, 48),
    ("ViT-B/16 @224", "vit_base_patch16_224", 224, 16),
    ("DINOv2-S/14 reg4 @224", "vit_small_patch14_reg4_dinov2", 224, 16),
    ("ViT-S/8 @224", "vit_small_patch8_224", 224, 8),
]
#: (field side, B) of the tiled figures, each run with the tail and without.
GPU_FIELDS = [(8192, 200), (32768, 200)]
CPU_FIELDS = [(1024, 200), (2048, 200)]
#: (field side, B) of the tiled figure with ViT-S/16 tiles (aim: pipeline ≤ 1.3× bare).
GPU_VITS_FIELD = (8192, 200)
CPU_VITS_FIELD = (1024, 16)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def quietly(fn, *args):
    """Run a benchmark's main, keeping its printout for the record instead of the console."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        out = fn(*args)
    return out, buffer.getvalue()


def pipeline_figure(model: str, size: int, n_boot: int, device: str, precision: str,
                    repeats: int) -> dict:
    import bench_pipeline

    out, text = quietly(bench_pipeline.main, [
        "--model", model, "--size", str(size), "--n-boot", str(n_boot), "--device", device,
        "--precision", precision, "--method", "patch", "--repeats", str(repeats)])
    return {**out, "printout": text}


def tiled_figure(size: int, n_boot: int, device: str, precision: str, tail: str,
                 model: str = "demo", repeats: int = 1) -> dict:
    import bench_tiled

    out, text = quietly(bench_tiled.main, [
        "--model", model, "--size", str(size), "--n-boot", str(n_boot), "--device", device,
        "--precision", precision, "--tail", tail, "--repeats", str(repeats)])
    return {**out, "printout": text}


def prepare_figure(size: int, device: str) -> dict:
    import bench_tiled_prepare

    out, text = quietly(bench_tiled_prepare.main, ["--size", str(size), "--device", device])
    return {**out, "printout": text}


def plan(args: argparse.Namespace) -> list[tuple[str, object]]:
    small = args.cpu_small
    device = "cpu" if small else args.device
    precision = "float32" if small else "bfloat16"
    repeats = 3
    jobs: list[tuple[str, object]] = []
    for label, model, size, n_boot in (CPU_MODELS if small else GPU_MODELS):
        jobs.append((f"pipeline {label} B={n_boot}",
                     lambda m=model, s=size, b=n_boot: pipeline_figure(m, s, b, device,
                                                                       precision, repeats)))
    for size, n_boot in (CPU_FIELDS if small else GPU_FIELDS):
        for tail in ("gpd", "none"):
            # the median of three where a run takes about a second (first-use costs of new
            # batch shapes were 0.06 s of a 0.08 s null pass on the H100)
            jobs.append((f"tiled {size}² B={n_boot} tail={tail}",
                         lambda s=size, b=n_boot, t=tail: tiled_figure(
                             s, b, device, "auto", t, repeats=1 if small or s > 8192 else 3)))
    size, n_boot = CPU_VITS_FIELD if small else GPU_VITS_FIELD
    jobs.append((f"tiled ViT-S/16 tiles {size}² B={n_boot}",
                 lambda: tiled_figure(size, n_boot, device, "auto", "gpd",
                                      model="vit_small_patch16_224",
                                      repeats=1 if small else 3)))
    # the same field with a model of ViT-S/16's tokens whose forward costs next to nothing:
    # the tiled path's own work, to set against the ViT-S/16 tiles' bare forward above
    jobs.append((f"tiled free-ViT-S/16 tiles {size}² B={n_boot}",
                 lambda: tiled_figure(size, n_boot, device, "auto", "gpd",
                                      model="free-vits16", repeats=1 if small else 3)))
    side = 2048 if small else 8192
    jobs.append((f"tiled prepare {side}²", lambda: prepare_figure(side, device)))
    # last, after the figures: where the device waits in the two runs short of their aims
    # (ViT-B/16 untiled, ViT-S/16 tiles), from a profiler trace after a warm-up
    untiled, tiled = ((("vit_small_patch16_224", 48), CPU_VITS_FIELD)
                      if small else (("vit_base_patch16_224", 1000), GPU_VITS_FIELD))
    common = ["--device", device, "--precision", precision]
    jobs.append((f"profile {untiled[0]} B={untiled[1]}", lambda: profile_figure(
        ["--model", untiled[0], "--n-boot", str(untiled[1]), *common])))
    jobs.append((f"profile ViT-S/16 tiles {tiled[0]}² B={tiled[1]}", lambda: profile_figure(
        ["--tiled", "--model", "vit_small_patch16_224", "--size", str(tiled[0]),
         "--n-boot", str(tiled[1]), "--device", device, "--precision", "auto"])))
    return jobs


def profile_figure(argv: list[str]) -> dict:
    import profile_run

    out, text = quietly(profile_run.main, argv)
    return {**out, "printout": text}


def environment() -> dict:
    import timm

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "timm": timm.__version__, "threads": torch.get_num_threads(),
           "machine": platform.machine(), "processor": platform.processor()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def markdown(records: list[dict], env: dict) -> str:
    lines = [f"Environment: {json.dumps(env)}", "",
             "| figure | status | pipeline s | bare forward s | throughput vs bare | "
             "statistics s (share) | chunk | tail |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for rec in records:
        r = rec.get("result") or {}
        stats = r.get("statistics_s", (r.get("timings") or {}).get("statistics_s"))
        share = r.get("statistics_share")
        tail = r.get("tail")
        tail_text = (f"{tail.get('steps')} steps, {tail.get('fits')} fits"
                     if isinstance(tail, dict) else "")
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} |".format(
            rec["figure"], rec["status"],
            _num(r.get("pipeline_s")), _num(r.get("bare_forward_s")),
            _num(r.get("bare_forward_s") / r["pipeline_s"], "{:.3f}×")
            if r.get("pipeline_s") and r.get("bare_forward_s") else "",
            f"{_num(stats)} ({100 * share:.1f} %)" if stats is not None and share else
            _num(stats), r.get("chunk_size", ""), tail_text))
    for rec in records:  # profiles: where the device waited
        r = rec.get("result") or {}
        if "wall_ms" not in r:
            continue
        lines += ["", f"### {rec['figure']}", "", _headline(r), ""]
        lines += [f"* idle {g['length_ms']:.2f} ms at {g['start_ms']:.1f} ms, "
                  f"{100 * g['host_share']:.0f} % in " + " > ".join(g["host"])
                  for g in r.get("gaps", [])]
        if r.get("host_functions_ms"):
            lines += ["host functions (ms): " + ", ".join(
                f"{k} {v:.1f}" for k, v in r["host_functions_ms"].items())]
        if r.get("idle_by_host_function_ms"):
            lines += ["", "idle by host function (ms): " + ", ".join(
                f"{k} {v:.2f}" for k, v in r["idle_by_host_function_ms"].items())]
        if r.get("beyond_bare"):
            import profile_run

            lines += [""] + [f"* {line}" for line in profile_run.beyond_bare_lines(r)]
    return "\n".join(lines) + "\n"


def _num(value, fmt: str = "{:.3f}") -> str:
    return "" if value is None else fmt.format(value)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="path prefix of the .json and .md written")
    ap.add_argument("--cpu-small", action="store_true", help="small sizes on the CPU")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget-s", type=float, default=330.0,
                    help="skip the remaining figures once this much time is spent")
    ap.add_argument("--only", default=None, help="run only figures whose name contains this")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    env = environment()
    log(f"environment {env}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    for name, job in plan(args):
        if args.only and args.only not in name:
            continue
        spent = time.perf_counter() - start
        if spent > args.budget_s:
            log(f"skipped {name}: time budget spent ({spent:.0f} s)")
            records.append({"figure": name, "status": "skipped (time budget)"})
            continue
        log(f"start {name}")
        t0 = time.perf_counter()
        try:
            result = job()
            records.append({"figure": name, "status": "ok", "result": result,
                            "seconds": time.perf_counter() - t0})
            log(f"done  {name} in {time.perf_counter() - t0:.1f} s: "
                f"{_headline(result)}")
        except Exception as exc:  # noqa: BLE001 -- one figure failing must not end the round
            records.append({"figure": name, "status": f"error: {type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc(),
                            "seconds": time.perf_counter() - t0})
            log(f"error {name}: {type(exc).__name__}: {exc}")
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        _write(out, records, env)
    log(f"all done in {time.perf_counter() - start:.0f} s; wrote {out}.json and {out}.md")
    return records


def _headline(result: dict) -> str:
    if "wall_ms" in result:  # a profile
        if "device_busy_ms" not in result:
            return f"{result['wall_ms']:.0f} ms under the profiler (host only)"
        worst = next(iter(result["idle_by_host_function_ms"].items()), ("", 0.0))
        return (f"device busy {100 * result['device_busy_share']:.1f} % of "
                f"{result['wall_ms']:.1f} ms; most idle in {worst[0]} ({worst[1]:.1f} ms)")
    if "rows" in result:  # the preparation figure
        return ", ".join(f"{r['image']}: device {r['device_s']:.3f} s, host "
                         f"{r['host_s']:.3f} s" for r in result["rows"])
    if "throughput_vs_bare" in result:
        return (f"throughput {result['throughput_vs_bare']:.3f}× bare, statistics "
                f"{100 * result['statistics_share']:.1f} %")
    return (f"pipeline {result['pipeline_s']:.2f} s, bare {result['bare_forward_s']:.2f} s, "
            f"statistics {100 * result['statistics_share']:.1f} %")


def _write(out: Path, records: list[dict], env: dict) -> None:
    out.with_suffix(".json").write_text(json.dumps({"environment": env, "figures": records},
                                                   indent=1, default=str))
    out.with_suffix(".md").write_text(markdown(records, env))


if __name__ == "__main__":
    main()

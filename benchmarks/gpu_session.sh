#!/usr/bin/env bash
# One command for a lent GPU machine, within 8 minutes of device time: the tests that need a
# GPU, the map checks' cost, then #26's figures (benchmarks/gpu_round4.py: pipeline ratios of four models, tiled
# 8192² and 32768² fields with and without the tail, ViT-S/16 tiles and the path's own work
# beside them, preparing a field on the device, and two profiles). Runs from the checkout
# with PYTHONPATH=src (nothing installed); the GPU machine's image has torch, timm, scipy,
# statsmodels, tifffile and scikit-image.
#
#   OUT=/some/folder bash benchmarks/gpu_session.sh                  # on the GPU machine
#   OUT=/tmp/gpu_dry bash benchmarks/gpu_session.sh --cpu-small      # a dry run on a CPU
#
# Arguments go to gpu_round4.py (--cpu-small, --only NAME, --budget-s S). Writes under $OUT:
# device.txt, gpu_tests.log, map_checks.json/.log, figures.json/.md (and figures.log).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=${OUT:-/tmp/attnreg_gpu}
mkdir -p "$out"
python3 - >"$out/device.txt" 2>&1 <<'EOF'
import platform, torch
print(platform.python_version(), "torch", torch.__version__)
print("cuda:", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
cat "$out/device.txt"
# the GPU's own checks: device scaling, step-down and token statistics CPU vs CUDA, scorers,
# engine, nulls and their normalisation (each skips on a machine without CUDA)
timeout 150 python3 -m pytest -q -p no:cacheprovider -k "gpu or cuda" \
    tests/test_device_scaling.py tests/test_stepdown.py tests/test_stats.py \
    tests/test_scorers.py tests/test_engine.py tests/test_nulls.py \
    tests/test_null_channels.py 2>&1 | tee "$out/gpu_tests.log" | tail -5
# the map checks from the observed pass's kept last-block input against two whole passes
# (round 17; the checks ran after the last null chunk, in ViT-B/16's 14 ms of round 6)
device=cuda models=vit_base_patch16_224,vit_large_patch16_224
for arg in "$@"; do [[ $arg == --cpu-small ]] && device=cpu models=vit_small_patch16_224; done
timeout 30 python3 benchmarks/bench_map_checks.py --device $device --models $models \
    --repeats 5 --json "$out/map_checks.json" 2>&1 | tee "$out/map_checks.log" | tail -3
budget=280
for arg in "$@"; do [[ $arg == --budget-s* ]] && budget=""; done
python3 benchmarks/gpu_round4.py --out "$out/figures" ${budget:+--budget-s $budget} "$@" \
    2>&1 | tee "$out/figures.log" | tail -40

"""benchmarks/gpu_session.sh runs every test that needs CUDA.

A lent GPU is rare and short: its one prepared command must not leave out a GPU test that
skips everywhere else (a new file, or a name its ``-k`` does not select).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_session.sh"


def _session_tests() -> tuple[set[str], list[str]]:
    """The test files the script passes to pytest and the words of its ``-k``."""
    text = SCRIPT.read_text()
    files = set(re.findall(r"\b(tests/[\w/]+\.py)\b", text))
    (keyword,) = re.findall(r'-k "([^"]+)"', text)
    return files, [w for w in keyword.split() if w != "or"]


def _cuda_names(func: ast.FunctionDef) -> list[str] | None:
    """The names ``-k`` can select a test by when it is skipped unless CUDA is there (a
    ``skipif`` on ``cuda.is_available()``), else None: the function's name, and for a
    parameter marked so, the parameter's id too (``test_x[cuda]``)."""
    names = None
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and "cuda.is_available" in ast.unparse(node)):
            continue
        callee = ast.unparse(node.func)
        if callee.endswith("param"):
            ids = [a.value for a in [*node.args, *(k.value for k in node.keywords
                                                   if k.arg == "id")]
                   if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            names = (names or [func.name]) + [f"{func.name}[{i}]" for i in ids]
        elif "skipif" in callee:
            names = names or [func.name]
    return names


def _cuda_tests() -> list[tuple[str, list[str]]]:
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and \
                    (names := _cuda_names(node)):
                found.append((path.relative_to(ROOT).as_posix(), names))
    return found


def test_every_cuda_test_is_run_by_the_gpu_session():
    files, words = _session_tests()
    assert files and words
    cuda_tests = _cuda_tests()
    assert len(cuda_tests) >= 8  # the scan finds the known ones (engine, nulls, stats, ...)
    missed = [f"{path}::{names[0]}" for path, names in cuda_tests
              if path not in files or not any(w.lower() in name.lower()
                                              for w in words for name in names)]
    assert not missed, ("tests that need CUDA but benchmarks/gpu_session.sh does not run "
                        f"(add the file, or name the test with 'gpu'/'cuda'): {missed}")


def test_the_scan_sees_a_cuda_test_the_session_would_miss(tmp_path):
    # the check itself can fail: a skipif on CUDA under a name -k does not select
    source = ('import pytest, torch\n'
              '@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")\n'
              'def test_bf16_agrees():\n    pass\n'
              'def test_plain():\n    pass\n'
              '@pytest.mark.parametrize("d", ["cpu", pytest.param("cuda", marks=pytest.mark.'
              'skipif(not torch.cuda.is_available(), reason="x"))])\n'
              'def test_tiles(d):\n    pass\n')
    funcs = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)]
    assert [_cuda_names(f) for f in funcs] == [
        ["test_bf16_agrees"], None, ["test_tiles", "test_tiles[cuda]"]]

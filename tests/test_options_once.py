"""Each run path checks its options once: the CLI and the API, counted at the validator."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile

from napari_attnreg import regularize
from napari_attnreg.cli import main
from napari_attnreg.core.run import options as O
from napari_attnreg.core.run.config import RunConfig


@pytest.fixture
def n_boot_checks(monkeypatch):
    """How often the validator checks ``n_boot`` (from a clean slate)."""
    calls = []
    check = O._check

    def counting(opt, value):
        if opt.name == "n_boot":
            calls.append(value)
        return check(opt, value)

    O.forget_checked_values()
    monkeypatch.setattr(O, "_check", counting)
    return calls


@pytest.fixture
def noise_image():
    return (np.random.default_rng(0).random((48, 48)) * 1000).astype(np.uint16)


def test_the_cli_checks_n_boot_once(tmp_path, noise_image, n_boot_checks):
    tifffile.imwrite(tmp_path / "a.tif", noise_image)
    code = main(["run", str(tmp_path / "a.tif"), "--model", "demo", "--n-boot", "4", "--out",
                 str(tmp_path / "out"), "--quiet", "--device", "cpu"])
    assert code == 0 and n_boot_checks == [4]  # six checks before: CLI, batch, resume, engine


def test_the_api_checks_n_boot_once(noise_image, n_boot_checks):
    result = regularize(noise_image, "demo", n_boot=4, device="cpu")
    assert result.metadata["n_boot"] == 4 and n_boot_checks == [4]


def test_a_value_changed_after_checking_is_checked_again(n_boot_checks):
    config = RunConfig(n_boot=7, channels=[0]).validate()
    config.validate()
    assert n_boot_checks == [7]
    config.n_boot = 0  # a different object: checked, and refused
    with pytest.raises(ValueError, match="n_boot"):
        config.validate()
    config.n_boot = 7
    config.channels.append(-1)  # the same list, changed in place: checked again
    with pytest.raises(ValueError, match="channels"):
        config.validate()


def _literal_defaults(name: str) -> list[str]:
    """Where ``name`` gets a literal default: a field, a keyword argument or a trait."""
    import ast
    from pathlib import Path

    src = Path(O.__file__).resolve().parents[2]
    found = []
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            pairs = []
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                pairs.append((node.target.id, node.value))
            elif isinstance(node, ast.Assign):
                pairs += [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.arguments):
                kw = [*node.posonlyargs, *node.args]
                pairs += list(zip([a.arg for a in kw[len(kw) - len(node.defaults):]],
                                  node.defaults))
                pairs += [(a.arg, d) for a, d in zip(node.kwonlyargs, node.kw_defaults)]
            for target, value in pairs:
                # None is "not given", not a second default value
                if target == name and (
                        isinstance(value, ast.Constant) and value.value is not None or (
                        isinstance(value, ast.Call) and value.args  # a trait: t.Int(200)
                        and isinstance(value.args[0], ast.Constant)
                        and isinstance(value.args[0].value, (int, float)))):
                    found.append(f"{path.relative_to(src)}:{getattr(value, 'lineno', 0)}")
    return found


@pytest.mark.parametrize("name", ["n_boot", "seed"])
def test_each_run_default_is_written_once(name):
    from napari_attnreg.notebook.state import ExplorerState

    # only the option metadata has it (as a call argument, which the scan leaves out)
    assert _literal_defaults(name) == []
    assert getattr(RunConfig(), name) == O.option(name).default
    assert getattr(ExplorerState(), name) == O.option(name).default

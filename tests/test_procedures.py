"""Statistical procedures as registered parts: the registry, the protocol, one new module
becoming a preset everywhere, and no preset name tested as a string outside the registry."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from napari_attnreg import regularize
from napari_attnreg.core.run.config import RunConfig
from napari_attnreg.core.run.options import applicable_options, validate_options
from napari_attnreg.core.stats import presets
from napari_attnreg.core.stats.choices import RULES
from napari_attnreg.core.stats.directional import directional_statistics
from napari_attnreg.core.stats.paper import compute_statistics
from napari_attnreg.core.stats.procedures import (
    DEFAULT_PROCEDURE,
    STATISTICS_KEYS,
    THRESHOLD_KEYS,
    Procedure,
    get_procedure,
    procedure_names,
    procedures_reading,
    register,
    unregister,
)
from napari_attnreg.core.stats.procedures.directional import Directional
from napari_attnreg.core.stats.rules import significance_mask
from napari_attnreg.core.stats.stepdown_maps import stepdown_statistics

SRC = Path(__file__).resolve().parents[1] / "src" / "napari_attnreg"
BUILT_IN = ("stepdown", "directional", "paper")


def _maps(seed: int = 0, n_null: int = 40, tokens: int = 64):
    rng = np.random.default_rng(seed)
    null = torch.from_numpy(rng.dirichlet(np.ones(tokens), size=n_null))
    observed = rng.dirichlet(np.ones(tokens))
    observed[:3] += 0.3
    return torch.from_numpy(observed / observed.sum()), null


def test_registry_holds_the_three_procedures_default_first():
    assert procedure_names() == BUILT_IN and DEFAULT_PROCEDURE == "stepdown"
    assert presets.PRESETS == BUILT_IN and presets.DEFAULT_PRESET == DEFAULT_PROCEDURE
    assert [get_procedure(n).name for n in BUILT_IN] == list(BUILT_IN)
    with pytest.raises(ValueError, match="use one of .*stepdown"):
        get_procedure("bayes")
    with pytest.raises(ValueError, match="taken"):
        register(Directional())
    with pytest.raises(ValueError, match="cannot be removed"):
        unregister(DEFAULT_PROCEDURE)


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_procedure_follows_the_protocol(name):
    proc = get_procedure(name)
    assert isinstance(proc, Procedure)
    assert set(proc.defaults) == set(STATISTICS_KEYS)
    assert set(proc.rules) <= set(RULES) and proc.defaults["rule"] in proc.rules
    assert tuple(proc.default_thresholds()) == THRESHOLD_KEYS
    assert proc.title and proc.label and proc.help and proc.side and proc.evidence_header
    assert proc.significance_meaning()
    for key in ("pvalue", "posterior"):
        text = proc.map_text(key)
        assert text.title and text.legend and text.colorbar
    with pytest.raises(ValueError, match="stores no map"):
        proc.map_text("volume")
    resolved = proc.resolve({})
    assert {k: resolved[k] for k in STATISTICS_KEYS} == dict(proc.defaults)
    # only the default procedure calls itself the default
    assert ("(default)" in proc.help) == (name == DEFAULT_PROCEDURE)


def test_procedures_answer_the_questions_callers_used_to_ask_of_the_name():
    step, up, paper = (get_procedure(n) for n in BUILT_IN)
    assert (step.uses_step_p, up.uses_step_p, paper.uses_step_p) == (True, False, False)
    assert (step.one_sided, up.one_sided, paper.one_sided) == (True, True, False)
    assert (step.clamps_nulls, up.clamps_nulls, paper.clamps_nulls) == (True, True, False)
    assert [p.pixels_per_token((16, 16)) for p in (step, up, paper)] == [1, 1, 256]
    assert step.half_patch_blocks and not up.half_patch_blocks and not paper.half_patch_blocks
    assert procedures_reading("tail") == ("stepdown",)
    assert procedures_reading("null_pool") == ("directional",)
    assert procedures_reading("pi0_method") == ("directional", "paper")
    assert procedures_reading("alternative") == ("paper",)


def test_refused_and_fixed_options_name_the_preset_to_use():
    with pytest.raises(ValueError, match="pooled-null procedures"):
        get_procedure("stepdown").resolve({"null_pool": "pooled"})
    with pytest.raises(ValueError, match="alternative='two-sided' belongs to the paper"):
        get_procedure("directional").resolve({"alternative": "two-sided"})
    with pytest.raises(ValueError, match="null_pool='position' is part of the directional"):
        get_procedure("paper").resolve({"null_pool": "position"})
    with pytest.raises(ValueError, match="not available under preset='paper'"):
        get_procedure("paper").resolve({"rule": "forwardstop"})


def test_statistics_are_the_computation_modules_numbers():
    observed, null = _maps()
    options = {**get_procedure("paper").defaults, "tail": "none"}
    got = get_procedure("paper").statistics(observed, null, options)
    want = compute_statistics(observed, null)
    for name in ("z", "p", "q", "lfdr", "posterior"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    got = get_procedure("directional").statistics(
        observed, null, get_procedure("directional").defaults)
    want = directional_statistics(observed, null, null_pool="pooled", pi0_method="bh")
    np.testing.assert_array_equal(got.q, want.q)
    got = get_procedure("stepdown").statistics(observed, null, {"tail": "none"})
    want = stepdown_statistics(observed, null, tail="none")
    np.testing.assert_array_equal(got.q, want.q)
    assert got.null_summary["p_map"] == want.null_summary["p_map"]


def test_mask_of_a_pooled_rule_is_the_rule_modules_mask():
    observed, null = _maps(1)
    proc = get_procedure("paper")
    s = proc.statistics(observed, null, proc.defaults)
    t = proc.default_thresholds()
    grid = (8, 8)
    kw = {k: getattr(s, k).reshape(grid) for k in ("z", "p", "lfdr", "posterior", "q")}
    got = proc.mask("lfdr", t, maps=kw, pi0=s.pi0, null_summary=s.null_summary, grid_shape=grid)
    want = significance_mask("lfdr", kw["z"], kw["p"], kw["lfdr"], s.pi0, z_th=0.0,
                             l_th=0.3, posterior=kw["posterior"], q=kw["q"])
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="step-down steps"):
        proc.mask("forwardstop", t, maps=kw, pi0=s.pi0, null_summary=s.null_summary,
                  grid_shape=grid)


class _Strict(Directional):
    """A fourth procedure a user might add: directional with a stricter default level."""

    name = "strict"
    title = "strict"
    label = "strict (q ≤ 0.01)"
    help = "strict: directional at q ≤ 0.01."
    defaults = {**Directional.defaults, "q_th": 0.01}


@pytest.fixture
def strict_procedure():
    register(_Strict())
    try:
        yield get_procedure("strict")
    finally:
        unregister("strict")


def test_a_registered_procedure_is_a_preset_without_other_changes(
        strict_procedure, tiny_backbone, blob_image):
    assert "strict" in procedure_names() and "strict" in presets.PRESET_DEFAULTS
    assert validate_options({"preset": "strict"}) == {"preset": "strict"}
    config = RunConfig(preset="strict", n_boot=8, device="cpu").validate()
    assert config.q_th == 0.01 and config.rule == "q" and config.null_pool == "pooled"
    assert "null_pool" in applicable_options({"preset": "strict"})
    assert "tail" not in applicable_options({"preset": "strict"})
    res = regularize(blob_image, tiny_backbone, preset="strict", n_boot=8, chunk_size=4,
                     device="cpu")
    assert res.preset == "strict" and res.procedure is strict_procedure
    assert res.thresholds_used["q_th"] == 0.01
    assert res.significant().shape == res.grid_shape


def test_an_unregistered_preset_is_refused_by_the_validator():
    with pytest.raises(ValueError, match="preset='strict' is not supported"):
        validate_options({"preset": "strict"})


def _preset_name_tests(path: Path, names: set[str], root: Path = SRC) -> list[str]:
    """``x == "paper"``, ``x in ("stepdown", ...)``, ``{"paper": ...}.get(x)`` in one file."""
    found = []

    def is_name(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(is_name(e) for e in node.elts)
        return False

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare) and any(map(is_name, [node.left, *node.comparators])):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
        elif isinstance(node, ast.Dict) and sum(map(is_name, node.keys)) >= 2:
            found.append(f"{path.relative_to(root)}:{node.lineno} (a dict keyed by preset)")
    return found


def test_no_preset_name_is_tested_as_a_string_outside_the_registry():
    names = set(procedure_names())
    inside = SRC / "core" / "stats" / "procedures"
    found = [hit for path in sorted(SRC.rglob("*.py")) if inside not in path.parents
             for hit in _preset_name_tests(path, names)]
    assert not found, "preset names tested outside core/stats/procedures:\n" + "\n".join(found)


def test_the_name_scan_finds_a_name_test(tmp_path):
    probe = tmp_path / "probe.py"  # the scan must catch what it forbids
    probe.write_text('def f(preset):\n    return preset == "paper" or preset in ("stepdown",)\n'
                     'HEADERS = {"stepdown": "a", "directional": "b"}\n')
    assert len(_preset_name_tests(probe, set(BUILT_IN), tmp_path)) == 3


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_procedure_declares_the_maps_its_result_holds(name):
    from dataclasses import fields

    from napari_attnreg.core.stats.paper import TokenStatistics

    proc = get_procedure(name)
    assert "z" in proc.stored_maps and proc.evidence_map in proc.stored_maps
    # every stored map is taken from a field of the statistics
    assert set(proc.stored_maps.values()) <= {f.name for f in fields(TokenStatistics)}


def test_a_result_names_its_maps_as_its_procedure_does(tiny_backbone, blob_image):
    res = regularize(blob_image, tiny_backbone, n_boot=8, chunk_size=4, device="cpu")
    assert list(res.maps) == ["z", "step_p", "adjusted_p", "evidence"]
    assert res.maps["adjusted_p"] is res.q and res.maps["evidence"] is res.posterior
    with pytest.raises(TypeError):
        res.maps["adjusted_p"] = res.p  # read-only: the result's own arrays
    paper = regularize(blob_image, tiny_backbone, preset="paper", n_boot=8, chunk_size=4,
                       device="cpu")
    assert list(paper.maps) == ["z", "p", "q", "lfdr", "posterior"]
    assert paper.maps["lfdr"] is paper.lfdr


def test_thresholds_fill_from_the_default_procedure_when_none_is_named():
    from napari_attnreg.core.run.thresholds import Thresholds

    default_rule = get_procedure(DEFAULT_PROCEDURE).defaults["rule"]
    assert Thresholds.from_mapping({"q_th": 0.05}).rule == default_rule == "forwardstop"

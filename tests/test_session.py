"""The session model: settings, results per image with their own thresholds, selection, events."""

from __future__ import annotations

import numpy as np
import pytest

from napari_attnreg.core.results.result import AttentionResult
from napari_attnreg.core.run.thresholds import Thresholds
from napari_attnreg.core.stats.presets import default_thresholds
from napari_attnreg.session import Session, Signal


def _result(preset: str = "directional", seed: int = 0, **thresholds) -> AttentionResult:
    rng = np.random.default_rng(seed)
    p = rng.uniform(size=(4, 5))
    return AttentionResult(
        attention=rng.uniform(size=(4, 5)),
        maps=dict(z=rng.normal(size=(4, 5)), p=p, lfdr=p, posterior=1 - p, q=p), pi0=0.8,
        thresholds={**default_thresholds(preset), **thresholds},
        image_shape=(8, 10), model_shape=(8, 10), patch_size=(2, 2),
        metadata={"preset": preset})


@pytest.fixture
def session():
    """A session with two images' results (different q thresholds) and a recorder of events."""
    s = Session({"preset": "directional", "n_boot": 50, **default_thresholds("directional")})
    s.seen = []
    for name in ("result_added", "result_removed", "selection_changed", "thresholds_changed",
                 "settings_changed"):
        getattr(s.events, name).connect(lambda *args, name=name: s.seen.append((name, *args)))
    s.add("a", {(): _result(seed=1, q_th=0.2)})
    s.add("b", {(): _result(seed=2)}, params={"n_boot": 50})
    s.seen.clear()
    return s


def test_a_result_keeps_its_runs_thresholds_and_is_the_latest(session):
    assert list(session) == ["a", "b"] and len(session) == 2 and "a" in session
    assert session.latest.key == "b" and session["b"].run.params["n_boot"] == 50
    assert session["a"].thresholds == Thresholds.of(session["a"].any_result)
    assert session["a"].thresholds.q_th == pytest.approx(0.2)
    assert session.find_run(session["a"].run.run_id) is session["a"]
    assert session.selected is None and session.shown() is None


def test_selection_events_and_unknown_keys(session):
    session.select("b")
    session.select("b")  # no change, no event
    assert session.seen == [("selection_changed", "b")] and session.selected.key == "b"
    with pytest.raises(KeyError, match="No result"):
        session.select("nope")
    assert session.selected_key == "b"
    session.select(None)
    assert session.seen[-1] == ("selection_changed", None)


def test_a_threshold_move_changes_only_the_selected_result(session):
    session.select("b")
    session.seen.clear()
    new = session.set_thresholds({"q_th": 0.5})
    assert new.q_th == pytest.approx(0.5) and new.rule == "q"  # the other keys kept
    assert session.seen == [("thresholds_changed", "b", new)]
    assert session.thresholds() == new and session.thresholds("b") == new
    assert session.thresholds("a").q_th == pytest.approx(0.2)  # the other image keeps its own
    shown = session.shown()
    np.testing.assert_array_equal(shown.significant(),
                                  session["b"].any_result.significant(q_th=0.5))
    # selecting the other image shows its own thresholds and count
    session.select("a")
    assert session.thresholds().q_th == pytest.approx(0.2)
    np.testing.assert_array_equal(session.shown().significant(),
                                  session["a"].any_result.significant(q_th=0.2))
    session.seen.clear()
    session.set_thresholds(session.thresholds())  # unchanged: no event
    assert session.seen == []


def test_thresholds_by_key_and_a_bad_value(session):
    session.set_thresholds({"rule": "p", "p_th": 0.01}, key="a")
    assert session.seen == [("thresholds_changed", "a", session["a"].thresholds)]
    assert session.selected is None and session.thresholds("a").rule == "p"
    with pytest.raises(ValueError, match="q_th"):
        session.set_thresholds({"q_th": 3.0}, key="a")
    assert session.thresholds("a").q_th == pytest.approx(0.2) and len(session.seen) == 1
    with pytest.raises(KeyError):
        session.set_thresholds({"q_th": 0.3}, key="nope")


def test_a_rule_the_results_preset_lacks_is_refused_and_nothing_changes(session):
    # rule='q' was kept for a step-down result: every redraw, table and export then failed
    # with "a step-down result has no 'p' map"
    rng = np.random.default_rng(3)
    step = AttentionResult(
        attention=rng.uniform(size=(4, 5)), pi0=1.0,
        maps={k: rng.uniform(size=(4, 5)) for k in ("z", "step_p", "adjusted_p", "evidence")},
        thresholds=default_thresholds("stepdown"), image_shape=(8, 10), model_shape=(8, 10),
        patch_size=(2, 2), metadata={"preset": "stepdown"})
    session.add("s", {(): step})
    session.seen.clear()
    before = session.thresholds("s")
    with pytest.raises(ValueError, match=r"rule='q' is not available under "
                                         r"preset='stepdown'; use one of forwardstop"):
        session.set_thresholds({"rule": "q"}, key="s")
    assert session.thresholds("s") == before and session.seen == []
    session.update_settings(preset="stepdown")
    session.seen.clear()
    with pytest.raises(ValueError, match="not available under preset='stepdown'"):
        session.set_thresholds({"rule": "lfdr"})  # the next run's, nothing selected
    assert session.settings["rule"] == "forwardstop" and session.seen == []
    session.set_thresholds({"rule": "q"}, key="a")  # a directional result offers it
    assert session.thresholds("a").rule == "q"


def test_with_nothing_selected_thresholds_are_the_next_runs_settings(session):
    assert session.thresholds() == Thresholds.from_preset("directional")
    session.set_thresholds({"q_th": 0.05})
    assert session.seen == [("settings_changed", {"q_th": 0.05})]
    assert session.settings["q_th"] == 0.05 and session.run_thresholds().q_th == 0.05
    assert session.thresholds("b").q_th == pytest.approx(0.1)  # no result touched


def test_settings_report_only_what_changed(session):
    assert session.update_settings(n_boot=50, seed=3) == {"seed": 3}
    assert session.seen == [("settings_changed", {"seed": 3})]
    assert session.update_settings({"seed": 3}) == {} and len(session.seen) == 1
    # a new preset brings its thresholds, unless they are given with it
    assert session.update_settings(preset="paper")["rule"] == "lfdr"
    assert session.settings_thresholds() == Thresholds.from_preset("paper")
    session.update_settings(preset="directional", q_th=0.02)
    assert session.settings_thresholds() == Thresholds.from_preset("directional").replace(
        q_th=0.02)
    with pytest.raises(TypeError):
        session.settings["seed"] = 4  # read-only: changes go through update_settings


def test_a_rerun_keeps_the_chosen_thresholds_unless_the_preset_changed(session):
    session.select("a")
    session.set_thresholds({"q_th": 0.4})
    session.add("a", {(): _result(seed=3)})  # same preset: the analyst's choice stays
    assert session.thresholds("a").q_th == pytest.approx(0.4)
    assert session.latest.key == "a" and session.selected_key == "a"
    assert session.run_thresholds().q_th == pytest.approx(0.4)  # a re-run starts from them
    session.update_settings(preset="paper")
    assert session.run_thresholds() == Thresholds.from_preset("paper")
    session.add("a", {(): _result("paper", seed=4)})  # another preset: the run's own
    assert session.thresholds("a") == Thresholds.from_preset("paper")
    session.add("c", {(): _result()}, thresholds={"q_th": 0.3})
    assert session.thresholds("c").q_th == pytest.approx(0.3)


def test_removing_the_selected_result_deselects_it_first(session):
    session.select("a")
    session.seen.clear()
    session.remove("a")
    assert session.seen == [("selection_changed", None), ("result_removed", "a")]
    with pytest.raises(KeyError):
        session.remove("a")
    session.clear()
    assert len(session) == 0 and session.latest is None
    with pytest.raises(ValueError, match="at least one plane"):
        session.add("x", {})


def test_partial_thresholds_of_a_result_are_completed():
    old = _result("paper")
    old.thresholds = {"rule": "lfdr", "l_th": 0.2}  # e.g. a file of an older version
    used = old.thresholds_used
    assert used["l_th"] == 0.2 and used["z_th"] == 0.0 and set(used) == set(Thresholds.of(old))
    assert Thresholds.of(old).l_th == 0.2 and Thresholds.from_result(old) == Thresholds.of(old)


def test_signal_order_disconnect_and_errors():
    calls = []
    sig = Signal("x")
    first = sig.connect(lambda v: calls.append(("first", v)))
    sig.connect(lambda v: calls.append(("second", v)))
    sig.connect(first)  # once only
    sig.emit(1)
    sig.disconnect(first)
    sig.disconnect(first)  # already gone: ignored
    sig.emit(2)
    assert calls == [("first", 1), ("second", 1), ("second", 2)] and len(sig) == 1

    def broken(_v):
        raise RuntimeError("slot failed")

    sig.connect(broken)
    with pytest.raises(RuntimeError, match="slot failed"):
        sig.emit(3)


def test_an_opened_result_sets_the_next_runs_preset_and_a_new_one_is_noted():
    # the front ends' Statistics control showed the next run's preset over an opened result
    # whose thresholds (and rules) were another preset's
    session = Session({"preset": "stepdown"})
    session.add("cells", {(): _result("paper", q_th=0.2)})
    session.select("cells")
    assert session.preset_note() == ("Statistics: step-down applies to the next run; the "
                                     "result shown keeps its paper statistics and thresholds.")
    changed = []
    session.events.settings_changed.connect(changed.append)
    assert "Statistics set to paper" in session.show_preset_of("cells")
    assert session.preset == "paper" and changed[-1]["preset"] == "paper"
    assert session.preset_note() is None and session.show_preset_of() is None
    assert session.thresholds().q_th == pytest.approx(0.2)  # the result keeps its own
    assert session.run_thresholds().q_th == pytest.approx(0.2)  # a re-run starts from them
    session.update_settings(preset="directional")
    assert "directional applies to the next run" in session.preset_note()
    assert session.thresholds().q_th == pytest.approx(0.2)

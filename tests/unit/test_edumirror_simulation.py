"""edumirror simulation and measurement: branching (a)7, the planner's evaluate step by hand, the teacher's goals,
the public-goods game, the Rater and the Surveyor; each with a negative control."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import yaml

from tasks.common.params import validate_paper_section
from tasks.edumirror import measurement, method, simulation
from tasks.edumirror.baselines import RandomPolicy
from tasks.edumirror.evaluate import ordering_of, survey_validity, sweep_settings
from tests.conftest import REPO

CPU = validate_paper_section("edumirror", yaml.safe_load((REPO / "params.yaml").read_text())["edumirror"])["cpu"]


def classroom(seed: int = 3, n_agents: int = 5) -> simulation.Classroom:
    return simulation.new_classroom(CPU, simulation.class_roles(n_agents), 5.0, [seed])


def branched(world=None, seed: int = 3) -> simulation.BranchedRun:
    return simulation.branched_run(world or simulation.build_world(CPU), classroom(seed),
                                   simulation.ValueDrivenPolicy(0.1), branch_tick=6, ticks=14)


def test_a7_branches_share_state_and_neglect_equals_unbranched():
    run = branched()
    assert run.shared_state_ok is True
    assert run.neglect_matches_unbranched is True
    # not vacuous: the timelines are equal up to the branch tick and differ after it
    for goal in ("punitive", "individual", "cooperative"):
        assert np.array_equal(run.trajectories[goal][:7], run.trajectories["neglect"][:7])
    assert not np.array_equal(run.trajectories["individual"], run.trajectories["neglect"])


def test_negative_control_branch_that_reseeds_the_rng_is_caught(monkeypatch):
    def reseeding_branch(room, goal):
        copied = copy.deepcopy(room)
        copied.goal, copied.goal_since, copied.rng = goal, room.tick, np.random.default_rng(12345)
        return copied

    monkeypatch.setattr(simulation, "branch", reseeding_branch)
    run = branched()
    assert run.shared_state_ok is False and run.neglect_matches_unbranched is False


def test_negative_control_branch_sharing_state_by_reference_is_caught(monkeypatch):
    def shallow_branch(room, goal):
        copied = copy.copy(room)
        copied.goal, copied.goal_since = goal, room.tick
        return copied

    monkeypatch.setattr(simulation, "branch", shallow_branch)
    run = branched()
    assert run.shared_state_ok is False or run.neglect_matches_unbranched is False


def test_fingerprint_sees_every_part_of_the_state():
    room = classroom()
    base = simulation.fingerprint(room)
    for mutate in (lambda r: r.needs.__setitem__((0, 0), 1.0), lambda r: r.affinity.__setitem__((0, 1), 0.3),
                   lambda r: r.memory[0].append((0, 0, "study", None)), lambda r: r.rng.random(),
                   lambda r: setattr(r, "norm", 0.5), lambda r: setattr(r, "tick", 1)):
        other = copy.deepcopy(room)
        mutate(other)
        assert simulation.fingerprint(other) != base
    assert simulation.fingerprint(simulation.branch(room, "cooperative")) == base


def tiny_world(**changes) -> simulation.World:
    world = simulation.build_world(CPU)
    return simulation.World(**{**world.__dict__, "tom_noise_sd": 0.0, **changes})


def test_evaluate_options_by_hand():
    """Needs at their targets: every deficit is 0, so all weights are 0.2 (self and target). The victim
    (theta 45) evaluates help toward student 0 and study: U_self(help) = 0.2 * (0.2 + 0.1 + 0.3) = 0.12,
    U_other(help) = 0.2 * (0.1 + 0.5 + 0.3 + 0.1) = 0.2; U(study) = cos45 * 0.2 * 0.5."""
    world = tiny_world()
    room = classroom()
    room.needs[:] = 7.0
    victim = room.victims()[0]
    options = [simulation.Option("help", 0), simulation.Option("study", None)]
    u = simulation.evaluate_options(world, room, victim, options)
    c = math.cos(math.radians(45))
    assert u == pytest.approx([c * 0.12 + c * 0.2, c * 0.1], abs=1e-12)


def test_evaluate_aggression_terms_by_hand():
    """The bully (theta -15, aggression 0.6) excluding student 3 at needs 7: U_self = 0.2 * 0.3 (exclusion's
    belonging and status) + 0.6 * 0.3 (aggression bonus) - 0.3 * (7 + 7) / 20 (retaliation risk) = 0.03;
    U_other = 0.2 * (-0.3 - 0.2 - 0.1) = -0.12; a class norm of 1 removes 1.0 perceived esteem: U_self -0.17."""
    world = tiny_world()
    room = classroom()
    room.needs[:] = 7.0
    u = simulation.evaluate_options(world, room, 0, [simulation.Option("exclude", 3)])
    cos, sin = math.cos(math.radians(-15)), math.sin(math.radians(-15))
    assert u[0] == pytest.approx(cos * 0.03 + sin * -0.12, abs=1e-12)
    room.norm = 1.0
    u_norm = simulation.evaluate_options(world, room, 0, [simulation.Option("exclude", 3)])
    assert u_norm[0] == pytest.approx(cos * (0.03 - 0.2) + sin * -0.12, abs=1e-12)
    room.norm, room.affinity[0, 3] = 0.0, -0.8  # retaliation bonus and reduced regard clip(1 - 0.8) = 0.2
    u_hate = simulation.evaluate_options(world, room, 0, [simulation.Option("exclude", 3)])
    assert u_hate[0] == pytest.approx(cos * (0.03 + 0.2) + sin * 0.2 * -0.12, abs=1e-12)


def test_teacher_goals_change_goals_not_outcomes_directly():
    world = tiny_world()
    room = classroom()
    room.goal = "cooperative"
    before = room.needs.copy()
    simulation.teacher_acts(world, room)
    assert room.norm == 1.0 and np.array_equal(room.needs, before)
    room = classroom()
    room.needs[3] = 2.0
    room.goal = "individual"
    simulation.teacher_acts(world, room)
    assert np.allclose(room.needs[3], 2.0 + np.array(CPU.teacher.counsel))
    room = classroom()
    room.goal = "punitive"
    room.events.append(simulation.Event(0, 0, "confront", 3, True))
    room.events.append(simulation.Event(0, 1, "rumour", 3, False))
    simulation.teacher_acts(world, room)
    assert np.allclose(room.needs[0], np.clip(6.0 + np.array(CPU.teacher.punish), 0, 10))
    assert np.allclose(room.needs[1], 6.0)  # undetected: not punished
    assert room.needs[3, 1] == pytest.approx(5.0 - CPU.teacher.punish_public_cost)
    with pytest.raises(ValueError, match="unknown teacher goal"):
        simulation.branch(room, "lenient")


def test_class_roles_and_feasible_options():
    assert simulation.class_roles(5) == ["bully", "follower", "follower", "victim"]
    roles = simulation.class_roles(15)
    assert roles.count("bully") == 2 and roles.count("victim") == 2 and roles.count("bystander") == 6
    options = simulation.feasible_options(4, 1)
    assert len(options) == 6 * 3 + 3 and all(o.target != 1 for o in options)


def test_sweep_scales_the_effect_groups():
    settings = sweep_settings([0.5, 1.5])
    default = {g: 1.0 for g in simulation.EFFECT_GROUPS}
    assert len(settings) == 1 + 8 + 4 and settings[0] == default
    teacher = [tuple(x[g] for g in simulation.TEACHER_EFFECT_GROUPS) for x in settings[1:9]]
    assert len(set(teacher)) == 8 and all(x["aggression"] == x["prosocial"] == 1.0 for x in settings[1:9])
    assert settings[9:] == [default | {"aggression": 0.5}, default | {"aggression": 1.5},
                            default | {"prosocial": 0.5}, default | {"prosocial": 1.5}]
    world = simulation.build_world(CPU, {"aggression": 0.5, "teacher_individual": 1.5, "teacher_cooperative": 0.5,
                                         "teacher_punitive": 2.0})
    base = simulation.build_world(CPU)
    exclude = simulation.ACTION_INDEX["exclude"]
    assert np.allclose(world.target_effect[exclude], 0.5 * base.target_effect[exclude])
    assert np.allclose(world.counsel, 1.5 * base.counsel)
    assert world.norm_help == 0.5 * base.norm_help and world.norm_exclude == 0.5 * base.norm_exclude
    assert np.allclose(world.punish, 2.0 * base.punish)
    assert world.punish_public_cost == 2.0 * base.punish_public_cost
    assert np.allclose(world.actor_effect[simulation.ACTION_INDEX["study"]],
                       base.actor_effect[simulation.ACTION_INDEX["study"]])
    with pytest.raises(ValueError, match="unknown effect groups"):
        simulation.build_world(CPU, {"teacher": 2.0})


def test_cooperative_breadth_margin_by_hand():
    from tasks.common.results import SeedResult
    from tasks.edumirror.claim_metrics import claim_metrics

    metrics = {"slope_healthy": 0.1, "slope_vulnerable": -0.2, "delta_cooperative": 1.0, "delta_individual": 3.0,
               "delta_punitive": -0.1, "sweep_orderings_held": 1.0, "sweep_settings": 4.0, "integrity_passed": 4.0,
               "integrity_checks": 4.0, "pg_increasing_pairs": 5.0, "pg_adjacent_pairs": 6.0,
               "cooperative_second_smallest_need_delta": 0.6, "individual_second_smallest_need_delta": 1.1,
               "punitive_second_smallest_need_delta": -0.3, "no_retaliation_risk_slope_healthy": -0.04,
               "no_retaliation_risk_slope_vulnerable": -0.05, "surveyor_need_r": 0.93,
               "surveyor_need_r_expected": 0.95}
    out = claim_metrics(CPU, SeedResult(0).add(metrics))
    assert out["cooperative_breadth_margin"] == pytest.approx(0.6 - 1.1)
    assert out["no_retaliation_risk_slope_healthy_minus_vulnerable"] == pytest.approx(0.01)
    assert out["surveyor_need_r_minus_expected"] == pytest.approx(-0.02)
    assert out["slope_healthy_minus_vulnerable"] == pytest.approx(0.3)


def test_ordering_of_mean_deltas():
    deltas = {"punitive": np.full((2, 5), 0.1), "individual": np.full((2, 5), 0.4),
              "cooperative": np.array([[1.0] * 5, [0.0] * 5])}
    assert ordering_of(deltas) == pytest.approx(0.1)


def test_public_goods_rates_follow_theta_and_random_baseline_does_not():
    def rate(theta, random_policy=False):
        return np.mean([simulation.public_goods_run(theta, 4, 20, 1.6, 0.1, 0.1, np.random.default_rng([r]),
                                                    random_policy) for r in range(20)])
    assert rate(-15.0) < 0.05 and rate(75.0) > 0.95
    assert abs(rate(-15.0, True) - 0.5) < 0.05 and abs(rate(75.0, True) - 0.5) < 0.05


def test_random_policy_ignores_utilities():
    rng = np.random.default_rng(0)
    picks = [RandomPolicy().select(lambda: None, [None] * 4, np.array([9.0, 0, 0, 0]), rng) for _ in range(400)]
    assert 60 < picks.count(0) < 140


def held_out_kappa(rater: measurement.Rater, paraphrases: tuple[int, ...]) -> float:
    """Kappa on every action x paraphrase x setting narration (Ava acting on Ben)."""
    held = [(measurement.narrate(a, 0, 1, p, s), simulation.CATEGORY_OF[a]) for a in measurement.TEMPLATES
            for p in paraphrases for s in range(len(measurement.SETTINGS))]
    return method.cohens_kappa(method.confusion_matrix([y for _, y in held], rater.code([t for t, _ in held]), 4))


def test_rater_learns_the_corpus_and_generalises_to_held_out_paraphrases():
    texts, labels = measurement.rater_corpus(600, 4, np.random.default_rng(0))
    rater, losses = measurement.train_rater(texts, labels, 150, 0.1, 0.0, seed=0)
    assert losses[-1] < 0.05 * losses[0]
    assert np.mean(rater.code(texts) == np.array(labels)) > 0.99
    assert held_out_kappa(rater, (0, 1, 2, 3)) == 1.0
    assert held_out_kappa(rater, (4, 5)) > 0.3  # unseen wordings: far above chance, far from perfect


def test_negative_control_rater_trained_on_shuffled_labels_is_caught():
    texts, labels = measurement.rater_corpus(600, 4, np.random.default_rng(0))
    shuffled = np.random.default_rng(1).permutation(labels).tolist()
    rater, _ = measurement.train_rater(texts, shuffled, 150, 0.1, 0.0, seed=0)
    assert held_out_kappa(rater, (0, 1, 2, 3)) < 0.2


def test_narration_and_bag_of_words():
    text = measurement.narrate("rumour", 0, 1, 0, 2)
    assert text == "after class, Ava spread a rumour about Ben."
    vocabulary = measurement.build_vocabulary([text])
    assert "ava" not in vocabulary and "rumour" in vocabulary
    x = measurement.bag_of_words(["a rumour rumour about nothing"], vocabulary)
    assert x[0, vocabulary.index("rumour")] == 2.0 and x[0, vocabulary.index("about")] == 1.0
    assert x.sum() == 4.0  # "nothing" is out of vocabulary


def test_surveyor_without_noise_recovers_the_latent_state():
    needs = np.array([[0.0, 2.0, 5.0, 8.0, 10.0], [10.0, 8.0, 5.0, 2.0, 0.0]])
    rses, need_answers = measurement.survey(needs, 0.0, 0.0, np.random.default_rng(0))
    # latent self-esteem (esteem + health) / 2 = 7.5 and 2.5: positive items rint(1 + 3 * 0.75) = 3, reverse 2
    assert rses[0].tolist() == [3, 2, 3, 3, 2, 2, 3, 2, 2, 3]
    assert method.rses_score(rses).tolist() == [30.0, 20.0]  # 10 * rint(1 + 3 * 0.75) and 10 * rint(1 + 3 * 0.25)
    scores = measurement.need_scale_scores(need_answers)
    assert np.max(np.abs(scores - needs)) <= 10 / 12 + 1e-9  # rounding to 7 points


def test_surveyor_validity_and_reverse_coding():
    needs = np.random.default_rng(0).uniform(0, 10, size=(400, 5))
    v = survey_validity(needs, 0.5, 0.4, np.random.default_rng(1))
    assert v["surveyor_need_r"] > 0.9 and v["surveyor_rses_r"] > 0.9
    assert v["surveyor_rses_alpha"] > 0.85 and v["surveyor_rses_alpha_uncoded"] < v["surveyor_rses_alpha"] - 0.3


def test_negative_control_scoring_without_reverse_coding_is_caught(monkeypatch):
    monkeypatch.setattr(measurement, "need_scale_scores",
                        lambda answers: (answers.mean(axis=-1) - 1.0) / 6 * 10.0)
    needs = np.random.default_rng(0).uniform(0, 10, size=(400, 5))
    import tasks.edumirror.evaluate as evaluate

    monkeypatch.setattr(evaluate, "need_scale_scores", measurement.need_scale_scores)
    assert survey_validity(needs, 0.5, 0.4, np.random.default_rng(1))["surveyor_need_r"] < 0.8


def test_config_rejects_bad_values():
    section = yaml.safe_load((REPO / "params.yaml").read_text())["edumirror"]
    section["cpu"]["scenario"]["branch_tick"] = 50
    with pytest.raises(Exception, match="branch_tick"):
        validate_paper_section("edumirror", section)

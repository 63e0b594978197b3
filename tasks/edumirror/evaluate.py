"""Evaluation step of edumirror: runs the experiments E1-E4 and the measurement checks; derives no claim numbers.

- E1 bullying: a healthy and a vulnerable victim (initial needs), ``replicates`` classrooms each; victim need
  trajectories and their slope over ticks 0..slope_window; the same classrooms with random-policy agents
  (baselines.RandomPolicy: no values) as the reference of what the harness alone does.
- E2 interventions: each classroom runs to ``branch_tick`` under neglect, branches into the four teacher goals
  from the identical state (RNG included) and runs to ``ticks``; victim needs at the end per branch; the
  counterfactual-integrity checks on every classroom.
- Sensitivity sweep: E2 (``sweep_replicates`` classrooms) at the default effect sizes, at every corner of
  {scales}^3 over the punitive, individual (counselling) and cooperative (class meeting) teacher groups, and at
  each scale of the aggression and prosocial groups one at a time; whether the ordering holds in each.
- E3 cooperation: a public-goods game per SVO angle, value-driven and random-policy agents.
- E4 scalability: E2 at each class size; run time per tick and whether the ordering holds.
- Measurement: the Rater codes the narrations of E1's events (against their true categories); the Surveyor
  administers RSES and the need items to every student at ticks 0, slope_window and ticks of E1 and E2.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np

from tasks.common.results import Progress, SeedResult, no_progress
from tasks.edumirror import method, simulation
from tasks.edumirror.baselines import RandomPolicy
from tasks.edumirror.config import EdumirrorConfig
from tasks.edumirror.measurement import (
    N_PARAPHRASES,
    NEED_ITEM_POINTS,
    NEED_ITEMS_PER_NEED,
    SETTINGS,
    latent_self_esteem,
    narrate,
    need_scale_scores,
    survey,
)
from tasks.edumirror.simulation import GOALS, Event, ValueDrivenPolicy
from tasks.edumirror.train import load_rater

E1_STREAM, E2_STREAM, SWEEP_STREAM, SIZE_STREAM, PG_STREAM, NARRATION_STREAM, SURVEY_STREAM = range(1, 8)
ACTIVE_GOALS = ("punitive", "individual", "cooperative")


def composite(needs: np.ndarray) -> np.ndarray:
    """Mean over the five needs (the victim's composite state)."""
    return np.asarray(needs).mean(axis=-1)


def run_e1(cfg: EdumirrorConfig, seed: int, policy: simulation.AgentPolicy
           ) -> tuple[dict[str, np.ndarray], list[tuple[Event, int]], list[np.ndarray]]:
    """Victim composite trajectories (replicates, ticks + 1) per condition; every event with its classroom's
    student count; the needs of every student at the survey ticks."""
    s = cfg.scenario
    world = simulation.build_world(cfg)
    roles = simulation.class_roles(5)
    trajectories: dict[str, np.ndarray] = {}
    events: list[tuple[Event, int]] = []
    snapshots: list[np.ndarray] = []
    for c, (condition, needs) in enumerate((("healthy", s.healthy_needs), ("vulnerable", s.vulnerable_needs))):
        rows = []
        for r in range(s.replicates):
            room = simulation.new_classroom(cfg, roles, needs, [seed, E1_STREAM, c, r])
            start = room.needs.copy()[None]
            trajectory = np.concatenate([start, simulation.run(world, room, policy, s.ticks)])
            victim = room.victims()
            rows.append(composite(trajectory[:, victim].mean(axis=1)))
            events += [(e, room.n_students) for e in room.events]
            snapshots += [trajectory[t] for t in (0, s.slope_window, s.ticks)]
        trajectories[condition] = np.array(rows)
    return trajectories, events, snapshots


def branch_deltas(runs: list[simulation.BranchedRun]) -> dict[str, np.ndarray]:
    """Victim need change vs neglect at the last tick, per active goal: (classrooms, 5)."""
    return {g: np.array([r.victim_final[g] - r.victim_final["neglect"] for r in runs]) for g in ACTIVE_GOALS}


def ordering_of(deltas: dict[str, np.ndarray]) -> float:
    """The ordering margin of the mean composite changes (method.ordering_margin)."""
    means = {g: float(composite(d).mean()) for g, d in deltas.items()}
    return method.ordering_margin(means["punitive"], means["individual"], means["cooperative"])


def branched_classrooms(cfg: EdumirrorConfig, world: simulation.World, policy: simulation.AgentPolicy,
                        n_agents: int, replicates: int, stream: list[int], check_unbranched: bool
                        ) -> list[simulation.BranchedRun]:
    s = cfg.scenario
    roles = simulation.class_roles(n_agents)
    return [simulation.branched_run(world, simulation.new_classroom(cfg, roles, s.victim.initial_needs,
                                                                    [*stream, r]),
                                    policy, s.branch_tick, s.ticks, check_unbranched)
            for r in range(replicates)]


def sweep_settings(scales: list[float]) -> list[dict[str, float]]:
    """The default effect sizes; every corner of scales^3 over the three teacher groups (punishment, counselling,
    class meeting vary independently, so the counselling-to-meeting ratio that decides the ordering moves); then
    each student group (aggression, prosocial) at each scale with the rest at default (one at a time)."""
    default = {g: 1.0 for g in simulation.EFFECT_GROUPS}
    teacher_corners = [default | dict(zip(simulation.TEACHER_EFFECT_GROUPS, c, strict=True))
                       for c in itertools.product(scales, repeat=len(simulation.TEACHER_EFFECT_GROUPS))]
    student_one_at_a_time = [default | {g: x} for g in simulation.STUDENT_EFFECT_GROUPS for x in scales]
    return [default, *teacher_corners, *student_one_at_a_time]


def run_public_goods(cfg: EdumirrorConfig, seed: int) -> list[dict]:
    s = cfg.scenario
    rows = []
    for k, theta in enumerate(s.pg_thetas):
        rates = {}
        for name, random_policy in (("value_driven", False), ("random", True)):
            choices = [simulation.public_goods_run(theta, s.pg_agents, s.pg_rounds, s.pg_multiplier,
                                                   cfg.agent.temperature, s.pg_affinity_rate,
                                                   np.random.default_rng([seed, PG_STREAM, k, r, int(random_policy)]),
                                                   random_policy)
                       for r in range(s.pg_replicates)]
            rates[name] = float(np.mean(choices))
        rows.append({"theta": theta, "contribution_rate": rates["value_driven"],
                     "random_contribution_rate": rates["random"],
                     "utility_difference": method.public_goods_utility_difference(theta, s.pg_multiplier,
                                                                                   s.pg_agents)})
    return rows


def rate_narrations(cfg: EdumirrorConfig, seed: int, model_dir: Path, events: list[tuple[Event, int]]
                    ) -> dict[str, float]:
    """The Rater's agreement with the true categories of the narrated events (Cohen's kappa), on all narrations
    and on those written with paraphrases the Rater never saw."""
    rater = load_rater(model_dir)
    rng = np.random.default_rng([seed, NARRATION_STREAM])
    paraphrases = rng.integers(N_PARAPHRASES, size=len(events))
    settings = rng.integers(len(SETTINGS), size=len(events))
    texts = [narrate(e.action, e.actor, e.target, int(p), int(st))
             for (e, _), p, st in zip(events, paraphrases, settings, strict=True)]
    truth = np.array([simulation.CATEGORY_OF[e.action] for e, _ in events])
    coded = rater.code(texts)
    n_classes = len(simulation.CATEGORIES)
    unseen = paraphrases >= cfg.measurement.train_paraphrases
    confusion = method.confusion_matrix(truth, coded, n_classes)
    shares = np.bincount(truth, minlength=n_classes) / len(truth)
    return {"rater_kappa": method.cohens_kappa(confusion),
            "rater_kappa_unseen_paraphrases": method.cohens_kappa(
                method.confusion_matrix(truth[unseen], coded[unseen], n_classes)),
            "rater_kappa_seen_paraphrases": method.cohens_kappa(
                method.confusion_matrix(truth[~unseen], coded[~unseen], n_classes)),
            "rater_accuracy": float(np.trace(confusion) / confusion.sum()),
            "rater_narrations": float(len(events)), "largest_category_share": float(shares.max())}


def survey_validity(needs: np.ndarray, noise_sd: float, acquiescence_sd: float, rng: np.random.Generator
                    ) -> dict[str, float]:
    """Surveyor validity against the latent state: mean Pearson r of each need scale with its latent need, r of
    RSES with latent self-esteem, Cronbach's alpha of the reverse-coded RSES items (and without reverse coding)."""
    rses, need_answers = survey(needs, noise_sd, acquiescence_sd, rng)
    scores = need_scale_scores(need_answers)
    rses_coded = method.reverse_code(rses, method.RSES_POINTS, method.RSES_REVERSE_ITEMS)
    expected_r = [method.expected_scale_r(float(needs[:, k].std()), method.NEED_MAX - method.NEED_MIN,
                                          NEED_ITEM_POINTS, NEED_ITEMS_PER_NEED, 1, noise_sd, acquiescence_sd)
                  for k in range(5)]
    alpha, alpha_uncoded = method.cronbach_alpha(rses_coded), method.cronbach_alpha(rses)
    return {"surveyor_need_r": float(np.mean([method.pearson(scores[:, k], needs[:, k]) for k in range(5)])),
            "surveyor_need_r_expected": float(np.mean(expected_r)),
            "surveyor_rses_r": method.pearson(method.rses_score(rses), latent_self_esteem(needs)),
            "surveyor_rses_alpha": alpha, "surveyor_rses_alpha_uncoded": alpha_uncoded,
            "surveyor_rses_reverse_coding_gain": alpha - alpha_uncoded}


def evaluate(cfg: EdumirrorConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    if cfg.hub is not None:
        from tasks.edumirror import hub

        return hub.evaluate(cfg, seed, Path(data_dir), Path(model_dir), device, progress)
    return simulate_and_measure(cfg, seed, Path(model_dir), ValueDrivenPolicy(cfg.agent.temperature), progress)


def simulate_and_measure(cfg: EdumirrorConfig, seed: int, model_dir: Path, policy: simulation.AgentPolicy,
                         progress: Progress = no_progress) -> SeedResult:
    """Every experiment and measurement of one seed with the given agent policy."""
    s, m = cfg.scenario, cfg.measurement
    result = SeedResult(seed)
    world = simulation.build_world(cfg)
    with result.stage("e1"):
        trajectories, events, snapshots = run_e1(cfg, seed, policy)
    window = s.slope_window + 1
    slopes = {c: np.array([method.ols_slope(t[:window]) for t in trajectories[c]]) for c in trajectories}
    result.add(slope_healthy=float(slopes["healthy"].mean()), slope_vulnerable=float(slopes["vulnerable"].mean()),
               vulnerable_min_composite_in_window=float(trajectories["vulnerable"][:, :window].mean(axis=0).min()),
               healthy_final_composite=float(trajectories["healthy"][:, -1].mean()),
               vulnerable_final_composite=float(trajectories["vulnerable"][:, -1].mean()),
               tables={"e1_trajectories": [{"condition": c, "tick": t, "replicate": r, "composite": float(v)}
                                           for c, arr in trajectories.items() for r, row in enumerate(arr)
                                           for t, v in enumerate(row)]})
    with result.stage("e1_random_policy"):  # baseline: the same classrooms with agents that ignore their values
        random_trajectories, _, _ = run_e1(cfg, seed, RandomPolicy())
    random_slopes = {c: np.array([method.ols_slope(t[:window]) for t in random_trajectories[c]])
                     for c in random_trajectories}
    result.add(random_policy_slope_healthy=float(random_slopes["healthy"].mean()),
               random_policy_slope_vulnerable=float(random_slopes["vulnerable"].mean()),
               random_policy_healthy_final_composite=float(random_trajectories["healthy"][:, -1].mean()))
    with result.stage("e1_no_retaliation_risk"):  # ablation: bullies see no risk in attacking healthy targets
        no_risk = cfg.model_copy(update={"agent": cfg.agent.model_copy(update={"retaliation_risk": 0.0})})
        no_risk_trajectories, _, _ = run_e1(no_risk, seed, policy)
    no_risk_slopes = {c: float(np.mean([method.ols_slope(t[:window]) for t in no_risk_trajectories[c]]))
                      for c in no_risk_trajectories}
    result.add(no_retaliation_risk_slope_healthy=no_risk_slopes["healthy"],
               no_retaliation_risk_slope_vulnerable=no_risk_slopes["vulnerable"])
    progress(0.15, f"E1 slopes healthy {slopes['healthy'].mean():.3f}, vulnerable {slopes['vulnerable'].mean():.3f}")

    with result.stage("e2"):
        runs = branched_classrooms(cfg, world, policy, 5, s.replicates, [seed, E2_STREAM], check_unbranched=True)
    deltas = branch_deltas(runs)
    victims = [i for i, role in enumerate(simulation.class_roles(5)) if role == "victim"]
    neglect_final = np.array([r.victim_final["neglect"] for r in runs])
    checks = [r.shared_state_ok for r in runs] + [bool(r.neglect_matches_unbranched) for r in runs]
    result.add({f"delta_{g}": float(composite(d).mean()) for g, d in deltas.items()})
    result.add({f"delta_{g}_{name}": float(d[:, k].mean())
                for g, d in deltas.items() for k, name in enumerate(method.NEED_NAMES)})
    # Breadth of improvement: ">= 4 of 5 needs improve" is "the second-smallest per-need mean change > 0", so
    # comparing the goals' second-smallest changes compares how broadly (at the 4-of-5 level) each improves.
    result.add({f"{g}_second_smallest_need_delta": float(np.sort(d.mean(axis=0))[1]) for g, d in deltas.items()})
    result.add(cooperative_beats_individual_needs=float(np.sum(deltas["cooperative"].mean(axis=0)
                                                               > deltas["individual"].mean(axis=0))))
    result.add(ordering_margin=ordering_of(deltas),
               neglect_final_composite=float(composite(neglect_final).mean()),
               integrity_passed=float(sum(checks)), integrity_checks=float(len(checks)),
               tables={"e2_need_deltas": [{"goal": g, "replicate": r, "need": name, "delta": float(d[r, k])}
                                          for g, d in deltas.items() for r in range(len(d))
                                          for k, name in enumerate(method.NEED_NAMES)],
                       "e2_trajectories": [{"goal": g, "tick": t, "composite": float(v)} for g in GOALS
                                           for t, v in enumerate(np.mean([composite(r.trajectories[g][:, victims]
                                                                                    .mean(axis=1)) for r in runs],
                                                                         axis=0))]})
    progress(0.35, "E2 deltas " + ", ".join(f"{g} {composite(d).mean():+.2f}" for g, d in deltas.items()))

    sweep_rows = []
    with result.stage("sweep"):
        for k, scales in enumerate(sweep_settings(s.sweep_scales)):
            sweep_runs = branched_classrooms(cfg, simulation.build_world(cfg, scales), policy, 5,
                                             s.sweep_replicates, [seed, SWEEP_STREAM, k], check_unbranched=False)
            sweep_deltas = branch_deltas(sweep_runs)
            margin = ordering_of(sweep_deltas)
            sweep_rows.append({**scales, "ordering_margin": margin, "ordering_holds": margin > 0,
                               **{f"delta_{g}": float(composite(d).mean()) for g, d in sweep_deltas.items()}})
    result.add(sweep_orderings_held=float(sum(r["ordering_holds"] for r in sweep_rows)),
               sweep_settings=float(len(sweep_rows)), tables={"sweep": sweep_rows})
    progress(0.6, f"sweep: ordering held in {sum(r['ordering_holds'] for r in sweep_rows)}/{len(sweep_rows)}")

    size_rows = []
    with result.stage("sizes"):
        for n_agents in s.class_sizes:
            started = time.perf_counter()
            size_runs = branched_classrooms(cfg, world, policy, n_agents, s.size_replicates,
                                            [seed, SIZE_STREAM, n_agents], check_unbranched=False)
            ticks_run = s.size_replicates * (s.branch_tick + len(GOALS) * (s.ticks - s.branch_tick))
            size_deltas = branch_deltas(size_runs)
            size_rows.append({"agents": n_agents, "ordering_margin": ordering_of(size_deltas),
                              "seconds_per_tick": (time.perf_counter() - started) / ticks_run,
                              **{f"delta_{g}": float(composite(d).mean()) for g, d in size_deltas.items()}})
    result.add({f"ordering_margin_{row['agents']}_agents": row["ordering_margin"] for row in size_rows})
    result.add(tables={"sizes": size_rows})
    progress(0.75, "sizes: " + ", ".join(f"{r['agents']}: {r['ordering_margin']:+.2f}" for r in size_rows))

    with result.stage("public_goods"):
        pg_rows = run_public_goods(cfg, seed)
    thetas = np.array(s.pg_thetas)
    rates = np.array([r["contribution_rate"] for r in pg_rows])
    random_rates = np.array([r["random_contribution_rate"] for r in pg_rows])
    rate_at = dict(zip(s.pg_thetas, rates, strict=True))
    result.add(pg_spearman=method.spearman(thetas, rates),
               pg_random_rate_range=float(random_rates.max() - random_rates.min()),
               pg_increasing_pairs=float(np.sum(np.diff(rates[np.argsort(thetas)]) > 0)),
               pg_adjacent_pairs=float(len(thetas) - 1),
               tables={"public_goods": pg_rows})
    if all(t in rate_at for t in (-15.0, 0.0, 45.0)):
        result.add(pg_svo_order_margin=float(min(rate_at[0.0] - rate_at[-15.0], rate_at[45.0] - rate_at[0.0])))

    with result.stage("measurement"):
        result.add(rate_narrations(cfg, seed, model_dir, events))
        # Each classroom's states at tick 0 and the branch tick are shared by its four branches: surveyed once.
        respondents = np.concatenate([np.concatenate(snapshots),
                                      *[r.trajectories["neglect"][[0, s.branch_tick]].reshape(-1, 5) for r in runs],
                                      *[r.trajectories[g][s.ticks] for r in runs for g in GOALS]])
        rng = np.random.default_rng([seed, SURVEY_STREAM])
        result.add(survey_validity(respondents, m.survey_noise_sd, m.acquiescence_sd, rng),
                   latent_need_sd=float(respondents.std(axis=0).mean()),
                   survey_respondents=float(len(respondents)))
        grid = [{"noise_sd": sd, **survey_validity(respondents, sd, m.acquiescence_sd,
                                                   np.random.default_rng([seed, SURVEY_STREAM, k]))}
                for k, sd in enumerate(m.survey_noise_grid)]
        result.add(tables={"survey_noise_grid": grid})
    m_out = result.metrics
    progress(1.0, f"Rater kappa {m_out['rater_kappa']:.3f}, Surveyor r {m_out['surveyor_need_r']:.3f}")
    return result


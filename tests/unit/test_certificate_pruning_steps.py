"""certificate_pruning outside the CGP core: benchmarks, baselines, the config's own validators, and the
contract's steps (data, train, evaluate, claim_metrics, figures) at the smoke profile."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest

from tasks.certificate_pruning import baselines, claim_metrics, data, figures, runs
from tasks.certificate_pruning.config import CONFIG
from tasks.certificate_pruning.evaluate import evaluate
from tasks.certificate_pruning.train import train
from tasks.common.claims import load_claims
from tasks.common.params import ParamsError, params_section, validate_paper_section
from tasks.common.results import SeedResult

TASK_DIR = Path(__file__).resolve().parents[2] / "tasks" / "certificate_pruning"


def fragment() -> dict:
    return params_section("certificate_pruning")


def smoke_config(**overrides):
    section = fragment()["smoke"] | overrides
    return CONFIG.model_validate(section)


# ------------------------------------------------------------------------------------------------
# Benchmarks
# ------------------------------------------------------------------------------------------------

KNOWN_MINIMA = {"branin": 0.397887, "hartmann3": -3.86278, "hartmann6": -3.32237, "rosenbrock4": 0.0,
                "levy5": 0.0, "ackley10": 0.0}


@pytest.mark.parametrize("name", sorted(KNOWN_MINIMA))
def test_test_functions_reach_their_known_minimum(name):
    fn = data.analytic_function(name)
    assert fn.f_best == pytest.approx(KNOWN_MINIMA[name], abs=2e-5)
    # Negative control: a point 30% into the box is not a minimiser.
    off = fn.low + 0.3 * (fn.high - fn.low)
    assert fn.fn(off[None])[0] > KNOWN_MINIMA[name] + 1e-2
    # ... and nothing in 20k uniform points goes below the known minimum.
    rng = np.random.default_rng(0)
    assert fn.fn(fn.low + rng.random((20_000, fn.dim)) * (fn.high - fn.low)).min() >= KNOWN_MINIMA[name] - 1e-6


def test_branin_other_minimisers_and_rescaling():
    np.testing.assert_allclose(data.branin(np.array([[-np.pi, 12.275], [9.42478, 2.475]])), 0.397887, atol=1e-5)
    rows = data.benchmark_rows(["branin", "needle2d"], seed=0, needle_width=0.08, lipschitz_samples=5000,
                               lipschitz_safety=1.2, svm_table=None)
    benches = {row["name"]: data.benchmark_from_row(row, None) for row in rows.to_dicts()}
    for bench in benches.values():
        assert bench.regret(bench.x_star) == pytest.approx(0.0, abs=1e-9)
        assert bench.value(np.random.default_rng(1).random((1000, 2))).max() <= 1.0 + 1e-9
    # Needle: L = 1 / width exactly inside the cone, times the safety factor.
    assert benches["needle2d"].lipschitz == pytest.approx(1.2 / 0.08, rel=1e-4)
    lipschitz = benches["branin"].lipschitz
    assert lipschitz > 1.0 and lipschitz < 20.0


def test_lipschitz_estimate_is_exact_on_a_linear_function_and_fails_for_a_tiny_sample():
    linear = lambda u: u @ np.array([3.0, 4.0])
    assert data.estimate_lipschitz(linear, 2, 100, 1.0, np.random.default_rng(0)) == pytest.approx(5.0, rel=1e-6)
    # Negative control: a 10-point sample almost always misses a narrow needle and reports L = 0.
    needle = data.needle_value(np.array([0.5, 0.5]), 0.02)
    assert data.estimate_lipschitz(needle, 2, 10, 1.2, np.random.default_rng(0)) == 0.0


def test_svm_table_and_surface():
    table = data.svm_accuracy_table(grid_size=3, n_samples=150, folds=2, log10_c=(-1.0, 2.0),
                                    log10_gamma=(-3.0, -1.0))
    assert table.height == 9 and table["accuracy"].is_between(0.0, 1.0).all()
    value, x_star = data.svm_surface(table)
    assert value(x_star[None])[0] == pytest.approx(1.0)
    corners = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=float)
    assert value(corners).min() >= 0.0 and value(np.array([[0.5, 0.5]]))[0] <= 1.0


def test_function_names():
    assert data.function_dim("ackley60") == 60 and data.function_dim("svm") == 2
    for bad in ("ackley1", "sphere3", "levy0"):
        with pytest.raises(ValueError, match="unknown benchmark"):
            data.function_dim(bad)


# ------------------------------------------------------------------------------------------------
# Baselines
# ------------------------------------------------------------------------------------------------


def tent2d(x: np.ndarray) -> np.ndarray:
    return 1.0 - 2.0 * np.linalg.norm(np.atleast_2d(x) - np.array([0.3, 0.7]), axis=1)


def noise_free_regret(optimizer, steps: int) -> float:
    for _ in range(steps):
        x = optimizer.ask()
        optimizer.tell(x, float(tent2d(x)[0]))
    return 1.0 - tent2d(optimizer.recommend())[0]


def test_hoo_cells_split_the_longest_side_at_the_midpoint():
    hoo = baselines.HOO(2, lipschitz=2.0, noise_sd=0.0, seed=0)
    np.testing.assert_allclose(hoo.ask(), [0.5, 0.5])
    hoo.tell(np.array([0.5, 0.5]), 0.0)
    low, high = hoo._child_cell(0, 0)
    np.testing.assert_allclose(low, [0, 0])
    np.testing.assert_allclose(high, [0.5, 1.0])
    low, high = hoo._child_cell(0, 1)
    np.testing.assert_allclose(low, [0.5, 0])


@pytest.mark.parametrize("make", [
    lambda: baselines.HOO(2, 2.0, 0.0, seed=0),
    lambda: baselines.Zooming(2, 2.0, 0.05, horizon=150, seed=0, pool_size=1024),
    lambda: baselines.GPUCB(2, 0.01, seed=0, pool_size=512, candidates=256, refit_growth=1.5),
], ids=["hoo", "zooming", "gp_ucb"])
def test_baselines_find_the_tent_peak(make):
    assert noise_free_regret(make(), 120) < 0.1


def test_hoo_b_values_exact_on_a_two_node_tree():
    """U = mean + sigma sqrt(2 log n / T) + L diam; B = min(U, max B(children)), missing child = +inf."""
    hoo = baselines.HOO(2, lipschitz=2.0, noise_sd=0.1, seed=0)
    hoo.tell(hoo.ask(), 0.5)  # root, centre (0.5, 0.5)
    x = hoo.ask()  # a child of the root (both missing: random side)
    hoo.tell(x, 0.1)
    b = hoo._b_values()
    bonus = lambda count: 0.1 * math.sqrt(2 * math.log(2) / count)
    child_u = 0.1 + bonus(1) + 2.0 * math.sqrt(0.5**2 + 1.0)
    root_u = 0.3 + bonus(2) + 2.0 * math.sqrt(2.0)
    assert b[1] == pytest.approx(child_u)  # its children are missing: B = U
    assert b[0] == pytest.approx(root_u)  # one root child is missing (B = inf), so B = U
    # Negative control: without the L diam term the child's U would be far smaller.
    assert 0.1 + bonus(1) < child_u - 2.0


def test_zooming_activates_uncovered_points_then_replays_arms():
    zoom = baselines.Zooming(2, lipschitz=2.0, noise_sd=0.05, horizon=100, seed=0, pool_size=256)
    first = zoom.ask()
    np.testing.assert_array_equal(first, zoom.pool[0])
    zoom.tell(first, float(tent2d(first)[0]))
    second = zoom.ask()
    uncovered = 2.0 * np.linalg.norm(zoom.pool - first, axis=1) > zoom.radii()[0]
    np.testing.assert_array_equal(second, zoom.pool[int(np.argmax(uncovered))])
    zoom.tell(second, float(tent2d(second)[0]))
    for _ in range(98):
        x = zoom.ask()
        zoom.tell(x, float(tent2d(x)[0]))
    assert zoom.samples.size < zoom.samples.total == 100  # some arms were played again
    regret = 1.0 - tent2d(zoom.recommend())[0]
    assert regret < 0.1


def test_direct_respects_the_budget_and_random_search_is_seeded():
    history = baselines.run_direct(lambda x: float(tent2d(x)[0]), 2, budget=60)
    assert len(history) == 60 and 1.0 - tent2d(history[-1])[0] < 0.1
    a, b = baselines.RandomSearch(3, seed=4), baselines.RandomSearch(3, seed=4)
    np.testing.assert_array_equal(a.ask(), b.ask())


# ------------------------------------------------------------------------------------------------
# Params fragment and config
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path,value,message", [
    (("cpu", "certificate", "pool_size"), 1000, "certificate_pruning.cpu.certificate.pool_size"),
    (("cpu", "baselines", "methods"), ["hoo", "turbo"], "certificate_pruning.cpu.baselines.methods"),
    (("cpu", "functions"), ["needle2d", "sphere2"], "certificate_pruning.cpu.functions"),
])
def test_the_configs_own_validators_name_the_key(path, value, message):
    """The paper's validators (power-of-two pool, known baselines and benchmarks); the generic checks
    (every profile validates, a bad number or an unknown key names its key) are tests/unit/test_paper_contracts.py."""
    section = copy.deepcopy(fragment())
    node = section
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ParamsError, match=message.replace(".", r"\.")):
        validate_paper_section("certificate_pruning", section)


def test_config_cross_checks():
    with pytest.raises(ValueError, match="svm section is required"):
        smoke_config(functions=["needle2d", "svm"])
    with pytest.raises(ValueError, match="needle2d"):
        smoke_config(functions=["branin"])


# ------------------------------------------------------------------------------------------------
# The contract's steps at the smoke profile, and the figures
# ------------------------------------------------------------------------------------------------


def run_steps(cfg, seed: int, data_dir: Path, model_dir: Path) -> SeedResult:
    """train -> evaluate -> claim_metrics, merged as the flow merges them (tasks/common/paper_flow.py)."""
    result = train(cfg, seed, data_dir, model_dir).merged(evaluate(cfg, seed, data_dir, model_dir))
    return result.add(claim_metrics.claim_metrics(cfg, result))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    cfg = smoke_config()
    root = tmp_path_factory.mktemp("cp")
    written = data.write_data(cfg, (0, 1), root / "data")
    results = [run_steps(cfg, seed, root / "data", root / "models" / f"seed{seed}") for seed in (0, 1)]
    return cfg, root, written, results


def test_write_data_files(smoke_run):
    _, root, written, _ = smoke_run
    assert sorted(p.name for p in written) == ["benchmarks_seed0.parquet", "benchmarks_seed1.parquet",
                                               "manifest.json"]
    assert not [p for p in (root / "data").iterdir() if p.name.endswith(".partial")]


def claim_metric_names(claim) -> list[str]:
    """Every metric a claim reads: its own, its counts, and its preconditions' metrics and counts."""
    names = []
    for measured in [claim, *claim.preconditions]:
        if measured.metric is not None:
            names.append(measured.metric)
        if measured.counts is not None:
            names += [measured.counts.successes, measured.counts.trials]
    return names


# A rate over conditioned runs is NaN when its seed counted none; these are the only metrics allowed to be NaN.
ZERO_TRIAL_RATES = {"c1_conditional_coverage_rate": "c1_conditional_runs",
                    "c3_adaptive_conditional_coverage": "c3_adaptive_conditional_runs",
                    "c3_adaptive_long_window_rate": "c3_adaptive_conditional_runs",
                    # the tight test bed's stopping statistics are NaN when no run stopped (issue 18)
                    "tight_valid_stop_rate": "c9b_stopped_runs", "tight_median_stop_time": "c9b_stopped_runs",
                    "tight_log10_tightness_at_stop": "c9b_stopped_runs",
                    "tight_pool_false_stop_rate": "tight_pool_stopped_runs"}


def test_train_writes_nothing_and_returns_an_empty_result(tmp_path):
    result = train(smoke_config(), 3, tmp_path / "data", tmp_path / "seed3")
    assert result == SeedResult(3)
    assert not (tmp_path / "seed3").exists()


def test_the_steps_return_every_claim_metric_of_its_profile(smoke_run):
    cfg, root, _, results = smoke_run
    claims = load_claims(TASK_DIR / "claims.yaml")
    for result in results:
        assert isinstance(result, SeedResult)
        for claim in claims:
            if "smoke" in claim.profiles:
                for name in claim_metric_names(claim):
                    assert name in result.metrics, (claim.id, name)
        assert all(isinstance(v, float) for v in result.metrics.values())
        # Only a conditional rate whose seed counted no run is NaN (smoke's T = 40 prunes nothing).
        not_finite = {k for k, v in result.metrics.items() if not math.isfinite(v)}
        assert not_finite <= set(ZERO_TRIAL_RATES), not_finite
        for name in not_finite:
            assert result.metrics[ZERO_TRIAL_RATES[name]] == 0.0, name
    assert not (root / "models").exists()  # nothing trained, nothing saved
    m = results[0].metrics
    assert m["c1_coverage_rate"] == 1.0 and m["c1_covered_runs"] == m["c1_runs"] == 2.0  # needle2d, branin
    assert m["c2_volume_max_increase"] == 0.0


def test_rates_are_their_counts_over_trials(smoke_run):
    """Every per-seed rate a binomial claim reads equals successes / trials, and the counts are integers."""
    _, _, _, results = smoke_run
    for claim in load_claims(TASK_DIR / "claims.yaml"):
        for measured in [claim, *claim.preconditions]:
            if measured.counts is None or "smoke" not in claim.profiles:
                continue
            for result in results:
                m = result.metrics
                k, n = m[measured.counts.successes], m[measured.counts.trials]
                assert k == round(k) and n == round(n) and 0 <= k <= n, claim.id
                if n == 0:  # a conditional rate with no counted run on this seed
                    assert math.isnan(m[measured.metric]) and measured.metric in ZERO_TRIAL_RATES, claim.id
                else:
                    assert m[measured.metric] == pytest.approx(k / n), claim.id


def test_precondition_counts_follow_the_traces(smoke_run):
    """The pruning and informativeness counts (reported), C1's conditional counts, C3a's window and C7's
    zero-radius control, recounted from the per-step curves and the repeated runs' table."""
    cfg, _, _, results = smoke_run
    pruned_volume = claim_metrics.PRUNED_VOLUME
    for result in results:
        m, curves = result.metrics, result.curves
        synthetic = [f for f in cfg.functions if f != "svm"]
        assert m["c1_pruned_runs"] == sum(curves[f"volume_{f}"][-1] <= pruned_volume for f in synthetic)
        assert m["c7_informative_runs"] == sum(curves[f"gap_{f}"][-1] < claim_metrics.INFORMATIVE_GAP
                                               for f in cfg.functions)
        assert m["c7_bounded_runs"] == sum(
            all(g >= r - 1e-12 for g, r in zip(curves[f"gap_{f}"], curves[f"regret_{f}_cgp"])) for f in cfg.functions)
        # C1 over the runs that pruned: the synthetic functions' runs and the repeated Needle-2D runs.
        repeated = result.tables["repeated_needle_runs"]
        assert len(repeated) == m["c1_repeated_runs"] == cfg.negative_control.runs
        runs_ = [(min(curves[f"margin_{f}"]), curves[f"volume_{f}"][-1]) for f in synthetic]
        runs_ += [(min(r["margin"]), r["final_volume"]) for r in repeated]
        assert all(len(r["margin"]) == cfg.budget.low_dim for r in repeated)
        assert m["c1_conditional_runs"] == sum(v <= pruned_volume or low < 0 for low, v in runs_)
        assert m["c1_conditional_covered_runs"] == sum(v <= pruned_volume and low >= 0 for low, v in runs_)
        # C3a's window: from the last doubling (included) to T.
        rows = {row["function"]: row for row in result.tables["benchmarks"]}
        windows = [len(curves[f"adaptive_margin_{f}"]) - (rows[f]["adaptive_doubling_steps"] or [1])[-1] + 1
                   for f in synthetic]
        assert m["c3_adaptive_min_window"] == min(windows) >= 1
        # C7's control: runs where eps_t of the zero-radius CGP fell below the regret of its recommendation.
        assert m["c7_zero_radius_runs"] == len(cfg.functions)
        assert m["c7_zero_radius_violated_runs"] == sum(
            any(g < r - 1e-12 for g, r in zip(curves[f"zero_radius_gap_{f}"], curves[f"zero_radius_regret_{f}"]))
            for f in cfg.functions)


def test_every_claim_metric_is_produced_by_a_config_with_every_section(tmp_path):
    """A tiny config with svm, trust_region and hybrid produces every metric that claims.yaml names."""
    cfg = smoke_config(functions=["needle2d", "branin", "svm"], budget={"low_dim": 20, "high_dim": 20},
                       svm={"grid_size": 3, "n_samples": 120, "folds": 2, "log10_c": [-1, 2],
                            "log10_gamma": [-3, -1]},
                       trust_region={"functions": ["ackley20"], "budget": 20, "local_points": 16},
                       hybrid={"local_radius": 0.3, "check_every": 5},
                       negative_control={"runs": 1, "noise_sd": 0.1, "budget": 10})
    data.write_data(cfg, (0,), tmp_path / "data")
    result = run_steps(cfg, 0, tmp_path / "data", tmp_path / "models" / "seed0")
    for claim in load_claims(TASK_DIR / "claims.yaml"):
        for name in claim_metric_names(claim):
            assert name in result.metrics, (claim.id, name)
    m = result.metrics
    for rate, k, n in [("c4_tr_win_rate_vs_random", "c4_tr_wins_vs_random", "c4_tr_runs"),
                       ("c5_hybrid_win_rate_vs_cgp", "c5_hybrid_wins_vs_cgp", "c5_hybrid_runs"),
                       ("c1_zero_radius_failure_rate", "c1_zero_radius_failures", "c1_zero_radius_runs")]:
        assert m[rate] == pytest.approx(m[k] / m[n])
    assert m["c4_tr_runs"] == 1.0 and m["c5_hybrid_runs"] == 3.0 and m["c1_zero_radius_runs"] == 1.0


def test_the_steps_are_deterministic(smoke_run):
    cfg, root, _, results = smoke_run
    again = run_steps(cfg, 0, root / "data", root / "models" / "seed0")
    strip = lambda m: {k: v for k, v in m.items() if not k.startswith("seconds_")}
    assert strip(again.metrics) == strip(results[0].metrics)
    assert again.curves == results[0].curves
    assert strip(results[1].metrics) != strip(results[0].metrics)


def test_evaluate_rejects_data_written_for_another_config(smoke_run):
    cfg, root, _, _ = smoke_run
    other = cfg.model_copy(update={"needle_width": 0.1})
    with pytest.raises(ValueError, match=r"certificate_pruning\.needle_width"):
        evaluate(other, 0, root / "data", root / "models" / "seed0")
    with pytest.raises(FileNotFoundError, match="seed 5"):
        evaluate(cfg, 5, root / "data", root / "models" / "seed5")
    with pytest.raises(FileNotFoundError, match="data phase"):
        evaluate(cfg, 0, root / "missing", root / "models" / "seed0")


def test_claim_metrics_are_derived_from_the_measurements(smoke_run):
    """claim_metrics reads the result it is given: x* pruned at the last step of Needle-2D's margin trace
    (a copy of seed 0's result) costs C1 one covered run; a zero-radius run marked covered removes a
    failure. The evaluation's own names are never returned again."""
    cfg, _, _, results = smoke_run
    original = results[0]
    measured = SeedResult(0).add({k: v for k, v in original.metrics.items() if k.startswith(("regret_", "lipschitz_"))},
                                 curves=original.curves, tables=original.tables)
    derived = claim_metrics.claim_metrics(cfg, measured)
    assert not set(derived) & set(measured.metrics)
    assert derived == {k: original.metrics[k] for k in derived}
    broken = SeedResult(0).add(measured.metrics, tables=measured.tables, curves={
        **measured.curves, "margin_needle2d": [*measured.curves["margin_needle2d"][:-1], -1.0]})
    assert claim_metrics.claim_metrics(cfg, broken)["c1_covered_runs"] == derived["c1_covered_runs"] - 1
    rows = measured.tables["zero_radius_runs"]
    assert derived["c1_zero_radius_failures"] == sum(not r["covered"] for r in rows)
    assert derived["c1_zero_radius_runs"] == cfg.negative_control.runs == len(rows)
    # A repeated Needle-2D run that loses x* at its last step is counted by C1's conditional rate as a
    # trial and a miss, even though it pruned little (a miss is never conditioned away).
    repeated = [dict(r) for r in measured.tables["repeated_needle_runs"]]
    assert repeated[0]["final_volume"] > claim_metrics.PRUNED_VOLUME and min(repeated[0]["margin"]) >= 0
    repeated[0]["margin"] = [*repeated[0]["margin"][:-1], -1.0]
    missed = claim_metrics.claim_metrics(cfg, SeedResult(0).add(measured.metrics, curves=measured.curves,
                                                                tables={**measured.tables,
                                                                        "repeated_needle_runs": repeated}))
    assert missed["c1_conditional_runs"] == derived["c1_conditional_runs"] + 1
    assert missed["c1_conditional_covered_runs"] == derived["c1_conditional_covered_runs"]
    # C7's control: a zero-radius gap of 0 at every step breaks the bound wherever the regret is positive.
    assert derived["c7_zero_radius_violated_runs"] < len(cfg.functions)
    zero_gap = {f"zero_radius_gap_{f}": [0.0] * len(measured.curves[f"zero_radius_gap_{f}"]) for f in cfg.functions}
    broken_gap = claim_metrics.claim_metrics(cfg, SeedResult(0).add(
        measured.metrics, tables=measured.tables, curves={**measured.curves, **zero_gap}))
    assert broken_gap["c7_zero_radius_violated_runs"] == len(cfg.functions)


def test_claim_metric_helpers():
    assert runs.covered_throughout([0.1, 0.0, 0.2])
    assert not runs.covered_throughout([0.1, -0.01, 0.2])
    assert runs.covered_throughout([0.1, -0.01, 0.2], 3)  # from step 3 (1-based, inclusive) on
    assert not runs.covered_throughout([0.1, -0.01, 0.2], 2)
    volume = 1.0 / np.arange(1, 101) ** 0.5
    volume[:9] = 1.0
    assert claim_metrics.loglog_slope(volume) == pytest.approx(-0.5, abs=1e-9)
    assert claim_metrics.loglog_slope(np.ones(50)) == 0.0
    assert runs.checkpoints(100, 4) == [25, 50, 75, 100]


def test_conditional_counts_drop_only_covered_runs_that_pruned_little():
    """(covered, pruned) per run: a run counts when it pruned or missed; a success when it pruned and covered."""
    covered = [True, True, False, False]
    pruned = [True, False, True, False]
    assert claim_metrics.conditional_counts(covered, pruned) == (1, 3)
    # The conditional rate never exceeds the unconditional one (only covered runs are dropped) ...
    k, n = claim_metrics.conditional_counts(covered, pruned)
    assert k / n <= sum(covered) / len(covered)
    # ... and nothing pruned and nothing missed leaves no trial (the rate is NaN, not a vacuous 1).
    assert claim_metrics.conditional_counts([True, True], [False, False]) == (0, 0)
    assert math.isnan(claim_metrics.rate(0, 0))


def test_coverage_window_runs_from_the_last_doubling_to_the_end():
    margins = [0.1] * 10
    assert claim_metrics.coverage_window(margins, []) == 10
    assert claim_metrics.coverage_window(margins, [3, 7]) == 4
    assert claim_metrics.coverage_window(margins, [10]) == 1  # a doubling at T: a one-step window


def test_the_controls_use_their_own_settings_and_streams(monkeypatch):
    """C7's control is CGP with c_i = 0 at the main noise and the known L; the repeated Needle-2D runs are
    CGP with the radius at the main noise and budget; each run on its own streams."""
    cfg = smoke_config(negative_control={"runs": 2, "noise_sd": 0.1, "budget": 10},
                       budget={"low_dim": 12, "high_dim": 12})
    rows = data.benchmark_rows(["needle2d"], seed=0, needle_width=0.08, lipschitz_samples=2000,
                               lipschitz_safety=1.2, svm_table=None)
    needle = data.benchmark_from_row(rows.to_dicts()[0], None)
    built = []
    original_init = runs.method.CertificateGuidedPruning.__init__

    def recording_init(self, dim, settings, seed):
        built.append((settings, seed))
        original_init(self, dim, settings, seed)

    monkeypatch.setattr(runs.method.CertificateGuidedPruning, "__init__", recording_init)
    zero = runs.run_zero_radius_cgp(cfg, needle, 0, 0)
    main = runs.run_cgp(cfg, needle, 0, 0)["cgp"]
    repeated = runs.repeated_needle_runs(cfg, needle, 0)
    (zero_settings, zero_seed), (main_settings, main_seed), *repeated_built = built
    assert zero_settings.radius_scale == 0.0 and main_settings.radius_scale == 1.0
    assert zero_settings.noise_sd == main_settings.noise_sd == cfg.noise_sd
    assert zero_settings.lipschitz == main_settings.lipschitz == needle.lipschitz
    assert [s.radius_scale for s, _ in repeated_built] == [1.0, 1.0]
    assert all(s.noise_sd == cfg.noise_sd for s, _ in repeated_built)
    assert len({zero_seed, main_seed, *(seed for _, seed in repeated_built)}) == 4  # own optimiser streams
    assert len(zero.gap) == len(main.gap) == 12
    assert [r["run"] for r in repeated] == [0, 1] and all(len(r["margin"]) == 12 for r in repeated)
    assert repeated[0]["margin"] != repeated[1]["margin"]


def test_figures_build_from_results(smoke_run, tmp_path):
    cfg, _, _, results = smoke_run
    written = figures.make_figures(cfg, results, tmp_path / "figures", tmp_path / "plots")
    names = sorted(p.name for p in written)
    assert names == sorted(["regret_curves.png", "certificate_traces.png", "volume_loglog_needle2d.png",
                            "active_set_needle2d.png", "active_set_branin.png", "regret_curves.csv",
                            "certificate_traces.csv", "c6_median_final_regret.csv", "tight_certificate_traces.png"])
    for path in written:
        assert path.stat().st_size > 100
    assert (tmp_path / "figures" / "regret_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_c6_cross_seed_medians():
    """Median over seeds of the final regret per (function, method), and CGP's median against each."""
    def seed(regrets):
        return SeedResult(0).add(tables={"regret_curves": [
            {"function": f, "method": meth, "t": t, "regret": r * (t == 2) + 9.0 * (t == 1)}
            for (f, meth), r in regrets.items() for t in (1, 2)]})
    results = [seed({("a", "cgp"): 0.1, ("a", "hoo"): 0.5, ("b", "cgp"): 0.6, ("b", "hoo"): 0.2}),
               seed({("a", "cgp"): 0.3, ("a", "hoo"): 0.1, ("b", "cgp"): 0.8, ("b", "hoo"): 0.4}),
               seed({("a", "cgp"): 0.2, ("a", "hoo"): 0.4, ("b", "cgp"): 0.7, ("b", "hoo"): 0.9})]
    rows = {(r["function"], r["method"]): r for r in figures.median_final_regret_rows(results)}
    assert rows["a", "cgp"]["median_final_regret"] == pytest.approx(0.2)
    assert rows["a", "hoo"]["median_final_regret"] == pytest.approx(0.4)
    assert rows["a", "hoo"]["cgp_median_le"] and not rows["b", "hoo"]["cgp_median_le"]


# ------------------------------------------------------------------------------------------------
# C3a: eventual coverage of CGP-Adaptive (issue 14: the check skipped the doubling step and read an
# empty range as covered when the last doubling was the last step)
# ------------------------------------------------------------------------------------------------


def test_eventual_coverage_checks_the_doubling_step_and_never_an_empty_range():
    """Margins U_t(x*) - l_t after steps 1..3; the step argument is the step of the last doubling.

    The old ``covered_throughout(margins, start)`` sliced ``margins[start:]``: with the last doubling at
    step 3 = T it read ``[]`` and said covered although x* was pruned at step 3, and with the doubling at
    step 2 it read only step 3 and missed the pruning at step 2. Both calls return True on the old code."""
    pruned_at_the_last_step = [0.1, 0.1, -0.5]
    assert not runs.covered_throughout(pruned_at_the_last_step, 3)
    pruned_at_the_doubling_step = [0.1, -0.5, 0.2]
    assert not runs.covered_throughout(pruned_at_the_doubling_step, 2)
    assert not claim_metrics.eventual_coverage(pruned_at_the_last_step, [1, 3])
    assert not claim_metrics.eventual_coverage(pruned_at_the_doubling_step, [2])
    assert claim_metrics.eventual_coverage(pruned_at_the_doubling_step, [3])  # pruned before the last doubling
    assert not claim_metrics.eventual_coverage(pruned_at_the_doubling_step, [])  # no doubling: the whole run
    for bad in (0, 4):
        with pytest.raises(ValueError, match="from_step"):
            runs.covered_throughout([0.1, 0.1, 0.1], bad)


def test_doubling_steps_index_the_first_post_doubling_margin():
    """The step CGP-Adaptive records for a doubling is the step t of the trace whose margin already uses the
    final L_hat (the doubling happens inside tell of step t), so eventual coverage must include it."""
    from tasks.certificate_pruning import method

    def tent(x):
        return 1.0 - 2.0 * np.abs(np.atleast_2d(x)[:, 0] - 0.3)

    bench = data.Benchmark("tent", 1, tent, np.array([0.3]), 2.0)
    cgp = method.AdaptiveCGP(1, method.CGPSettings(1.0, noise_sd=0.0, pool_size=256), seed=0, initial_lipschitz=0.25)
    lipschitz_after_step = []
    original_tell = cgp.tell

    def tell(x, y):
        original_tell(x, y)
        lipschitz_after_step.append(cgp.lipschitz)

    cgp.tell = tell
    trace = runs.trace_cgp(cgp, bench, lambda x: float(tent(x)[0]), budget=30, stop_gap=1e-9)
    assert cgp.doubling_steps and len(trace.margin) == 30
    last = cgp.doubling_steps[-1]
    assert lipschitz_after_step[last - 1] == cgp.lipschitz > lipschitz_after_step[last - 2]
    assert claim_metrics.eventual_coverage(trace.margin, cgp.doubling_steps)  # noise-free, final L_hat >= 2

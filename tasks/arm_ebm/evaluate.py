"""Evaluation step of arm_ebm: the exact identities and the bound study (no training), then the models
``train.py`` saved; returns raw measurements only (``claim_metrics.py`` derives the claims' numbers).

- E1 (C1-C2d): the ARM <-> EBM bijection, soft Bellman residual, telescoping, V = log Z, reward shaping and
  the myopic negative control on the enumerable toy, float64; a random tiny GPT-2 through ARM -> EBM -> ARM;
- E4 (C4a, C4d): KL(p_R || p_qhat) of q* + Uniform[-eps, eps] noise against the 2 T eps bound, per (eps, T), one
  toy per T; (C4b) the KL of the first T tokens' laws on one toy (T_max), the same draws for every T;
- E2 (C5a-c, C4c): the trained GPT-2 ARM, the exact ARM and the myopic ARM against p_R;
- E3 (C3a-c): the neural EBM's and the tabular models' NLLs;
- paper profile (C2e): the telescoping identity on a hub LM (``hub.py``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tasks.arm_ebm import data, method
from tasks.arm_ebm.config import ArmEbmConfig, BoundConfig, TabularConfig, ToyConfig
from tasks.arm_ebm.model import load_gpt2_arm, load_neural_ebm, load_tabular, toy_rewards_and_target
from tasks.common import tiny_lm
from tasks.common.results import Progress, SeedResult, no_progress

ARMS = ("ebm", "exact", "gpt2", "myopic")  # columns of the first-token marginals table (figures.py)

# ------------------------------------------------------------------------------------------------
# E1 / C1-C2: exact identities on the enumerable toy
# ------------------------------------------------------------------------------------------------


def exact_identities(toy: ToyConfig, seed: int, energy_from_data: np.ndarray | None = None) -> dict[str, float]:
    """Bijection, soft Bellman residual, telescoping, reward shaping, and the myopic negative control."""
    if energy_from_data is not None:
        data.check_toy_energy(energy_from_data, toy, seed)
    total, target = toy_rewards_and_target(toy, seed)
    energy = method.sequence_energy(total)
    q_star, values = method.soft_bellman(total)
    rng = np.random.default_rng(seed)
    potential = [rng.normal(size=(toy.n_prompts, toy.vocab_size**t)) for t in range(toy.horizon)]
    potential.append(np.zeros((toy.n_prompts, toy.vocab_size**toy.horizon)))
    shaped = method.ebm_log_probs(method.sequence_energy(method.shape_rewards(total, potential)))
    myopic = method.arm_log_probs(method.myopic_arm(total))
    recovered_rewards = method.arm_to_rewards(q_star)
    return {
        "e1_max_logprob_error": float(np.max(np.abs(method.arm_log_probs(q_star) - target))),
        "e1_bellman_residual": method.bellman_residual(q_star, total),
        "e1_telescoping_error": float(np.max(np.abs(
            method.sequence_energy(recovered_rewards) - method.arm_log_probs(q_star) - values[0]))),
        "e1_log_partition_error": float(np.max(np.abs(values[0][:, 0] - method.log_partition(energy)))),
        "e1_shaping_error": float(np.max(np.abs(shaped - target))),
        "e1_myopic_max_logprob_error": float(np.max(np.abs(myopic - target))),
    }


def random_gpt2_roundtrip(toy: ToyConfig, seed: int, n_layer: int = 2, n_head: int = 2, n_embd: int = 32
                          ) -> float:
    """ARM -> EBM -> ARM on a randomly initialised tiny GPT-2 (float64): max log-prob error."""
    config = tiny_lm.tiny_gpt2_config(toy.vocab_size + toy.n_prompts, toy.horizon + 1, n_layer, n_head, n_embd)
    model = tiny_lm.build_tiny_gpt2(config, seed=seed, dtype=torch.float64).eval()
    q = method.prefix_tree_logits(method.gpt2_logits_fn(model), toy.n_prompts, toy.vocab_size, toy.horizon)
    q_back, _ = method.soft_bellman(method.arm_to_rewards(q))
    return float(np.max(np.abs(method.arm_log_probs(q_back) - method.arm_log_probs(q))))


# ------------------------------------------------------------------------------------------------
# E4 / C4: distillation bound (the 2*T*eps bound is the project's derivation)
# ------------------------------------------------------------------------------------------------


def bound_study(bound: BoundConfig, toy: ToyConfig, seed: int) -> tuple[dict[str, float], list[dict]]:
    """KL(p_R || p_qhat) for q* + Uniform[-eps, eps] noise, ``draws`` per (eps, T): the fraction of (draw,
    prompt) KLs above the bound, and one row per (eps, T) with the mean and largest KL and the bound."""
    rng = np.random.default_rng(20_000 + seed)
    rows = []
    violations = total = 0
    for horizon in bound.horizons:
        spec = method.ToyEBMSpec(bound.vocab_size, horizon, bound.n_prompts, toy.a, toy.b, toy.c, seed=seed)
        _, rewards = method.toy_ebm_rewards(spec)
        q_star, _ = method.soft_bellman(rewards)
        target = method.ebm_log_probs(method.sequence_energy(rewards))
        for eps in bound.eps:
            # (draws, prompts): the bound must hold for every prompt of every draw.
            kls = np.array([method.kl_divergence(target, method.arm_log_probs(
                method.perturb_logits(q_star, eps, rng))) for _ in range(bound.draws)])
            limit = method.distillation_bound(horizon, eps)
            violations += int(np.sum(kls > limit))
            total += kls.size
            rows.append({"eps": eps, "T": horizon, "mean_kl": float(kls.mean()), "max_kl": float(kls.max()),
                         "bound": limit})
    return {"e4_bound_violation_rate": violations / total}, rows


def stepwise_kl_tables(target_logp: np.ndarray, vocab_size: int) -> tuple[list[np.ndarray], np.ndarray]:
    """What :func:`fast_stepwise_kl` needs of p_R once: the joint weights p_R(s_t (+) a | x) as (X, V**t, V)
    tables and, per step, mean_x sum p_R(s_t, a) log pi_R(a|s_t) (minus the conditional entropy)."""
    marginals = method.prefix_marginals(target_logp, vocab_size)
    n_prompts = marginals[0].shape[0]
    weights = [marginals[t + 1].reshape(n_prompts, vocab_size**t, vocab_size) for t in range(len(marginals) - 1)]
    log_pi = method.next_token_log_probs(target_logp, vocab_size)
    with np.errstate(invalid="ignore"):
        neg_entropy = np.array([float(np.where(w > 0, w * lp, 0.0).sum(axis=(1, 2)).mean())
                                for w, lp in zip(weights, log_pi)])
    return weights, neg_entropy


def fast_stepwise_kl(weights: list[np.ndarray], neg_entropy: np.ndarray, q: list[np.ndarray]) -> np.ndarray:
    """:func:`method.stepwise_kl` with p_R's part precomputed (:func:`stepwise_kl_tables`): entry t is
    mean_x sum_{s_t, a} p_R(s_t, a | x) (log pi_R(a|s_t) - log softmax q_t(s_t, .)_a) (unit test: equal to
    ``method.stepwise_kl`` to 1e-12)."""
    return np.array([neg_entropy[t] - float((w * method.log_softmax(np.asarray(table, dtype=np.float64), axis=-1))
                                            .sum(axis=(1, 2)).mean()) for t, (w, table) in enumerate(zip(weights, q))])


def fixed_toy_horizon_study(bound: BoundConfig, toy: ToyConfig, seed: int) -> list[dict]:
    """C4b: the distillation error against T on ONE toy, the bound study's toy at horizon T_max =
    max(bound.horizons) (global terms on its step T_max). For q_hat = q* + Uniform[-eps, eps] noise (``draws``
    per eps, own stream 30_000 + seed), KL(p_R^{<=T} || p_qhat^{<=T}) between the laws of the first T tokens,
    for every T of ``bound.horizons``, the same draw for every T. By the chain rule it is the sum of the
    first T per-step expected KLs (:func:`method.stepwise_kl`), each >= 0, so for every draw it cannot
    decrease with T (it grows strictly unless a step's noise is constant over tokens). ``bound_study``
    instead builds one toy per T (its global terms on step T), so its KL need not grow with T.

    One row per (eps, T): mean and largest over draws of the prompt-averaged KL, and the bound 2 T eps."""
    horizon = max(bound.horizons)
    spec = method.ToyEBMSpec(bound.vocab_size, horizon, bound.n_prompts, toy.a, toy.b, toy.c, seed=seed)
    _, rewards = method.toy_ebm_rewards(spec)
    q_star, _ = method.soft_bellman(rewards)
    weights, neg_entropy = stepwise_kl_tables(method.ebm_log_probs(method.sequence_energy(rewards)),
                                              bound.vocab_size)
    rng = np.random.default_rng(30_000 + seed)
    rows = []
    for eps in bound.eps:
        # (draws, T_max): entry [d, T - 1] is draw d's KL of the first T tokens' laws.
        prefix_kl = np.cumsum([fast_stepwise_kl(weights, neg_entropy, method.perturb_logits(q_star, eps, rng))
                               for _ in range(bound.draws)], axis=1)
        for t in bound.horizons:
            kls = prefix_kl[:, t - 1]
            rows.append({"eps": eps, "T": t, "mean_kl": float(kls.mean()), "max_kl": float(kls.max()),
                         "bound": method.distillation_bound(t, eps)})
    return rows


def shift_invariant_logit_error(q_hat: list[np.ndarray], q_star: list[np.ndarray]) -> float:
    """eps_eff = max_s min_c max_a |q_hat(s,a) - q*(s,a) - c| = max_s range_a(q_hat - q*)/2.

    Logits are defined up to a per-state constant, so the bound's eps is taken after the best shift.
    """
    return float(max(np.max(np.ptp(h - s, axis=-1)) / 2 for h, s in zip(q_hat, q_star)))


# ------------------------------------------------------------------------------------------------
# E2 / C5 (lookahead) and E4's distilled GPT-2
# ------------------------------------------------------------------------------------------------


def entropy_per_sequence(logp: np.ndarray) -> float:
    """H(p) = -sum_y p(y|x) log p(y|x), averaged over prompts: the floor of any model's NLL."""
    return float(-(np.exp(logp) * logp).sum(axis=1).mean())


def evaluate_arms(toy: ToyConfig, seed: int, model: torch.nn.Module) -> tuple[dict[str, float], list[dict]]:
    """KL to p_R and first-token marginals of the exact ARM, the myopic ARM and the trained GPT-2; the
    GPT-2's shift-invariant logit error eps_eff (E4). Returns (metrics, first-token marginals at prompt 0
    as rows {token, ebm, exact, gpt2, myopic})."""
    total, target = toy_rewards_and_target(toy, seed)
    q_star, _ = method.soft_bellman(total)
    arms = {"exact": method.arm_log_probs(q_star), "myopic": method.arm_log_probs(method.myopic_arm(total))}
    # float32 forward passes (the logits are then handled in float64): the KLs measured here are >= 1e-4,
    # far above float32 rounding of the logits (~1e-6); the float64 identities are E1's.
    q_gpt2 = method.prefix_tree_logits(method.gpt2_logits_fn(model), toy.n_prompts, toy.vocab_size, toy.horizon)
    arms["gpt2"] = method.arm_log_probs(q_gpt2)
    steps_kl = method.stepwise_kl(target, q_gpt2)
    kl = {name: float(method.kl_divergence(target, logp).mean()) for name, logp in arms.items()}
    tv = {name: float(method.first_token_tv(target, logp, toy.vocab_size).max()) for name, logp in arms.items()}
    entropy = entropy_per_sequence(target)
    metrics = {
        "e2_kl_exact": kl["exact"], "e2_kl_myopic": kl["myopic"], "e2_kl_gpt2": kl["gpt2"],
        "e2_kl_gpt2_last_step": float(steps_kl[-1]), "e2_kl_gpt2_lookahead": float(steps_kl[:-1].sum()),
        "e2_first_token_tv_gpt2": tv["gpt2"], "e2_first_token_tv_myopic": tv["myopic"],
        "e2_entropy_floor": entropy,
        "e2_gpt2_cross_entropy": entropy + kl["gpt2"],
        "e4_gpt2_logit_error": shift_invariant_logit_error(q_gpt2, q_star),
    }
    marginals = {name: method.first_token_marginal(logp, toy.vocab_size)[0] for name, logp in
                 (arms | {"ebm": target}).items()}
    rows = [{"token": v} | {name: float(marginals[name][v]) for name in ARMS} for v in range(toy.vocab_size)]
    return metrics, rows


# ------------------------------------------------------------------------------------------------
# E3 / C3: supervised equivalence
# ------------------------------------------------------------------------------------------------


def neural_ebm_metrics(cfg: ArmEbmConfig, seed: int, model_dir: Path) -> dict[str, float]:
    """The trained MLP EBM's population cross-entropy H(p_R) + KL(p_R || p_theta) and its KL."""
    toy = cfg.toy
    _, target = toy_rewards_and_target(toy, seed)
    energy_net = load_neural_ebm(model_dir, toy, cfg.neural_ebm.hidden)
    ebm_logp = method.neural_ebm_log_probs(energy_net, toy.n_prompts, toy.vocab_size, toy.horizon)
    ebm_kl = float(method.kl_divergence(target, ebm_logp).mean())
    return {"e3_neural_ebm_cross_entropy": entropy_per_sequence(target) + ebm_kl, "e3_neural_ebm_kl": ebm_kl}


def tabular_metrics(tab: TabularConfig, samples: np.ndarray, model_dir: Path) -> dict[str, float]:
    """Tabular ARM vs tabular EBM on their training samples: largest TV over prompts, each model's NLL and
    the empirical entropy floor (the NLL of the samples' own law, the common minimiser)."""
    q, energy = load_tabular(model_dir)
    arm_logp, ebm_logp = method.arm_log_probs(q), method.ebm_log_probs(energy)
    empirical = method.empirical_log_probs(samples, tab.vocab_size, tab.horizon, tab.n_prompts)
    return {
        "e3_tabular_tv": float(method.total_variation(arm_logp, ebm_logp).max()),
        "e3_tabular_arm_nll": method.empirical_nll(samples, arm_logp, tab.vocab_size),
        "e3_tabular_ebm_nll": method.empirical_nll(samples, ebm_logp, tab.vocab_size),
        "e3_tabular_nll_floor": method.empirical_nll(samples, empirical, tab.vocab_size),
    }


# ------------------------------------------------------------------------------------------------
# One seed
# ------------------------------------------------------------------------------------------------


def evaluate_identities_and_bound(cfg: ArmEbmConfig, seed: int, data_dir: Path, result: SeedResult) -> None:
    """E1 (checks the data phase's toy table against the config first), E4's bound study (one toy per T) and
    its fixed-toy study (one toy, the first T tokens)."""
    with result.stage("e1"):
        result.add(exact_identities(cfg.toy, seed, data.read_toy_energy(data_dir, cfg.toy, seed)),
                   e1_gpt2_roundtrip_error=random_gpt2_roundtrip(cfg.toy, seed))
    with result.stage("e4_bound"):
        bound_metrics, bound_rows = bound_study(cfg.bound, cfg.toy, seed)
    result.add(bound_metrics, tables={"e4_kl_vs_T": bound_rows})
    with result.stage("e4_fixed_toy"):
        fixed_rows = fixed_toy_horizon_study(cfg.bound, cfg.toy, seed)
    result.add(tables={"e4_fixed_toy_kl_vs_T": fixed_rows})


def evaluate_trained(cfg: ArmEbmConfig, seed: int, data_dir: Path, model_dir: Path, result: SeedResult) -> None:
    """E2 on the GPT-2 ARM, then E3 on the neural EBM and the tabular models, where the profile has them."""
    if cfg.gpt2 is not None:
        with result.stage("e2_gpt2_eval"):
            metrics, marginals = evaluate_arms(cfg.toy, seed, load_gpt2_arm(model_dir, cfg.toy, cfg.gpt2))
        result.add(metrics, tables={"first_token_marginals_prompt0": marginals})
        if cfg.neural_ebm is not None:
            with result.stage("e3_neural_eval"):
                result.add(neural_ebm_metrics(cfg, seed, model_dir))
    if cfg.tabular is not None:
        with result.stage("e3_tabular_eval"):
            result.add(tabular_metrics(cfg.tabular, data.read_tabular_samples(data_dir, seed), model_dir))


def evaluate(cfg: ArmEbmConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    """Every measurement of one seed; ``device`` is the hub model's (paper profile)."""
    result = SeedResult(seed)
    evaluate_identities_and_bound(cfg, seed, data_dir, result)
    progress(0.3, f"seed {seed}: E1 and E4 done")
    evaluate_trained(cfg, seed, data_dir, model_dir, result)
    if cfg.hub is not None:
        from tasks.arm_ebm.hub import hub_telescoping

        progress(0.5, f"seed {seed}: telescoping on {cfg.hub.hf_model}")
        with result.stage("hub"):
            result.add(hub_telescoping(cfg.hub, seed, device))
    progress(1.0, f"seed {seed}: evaluated")
    return result

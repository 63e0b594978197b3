"""arm_ebm pieces outside method.py's core identities: the neural EBM, the shift-invariant logit
error, the toy data table, and the tiny GPT-2 helpers they rely on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.arm_ebm import data, experiment, method
from tasks.arm_ebm.config import ArmEbmConfig, BoundConfig, ToyConfig
from tasks.common import tiny_lm


def small_target(seed: int = 0):
    spec = method.ToyEBMSpec(vocab_size=2, horizon=3, n_prompts=2, seed=seed)
    _, total = method.toy_ebm_rewards(spec)
    return method.ebm_log_probs(method.sequence_energy(total))


def test_one_hot_sequences_layout():
    inputs = method.one_hot_sequences(n_prompts=2, vocab_size=3, horizon=2)
    assert inputs.shape == (2 * 9, 2 + 2 * 3)
    # Row 1 * 9 + 5: prompt 1, sequence index 5 = tokens (1, 2) -> [0,1 | 0,1,0 | 0,0,1]
    assert inputs[14].tolist() == [0, 1, 0, 1, 0, 0, 0, 1]


def test_neural_ebm_fits_a_small_target_and_untrained_does_not():
    target = small_target()
    fitted, curve = method.fit_neural_ebm(target, 2, 3, hidden=32, steps=800, lr=1e-2, seed=0)
    assert method.kl_divergence(target, fitted).max() < 1e-3
    assert curve[-1] < curve[0]
    untrained, _ = method.fit_neural_ebm(target, 2, 3, hidden=32, steps=0, lr=1e-2, seed=0)
    assert method.kl_divergence(target, untrained).max() > 0.5


def test_shift_invariant_logit_error_exact_values():
    q_star = [np.zeros((1, 1, 3))]
    # A constant shift costs nothing; a spread of 1.0 costs 0.5 after the best shift.
    assert experiment.shift_invariant_logit_error([q_star[0] + 7.0], q_star) == 0.0
    assert experiment.shift_invariant_logit_error([np.array([[[0.0, 1.0, 0.5]]])], q_star) == 0.5
    # Negative control: without the shift the error of the constant offset would be 7.
    assert np.max(np.abs(q_star[0] + 7.0 - q_star[0])) == 7.0


def test_toy_table_round_trip_and_seed_dependence():
    toy = ToyConfig(vocab_size=3, horizon=3, n_prompts=2)
    frame = data.toy_table(toy, seed=0)
    energy = data.energy_from_table(frame, toy)
    _, total = method.toy_ebm_rewards(data.toy_spec(toy, 0))
    np.testing.assert_array_equal(energy, method.sequence_energy(total))
    assert frame.height == 2 * 27
    assert np.allclose(np.exp(frame["log_prob"].to_numpy()).reshape(2, 27).sum(1), 1.0)
    assert not np.allclose(energy, data.energy_from_table(data.toy_table(toy, seed=1), toy))


def test_exact_identities_reject_stale_data():
    toy = ToyConfig(vocab_size=3, horizon=3, n_prompts=2)
    stale = data.energy_from_table(data.toy_table(toy, seed=1), toy)
    with pytest.raises(ValueError, match="rerun the data phase"):
        experiment.exact_identities(toy, seed=0, energy_from_data=stale)


def test_tiny_lm_sequence_nll_and_atomic_save(tmp_path):
    config = tiny_lm.tiny_gpt2_config(vocab_size=7, n_positions=5, n_layer=1, n_head=2, n_embd=8)
    model = tiny_lm.build_tiny_gpt2(config, seed=3, dtype=torch.float64).eval()
    ids = torch.tensor([[5, 0, 1, 2], [6, 2, 2, 0]])
    logits = model(input_ids=ids).logits[:, :-1, :3]
    manual = -torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1).sum(-1)
    torch.testing.assert_close(tiny_lm.sequence_nll(model, ids, label_vocab=3), manual)
    # Same seed, same weights; another seed differs.
    again = tiny_lm.build_tiny_gpt2(config, seed=3, dtype=torch.float64)
    other = tiny_lm.build_tiny_gpt2(config, seed=4, dtype=torch.float64)
    first_weight = next(iter(model.parameters()))
    assert torch.equal(first_weight, next(iter(again.parameters())))
    assert not torch.equal(first_weight, next(iter(other.parameters())))
    path = tiny_lm.save_model(model, tmp_path / "m")
    loaded = tiny_lm.load_model(path, dtype=torch.float64)
    torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_hub_telescoping_on_a_local_stand_in(tmp_path):
    """The paper profile's loader and identity, on a tiny local model + tokenizer (no network)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tasks.arm_ebm.config import PaperProfileConfig

    vocab = {w: i for i, w in enumerate(["[UNK]", "the", "movie", "was", "good", "bad", "a", "b"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path / "stand-in")
    config = tiny_lm.tiny_gpt2_config(vocab_size=len(vocab), n_positions=16, n_layer=1, n_head=2, n_embd=8)
    tiny_lm.build_tiny_gpt2(config, seed=0).save_pretrained(tmp_path / "stand-in")
    hub = PaperProfileConfig(hf_model=str(tmp_path / "stand-in"), prompts=["the movie was", "a b"],
                             new_tokens=5, samples_per_prompt=2, dtype="float64")
    metrics = experiment.hub_telescoping(hub, seed=0, device="cpu")
    assert metrics["hub_telescoping_error"] < 1e-10
    assert metrics["hub_mean_log_prob"] < 0


def test_horizon_increases_counts_adjacent_pairs():
    rows = [{"eps": e, "T": t, "mean_kl": kl} for e, t, kl in [
        (0.1, 3, 0.30), (0.1, 2, 0.20), (0.1, 4, 0.25),  # 2 -> 3 up, 3 -> 4 down (rows out of order)
        (0.2, 2, 0.50), (0.2, 3, 0.60), (0.2, 4, 0.70)]]
    assert experiment.horizon_increases(rows, [0.1, 0.2]) == (3, 4)
    assert experiment.horizon_increases(rows, [0.2]) == (2, 2)


def test_bound_study_emits_the_c4b_counts():
    bound = BoundConfig(eps=[0.05, 0.2], horizons=[2, 3, 4], draws=5, vocab_size=3, n_prompts=2)
    metrics, rows = experiment.bound_study(bound, ToyConfig(vocab_size=3, horizon=4, n_prompts=2), seed=0)
    assert metrics["e4_T_pairs"] == 4.0 and len(rows) == 6
    assert metrics["e4_T_increase_rate"] == metrics["e4_T_increases"] / 4.0
    assert 0 <= metrics["e4_T_increases"] <= 4


def _gpt2_config(**gpt2):
    base = {"n_layer": 1, "n_head": 2, "n_embd": 16, "steps": 60, "batch_size": 32, "lr": 1e-2,
            "warmup_steps": 5}
    return ArmEbmConfig(toy=ToyConfig(vocab_size=2, horizon=3, n_prompts=2),
                        bound=BoundConfig(eps=[0.1], horizons=[2, 3], draws=1, vocab_size=2, n_prompts=2),
                        gpt2=base | gpt2)


def test_train_gpt2_arm_learns_and_stops_at_the_floor():
    target = small_target()
    cfg = _gpt2_config()
    model, losses, summary = experiment.train_gpt2_arm(cfg, 0, target)
    assert len(losses) == 60 and summary["e2_gpt2_steps"] == 60.0
    q = method.prefix_tree_logits(method.gpt2_logits_fn(model), 2, 2, 3)
    kl = method.kl_divergence(target, method.arm_log_probs(q)).mean()
    untrained = tiny_lm.build_tiny_gpt2(tiny_lm.tiny_gpt2_config(4, 4, 1, 2, 16), seed=0)
    q0 = method.prefix_tree_logits(method.gpt2_logits_fn(untrained), 2, 2, 3)
    assert kl < 0.5 * method.kl_divergence(target, method.arm_log_probs(q0)).mean()
    # The losses estimate H(p_R) + KL: their tail sits near the floor plus the model's KL.
    entropy = experiment.entropy_per_sequence(target)
    assert abs(np.mean(losses[-10:]) - (entropy + kl)) < 0.1
    # Early stop once the running KL estimate is <= stop_kl: a huge stop_kl stops after one window.
    _, losses_stop, summary_stop = experiment.train_gpt2_arm(_gpt2_config(stop_kl=100.0, stop_window=7), 0, target)
    assert len(losses_stop) == 7 and summary_stop["e2_gpt2_steps"] == 7.0
    assert losses_stop == losses[:7]  # same draws and updates up to the stop
    # The init scale is the config's (GPT2Config.initializer_range).
    wide, _, _ = experiment.train_gpt2_arm(_gpt2_config(steps=0, init_std=0.5), 0, target)
    assert wide.config.initializer_range == 0.5
    assert float(wide.transformer.wte.weight.detach().std()) > 0.3

"""coda's early-stopping test bed (issue 18): the early-stopping counter and training loop, the no-ODE ablation
at a matched parameter count and its claim metrics, and claim C3c on the deterministic FLOP count. Each check
has a negative control that breaks the library and shows the same check failing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tasks.coda import claim_metrics as cm
from tasks.coda import data, evaluate, method, model, select_lr, train
from tasks.coda.config import CONFIG, TrainConfig
from tasks.common.params import params_section
from tasks.common.results import SeedResult

# ----------------------------------------------------------------------------------------------------
# Early stopping (README, "Training")
# ----------------------------------------------------------------------------------------------------


def check_epochs_since_improvement() -> None:
    since = method.epochs_since_improvement
    assert since([], 0.02) == 0
    assert since([1.0], 0.02) == 0  # the first epoch always improves
    assert since([1.0, 0.5, 0.6, 0.7], 0.02) == 2  # last improvement at 0.5
    # 0.985 and 0.981 are within 2% of 1.0 (not below 0.98): they do not move the reference, so the slow
    # drift is counted from 1.0 and 0.97 (< 0.98) improves
    assert since([1.0, 0.985, 0.981, 0.97], 0.02) == 0
    assert since([1.0, 0.985, 0.981], 0.02) == 2
    assert since([1.0, 0.99, 0.99, 0.99], 0.0) == 2  # tolerance 0: any strict decrease improves


def test_epochs_since_improvement_exact():
    check_epochs_since_improvement()


def test_epochs_since_improvement_check_fails_when_small_gains_move_the_reference(monkeypatch):
    """Negative control: a counter that re-bases on every lower loss hides a slow drift (0.975 then counts as
    the new reference, so 0.97 is not an improvement)."""

    def rebasing(val_losses, tolerance):
        reference, since = float("inf"), 0
        for loss in val_losses:
            since = 0 if loss < (1 - tolerance) * reference else since + 1
            reference = min(reference, loss)
        return since

    monkeypatch.setattr(method, "epochs_since_improvement", rebasing)
    with pytest.raises(AssertionError):
        check_epochs_since_improvement()


def check_has_converged() -> None:
    rule = TrainConfig(max_epochs=10, patience=2, min_rel_improvement=0.02, batch_size=1, lr=0.1)
    untrained = 3.0  # no initial drop asked (min_initial_drop 0): every best here is below the untrained loss
    assert cm.has_converged([1.0, 0.5, 0.6, 0.7], untrained, rule)
    assert not cm.has_converged([1.0, 0.5, 0.6], untrained, rule)  # one epoch without improvement: patience is 2
    assert not cm.has_converged([3.0, 2.0, 1.0], untrained, rule)  # still improving (stopped by max_epochs)
    assert cm.has_converged([1.0, 0.99, 0.985], untrained, rule)  # within 2% of the best for two epochs


def test_has_converged_is_the_early_stopping_rule():
    check_has_converged()


def test_has_converged_check_fails_when_it_ignores_the_tolerance(monkeypatch):
    """Negative control (review of 2026-12-02, finding 5): a rule that counts only epochs since the lowest loss
    (tolerance ignored) calls the slow drift [1.0, 0.99, 0.985] still improving, so the check fails."""
    monkeypatch.setattr(method, "epochs_since_improvement",
                        lambda losses, tol: len(losses) - 1 - min(range(len(losses)), key=losses.__getitem__))
    with pytest.raises(AssertionError):
        check_has_converged()


def test_patience_must_be_below_max_epochs():
    with pytest.raises(ValueError, match="patience"):
        TrainConfig(max_epochs=5, patience=5, batch_size=1, lr=0.1)


def tiny_split(n: int = 6) -> model.Split:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(n, 3, 2, generator=generator)
    return model.Split(inputs, torch.full((n, 3), 0.1), torch.randn(n, 3, 1, generator=generator), torch.ones(n, 3))


def run_scripted_training(monkeypatch, scripted: list[float], patience: int, min_epochs: int = 1
                          ) -> tuple[list[float], list[torch.Tensor], torch.Tensor]:
    """Train a tiny GRU model while the validation loss follows ``scripted``; returns the validation curve,
    the weight snapshot seen at each validation and the weight kept at the end."""
    snapshots: list[torch.Tensor] = []
    script = iter(scripted)

    def scripted_loss(net, _val):
        snapshots.append(net.head.weight.detach().clone())
        return next(script)

    monkeypatch.setattr(train, "validation_loss", scripted_loss)
    torch.manual_seed(0)
    net = method.SequenceModel([_PassThrough()], torch.nn.Linear(2, 1), "forecast")
    rule = TrainConfig(max_epochs=len(scripted), patience=patience, min_rel_improvement=0.02, min_epochs=min_epochs,
                       batch_size=2, lr=0.1)
    _, val_curve, _ = train.train_model(net, tiny_split(), tiny_split(), rule, rule.max_epochs, seed=0, lr=rule.lr)
    return val_curve, snapshots, net.head.weight.detach().clone()


class _PassThrough(torch.nn.Module):
    def forward(self, inputs: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        return inputs


def test_training_stops_at_the_patience_and_keeps_the_best_weights(monkeypatch):
    val_curve, snapshots, kept = run_scripted_training(monkeypatch, [1.0, 0.5, 0.6, 0.7, 0.1, 0.1], patience=2)
    assert val_curve == [1.0, 0.5, 0.6, 0.7]  # stopped after two epochs without improvement
    assert torch.equal(kept, snapshots[1]) and not torch.equal(kept, snapshots[-1])  # the epoch of 0.5


def test_training_check_fails_when_the_counter_never_fires(monkeypatch):
    """Negative control: with the counter broken (always 0) training runs to max_epochs and keeps 0.1's weights."""
    monkeypatch.setattr(method, "epochs_since_improvement", lambda losses, tolerance: 0)
    val_curve, _, _ = run_scripted_training(monkeypatch, [1.0, 0.5, 0.6, 0.7, 0.1, 0.1], patience=2)
    assert val_curve != [1.0, 0.5, 0.6, 0.7]


# ----------------------------------------------------------------------------------------------------
# A rule a stalled model cannot pass (review of 2026-12-02, finding 2): warm-up, initial drop
# ----------------------------------------------------------------------------------------------------

# the shape of the stalled oscillator runs of the 2026-12-02 test bed: validation loss flat near ln 3 for longer
# than the patience, then (if training goes on) dropping
FLAT_THEN_DROPPING = [1.10, 1.09, 1.10, 1.10, 0.80, 0.50, 0.50, 0.50, 0.50]
STALL_RULE = dict(max_epochs=40, patience=3, min_rel_improvement=0.02, batch_size=1, lr=0.1)


LN3 = math.log(3.0)  # the untrained loss of a 3-class model that predicts uniformly (the oscillator plateau)
# seed 3's occupancy CoDA of the 2026-12-02 runs: best at epoch 1 (0.150), then overfit (training loss -> 0,
# validation loss rising); its untrained validation loss is 0.657 (re-initialised with seed 3)
OVERFIT_AFTER_EPOCH_1 = [0.15, 0.4, 0.8, 1.0, 1.06, 1.06, 1.06]
OVERFIT_UNTRAINED = 0.657


def check_stall_is_not_converged() -> None:
    new_rule = TrainConfig(**STALL_RULE, min_epochs=6, min_initial_drop=0.2)
    stalled = FLAT_THEN_DROPPING[:4]  # where the old rule stopped: 3 epochs without a 2% gain over 1.10
    assert not method.should_stop(stalled, 6, 3, 0.02)  # 4 epochs < the warm-up of 6
    assert method.should_stop(stalled, 1, 3, 0.02)
    assert not cm.left_untrained_plateau(stalled, LN3, 0.2)  # best 1.09 > 0.8 x ln 3 = 0.879
    assert not cm.has_converged(stalled, LN3, new_rule)
    # a stall that outlasts the warm-up still fails: flat for 8 epochs, stopped by the counter
    assert not cm.has_converged([1.10, 1.09, 1.10, 1.10, 1.09, 1.10, 1.10, 1.10], LN3, new_rule)
    assert cm.convergence_parts([1.10, 1.09, 1.10, 1.10, 1.09, 1.10, 1.10, 1.10], LN3, new_rule) == (True, False)
    # learned in epoch 1, then overfit: 0.15 <= 0.8 x 0.657 = 0.526, 7 epochs >= 6, 6 epochs without a gain
    assert cm.left_untrained_plateau(OVERFIT_AFTER_EPOCH_1, OVERFIT_UNTRAINED, 0.2)
    assert cm.has_converged(OVERFIT_AFTER_EPOCH_1, OVERFIT_UNTRAINED, new_rule)
    # the whole curve: left the plateau (0.50 <= 0.879), 9 epochs >= 6, 3 epochs within 2% of 0.50
    assert cm.left_untrained_plateau(FLAT_THEN_DROPPING, LN3, 0.2)
    assert method.should_stop(FLAT_THEN_DROPPING, 6, 3, 0.02)
    assert cm.has_converged(FLAT_THEN_DROPPING, LN3, new_rule)
    assert not cm.has_converged(FLAT_THEN_DROPPING[:8], LN3, new_rule)  # 2 epochs at 0.50 < patience 3
    # the reference is the untrained loss, not epoch 1's: a first epoch worse than the start does not lower the bar
    assert not cm.left_untrained_plateau([1.3, 1.0], 1.0, 0.2)  # 1.0 > 0.8 x 1.0 (epoch 1's 1.3 would pass it)
    # the boundary of the drop: exactly 0.8 x the untrained loss passes, just above fails
    assert cm.left_untrained_plateau([1.2, 0.8], 1.0, 0.2) and not cm.left_untrained_plateau([1.2, 0.8001], 1.0, 0.2)
    assert not cm.left_untrained_plateau([], 1.0, 0.2)


def test_a_stalled_model_is_not_converged_and_a_dropping_one_is():
    check_stall_is_not_converged()


def test_the_old_rule_passes_the_stalled_model():
    """Negative control, by the rule itself: with no warm-up and no initial drop (the 2026-12-02 rule) the curve
    that stopped on its plateau counts as converged."""
    assert cm.has_converged(FLAT_THEN_DROPPING[:4], LN3, TrainConfig(**STALL_RULE))


def test_stall_check_fails_when_the_library_drops_the_warm_up_and_the_initial_drop(monkeypatch):
    """Negative control: the library's rule broken back to the old one (no warm-up, no initial drop)."""
    monkeypatch.setattr(method, "should_stop", lambda losses, min_epochs, patience, tol:
                        method.epochs_since_improvement(losses, tol) >= patience)
    monkeypatch.setattr(cm, "left_untrained_plateau", lambda losses, untrained, drop: bool(losses))
    with pytest.raises(AssertionError):
        check_stall_is_not_converged()


def test_stall_check_fails_when_the_initial_drop_is_measured_from_the_last_epoch(monkeypatch):
    """Negative control: a drop measured against the LAST epoch (min(L) <= 0.8 x L_T) fails the whole
    flat-then-dropping curve (0.50 > 0.8 x 0.50)."""
    monkeypatch.setattr(cm, "left_untrained_plateau", lambda losses, untrained, drop: bool(losses) and
                        min(losses) <= (1 - drop) * losses[-1])
    with pytest.raises(AssertionError):
        check_stall_is_not_converged()


def test_stall_check_fails_when_the_initial_drop_is_measured_from_the_first_epoch(monkeypatch):
    """Negative control (review of the 2026-12-02 second round, finding 1): the 07:04 run's reference, the FIRST
    epoch's loss (``method.left_initial_plateau``), calls the pair that learned in epoch 1 and then overfit not
    converged (0.15 > 0.8 x 0.15), so the check fails."""
    monkeypatch.setattr(cm, "left_untrained_plateau",
                        lambda losses, untrained, drop: method.left_initial_plateau(losses, drop))
    with pytest.raises(AssertionError):
        check_stall_is_not_converged()


def check_rows_carry_their_untrained_reference() -> None:
    rule = TrainConfig(**STALL_RULE, min_epochs=6, min_initial_drop=0.2)
    rows = [{"task": "occupancy", "model": "coda", "layers": 1, "untrained_val_loss": OVERFIT_UNTRAINED},
            {"task": "occupancy", "model": "gru", "layers": 1, "untrained_val_loss": 0.18}]  # 0.15 > 0.144
    result = SeedResult(3).add(curves={f"val_loss_occupancy_{m}_L1": OVERFIT_AFTER_EPOCH_1 for m in ("coda", "gru")},
                               tables={"models": rows})
    coda, gru = cm.with_convergence(result, rule)
    assert (coda["stopped"], coda["left_plateau"], coda["converged"]) == (True, True, True)
    assert (gru["stopped"], gru["left_plateau"], gru["converged"]) == (True, False, False)
    assert coda["val_curve"] == OVERFIT_AFTER_EPOCH_1


def test_with_convergence_reads_each_rows_untrained_loss():
    check_rows_carry_their_untrained_reference()


def test_with_convergence_check_fails_with_the_first_epoch_reference(monkeypatch):
    """Negative control: with the first epoch as the reference both rows fail the drop."""
    monkeypatch.setattr(cm, "left_untrained_plateau",
                        lambda losses, untrained, drop: method.left_initial_plateau(losses, drop))
    with pytest.raises(AssertionError):
        check_rows_carry_their_untrained_reference()


def check_untrained_loss_is_where_training_starts(monkeypatch, tmp_path) -> None:
    """The evaluation's L_0 equals the validation loss of the model train.fit hands to train_model (before any
    step), for every kind, and of the student train.convert_ltc hands to the distillation, at seed 3."""
    cfg = CONFIG.model_validate(params_section("coda")["smoke"])
    task = data.make_task(cfg.data, "lotka_volterra", 3)
    fit_split, val = model.task_splits(task, "cpu")[0], model.split_part(task, "val", "cpu")
    seen: dict[str, float] = {}

    def record_start(net, _fit, val_split, _rule, _max_epochs, _seed, _lr):
        seen["start"] = train.validation_loss(net, val_split)
        return [1.0], [1.0], [0.0]

    def record_student(_teacher, student, *_args):
        seen["student"] = train.validation_loss(student, val)
        return [0.0]

    monkeypatch.setattr(train, "train_model", record_start)
    monkeypatch.setattr(method, "distill_layerwise", record_student)
    monkeypatch.setattr(train, "save_model", lambda *args: None)
    losses = {}
    for kind in ("ltc", "coda", "gru_dense", "gru"):
        train.fit(kind, 1, task, fit_split, val, cfg, 3)
        losses[kind] = evaluate.untrained_validation_loss(kind, 1, task, cfg, 3, "cpu")
        assert losses[kind] == seen["start"], kind
    assert len(set(losses.values())) == 4  # four different models, four different starting losses
    teacher = model.build_model("ltc", 1, task, cfg.model, 3)
    train.convert_ltc(teacher, task, fit_split, val, cfg, 3, tmp_path)
    assert evaluate.untrained_validation_loss("coda_converted", 1, task, cfg, 3, "cpu") == seen["student"]
    assert seen["student"] != losses["coda"]  # the student is drawn with seed + 1


def test_untrained_loss_is_where_training_starts(monkeypatch, tmp_path):
    check_untrained_loss_is_where_training_starts(monkeypatch, tmp_path)


def test_untrained_loss_check_fails_when_the_model_is_drawn_with_another_seed(monkeypatch, tmp_path):
    """Negative control: an untrained model built with seed 0 (as ``model.load_model`` builds its shell) is not
    the one training started from, so the exact check fails."""
    real = evaluate.untrained_model
    monkeypatch.setattr(evaluate, "untrained_model", lambda name, layers, task, cfg, seed:
                        real(name, layers, task, cfg, 0))
    with pytest.raises(AssertionError):
        check_untrained_loss_is_where_training_starts(monkeypatch, tmp_path)


def test_training_with_a_warm_up_goes_past_the_plateau(monkeypatch):
    val_curve, snapshots, kept = run_scripted_training(monkeypatch, FLAT_THEN_DROPPING + [0.1], patience=3,
                                                       min_epochs=6)
    assert val_curve == FLAT_THEN_DROPPING  # not stopped at epoch 4; stopped at 9, 3 epochs after 0.50
    assert torch.equal(kept, snapshots[5])  # the first epoch of 0.50 (later equal losses do not replace it)


def test_training_warm_up_check_fails_without_the_warm_up(monkeypatch):
    """Negative control: the library's stop ignoring min_epochs stops on the plateau, at epoch 4."""
    monkeypatch.setattr(method, "should_stop", lambda losses, min_epochs, patience, tol:
                        method.epochs_since_improvement(losses, tol) >= patience)
    val_curve, _, _ = run_scripted_training(monkeypatch, FLAT_THEN_DROPPING + [0.1], patience=3, min_epochs=6)
    assert val_curve == FLAT_THEN_DROPPING[:4]


def test_min_epochs_must_be_below_max_epochs():
    with pytest.raises(ValueError, match="min_epochs"):
        TrainConfig(max_epochs=5, patience=2, min_epochs=5, batch_size=1, lr=0.1)


def test_lr_by_model_is_per_kind_and_checked():
    rule = TrainConfig(max_epochs=5, patience=2, batch_size=1, lr=0.1, lr_by_model={"ltc": 0.05})
    assert (rule.lr_for("ltc"), rule.lr_for("coda")) == (0.05, 0.1)
    with pytest.raises(ValueError, match="lr_by_model.*unknown"):
        TrainConfig(max_epochs=5, patience=2, batch_size=1, lr=0.1, lr_by_model={"lstm": 0.05})
    with pytest.raises(ValueError, match="lr_by_model"):
        TrainConfig(max_epochs=5, patience=2, batch_size=1, lr=0.1, lr_by_model={"ltc": 0.0})


def check_the_trained_model_uses_its_kinds_lr(monkeypatch) -> None:
    """train.fit hands train_model the kind's lr_by_model entry."""
    seen = {}

    def record(net, fit_split, val, cfg, max_epochs, seed, lr):
        seen["lr"] = lr
        return [1.0], [1.0], [0.0]

    monkeypatch.setattr(train, "train_model", record)
    cfg = CONFIG.model_validate(params_section("coda")["smoke"])
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"lr_by_model": {"ltc": 0.037}})})
    task = data.make_task(cfg.data, "lotka_volterra", 0)
    splits = (model.task_splits(task, "cpu")[0], model.split_part(task, "val", "cpu"))
    train.fit("ltc", 1, task, *splits, cfg, 0)
    assert seen["lr"] == 0.037
    train.fit("gru", 1, task, *splits, cfg, 0)
    assert seen["lr"] == cfg.train.lr


def test_the_trained_model_uses_its_kinds_lr(monkeypatch):
    check_the_trained_model_uses_its_kinds_lr(monkeypatch)


def test_kinds_lr_check_fails_when_lr_for_ignores_the_kind(monkeypatch):
    """Negative control (review of the 2026-12-02 second round, finding 5): an lr_for that returns the shared lr
    for every kind hands the LTC 5e-3, not 0.037."""
    monkeypatch.setattr(TrainConfig, "lr_for", lambda self, kind: self.lr)
    with pytest.raises(AssertionError):
        check_the_trained_model_uses_its_kinds_lr(monkeypatch)


def check_train_model_steps_at_its_lr() -> None:
    """One Adam step (one batch of 2, one epoch) moves every weight by lr x g / (|g| + 1e-8) = lr in size: the
    lr argument (0.037), not the config's (0.1)."""
    torch.manual_seed(0)
    net = method.SequenceModel([_PassThrough()], torch.nn.Linear(2, 1), "forecast")
    before = net.head.weight.detach().clone()
    rule = TrainConfig(max_epochs=2, patience=1, min_rel_improvement=0.02, batch_size=2, lr=0.1)
    train.train_model(net, tiny_split(2), tiny_split(2), rule, 1, seed=0, lr=0.037)
    step = (net.head.weight.detach() - before).abs()
    assert torch.allclose(step, torch.full_like(step, 0.037), rtol=1e-5)


def test_train_model_steps_at_its_lr_argument():
    check_train_model_steps_at_its_lr()


def test_train_model_lr_check_fails_when_it_uses_the_configs_lr(monkeypatch):
    """Negative control (finding 5): a train_model that ignores its lr argument and reads cfg.lr steps by 0.1."""
    real = train.train_model
    monkeypatch.setattr(train, "train_model", lambda net, fit_split, val, cfg, max_epochs, seed, lr:
                        real(net, fit_split, val, cfg, max_epochs, seed, cfg.lr))
    with pytest.raises(AssertionError):
        check_train_model_steps_at_its_lr()


# ----------------------------------------------------------------------------------------------------
# Learning-rate selection on the validation split (README, "Learning rates")
# ----------------------------------------------------------------------------------------------------

# task a on a large loss scale, task b on a small one: lr 0.01 is best on a, 0.02 ten times better on b
SELECTION_ROWS = [{"task": "a", "model": "ltc", "lr": 0.01, "best_val_loss": 1.0},
                  {"task": "a", "model": "ltc", "lr": 0.02, "best_val_loss": 1.5},
                  {"task": "b", "model": "ltc", "lr": 0.01, "best_val_loss": 0.01},
                  {"task": "b", "model": "ltc", "lr": 0.02, "best_val_loss": 0.001},
                  {"task": "a", "model": "coda", "lr": 0.01, "best_val_loss": 2.0},
                  {"task": "a", "model": "coda", "lr": 0.02, "best_val_loss": 1.0},
                  {"task": "b", "model": "coda", "lr": 0.01, "best_val_loss": 0.5},
                  {"task": "b", "model": "coda", "lr": 0.02, "best_val_loss": 1.0}]


def check_choose_lr() -> None:
    chosen = select_lr.choose_lr(SELECTION_ROWS)
    # ltc: 0.01 -> sqrt(1 x 10) = 3.1623; 0.02 -> sqrt(1.5 x 1) = 1.2247 (a raw mean would pick 0.01)
    assert chosen["ltc"]["lr"] == 0.02
    assert chosen["ltc"]["score_by_lr"][0.01] == pytest.approx(10 ** 0.5)
    assert chosen["ltc"]["score_by_lr"][0.02] == pytest.approx(1.5 ** 0.5)
    # coda: both sqrt(2 x 1) = sqrt(2): a tie goes to the smaller lr
    assert chosen["coda"]["score_by_lr"][0.01] == pytest.approx(2 ** 0.5) == chosen["coda"]["score_by_lr"][0.02]
    assert chosen["coda"]["lr"] == 0.01
    with pytest.raises(ValueError, match="not every task"):
        select_lr.choose_lr(SELECTION_ROWS[:3])


def test_choose_lr_exact():
    check_choose_lr()


def test_choose_lr_check_fails_on_the_raw_mean_of_losses(monkeypatch):
    """Negative control: a selection on the raw mean loss (scale-dependent) picks 0.01 for the LTC."""

    def raw_mean(rows):
        out = {}
        for kind in {r["model"] for r in rows}:
            mine = [r for r in rows if r["model"] == kind]
            scores = {lr: sum(r["best_val_loss"] for r in mine if r["lr"] == lr) for lr in {r["lr"] for r in mine}}
            out[kind] = {"lr": min(scores, key=lambda lr: (scores[lr], lr)), "score_by_lr": scores}
        return out

    monkeypatch.setattr(select_lr, "choose_lr", raw_mean)
    with pytest.raises(AssertionError):
        check_choose_lr()


def check_with_lr() -> None:
    cfg = CONFIG.model_validate(params_section("coda")["cpu"])
    run = select_lr.with_lr(cfg, "ltc", 0.037)
    assert run.train.lr_for("ltc") == 0.037
    assert run.train.lr_for("coda") == cfg.train.lr == 0.02  # the other kinds fall back to the shared lr
    assert run.train.model_copy(update={"lr_by_model": {}}) == cfg.train.model_copy(update={"lr_by_model": {}})
    assert (run.data, run.model, run.study) == (cfg.data, cfg.model, cfg.study)


def test_with_lr_sets_one_kinds_lr_only():
    check_with_lr()


def test_with_lr_check_fails_when_it_sets_the_shared_lr(monkeypatch):
    """Negative control: a with_lr that sets the shared lr (every kind) changes CoDA's lr too."""
    monkeypatch.setattr(select_lr, "with_lr", lambda cfg, kind, lr: cfg.model_copy(
        update={"train": cfg.train.model_copy(update={"lr": lr, "lr_by_model": {kind: lr}})}))
    with pytest.raises(AssertionError):
        check_with_lr()


def check_selection_rows(monkeypatch) -> None:
    """selection_rows trains each kind on each task at the lr it is given, and records best loss, epochs and
    convergence against the untrained loss (stubbed: 1.0 for the LTC, 0.4 for the GRU)."""
    cfg = CONFIG.model_validate(params_section("coda")["smoke"])
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"tasks": ["lotka_volterra", "occupancy"]})})
    curves = {"ltc": [0.9, 0.5, 0.5, 0.5], "gru": [0.9, 0.5, 0.6, 0.7]}
    trained = []

    def fake_fit(kind, layers, task, fit_split, val, run_cfg, seed):
        trained.append((task.name, kind, layers, run_cfg.train.lr_for(kind), seed))
        return None, {"val_loss": curves[kind]}, {"best_val_loss": min(curves[kind]), "epochs": len(curves[kind])}

    monkeypatch.setattr(train, "fit", fake_fit)
    monkeypatch.setattr(evaluate, "untrained_validation_loss",
                        lambda kind, layers, task, run_cfg, seed, device: {"ltc": 1.0, "gru": 0.4}[kind])
    rows = select_lr.selection_rows(cfg, 100, 0.037, ["ltc", "gru"])
    assert trained == [(t, k, 1, 0.037, 100) for t in ("lotka_volterra", "occupancy") for k in ("ltc", "gru")]
    # smoke rule: patience 2, no warm-up, no drop asked (best <= the untrained loss): the LTC (0.5 <= 1.0)
    # converged, the GRU (0.5 > 0.4) did not
    assert [(r["task"], r["model"], r["lr"], r["best_val_loss"], r["epochs"], r["converged"]) for r in rows] == [
        ("lotka_volterra", "ltc", 0.037, 0.5, 4, True), ("lotka_volterra", "gru", 0.037, 0.5, 4, False),
        ("occupancy", "ltc", 0.037, 0.5, 4, True), ("occupancy", "gru", 0.037, 0.5, 4, False)]


def test_selection_rows_exact(monkeypatch):
    check_selection_rows(monkeypatch)


def test_selection_rows_check_fails_when_the_lr_is_not_applied(monkeypatch):
    """Negative control: a with_lr that returns the profile unchanged trains at the profile's lr, not 0.037."""
    monkeypatch.setattr(select_lr, "with_lr", lambda cfg, kind, lr: cfg)
    with pytest.raises(AssertionError):
        check_selection_rows(monkeypatch)


LR_SELECTION = Path(__file__).resolve().parents[2] / "reports" / "coda" / "lr_selection.json"


def check_params_lrs_are_the_recorded_choice(lr_by_model: dict, selection: dict) -> None:
    """params.yaml's cpu lr_by_model is the choice recorded in reports/coda/lr_selection.json, and that choice is
    what choose_lr gives on the recorded rows (review of the 2026-12-02 second round, finding 4)."""
    recorded = {kind: choice["lr"] for kind, choice in selection["chosen"].items()}
    assert {kind: choice["lr"] for kind, choice in select_lr.choose_lr(selection["rows"]).items()} == recorded
    assert {kind: float(lr) for kind, lr in lr_by_model.items()} == recorded


def test_params_lrs_are_the_recorded_choice():
    check_params_lrs_are_the_recorded_choice(params_section("coda")["cpu"]["train"]["lr_by_model"],
                                             json.loads(LR_SELECTION.read_text()))


def test_params_lr_check_fails_on_a_perturbed_params_value():
    """Negative control: the LTC's params value set to the grid's 5e-3 no longer matches the record."""
    perturbed = dict(params_section("coda")["cpu"]["train"]["lr_by_model"]) | {"ltc": 5e-3}
    with pytest.raises(AssertionError):
        check_params_lrs_are_the_recorded_choice(perturbed, json.loads(LR_SELECTION.read_text()))


# ----------------------------------------------------------------------------------------------------
# The no-ODE ablation at a matched parameter count (claims C2c, C2d)
# ----------------------------------------------------------------------------------------------------


def check_ablation_parameters() -> None:
    # by hand, in_dim 3, out 32, GRU 16, rank 8: CoDA 3*16*19 + 6*16 + 2*64 + 8*16 + 24*32 + 32 = 2064;
    # GRU + dense of width w: 3w(3 + w) + 6w + 32w + 32 = 3w^2 + 47w + 32: w = 19 gives 2008, w = 20 gives 2172
    assert method.coda_parameters(3, 32, 16, 8) == 2064
    assert method.gru_dense_parameters(3, 32, 19) == 2008
    assert method.matched_ablation_hidden(3, 32, 16, 8) == 19
    for in_dim in (2, 3, 4, 5):  # the tasks' input widths
        coda = method.CodaBlock(in_dim, 32, 16, 8)
        width = method.matched_ablation_hidden(in_dim, 32, 16, 8)
        ablation = method.GruDenseBlock(in_dim, 32, width)
        n_coda, n_ablation = (sum(p.numel() for p in b.parameters()) for b in (coda, ablation))
        assert n_coda == method.coda_parameters(in_dim, 32, 16, 8)
        assert n_ablation == method.gru_dense_parameters(in_dim, 32, width)
        assert abs(n_ablation / n_coda - 1) <= 0.05


def test_ablation_parameters_matched():
    check_ablation_parameters()


def test_ablation_parameter_check_fails_when_the_ablation_keeps_the_coda_gru_width(monkeypatch):
    """Negative control: the ablation built at CoDA's own GRU width (16) misses the ODE's parameters."""
    monkeypatch.setattr(method, "matched_ablation_hidden", lambda in_dim, out_dim, hidden, rank: hidden)
    with pytest.raises(AssertionError):
        check_ablation_parameters()


def check_ablation_block() -> None:
    torch.manual_seed(0)
    block = method.GruDenseBlock(2, 4, 5)
    inputs = torch.randn(3, 6, 2)
    memory, _ = block.gru(inputs)
    expected = memory @ block.readout.weight.T + block.readout.bias
    assert torch.allclose(block(inputs, torch.full((3, 6), 0.1)), expected)
    # the block itself ignores the dt argument (no ODE); Delta still reaches it as the inputs' last feature
    assert torch.equal(block(inputs, torch.full((3, 6), 0.1)), block(inputs, torch.full((3, 6), 0.9)))


def test_ablation_block_is_gru_then_dense_without_the_ode():
    check_ablation_block()


def test_ablation_block_check_fails_when_the_readout_drops_its_bias(monkeypatch):
    """Negative control (finding 5): a GruDenseBlock whose read-out skips the bias breaks the exact forward."""
    def no_bias(self, inputs, dt):
        memory, _ = self.gru(inputs)
        return memory @ self.readout.weight.T

    monkeypatch.setattr(method.GruDenseBlock, "forward", no_bias)
    with pytest.raises(AssertionError):
        check_ablation_block()


def test_model_plan_and_builder_include_the_ablation():
    cfg = CONFIG.model_validate(params_section("coda")["cpu"])
    assert ("lotka_volterra", model.ABLATION, 1) in model.model_plan(cfg)
    no_ablation = cfg.model_copy(update={"study": cfg.study.model_copy(update={"ablation": False})})
    assert all(kind != model.ABLATION for _, kind, _ in model.model_plan(no_ablation))


def _row(task, name, score, *, kind="forecast", params=100, flops=1.0, ms=1.0, curve=(1.0, 0.5, 0.5, 0.5),
         chance=10.0):
    return {"task": task, "kind": kind, "model": name, "layers": 1, "score": score, "parameters": params,
            "train_step_flops": flops, "ms_train_step_paired": ms, "chance_score": chance,
            "stopped": True, "left_plateau": True, "converged": True, "val_curve": list(curve)}


def ablation_config():
    cfg = CONFIG.model_validate(params_section("coda")["smoke"])
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"tasks": ["lotka_volterra", "occupancy"]})})


def test_ablation_metrics_exact():
    cfg = ablation_config()
    coda = {"lotka_volterra": _row("lotka_volterra", "coda", 1.0, params=100, flops=3.0, ms=6.0,
                                   curve=(1.0, 0.6, 0.4, 0.3)),
            "occupancy": _row("occupancy", "coda", 90.0, kind="classify", chance=50.0, params=200, flops=2.0,
                              ms=4.0, curve=(1.0, 0.2, 0.2))}
    ablation = {"lotka_volterra": _row("lotka_volterra", "gru_dense", 1.2, params=104, flops=1.0, ms=1.0,
                                       curve=(1.0, 0.5, 0.4, 0.4)),
                "occupancy": _row("occupancy", "gru_dense", 89.0, kind="classify", chance=50.0, params=190,
                                  flops=1.0, ms=2.0, curve=(1.0, 0.5, 0.3, 0.25))}
    metrics = cm.ablation_metrics(coda, ablation, cfg)
    # lotka_volterra: 1.2 > 1.1 x 1.0, the ODE matters; occupancy: 89 >= 90 - 2, parity
    assert (metrics["ode_matters_count"], metrics["ablation_trials"]) == (1.0, 2.0)
    assert metrics["ode_matters_fraction"] == 0.5
    assert metrics["ablation_parity_count"] == 1.0
    assert metrics["coda_learned_count"] == 2.0 and metrics["ablation_coda_converged_count"] == 2.0
    # the ablation above chance: LV 1.2 vs chance 10 (1.1 x 1.2 < 10: learned); occupancy 89 vs 50 (learned)
    assert metrics["ablation_learned_count"] == 2.0 and metrics["ablation_learned_fraction"] == 1.0
    at_chance = ablation | {"occupancy": ablation["occupancy"] | {"score": 51.0}}  # 50 >= 51 - 2: not learned
    assert cm.ablation_metrics(coda, at_chance, cfg)["ablation_learned_count"] == 1.0
    assert metrics["ablation_parameter_mismatch_max"] == pytest.approx(0.05)  # |190/200 - 1| > |104/100 - 1|
    assert metrics["train_flops_ratio_coda_over_ablation_median"] == pytest.approx(2.5)  # median(3, 2)
    assert metrics["measured_train_time_ratio_coda_over_ablation_median"] == pytest.approx(4.0)  # median(6, 2)
    # matched target: LV max(0.3, 0.4) = 0.4, CoDA reaches it at epoch 3, the ablation at 3: (3 x 3)/(3 x 1) = 3;
    # occupancy max(0.2, 0.25) = 0.25, CoDA at 2, the ablation at 4: (2 x 2)/(4 x 1) = 1; median 2
    assert metrics["flops_to_target_ratio_coda_over_ablation_median"] == pytest.approx(2.0)
    assert cm.epochs_to_target([1.0, 0.5, 0.4], 0.45) == 3 and cm.epochs_to_target([1.0], 0.5) == 0


def test_ablation_metric_fails_when_parity_is_read_the_wrong_way(monkeypatch):
    """Negative control: with CoDA as the candidate and the ablation as the reference (roles swapped), the LV
    pair counts as parity (1.0 <= 1.1 x 1.2), so the exact count above fails."""
    real = cm.parity_metrics
    monkeypatch.setattr(cm, "parity_metrics",
                        lambda pairs, *args: real([(ref, cand) for cand, ref in pairs], *args))
    with pytest.raises(AssertionError):
        test_ablation_metrics_exact()


def test_ablation_learned_check_fails_when_learned_ignores_the_chance_score(monkeypatch):
    """Negative control: a ``learned`` that calls every model learned (ignores the chance score) counts the
    ablation at 51% against a 50% chance as learned, so the exact count above fails."""
    monkeypatch.setattr(cm, "learned", lambda row, study: True)
    with pytest.raises(AssertionError):
        test_ablation_metrics_exact()


# ----------------------------------------------------------------------------------------------------
# Claim C3c on the deterministic FLOP count
# ----------------------------------------------------------------------------------------------------


def _cost(task, name, layers, flops, ms):
    return {"task": task, "model": name, "layers": layers, "train_step_flops": flops, "inference_flops": flops,
            "ms_train_step_paired": ms, "ms_inference_batch_paired": ms}


COSTS = [_cost("lotka_volterra", "ltc", 1, 60.0, 10.0), _cost("lotka_volterra", "coda", 1, 15.0, 2.0),
         _cost("lotka_volterra", "ltc", 2, 120.0, 20.0), _cost("lotka_volterra", "coda", 2, 40.0, 5.0),
         _cost("occupancy", "ltc", 1, 80.0, 8.0), _cost("occupancy", "coda", 1, 10.0, 4.0),
         _cost("occupancy", "ltc", 2, 160.0, 16.0), _cost("occupancy", "coda", 2, 16.0, 4.0)]


def test_epochs_to_target_check_fails_when_off_by_one(monkeypatch):
    """Negative control (finding 5): an epochs_to_target that counts from 0 changes the matched-target ratio
    (LV (2 x 3)/(2 x 1) = 3, occupancy (1 x 2)/(3 x 1) = 2/3, median 1.83), so the exact check fails."""
    monkeypatch.setattr(cm, "epochs_to_target",
                        lambda curve, target: next((i for i, loss in enumerate(curve) if loss <= target), 0))
    with pytest.raises(AssertionError):
        test_ablation_metrics_exact()


def test_depth_speedups_exact():
    metrics = cm.depth_speedups(COSTS, ["lotka_volterra", "occupancy"])
    # FLOPs: LV (120/40)/(60/15) = 3/4 = 0.75; occupancy (160/16)/(80/10) = 10/8 = 1.25; min 0.75
    assert metrics["flops_speedup_2layer_over_1layer_min"] == pytest.approx(0.75)
    # wall-clock: LV (20/5)/(10/2) = 0.8; occupancy (16/4)/(8/4) = 2; min 0.8
    assert metrics["measured_speedup_2layer_over_1layer_min"] == pytest.approx(0.8)


def test_depth_speedup_check_fails_when_the_library_reads_the_depths_swapped(monkeypatch):
    """Negative control in the library (review of 2026-12-02, finding 5): a ``find`` that returns the other
    depth's row inverts the ratio, so the exact check fails."""
    real = cm.find
    monkeypatch.setattr(cm, "find", lambda rows, task, name, layers=1: real(rows, task, name, 3 - layers))
    with pytest.raises(AssertionError):
        test_depth_speedups_exact()


def test_depth_speedup_check_fails_when_the_depths_are_swapped():
    """Negative control: reading the 1-layer rows as 2-layer ones inverts the ratio (LV 4/3)."""
    swapped = [row | {"layers": 3 - row["layers"]} for row in COSTS]
    with pytest.raises(AssertionError):
        assert cm.depth_speedups(swapped, ["lotka_volterra", "occupancy"])[
            "flops_speedup_2layer_over_1layer_min"] == pytest.approx(0.75)


# ----------------------------------------------------------------------------------------------------
# Claim C3c's FLOP arithmetic (evaluate.depth_costs), by hand on a tiny case (review of 2026-12-02, finding 1)
# ----------------------------------------------------------------------------------------------------
B, T, D_IN, U, UNFOLDS, N_OUT = 2, 3, 2, 4, 2, 2  # batch, steps, input width, LTC units, unfolds, outputs


def tiny_task():
    from tasks.coda import data

    n = 2 * B  # B training rows, B test rows
    gen = torch.Generator().manual_seed(0)
    return data.TaskArrays(
        name="tiny", kind="forecast", inputs=torch.randn(n, T, D_IN, generator=gen).numpy(),
        dt=torch.full((n, T), 0.1).numpy(), targets=torch.randn(n, T, N_OUT, generator=gen).numpy(),
        mask=torch.ones(n, T).numpy(), split=__import__("numpy").array(["train"] * B + ["test"] * B),
        n_outputs=N_OUT)


def tiny_config():
    cfg = CONFIG.model_validate(params_section("coda")["smoke"])
    return cfg.model_copy(update={
        "model": cfg.model.model_copy(update={"ltc_units": U, "ode_unfolds": UNFOLDS, "coda_gru_hidden": 3,
                                              "coda_rank": 2}),
        "train": cfg.train.model_copy(update={"batch_size": B}),
        "study": cfg.study.model_copy(update={"timing_batch": B, "timing_repeats": 1})})


def hand_ltc_train_flops(layers: int) -> int:
    """Matrix-product FLOPs of one LTC training step, by hand ((m x k) @ (k x n) = 2mkn forward; backward one
    such product per operand that needs a gradient). Per layer of input width d: the input map (B T x d) @
    (d x 2U): forward, weight gradient, and the input's gradient from layer 2 on (layer 1's input is data);
    T x UNFOLDS synapse products (B x U) @ (U x 2U): forward and weight gradient each, the state's gradient for
    all but the first (its state is the constant zero). Head (B T x U) @ (U x N_OUT): forward and both
    gradients. Elementwise operations (sigmoid, softplus, the division of the unfold) are not counted."""
    total, width = 0, D_IN
    for layer in range(layers):
        input_map = 2 * B * T * width * 2 * U
        total += input_map * (2 + (layer > 0))
        synapse = 2 * B * U * 2 * U
        total += synapse * (2 * T * UNFOLDS + (T * UNFOLDS - 1))
        width = U
    return total + 3 * (2 * B * T * U * N_OUT)


def check_depth_costs_ltc_flops() -> dict:
    from tasks.coda import evaluate

    task, cfg = tiny_task(), tiny_config()
    split = model.task_splits(task, "cpu")
    rows = {seed: evaluate.depth_costs(task, split, cfg, seed) for seed in (0, 1)}
    for seed_rows in rows.values():
        ltc = {r["layers"]: r["train_step_flops"] for r in seed_rows if r["model"] == "ltc"}
        # 1 layer: input map 2*2*3*2*8 = 192 x 2; synapse 2*2*4*8 = 128 x (12 + 5); head 2*2*3*4*2 = 96 x 3
        assert hand_ltc_train_flops(1) == 192 * 2 + 128 * 17 + 96 * 3 == 2848
        assert ltc[1] == 2848
        # 2 layers: + input map of width U 2*2*3*4*8 = 384 x 3 and another 128 x 17
        assert ltc[2] == hand_ltc_train_flops(2) == 2848 + 384 * 3 + 128 * 17 == 6176
    # the LTC's count does not depend on the weights (seed 0 and seed 1 give the same)
    assert [r["train_step_flops"] for r in rows[0] if r["model"] == "ltc"] == \
        [r["train_step_flops"] for r in rows[1] if r["model"] == "ltc"]
    return rows


def test_depth_costs_ltc_flops_exact():
    rows = check_depth_costs_ltc_flops()
    coda = {r["layers"]: r["train_step_flops"] for r in rows[0] if r["model"] == "coda"}
    assert coda[2] > coda[1] > 0  # CoDA's count (ZOH series: weight-dependent squarings) is measured, not pinned


def test_depth_costs_flop_check_fails_when_the_backward_is_not_counted(monkeypatch):
    """Negative control: a training-step counter that misses the backward pass (forward FLOPs only) breaks
    the hand count."""
    monkeypatch.setattr(method, "training_step_flops", lambda m, x, dt, loss_fn: method.forward_flops(m, x, dt))
    with pytest.raises(AssertionError):
        check_depth_costs_ltc_flops()

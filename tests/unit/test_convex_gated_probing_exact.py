"""convex_gated_probing method: exact values of the log-mel front end where test_convex_gated_probing_method.py's
tolerance (atol 1e-5) or inputs (no padding) could not tell a right formula from a wrong one (issue 20, survivors of
the mutation run), each with a negative control that breaks the library."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tasks.convex_gated_probing import method

N_FFT, HOP, N_MELS, RATE = 256, 32, 32, 8000  # 32 mel bands: more than the 30 frames of the padded case


def reference_db(waves: torch.Tensor) -> torch.Tensor:
    """10 log10 of the mel power of a centred Hann STFT, written out (the docstring's pipeline before pad/crop)."""
    spec = torch.stft(waves, n_fft=N_FFT, hop_length=HOP, window=torch.hann_window(N_FFT), return_complex=True,
                      center=True).abs().pow(2)
    return 10.0 * torch.log10((spec.transpose(1, 2) @ method.mel_filterbank(N_FFT, N_MELS, RATE)).clamp_min(1e-10))


def check_front_end_exact() -> None:
    waves = 1e-3 * torch.randn(1, 800, generator=torch.Generator().manual_seed(0))  # quiet: every dB value < 0
    frames = 800 // HOP + 1
    db = reference_db(waves)
    assert float(db.max()) < 0
    # no padding: bit-identical to min-max of 10 log10 (a factor 11 would cancel in the min-max only up to rounding)
    exact = method.log_mel_frontend(waves, RATE, N_FFT, HOP, N_MELS, frames)
    assert torch.equal(exact, method.minmax_per_clip(db))
    # 4 frames short: the padding rows hold the clip's minimum dB, so they map to 0 and leave the real frames as
    # they were (padding with 0 dB, above every real value, would become the maximum instead)
    padded = method.log_mel_frontend(waves, RATE, N_FFT, HOP, N_MELS, frames + 4)
    assert padded.shape == (1, frames + 4, N_MELS)
    assert torch.equal(padded[:, :frames], exact) and torch.equal(padded[:, frames:], torch.zeros(1, 4, N_MELS))


def test_front_end_exact_with_and_without_padding():
    check_front_end_exact()


@pytest.mark.parametrize("broken", ["zero_padding", "scale_11"])
def test_negative_control_broken_front_end_is_caught(monkeypatch, broken):
    def front_end(waves, sample_rate, n_fft, hop, n_mels, n_frames):
        spec = torch.stft(waves, n_fft=n_fft, hop_length=hop, window=torch.hann_window(n_fft), return_complex=True,
                          center=True).abs().pow(2)
        mel = spec.transpose(1, 2) @ method.mel_filterbank(n_fft, n_mels, sample_rate)
        db = (11.0 if broken == "scale_11" else 10.0) * torch.log10(mel.clamp_min(1e-10))
        if db.shape[1] < n_frames:
            fill = 0.0 if broken == "zero_padding" else float(db.min())
            db = F.pad(db, (0, 0, 0, n_frames - db.shape[1]), value=fill)
        return method.minmax_per_clip(db[:, :n_frames])

    monkeypatch.setattr(method, "log_mel_frontend", front_end)
    with pytest.raises(AssertionError):
        check_front_end_exact()


def check_metrics_and_scaling_exact() -> None:
    """AP breaks ties in index order (120 scores on 3 levels: an unstable sort reorders them); the prior entropy in
    float64 for float32 labels and finite for a class that never occurs; min-max per clip for ranges below 1;
    standardising features whose spread is below 1; ProtoBin prototypes start as N(0, 0.02^2)."""
    import numpy as np

    scores = np.array([float(i % 3) for i in range(120)])
    labels = np.array([i % 7 in (0, 3) for i in range(120)])
    ranking = sorted(range(120), key=lambda i: (-scores[i], i))
    hits, precisions = 0, []
    for rank, i in enumerate(ranking, start=1):
        if labels[i]:
            hits += 1
            precisions.append(hits / rank)
    assert method.average_precision(scores, labels) == pytest.approx(sum(precisions) / len(precisions), abs=1e-12)
    prevalence = np.array([0.25, 0.5])
    by_hand = float(np.mean(-prevalence * np.log(prevalence) - (1 - prevalence) * np.log(1 - prevalence)))
    labels32 = np.array([[1, 0], [0, 1], [0, 1], [0, 0]], dtype=np.float32)
    assert method.prior_entropy(labels32) == pytest.approx(by_hand, abs=1e-15)
    never = method.prior_entropy(np.array([[0, 1], [0, 0]]))
    assert never == pytest.approx((0.0 + 1e-12 * (1 - np.log(1e-12)) + math.log(2)) / 2, abs=1e-12)
    clips = torch.tensor([[0.1, 0.3, 0.2], [2.0, 2.25, 2.5]])
    assert torch.allclose(method.minmax_per_clip(clips), torch.tensor([[0.0, 1.0, 0.5], [0.0, 0.5, 1.0]]), atol=1e-6)
    train = torch.tensor([[0.1], [0.3], [0.2]])
    assert torch.allclose(method.standardise(train)[0], torch.tensor([[-1.0], [1.0], [0.0]]), atol=1e-5)
    torch.manual_seed(0)
    prototypes = method.ProtoBinHead(64, 16, 3).prototypes.detach()
    assert 0.018 < float(prototypes.std()) < 0.022


def test_metrics_and_scaling_exact():
    check_metrics_and_scaling_exact()


@pytest.mark.parametrize("broken", ["unstable_ap", "global_min", "eps_one"])
def test_negative_control_metrics_and_scaling(monkeypatch, broken):
    import numpy as np

    if broken == "unstable_ap":
        real = method.average_precision
        monkeypatch.setattr(method, "average_precision", lambda s, y: real(
            np.asarray(s) + 1e-9 * np.random.default_rng(0).random(len(s)), y))
    elif broken == "global_min":
        monkeypatch.setattr(method, "minmax_per_clip", lambda x, eps=1e-8: (x - x.min()) / (
            x.reshape(x.shape[0], -1).amax(dim=1).reshape(-1, 1) - x.min()).clamp_min(eps))
    else:
        monkeypatch.setattr(method, "standardise", lambda train, *others: [
            (t - train.mean(dim=0)) / train.std(dim=0).clamp_min(1.000001) for t in (train, *others)])
    with pytest.raises(AssertionError):
        check_metrics_and_scaling_exact()


# ------------------------------------------------------------------ GeneratorDropout: float64, the boundary u = p

# float64 uniforms of torch.Generator().manual_seed(5); p is the fourth one, so that entry sits exactly on the
# boundary u = p of m = [u >= p] (kept), and entries 1 and 4 (0.2598, 0.2661) are the only ones below it.
DROPOUT_P = 0.31513260814905053


def dropout_float64_case() -> tuple[torch.Tensor, torch.Tensor]:
    dropout = method.GeneratorDropout(DROPOUT_P).train()
    method.attach_dropout_generator(dropout, torch.Generator().manual_seed(5))
    x = torch.arange(1.0, 9.0, dtype=torch.float64)
    expected = torch.tensor([1.0, 0.0, 3.0, 4.0, 0.0, 6.0, 7.0, 8.0], dtype=torch.float64) / (1.0 - DROPOUT_P)
    return dropout(x), expected


def test_generator_dropout_float64_draws_and_the_boundary_is_kept():
    """The uniforms are drawn in x's dtype (float64 here: different draws from float32's, which would keep entries
    0, 2, 3, 4, 7) and an entry with u = p exactly is kept."""
    out, expected = dropout_float64_case()
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected, rtol=1e-15, atol=0.0)


@pytest.mark.parametrize("broken", ["strict", "float32_uniforms"])
def test_negative_control_generator_dropout_boundary_and_dtype(monkeypatch, broken):
    def forward(self, x):
        dtype = torch.float32 if broken == "float32_uniforms" else x.dtype
        uniform = torch.rand(x.shape, generator=self.generator, dtype=dtype)
        keep = uniform > self.p if broken == "strict" else uniform >= self.p
        return x * keep.to(x.dtype) / (1.0 - self.p)

    monkeypatch.setattr(method.GeneratorDropout, "forward", forward)
    with pytest.raises(AssertionError):
        test_generator_dropout_float64_draws_and_the_boundary_is_kept()

"""DiffDT as a pure library (no Prefect, no MLflow, no file layout). [reconstructed]

The paper (Wei, Dan, Wu, ICML 2026, arXiv 2605.09771) gives the method at abstract level only: a generative
model of tokenised healthcare events with ICD-10 Z / V-Y codes as social-determinant (SDoH) tokens, married to
conditioned latent diffusion of multi-organ imaging traits, a geometric diffusion model for the temporal
evolution of brain networks, and simulated interventions. Every equation below is reconstructed from the named
prior work and labelled with it:

- event backbone (Delphi-2M, Shmatko et al. 2025): a GPT over (age, token) pairs whose heads are log-rates
  l_k of competing exponential waiting times; the next event k* after a wait dt has likelihood
  lambda_k* exp(-sum_k lambda_k dt), so the loss is  L = -l_k* + sum_k exp(l_k) dt  (a censored interval
  contributes the survival term only);
- SPD geometry (Arsigny et al. 2006; Pennec et al. 2006): log / exp maps at C1,
  S = logm(C1^-1/2 C2 C1^-1/2),  C2 = C1^1/2 expm(S) C1^1/2 (SPD by construction), the affine-invariant
  distance d(C, D) = ||logm(C^-1/2 D C^-1/2)||_F and the log-Euclidean mean expm(mean logm C);
- conditioned DDPM (Ho et al. 2020; TabDDPM, Kotelnikov et al. 2023) with epsilon-prediction, loss
  E||eps - eps_theta(sqrt(abar_t) z0 + sqrt(1 - abar_t) eps, t, c)||^2, and classifier-free guidance
  (Ho & Salimans 2022) eps_hat = (1 + w) eps_theta(z_t, c) - w eps_theta(z_t, null);
- evaluation: Mann-Whitney AUC, energy distance (Szekely & Rizzo 2013), sign agreement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from transformers import GPT2Config, GPT2Model

# --- event likelihood (Delphi-style competing exponentials) ------------------------------------------------


def event_nll(log_rates: torch.Tensor, target: torch.Tensor, dt: torch.Tensor,
              at_risk: torch.Tensor | None = None) -> torch.Tensor:
    """Per-interval negative log-likelihood of competing exponential waiting times.

    ``log_rates`` (..., K): l_k; ``target`` (...): index k* of the event that ended the interval, or -1 for a
    censored interval (no event: padding, end of follow-up); ``dt`` (...): the interval's length in years;
    ``at_risk`` (..., K) bool: which events can still happen (each disease once). Returns
    -l_k* [if an event] + sum_{k at risk} exp(l_k) dt, elementwise over the leading dimensions.
    """
    rates = torch.exp(log_rates)
    if at_risk is not None:
        rates = rates * at_risk.to(rates.dtype)
    survival = rates.sum(dim=-1) * dt
    is_event = target >= 0
    picked = log_rates.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return survival - torch.where(is_event, picked, torch.zeros_like(picked))


def sinusoidal_age(age: torch.Tensor, dim: int, max_period: float = 365.0) -> torch.Tensor:
    """Continuous-age encoding (Delphi replaces positions by age): [sin(age w_i), cos(age w_i)], with
    w_i = max_period^(-i / (dim/2)) / 1 for i = 0..dim/2-1 (ages in years)."""
    if dim % 2:
        raise ValueError(f"sinusoidal_age: dim must be even (got {dim})")
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=age.dtype, device=age.device) / half)
    angles = age.unsqueeze(-1) * freqs
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


@dataclass(frozen=True)
class Vocabulary:
    """Token ids: 0 padding, 1 no-event, 2 / 3 sex, one sensor token per organ, then the event tokens
    (SDoH codes first, then disease codes with death last). Events are what the heads predict."""

    n_sdoh: int
    n_disease: int
    organs: tuple[str, ...] = ("brain", "heart", "liver", "kidney")

    PAD: int = 0
    NO_EVENT: int = 1
    MALE: int = 2
    FEMALE: int = 3

    @property
    def first_sensor(self) -> int:
        return 4

    def sensor(self, organ: str) -> int:
        return self.first_sensor + self.organs.index(organ)

    @property
    def first_event(self) -> int:
        return self.first_sensor + len(self.organs)

    @property
    def n_events(self) -> int:
        return self.n_sdoh + self.n_disease

    @property
    def size(self) -> int:
        return self.first_event + self.n_events

    def sdoh(self, j: int) -> int:
        return self.first_event + j

    def disease(self, k: int) -> int:
        return self.first_event + self.n_sdoh + k


class EventBackbone(nn.Module):
    """GPT-2 trunk over (age, token) pairs; sensor tokens add a linear projection of an organ's latent.

    Input embedding = token embedding + sinusoidal(age) (+ W_o latent_o at a sensor token of organ o); GPT-2's
    own position table is fed position 0 everywhere, so order enters only through causal attention and age.
    The head maps each hidden state to log-rates of the ``vocab.n_events`` event tokens.
    """

    def __init__(self, vocab: Vocabulary, sensor_dims: dict[str, int], n_layer: int, n_head: int, n_embd: int,
                 n_positions: int):
        super().__init__()
        self.vocab = vocab
        self.n_embd = n_embd
        self.trunk = GPT2Model(GPT2Config(vocab_size=vocab.size, n_positions=n_positions, n_layer=n_layer,
                                          n_head=n_head, n_embd=n_embd, n_inner=4 * n_embd, resid_pdrop=0.0,
                                          embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None,
                                          pad_token_id=None))
        self.token = nn.Embedding(vocab.size, n_embd)
        self.sensor_proj = nn.ModuleDict({o: nn.Linear(d, n_embd) for o, d in sensor_dims.items()})
        self.head = nn.Linear(n_embd, vocab.n_events)

    def embed(self, tokens: torch.Tensor, ages: torch.Tensor,
              sensors: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        x = self.token(tokens) + sinusoidal_age(ages, self.n_embd)
        for organ, latent in (sensors or {}).items():
            if organ in self.sensor_proj:
                here = (tokens == self.vocab.sensor(organ)).unsqueeze(-1).to(x.dtype)
                x = x + here * self.sensor_proj[organ](latent).unsqueeze(1)
        return x

    def hidden(self, tokens: torch.Tensor, ages: torch.Tensor, sensors: dict[str, torch.Tensor] | None = None
               ) -> torch.Tensor:
        mask = (tokens != self.vocab.PAD).long()
        out = self.trunk(inputs_embeds=self.embed(tokens, ages, sensors), attention_mask=mask,
                         position_ids=torch.zeros_like(tokens))
        return out.last_hidden_state

    def forward(self, tokens: torch.Tensor, ages: torch.Tensor, sensors: dict[str, torch.Tensor] | None = None
                ) -> torch.Tensor:
        return self.head(self.hidden(tokens, ages, sensors))


def sequence_targets(tokens: torch.Tensor, ages: torch.Tensor, vocab: Vocabulary
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Targets of every position i for the interval (age_i, age_{i+1}]: event index (or -1 if token i+1 is not
    an event: padding, no-event, sensor), dt = age_{i+1} - age_i, a validity mask (token i+1 exists), and the
    at-risk mask (an event token seen at or before i cannot recur)."""
    nxt = tokens[:, 1:]
    target = torch.where(nxt >= vocab.first_event, nxt - vocab.first_event, torch.full_like(nxt, -1))
    dt = (ages[:, 1:] - ages[:, :-1]).clamp(min=0.0)
    valid = nxt != vocab.PAD
    seen = torch.zeros(tokens.shape[0], tokens.shape[1], vocab.n_events, dtype=torch.bool, device=tokens.device)
    is_event = tokens >= vocab.first_event
    idx = (tokens - vocab.first_event).clamp(min=0)
    seen.scatter_(2, idx.unsqueeze(-1), is_event.unsqueeze(-1))
    at_risk = ~torch.cummax(seen.to(torch.uint8), dim=1).values.bool()
    return target, dt, valid, at_risk[:, :-1]


def backbone_loss(model: EventBackbone, tokens: torch.Tensor, ages: torch.Tensor,
                  sensors: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """Mean event NLL over the valid intervals of a batch (Delphi's objective, censoring included)."""
    target, dt, valid, at_risk = sequence_targets(tokens, ages, model.vocab)
    log_rates = model(tokens, ages, sensors)[:, :-1]
    nll = event_nll(log_rates, target, dt, at_risk)
    return (nll * valid).sum() / valid.sum().clamp(min=1)


def draw_next_event(rates: torch.Tensor, age: torch.Tensor, next_pad_age: torch.Tensor, generator: torch.Generator
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the competing-exponentials sampler: the wait is Exp(sum_k lambda_k) and the event is k with
    probability lambda_k / sum lambda; when the wait passes ``next_pad_age`` a no-event (index -1) is placed there
    instead (the exponential is memoryless, so restarting at the padding age is exact). Returns (event, age)."""
    total = rates.sum(dim=-1)
    u = torch.rand(total.shape, generator=generator, dtype=rates.dtype)
    wait = -torch.log1p(-u) / total.clamp(min=1e-12)
    probs = rates / total.clamp(min=1e-12).unsqueeze(-1)
    event = torch.multinomial(probs.clamp(min=0) + (total <= 0).unsqueeze(-1).to(rates.dtype), 1,
                              generator=generator).squeeze(-1)
    new_age = age + wait
    padded = new_age > next_pad_age
    return torch.where(padded, torch.full_like(event, -1), event), torch.where(padded, next_pad_age, new_age)


@torch.no_grad()
def sample_incidence(model: EventBackbone, tokens: torch.Tensor, ages: torch.Tensor,
                     sensors: dict[str, torch.Tensor] | None, horizon: float, allowed: torch.Tensor, n_steps: int,
                     generator: torch.Generator, pad_origin: float, pad_every: float) -> torch.Tensor:
    """Sample one future per row from right-padded prefixes that end at the start visit (the last real token's
    age) and return which events occur in (start, start + horizon] (N, n_events) bool.

    Competing exponentials (``draw_next_event``) with the rates of the events that are ``allowed`` (e.g. diseases
    and death: the SDoH history is held fixed) and not yet seen; a no-event token is placed at every padding age
    pad_origin + m pad_every, as in training, and at the horizon. The last event index is death, which ends the
    future. Uses GPT-2's key/value cache, so each step costs one token per row.
    """
    vocab = model.vocab
    n = tokens.shape[0]
    rows = torch.arange(n)
    mask = (tokens != vocab.PAD).long()
    last = mask.sum(dim=1) - 1
    _, _, _, at_risk = sequence_targets(torch.cat([tokens, tokens[:, :1]], dim=1),
                                             torch.cat([ages, ages[:, :1]], dim=1), vocab)
    at_risk = at_risk[rows, last] & allowed.unsqueeze(0)
    age = ages[rows, last].to(torch.float64)
    end = age + horizon
    out = model.trunk(inputs_embeds=model.embed(tokens, ages, sensors), attention_mask=mask,
                      position_ids=torch.zeros_like(tokens), use_cache=True)
    cache, hidden = out.cache, out.last_hidden_state[rows, last]
    occurred = torch.zeros(n, vocab.n_events, dtype=torch.bool)
    active = torch.ones(n, dtype=torch.bool)
    death = vocab.n_events - 1
    for _ in range(n_steps):
        rates = torch.exp(model.head(hidden).to(torch.float64)) * at_risk
        next_pad = torch.minimum(pad_origin + pad_every * (torch.floor((age - pad_origin) / pad_every) + 1), end)
        event, new_age = draw_next_event(rates, age, next_pad, generator)
        happened = active & (event >= 0)
        occurred[rows[happened], event[happened]] = True
        at_risk[rows[happened], event[happened]] = False
        active = active & (new_age < end) & ~(happened & (event == death))
        age = torch.where(active | happened, new_age, age)
        if not bool(active.any()):
            break
        token = torch.where(event >= 0, vocab.first_event + event, torch.full_like(event, vocab.NO_EVENT))
        mask = torch.cat([mask, torch.ones(n, 1, dtype=mask.dtype)], dim=1)
        out = model.trunk(inputs_embeds=model.embed(token.unsqueeze(1), age.to(ages.dtype).unsqueeze(1)),
                          attention_mask=mask, position_ids=torch.zeros(n, 1, dtype=torch.long),
                          cache=cache, use_cache=True)
        cache, hidden = out.cache, out.last_hidden_state[:, -1]
    return occurred


# --- SPD geometry --------------------------------------------------------------------------------------------


def _sym_fn(mat: torch.Tensor, fn) -> torch.Tensor:
    """f(M) = U diag(f(eigvals)) U^T for symmetric M (batched)."""
    vals, vecs = torch.linalg.eigh(mat)
    return (vecs * fn(vals).unsqueeze(-2)) @ vecs.transpose(-1, -2)


def sym(mat: torch.Tensor) -> torch.Tensor:
    return 0.5 * (mat + mat.transpose(-1, -2))


def spd_sqrt(mat: torch.Tensor) -> torch.Tensor:
    return _sym_fn(mat, torch.sqrt)


def spd_invsqrt(mat: torch.Tensor) -> torch.Tensor:
    return _sym_fn(mat, torch.rsqrt)


def spd_log(mat: torch.Tensor) -> torch.Tensor:
    return _sym_fn(mat, torch.log)


def sym_exp(mat: torch.Tensor) -> torch.Tensor:
    return _sym_fn(mat, torch.exp)


def tangent_at(base: torch.Tensor, point: torch.Tensor) -> torch.Tensor:
    """Log map in the whitened chart at ``base``: S = logm(B^-1/2 C B^-1/2) (symmetric)."""
    w = spd_invsqrt(base)
    return spd_log(sym(w @ point @ w))


def exp_at(base: torch.Tensor, tangent: torch.Tensor) -> torch.Tensor:
    """Exp map: C = B^1/2 expm(S) B^1/2, SPD for every symmetric S (the inverse of ``tangent_at``)."""
    r = spd_sqrt(base)
    return sym(r @ sym_exp(sym(tangent)) @ r)


def airm_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Affine-invariant Riemannian distance d(A, B) = ||logm(A^-1/2 B A^-1/2)||_F (batched)."""
    return torch.linalg.matrix_norm(tangent_at(a, b), ord="fro")


def log_euclidean_mean(mats: torch.Tensor) -> torch.Tensor:
    """expm(mean_i logm C_i): the closed-form Frechet mean under the log-Euclidean metric."""
    return sym_exp(spd_log(mats).mean(dim=0))


def is_spd(mats: torch.Tensor, tol: float = 0.0) -> torch.Tensor:
    """True where the symmetric part's smallest eigenvalue exceeds ``tol`` (and all entries are finite)."""
    finite = torch.isfinite(mats).flatten(-2).all(dim=-1)
    safe = torch.where(finite.unsqueeze(-1).unsqueeze(-1), mats, torch.zeros_like(mats))
    return finite & (torch.linalg.eigvalsh(sym(safe))[..., 0] > tol)


def project_spd(mats: torch.Tensor, floor: float) -> torch.Tensor:
    """Nearest SPD matrix in Frobenius norm with eigenvalues clipped at ``floor`` (repairs a baseline's output)."""
    return _sym_fn(sym(mats), lambda v: v.clamp(min=floor))


def _vech_scale(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Upper-triangle indices and the factors 1 (diagonal) / sqrt(2) (off-diagonal), built in ``dtype``."""
    rows, cols = torch.triu_indices(n, n)
    scale = torch.where(rows == cols, torch.ones((), dtype=dtype), torch.full((), 2.0, dtype=dtype).sqrt())
    return rows, cols, scale


def vech(mat: torch.Tensor) -> torch.Tensor:
    """Upper triangle (diagonal included) of a symmetric n x n matrix as n(n+1)/2 numbers, off-diagonals scaled by
    sqrt(2) so that ||vech(S)||_2 = ||S||_F."""
    rows, cols, scale = _vech_scale(mat.shape[-1], mat.dtype)
    return mat[..., rows, cols] * scale


def unvech(vec: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of ``vech``."""
    if vec.shape[-1] != n * (n + 1) // 2:
        raise ValueError(f"unvech: expected {n * (n + 1) // 2} numbers for n = {n}, got {vec.shape[-1]}")
    rows, cols, scale = _vech_scale(n, vec.dtype)
    out = torch.zeros(*vec.shape[:-1], n, n, dtype=vec.dtype, device=vec.device)
    out[..., rows, cols] = vec / scale
    out[..., cols, rows] = vec / scale
    return out


# --- conditioned DDPM ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoiseSchedule:
    """Linear beta schedule of a DDPM (Ho et al. 2020): beta_t from beta_1 to beta_T, abar_t = prod (1 - beta)."""

    betas: torch.Tensor

    @classmethod
    def linear(cls, steps: int, beta_start: float = 1e-4, beta_end: float = 0.02) -> NoiseSchedule:
        scale = 1000.0 / steps  # keeps abar_T near zero at any T (the improved-DDPM rescaling)
        return cls(torch.linspace(beta_start * scale, min(beta_end * scale, 0.999), steps, dtype=torch.float64))

    @property
    def steps(self) -> int:
        return int(self.betas.shape[0])

    @property
    def alpha_bar(self) -> torch.Tensor:
        return torch.cumprod(1.0 - self.betas, dim=0)


def q_sample(schedule: NoiseSchedule, z0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Forward diffusion z_t = sqrt(abar_t) z0 + sqrt(1 - abar_t) eps (t is 0-based)."""
    abar = schedule.alpha_bar.to(z0.dtype)[t].unsqueeze(-1)
    return abar.sqrt() * z0 + (1.0 - abar).sqrt() * noise


class Denoiser(nn.Module):
    """eps_theta(z_t, t, c): an MLP whose hidden layers are FiLM-modulated by an embedding of (t, c). A condition
    row of zeros with ``has_cond`` = 0 is the null condition of classifier-free guidance."""

    def __init__(self, data_dim: int, cond_dim: int, hidden: int, n_layers: int, t_dim: int = 32):
        super().__init__()
        self.t_dim = t_dim
        self.cond_dim = cond_dim
        self.inp = nn.Linear(data_dim, hidden)
        self.ctx = nn.Sequential(nn.Linear(t_dim + cond_dim + 1, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.layers = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(n_layers))
        self.films = nn.ModuleList(nn.Linear(hidden, 2 * hidden) for _ in range(n_layers))
        self.out = nn.Linear(hidden, data_dim)

    def forward(self, z: torch.Tensor, t: torch.Tensor, cond: torch.Tensor, has_cond: torch.Tensor) -> torch.Tensor:
        temb = sinusoidal_age(t.to(z.dtype), self.t_dim, max_period=10_000.0)
        ctx = self.ctx(torch.cat([temb, cond * has_cond.unsqueeze(-1), has_cond.unsqueeze(-1)], dim=-1))
        h = self.inp(z)
        for layer, film in zip(self.layers, self.films, strict=True):
            scale, shift = film(ctx).chunk(2, dim=-1)
            h = h + layer(torch.nn.functional.silu(h * (1 + scale) + shift))
        return self.out(torch.nn.functional.silu(h))


def ddpm_loss(model: Denoiser, schedule: NoiseSchedule, z0: torch.Tensor, cond: torch.Tensor,
              generator: torch.Generator, cond_dropout: float) -> torch.Tensor:
    """E_{t, eps} ||eps - eps_theta(z_t, t, c)||^2 with the condition dropped (null) with prob ``cond_dropout``."""
    n = z0.shape[0]
    t = torch.randint(0, schedule.steps, (n,), generator=generator)
    noise = torch.randn(z0.shape, generator=generator, dtype=z0.dtype)
    keep = (torch.rand(n, generator=generator) >= cond_dropout).to(z0.dtype)
    pred = model(q_sample(schedule, z0, t, noise), t, cond, keep)
    return ((pred - noise) ** 2).sum(dim=-1).mean()


def guided_eps(eps_cond: torch.Tensor, eps_null: torch.Tensor, w: float) -> torch.Tensor:
    """Classifier-free guidance: eps_hat = (1 + w) eps(z, c) - w eps(z, null)."""
    return (1.0 + w) * eps_cond - w * eps_null


@torch.no_grad()
def ddpm_sample(model: Denoiser, schedule: NoiseSchedule, cond: torch.Tensor, data_dim: int, w: float,
                generator: torch.Generator, conditional: bool = True, clip_x0: float = 5.0) -> torch.Tensor:
    """Ancestral sampling with the clipped-x0 parameterisation of Ho et al. (2020, their implementation's
    ``clip_denoised``): x0_hat = clip((z_t - sqrt(1 - abar_t) eps_hat) / sqrt(abar_t), +-clip_x0), then
    z_{t-1} ~ N(c1 x0_hat + c2 z_t, sigma_t^2) with c1 = sqrt(abar_{t-1}) beta_t / (1 - abar_t),
    c2 = sqrt(1 - beta_t) (1 - abar_{t-1}) / (1 - abar_t), sigma_t^2 = beta_t (1 - abar_{t-1}) / (1 - abar_t);
    the data are standardised, so the clip only bounds a diverging trajectory. ``conditional=False`` samples
    from eps(z, null) alone (the unconditional model)."""
    n = cond.shape[0]
    betas = schedule.betas.to(cond.dtype)
    abar = schedule.alpha_bar.to(cond.dtype)
    z = torch.randn((n, data_dim), generator=generator, dtype=cond.dtype)
    ones, zeros = torch.ones(n, dtype=cond.dtype), torch.zeros(n, dtype=cond.dtype)
    for step in reversed(range(schedule.steps)):
        t = torch.full((n,), step, dtype=torch.long)
        eps_null = model(z, t, cond, zeros)
        eps = guided_eps(model(z, t, cond, ones), eps_null, w) if conditional else eps_null
        x0 = ((z - (1.0 - abar[step]).sqrt() * eps) / abar[step].sqrt()).clamp(-clip_x0, clip_x0)
        abar_prev = abar[step - 1] if step > 0 else torch.ones((), dtype=cond.dtype)
        mean = (abar_prev.sqrt() * betas[step] * x0 + (1.0 - betas[step]).sqrt() * (1.0 - abar_prev) * z
                ) / (1.0 - abar[step])
        if step > 0:
            var = betas[step] * (1.0 - abar_prev) / (1.0 - abar[step])
            mean = mean + var.sqrt() * torch.randn(z.shape, generator=generator, dtype=z.dtype)
        z = mean
    return z


# --- evaluation -------------------------------------------------------------------------------------------------


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney AUC: P(score_pos > score_neg) + 0.5 P(tie); NaN without both classes."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), dtype=float)
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = 0.5 * (i + j) + 1.0
        i = j + 1
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def age_stratified_auc(scores: np.ndarray, labels: np.ndarray, ages: np.ndarray, edges: np.ndarray) -> float:
    """Mean of the AUCs within age bins [edges_i, edges_{i+1}) that hold both classes (Delphi's age-stratified
    evaluation); NaN when no bin does."""
    values = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        inside = (ages >= lo) & (ages < hi)
        value = auc(scores[inside], labels[inside])
        if not math.isnan(value):
            values.append(value)
    return float(np.mean(values)) if values else float("nan")


def energy_distance(x: torch.Tensor, y: torch.Tensor) -> float:
    """Energy distance 2 E||X - Y|| - E||X - X'|| - E||Y - Y'|| (V-statistic; zero iff equal samples)."""
    xy = torch.cdist(x, y).mean()
    xx = torch.cdist(x, x).mean()
    yy = torch.cdist(y, y).mean()
    return float(2 * xy - xx - yy)


def sign_agreement(predicted: np.ndarray, true: np.ndarray, min_abs_true: float) -> tuple[int, int]:
    """(agreements, trials) over the entries with |true| > ``min_abs_true``: agreement is sign(pred) = sign(true)."""
    predicted, true = np.asarray(predicted, dtype=float), np.asarray(true, dtype=float)
    chosen = np.abs(true) > min_abs_true
    return int((np.sign(predicted[chosen]) == np.sign(true[chosen])).sum()), int(chosen.sum())

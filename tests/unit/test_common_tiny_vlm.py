"""Tiny VLM (encoder -> projector -> GPT-2 via inputs_embeds): exact identities, each with a negative control."""

from __future__ import annotations

import time

import pytest
import torch
from pydantic import ValidationError

from tasks.common import tiny_vlm
from tasks.common.tiny_vlm import (
    TinyVLMConfig,
    build_tiny_vlm,
    caption_loss,
    generate,
    load_vlm,
    save_vlm,
    sequence_logprob,
)

VOCAB = 11


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Tensors here are tiny: intra-op threads only add synchronisation (and stall on a busy machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def make_model(seed: int = 0, **overrides) -> tiny_vlm.TinyVLM:
    fields = {"vocab_size": VOCAB, "max_frames": 3, "lm_positions": 64} | overrides
    return build_tiny_vlm(TinyVLMConfig(**fields), seed=seed).eval()


def images(n: int, seed: int, frames: int | None = None) -> torch.Tensor:
    shape = (n, 3, 16, 16) if frames is None else (n, frames, 3, 16, 16)
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed))


def hand_caption_logprobs(logits: torch.Tensor, prefix: int, caption: torch.Tensor, mask: torch.Tensor,
                          shift: int = 1) -> list[list[float]]:
    """log p(caption_j) read from the logits at position prefix + j - shift, real tokens only."""
    logp = torch.log_softmax(logits.detach().double(), dim=-1)
    return [[float(logp[b, prefix + j - shift, caption[b, j]]) for j in range(caption.shape[1]) if mask[b, j]]
            for b in range(caption.shape[0])]


# ----------------------------------------------------------------------------- config, shapes, encoder


def test_config_validates_sizes():
    TinyVLMConfig(vocab_size=VOCAB)  # the defaults are consistent
    with pytest.raises(ValidationError, match="multiple of patch_size"):
        TinyVLMConfig(vocab_size=VOCAB, image_size=18)
    with pytest.raises(ValidationError, match="no room for text"):
        TinyVLMConfig(vocab_size=VOCAB, max_frames=4, lm_positions=64)  # 4 x 16 image tokens
    with pytest.raises(ValidationError):
        TinyVLMConfig(vocab_size=VOCAB, encoder_widht=32)  # typo: extra keys are forbidden


@pytest.mark.parametrize("kind,depth", [("vit", 2), ("cnn", 3)])
def test_token_counts_and_hidden_states(kind, depth):
    model = make_model(encoder_kind=kind, encoder_depth=depth, patch_size=4)
    n = (16 // 4) * (16 // 4)
    assert model.num_image_tokens() == n and model.num_image_tokens(3) == 3 * n
    out = model.encode(images(2, 0))
    assert out.tokens.shape == (2, n, 32)
    assert len(out.hidden_states) == depth + 1
    assert all(state.shape == (2, n, 32) for state in out.hidden_states)
    assert torch.equal(out.tokens, model.encoder.norm(out.hidden_states[-1]))  # tokens = final norm of last layer
    video = model.encode(images(2, 0, frames=3))
    assert video.tokens.shape == (2, 3 * n, 32) and len(video.hidden_states) == depth + 1
    assert model(images(2, 0, frames=3), torch.zeros(2, 5, dtype=torch.long)).shape == (2, 3 * n + 5, VOCAB)
    with pytest.raises(ValueError, match="max_frames"):
        model.encode(images(1, 0, frames=4))


def test_frames_encoded_independently_in_time_order():
    clip = images(2, 1, frames=3)
    model = make_model()
    out = model.encode(clip)
    for t in range(3):
        alone = model.encode(clip[:, t])
        block = slice(16 * t, 16 * (t + 1))
        assert torch.allclose(out.tokens[:, block], alone.tokens, atol=1e-6)
        assert all(torch.allclose(v[:, block], a, atol=1e-6) for v, a in zip(out.hidden_states, alone.hidden_states))
    # Negative control: the order is real, frame 1's tokens are not frame 0's.
    assert not torch.allclose(out.tokens[:, 16:32], model.encode(clip[:, 0]).tokens, atol=1e-3)


def test_time_embedding_separates_identical_frames():
    still = images(1, 2)[:, None].expand(1, 3, 3, 16, 16)
    plain = make_model().encode(still).tokens
    assert torch.equal(plain[:, :16], plain[:, 16:32])  # no time embedding: identical frames, identical tokens
    timed_model = make_model(time_embedding=True)
    timed = timed_model.encode(still).tokens
    difference = timed_model.time[1] - timed_model.time[0]
    assert torch.allclose(timed[:, 16:32] - timed[:, :16], difference.expand(1, 16, 32), atol=1e-6)
    assert difference.abs().max() > 0.1  # negative control: the embedding is not vacuous


def test_build_is_reproducible_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    first, again, other = make_model(seed=3), make_model(seed=3), make_model(seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))
    assert not all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), other.state_dict().values()))


# ----------------------------------------------------------------------------- loss and log-probs


def caption_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    prompt = torch.tensor([[9, 3], [9, 4]])
    caption = torch.tensor([[1, 2, 5, 10], [6, 7, 0, 0]])
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    return images(2, 5), prompt, caption, mask


def test_caption_loss_is_mean_cross_entropy_on_caption_tokens_only():
    model = make_model()
    pixels, prompt, caption, mask = caption_batch()
    logits = model(pixels, torch.cat([prompt, caption], 1))
    prefix = model.num_image_tokens() + prompt.shape[1]
    hand = hand_caption_logprobs(logits, prefix, caption, mask)
    expected = -sum(sum(row) for row in hand) / int(mask.sum())
    assert float(caption_loss(model, pixels, prompt, caption, mask).detach()) == pytest.approx(expected, abs=1e-6)
    per_sequence = sequence_logprob(model, pixels, prompt, caption, mask)
    assert per_sequence.tolist() == pytest.approx([sum(row) for row in hand], abs=1e-5)
    # Negative control: the same check against an off-by-one reading of the logits fails.
    unshifted = hand_caption_logprobs(logits, prefix, caption, mask, shift=0)
    assert abs(-sum(sum(row) for row in unshifted) / int(mask.sum()) - expected) > 1e-3


def test_caption_loss_check_catches_prompt_positions_in_the_loss(monkeypatch):
    model = make_model()
    pixels, prompt, caption, mask = caption_batch()
    logits = model(pixels, torch.cat([prompt, caption], 1))
    prefix = model.num_image_tokens() + prompt.shape[1]
    hand = hand_caption_logprobs(logits, prefix, caption, mask)
    expected = -sum(sum(row) for row in hand) / int(mask.sum())
    original = tiny_vlm.build_labels

    def labels_with_prompt(num_image_tokens, prompt_ids, caption_ids, caption_mask):
        labels = original(num_image_tokens, prompt_ids, caption_ids, caption_mask)
        labels[:, num_image_tokens + 1:num_image_tokens + prompt_ids.shape[1]] = prompt_ids[:, 1:]
        return labels

    monkeypatch.setattr(tiny_vlm, "build_labels", labels_with_prompt)
    assert abs(float(caption_loss(model, pixels, prompt, caption, mask).detach()) - expected) > 1e-3


def test_padding_tokens_do_not_count():
    model = make_model()
    pixels, prompt, caption, mask = caption_batch()
    loss = caption_loss(model, pixels, prompt, caption, mask)
    repadded = caption.masked_fill(~mask, 8)
    assert torch.equal(caption_loss(model, pixels, prompt, repadded, mask), loss)
    changed = caption.clone()
    changed[1, 1] = 8  # negative control: a real caption token does count
    assert not torch.equal(caption_loss(model, pixels, prompt, changed, mask), loss)


def test_caption_gradient_reaches_the_encoder_only_through_the_projector():
    model = make_model()
    pixels, prompt, caption, mask = caption_batch()
    sequence_logprob(model, pixels, prompt, caption, mask).sum().backward()
    assert model.encoder.patchify.weight.grad.abs().max() > 0
    model.zero_grad(set_to_none=False)
    # Negative control: with the projector's output zeroed no gradient reaches the encoder.
    model.projector.register_forward_hook(lambda module, inputs, output: torch.zeros_like(output))
    sequence_logprob(model, pixels, prompt, caption, mask).sum().backward()
    assert model.encoder.patchify.weight.grad.abs().max() == 0


def test_sequences_longer_than_the_position_table_are_refused():
    model = make_model(max_frames=1, lm_positions=20)  # 16 image tokens + 4 text positions
    pixels = images(1, 0)
    assert model(pixels, torch.zeros(1, 4, dtype=torch.long)).shape == (1, 20, VOCAB)
    with pytest.raises(ValueError, match="lm_positions"):
        model(pixels, torch.zeros(1, 5, dtype=torch.long))
    assert generate(model, pixels, torch.zeros(1, 2, dtype=torch.long), 3).tokens.shape == (1, 3)
    with pytest.raises(ValueError, match="lm_positions"):
        generate(model, pixels, torch.zeros(1, 2, dtype=torch.long), 4)


def test_image_conditions_the_caption_logits():
    model = make_model()
    prompt = torch.tensor([[9, 3]])
    first_caption = model.num_image_tokens() + prompt.shape[1] - 1
    at_first = lambda pixels: model(pixels, prompt)[0, first_caption]
    a, b = images(1, 10), images(1, 11)
    assert torch.equal(at_first(a), at_first(a.clone()))
    assert (at_first(a) - at_first(b)).abs().max() > 1e-3
    # Negative control: with the projector's output zeroed the image cannot reach the text.
    model.projector.register_forward_hook(lambda module, inputs, output: torch.zeros_like(output))
    assert torch.equal(at_first(a), at_first(b))


# ----------------------------------------------------------------------------- generation


def stepwise_greedy(model, pixels, prompt, steps):
    ids = prompt
    for _ in range(steps):
        ids = torch.cat([ids, model(pixels, ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[:, prompt.shape[1]:]


@torch.no_grad()
def test_greedy_generation_is_stepwise_argmax_of_full_forwards():
    model = make_model()
    pixels, prompt = images(3, 20), torch.tensor([[9], [9], [9]])
    out = generate(model, pixels, prompt, max_new_tokens=6)
    assert torch.equal(out.tokens, stepwise_greedy(model, pixels, prompt, 6))
    assert out.mask.all()
    # Negative control: a hot sample is not the argmax path.
    hot = generate(model, pixels, prompt, 6, do_sample=True, temperature=5.0,
                   generator=torch.Generator().manual_seed(0))
    assert not torch.equal(hot.tokens, out.tokens)


@torch.no_grad()
@pytest.mark.parametrize("frames", [None, 3])
def test_kv_cache_equals_recompute(frames):
    model = make_model(time_embedding=True)
    pixels, prompt = images(2, 21, frames), torch.tensor([[9, 3], [9, 4]])
    for kwargs in ({}, {"do_sample": True, "temperature": 1.5, "top_k": 5}):
        runs = [generate(model, pixels, prompt, 8, use_cache=use_cache, generator=torch.Generator().manual_seed(1),
                         **kwargs) for use_cache in (True, False)]
        assert torch.equal(runs[0].tokens, runs[1].tokens)
        assert torch.allclose(runs[0].logits, runs[1].logits, atol=1e-5, rtol=0)
    other = generate(model, images(2, 22, frames), prompt, 8)
    assert not torch.allclose(other.logits, runs[0].logits, atol=1e-3)  # negative control: not vacuous


@torch.no_grad()
def test_sampling_is_reproducible_from_the_generator():
    model = make_model()
    pixels, prompt = images(4, 23), torch.full((4, 1), 9)
    sample = lambda seed, **kw: generate(model, pixels, prompt, 10, do_sample=True, temperature=2.0,
                                         generator=torch.Generator().manual_seed(seed), **kw).tokens
    assert torch.equal(sample(7), sample(7))
    assert not torch.equal(sample(7), sample(8))  # negative control
    assert torch.equal(sample(7, top_k=1), generate(model, pixels, prompt, 10).tokens)  # top-1 sampling = greedy
    with pytest.raises(ValueError, match="Generator"):
        generate(model, pixels, prompt, 3, do_sample=True)


@torch.no_grad()
@pytest.mark.parametrize("seed,first_token,eos", [(1, 9, 5), (0, 1, 8)])
def test_eos_stops_masks_and_scores_consistently(seed, first_token, eos):
    model = make_model(seed=seed)
    pixels, prompt = images(3, 24), torch.full((3, 1), first_token)
    free = generate(model, pixels, prompt, 6)
    hits = [(row == eos).nonzero() for row in free.tokens]
    lengths = [int(h[0]) + 1 if len(h) else 6 for h in hits]
    assert len(set(lengths)) > 1  # the case is informative: rows end at different steps
    out = generate(model, pixels, prompt, 6, eos_token_id=eos, pad_token_id=0)
    assert out.tokens.shape[1] == max(lengths)  # the loop stops once every row has ended
    for row, length in enumerate(lengths):
        assert out.mask[row].tolist() == [True] * length + [False] * (max(lengths) - length)
        assert torch.equal(out.tokens[row, :length], free.tokens[row, :length])
        assert (out.tokens[row, length:] == 0).all()
    # Scoring a generated continuation reproduces the logits it was drawn from (what RL relies on).
    logp = torch.log_softmax(out.logits, -1).gather(-1, out.tokens[..., None]).squeeze(-1)
    expected = (logp * out.mask).sum(-1)
    assert torch.allclose(sequence_logprob(model, pixels, prompt, out.tokens, out.mask), expected, atol=1e-5)
    unmasked = sequence_logprob(model, pixels, prompt, out.tokens, torch.ones_like(out.mask))
    assert not torch.allclose(unmasked, expected, atol=1e-3)  # negative control: the mask matters


# ----------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("overrides", [{}, {"encoder_kind": "cnn", "projector": "linear", "time_embedding": True}])
def test_save_load_round_trip_is_bit_exact(tmp_path, overrides):
    model = make_model(seed=5, **overrides)
    target = save_vlm(model, tmp_path / "vlm")
    assert sorted(p.name for p in target.iterdir()) == ["model.safetensors", "vlm_config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vlm"]  # no temp folder left behind
    loaded = load_vlm(target)
    assert loaded.config == model.config
    pixels, ids = images(2, 30, frames=2), torch.tensor([[9, 1, 2], [9, 3, 4]])
    assert torch.equal(loaded(pixels, ids), model(pixels, ids))
    assert loaded.lm.lm_head.weight.data_ptr() == loaded.lm.transformer.wte.weight.data_ptr()  # still tied
    assert not torch.equal(make_model(seed=6, **overrides)(pixels, ids), model(pixels, ids))  # negative control


# ----------------------------------------------------------------------------- learning

BOS, EOS = 7, 8  # vocabulary: colours 0-2, quadrants 3-6, BOS, EOS


def square_batch(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """16x16 noisy images, a 4x4 square of one of 3 colours jittered inside one of 4 quadrants;
    caption [colour, 3 + quadrant, EOS]."""
    colour = torch.randint(0, 3, (n,), generator=generator)
    quadrant = torch.randint(0, 4, (n,), generator=generator)
    offset = torch.randint(0, 5, (n, 2), generator=generator)
    top, left = 8 * (quadrant // 2) + offset[:, 0], 8 * (quadrant % 2) + offset[:, 1]
    grid = torch.arange(16)
    rows = (grid >= top[:, None]) & (grid < top[:, None] + 4)
    cols = (grid >= left[:, None]) & (grid < left[:, None] + 4)
    square = (rows[:, :, None] & cols[:, None, :]).float()
    pixels = 0.1 * torch.randn(n, 3, 16, 16, generator=generator)
    pixels += torch.nn.functional.one_hot(colour, 3).float()[:, :, None, None] * square[:, None]
    return pixels, torch.stack([colour, 3 + quadrant, torch.full_like(colour, EOS)], dim=1)


def exact_accuracy(model, pixels, captions) -> float:
    out = generate(model, pixels, torch.full((len(pixels), 1), BOS), max_new_tokens=4, eos_token_id=EOS)
    right = (out.tokens[:, :3] == captions).all(1) & (out.mask.sum(1) == 3)
    return float(right.float().mean())


def test_learns_colour_and_position_of_a_square():
    config = TinyVLMConfig(vocab_size=9, encoder_width=32, encoder_depth=1, lm_width=32, lm_depth=1, lm_positions=24)
    model = build_tiny_vlm(config, seed=0)
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    prompt = torch.full((32, 1), BOS)
    start = time.perf_counter()
    for _ in range(200):
        pixels, captions = square_batch(32, generator)
        loss = caption_loss(model, pixels, prompt, captions, torch.ones_like(captions, dtype=torch.bool))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    train_s = time.perf_counter() - start
    model.eval()
    held_out = square_batch(256, torch.Generator().manual_seed(1))
    with torch.no_grad():
        start = time.perf_counter()
        accuracy = exact_accuracy(model, *held_out)
        generate_s = time.perf_counter() - start
        print(f"tiny VLM: 200 steps {train_s:.2f} s, greedy decoding of 256 captions {generate_s:.3f} s, "
              f"held-out exact accuracy {accuracy:.3f}")
        assert accuracy >= 0.9
        # Negative control: the same model with the image cut off is at chance (1/12 exact captions).
        model.projector.register_forward_hook(lambda module, inputs, output: torch.zeros_like(output))
        assert exact_accuracy(model, *held_out) <= 0.25

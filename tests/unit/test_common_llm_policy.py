"""LLM policies: TransformersPolicy against hand computations, OpenAIServerPolicy's echo parsing against a
stubbed vLLM-shaped response. The real ``transformers serve`` is exercised in tests/pipeline/test_llm_server.py."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tasks.common import llm_policy
from tasks.common.llm_policy import (
    LLMPolicy,
    OpenAIServerPolicy,
    TransformersPolicy,
    argmax_first,
    continuation_start,
)
from tasks.common.llm_server import build_tiny_local_model, torch_threads

PROMPT = "the cat"
CONTINUATIONS = [" sat on the mat.", " sat", " zq!", "."]


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> TransformersPolicy:
    directory = build_tiny_local_model(tmp_path_factory.mktemp("llm") / "tiny", seed=0, train_steps=80)
    return TransformersPolicy.from_directory(directory)


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: these models are tiny, and two threads crawl on a busy 2-core machine."""
    with torch_threads(1):
        yield


def hand_scores(policy: TransformersPolicy, prompt: str, continuations: list[str]) -> list[float]:
    """Tokenize prompt and continuation separately, one forward pass, log-softmax written out by hand."""
    tokenizer, model = policy.tokenizer, policy.model
    prompt_ids = tokenizer(prompt)["input_ids"]
    results = []
    for continuation in continuations:
        cont_ids = tokenizer(continuation, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt_ids + cont_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].double()
        total = 0.0
        for j, token in enumerate(cont_ids):
            row = logits[len(prompt_ids) + j - 1].tolist()
            top = max(row)
            log_norm = top + math.log(sum(math.exp(x - top) for x in row))
            total += row[token] - log_norm
        results.append(total)
    return results


def max_gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_policies_satisfy_the_protocol(policy):
    assert isinstance(policy, LLMPolicy)
    assert isinstance(OpenAIServerPolicy("http://127.0.0.1:1/v1", "m"), LLMPolicy)


def test_score_equals_hand_computed_log_softmax_sums(policy):
    expected = hand_scores(policy, PROMPT, CONTINUATIONS)
    got = policy.score(PROMPT, CONTINUATIONS)
    assert max_gap(got, expected) < 1e-6, (got, expected)
    assert all(value < 0 for value in got)
    # The trained toy grammar prefers a word it saw after "the cat" to noise of the same length.
    assert got[1] > got[2]
    assert policy.score(PROMPT, [""]) == [0.0]


def test_score_check_catches_an_off_by_one_position(policy, monkeypatch):
    """Negative control: shifting the logit rows by one (row t predicting token t) must fail the check."""
    monkeypatch.setattr(llm_policy, "_predicting_positions", lambda start, end: range(start, end))
    shifted = policy.score(PROMPT, CONTINUATIONS)
    assert max_gap(shifted, hand_scores(policy, PROMPT, CONTINUATIONS)) > 1e-3


def test_choose_is_the_argmax_of_score(policy, monkeypatch):
    scores = policy.score(PROMPT, CONTINUATIONS)
    assert policy.choose(PROMPT, CONTINUATIONS) == max(range(len(scores)), key=scores.__getitem__)
    assert policy.choose(PROMPT, [" zq!", " sat"]) == 1
    # Ties go to the lowest index.
    monkeypatch.setattr(TransformersPolicy, "score", lambda self, prompt, options: [1.0, 3.0, 3.0])
    assert policy.choose(PROMPT, ["a", "b", "c"]) == 1


def test_argmax_first():
    assert argmax_first([0.5, 2.0, 2.0, -1.0]) == 1
    assert argmax_first([float("nan"), -3.0]) == 1
    assert argmax_first([-math.inf, -math.inf]) == 0
    with pytest.raises(ValueError):
        argmax_first([])


def test_continuation_boundary_rules():
    # A BPE-like token "t ca" straddling the prompt end (4 characters) is refused.
    with pytest.raises(ValueError, match="token boundary"):
        continuation_start([(0, 2), (2, 6), (6, 8)], 4)
    # A zero-width BOS counts as the prompt; an empty prompt without one is refused.
    assert continuation_start([(0, 0), (0, 3)], 0) == 1
    with pytest.raises(ValueError, match="no tokens"):
        continuation_start([(0, 3)], 0)
    assert continuation_start([(0, 3), (3, 4)], 4) == 2  # empty continuation: nothing to sum


def test_score_rejects_an_empty_prompt(policy):
    with pytest.raises(ValueError, match="no tokens"):
        policy.score("", [" the cat"])


def test_greedy_generate_equals_argmax_decoding(policy):
    prompts = ["the cat", "a bird ", "my friend looked"]
    max_new = 12
    expected = []
    for prompt in prompts:
        ids = policy.tokenizer(prompt)["input_ids"]
        new: list[int] = []
        for _ in range(max_new):
            with torch.no_grad():
                logits = policy.model(input_ids=torch.tensor([ids + new])).logits[0, -1]
            token = int(torch.argmax(logits))
            new.append(token)
            if token == policy.tokenizer.eos_token_id:
                break
        expected.append(policy.tokenizer.decode(new, skip_special_tokens=True))
    assert policy.generate(prompts, max_new, temperature=0.0) == expected
    assert any(text.strip() for text in expected)


def test_sampled_generate_is_reproducible_by_seed(policy):
    prompts = ["the dog", "the fox"]
    first = policy.generate(prompts, 16, temperature=1.0, seed=7)
    assert policy.generate(prompts, 16, temperature=1.0, seed=7) == first
    assert policy.generate(prompts, 16, temperature=1.0, seed=8) != first
    # Prompt i uses seed + i: a prompt's sample does not depend on the prompts before it.
    assert policy.generate(["the fox"], 16, temperature=1.0, seed=8) == [first[1]]
    # Greedy ignores the seed.
    assert policy.generate(prompts, 8, seed=1) == policy.generate(prompts, 8, seed=2)


def test_generate_rejects_bad_arguments(policy):
    with pytest.raises(ValueError, match="max_new_tokens"):
        policy.generate(["x"], 0)
    with pytest.raises(ValueError, match="temperature"):
        policy.generate(["x"], 4, temperature=-1.0)


# --------------------------------------------------------------------------------------------
# OpenAIServerPolicy: request shape and echo parsing, against a stub speaking vLLM's response format.


def vllm_like_echo_logprobs(policy: TransformersPolicy, text: str) -> dict:
    """What vLLM returns for ``echo=True, logprobs=1, max_tokens=1``: every prompt token with its log-prob
    (``None`` for the first), its character offset, then one generated token placed after the text."""
    encoded = policy.tokenizer(text, return_offsets_mapping=True)
    ids = encoded["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(policy.model(input_ids=torch.tensor([ids])).logits[0].double(), dim=-1)
    token_logprobs = [None] + [float(logp[t - 1, ids[t]]) for t in range(1, len(ids))]
    tokens = [text[begin:end] for begin, end in encoded["offset_mapping"]]
    offsets = [begin for begin, _ in encoded["offset_mapping"]]
    return {"tokens": [*tokens, " x"], "token_logprobs": [*token_logprobs, -0.25],
            "text_offset": [*offsets, len(text)], "top_logprobs": None}


def stub_client(handler):
    import httpx
    import openai

    return openai.OpenAI(base_url="http://stub/v1", api_key="EMPTY", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(handler)))


def completion_body(text: str, logprobs: dict | None) -> dict:
    return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "stub",
            "choices": [{"index": 0, "text": text, "finish_reason": "length", "logprobs": logprobs}]}


def test_server_score_parses_echoed_prompt_logprobs(policy):
    import httpx

    requests = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body)
        return httpx.Response(200, json=completion_body(body["prompt"] + " x",
                                                        vllm_like_echo_logprobs(policy, body["prompt"])))

    server = OpenAIServerPolicy("http://stub/v1", "stub", client=stub_client(handler))
    got = server.score(PROMPT, CONTINUATIONS)
    assert max_gap(got, policy.score(PROMPT, CONTINUATIONS)) < 1e-9
    assert server.choose(PROMPT, CONTINUATIONS) == policy.choose(PROMPT, CONTINUATIONS)
    assert {(r["echo"], r["logprobs"], r["max_tokens"], r["temperature"]) for r in requests} == {(True, 1, 1, 0.0)}
    assert [r["prompt"] for r in requests[:len(CONTINUATIONS)]] == [PROMPT + c for c in CONTINUATIONS]


def test_server_score_refuses_offsets_that_do_not_spell_the_continuation(policy):
    """Offsets shifted by three characters (old vLLM counted a BOS's text) must not be scored silently."""
    import httpx

    def handler(request: httpx.Request) -> httpx.Response:
        prompt = json.loads(request.content)["prompt"]
        logprobs = vllm_like_echo_logprobs(policy, prompt)
        logprobs["text_offset"] = [0] + [offset + 3 for offset in logprobs["text_offset"][1:]]
        return httpx.Response(200, json=completion_body(prompt + " x", logprobs))

    server = OpenAIServerPolicy("http://stub/v1", "stub", client=stub_client(handler))
    with pytest.raises(ValueError, match="do not spell"):
        server.score(PROMPT, [" sat on the mat."])


def test_server_score_without_prompt_logprobs_is_not_implemented():
    import httpx

    client = stub_client(lambda request: httpx.Response(200, json=completion_body(" ", None)))
    with pytest.raises(NotImplementedError, match="echo"):
        OpenAIServerPolicy("http://stub/v1", "stub", client=client).score(PROMPT, [" sat"])
    with pytest.raises(NotImplementedError, match="chat"):
        OpenAIServerPolicy("http://stub/v1", "stub", chat=True, client=client).choose(PROMPT, [" a", " b"])


def test_server_generate_request_shape():
    import httpx

    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.path, body))
        if request.url.path.endswith("/chat/completions"):
            return httpx.Response(200, json={
                "id": "c", "object": "chat.completion", "created": 0, "model": "stub",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "hi " + body["messages"][0]["content"]}}]})
        return httpx.Response(200, json=completion_body("<" + body["prompt"] + ">", None))

    client = stub_client(handler)
    assert OpenAIServerPolicy("u", "stub", client=client).generate(["a", "b"], 5, 0.5, seed=3) == ["<a>", "<b>"]
    assert OpenAIServerPolicy("u", "stub", chat=True, client=client).generate(["q"], 4) == ["hi q"]
    (path_a, body_a), (_, body_b), (path_c, body_c) = seen
    assert path_a.endswith("/v1/completions") and path_c.endswith("/v1/chat/completions")
    assert (body_a["max_tokens"], body_a["temperature"], body_a["top_p"], body_a["seed"]) == (5, 0.5, 1.0, 3)
    assert body_b["seed"] == 4 and body_c["messages"] == [{"role": "user", "content": "q"}]

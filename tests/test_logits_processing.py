"""vLLM's logits processing: presence / frequency / repetition penalties, logit_bias and allowed_token_ids, against
transformers as the oracle (its own generate() for the repetition penalty and the bias; a forward loop with the
OpenAI API's formula for presence / frequency), lossless under speculative decoding, and over HTTP; and prompt
logprobs (``prompt_logprobs``, completions' echo + logprobs) against transformers' log-softmax."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch
import transformers
from drafters import make_dflash
from test_server import tiny_openai_client

from specserve import LLM, SamplingParams

VOCAB = 49152
N = 16
PROMPTS = ["The capital of France is", "1 2 3 4 5 6 7 8 9 10 1 2 3 4", "Hello there, how are you doing"]


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir: str) -> LLM:
    return LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=4)


@pytest.fixture(scope="module")
def hf(tiny_qwen3_dir: str) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()


def _ids(tok: Any) -> list[list[int]]:
    return [tok(p).input_ids for p in PROMPTS]


def _engine(llm: LLM, ids: list[list[int]], **kw: Any) -> list[list[int]]:
    sp = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, **kw)
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": i} for i in ids], sp)]


def _hf_greedy(hf: Any, ids: list[int], **kw: Any) -> list[int]:
    """transformers' own greedy generate() with its logits processors (``kw``), N tokens, no EOS."""
    x = torch.tensor([ids])
    with torch.no_grad():
        y = hf.generate(x, max_new_tokens=N, do_sample=False, eos_token_id=None, pad_token_id=0, **kw)
    return y[0, x.shape[1] :].tolist()


def _reference(hf: Any, ids: list[int], presence: float = 0.0, frequency: float = 0.0) -> list[int]:
    """Greedy with the OpenAI API's penalties: logit[t] -= frequency * count(t) + presence * (count(t) > 0) over
    the tokens generated so far."""
    out: list[int] = []
    for _ in range(N):
        with torch.no_grad():
            logits = hf(torch.tensor([ids + out])).logits[0, -1].float()
        for t, c in Counter(out).items():
            logits[t] -= frequency * c + presence
        out.append(int(logits.argmax()))
    return out


@pytest.mark.parametrize("presence, frequency", [(1.5, 0.0), (0.0, 0.8), (0.5, -0.3)])
def test_presence_and_frequency_penalties_match_the_formula(
    llm: LLM, hf: Any, smol_tokenizer: Any, presence: float, frequency: float
) -> None:
    ids = _ids(smol_tokenizer)
    got = _engine(llm, ids, presence_penalty=presence, frequency_penalty=frequency)
    assert got == [_reference(hf, i, presence, frequency) for i in ids]
    assert got != _engine(llm, ids)  # the penalties change these outputs


@pytest.mark.parametrize("penalty", [1.4, 0.7])
def test_repetition_penalty_matches_transformers(
    llm: LLM, hf: Any, smol_tokenizer: Any, penalty: float
) -> None:
    ids = _ids(smol_tokenizer)
    want = [_hf_greedy(hf, i, repetition_penalty=penalty) for i in ids]
    got = _engine(llm, ids, repetition_penalty=penalty)
    assert got == want and got != _engine(llm, ids)


def test_logit_bias_and_allowed_token_ids(llm: LLM, hf: Any, smol_tokenizer: Any) -> None:
    ids = _ids(smol_tokenizer)
    plain = _engine(llm, ids)
    # the bias of transformers' SequenceBiasLogitsProcessor on single tokens is OpenAI's logit_bias
    bias = {plain[0][0]: -3.0, 1234: 2.5, 777: 1.0}
    want = [_hf_greedy(hf, i, sequence_bias={(t,): b for t, b in bias.items()}) for i in ids]
    got = _engine(llm, ids, logit_bias=bias)
    assert got == want and got != plain
    # logprobs stay the model's own (vLLM's raw_logprobs), before the bias that picked the token
    sp = SamplingParams(temperature=0, max_tokens=1, logprobs=0, logit_bias={4321: 100.0})
    o = llm.generate([{"prompt_token_ids": ids[0]}], sp)[0].outputs[0]
    with torch.no_grad():
        raw = torch.log_softmax(hf(torch.tensor([ids[0]])).logits[0, -1].float(), -1)[4321]
    assert o.token_ids == [4321] and abs(o.logprobs[0][4321].logprob - float(raw)) < 1e-4
    allowed = [101, 202, 303, 404, 505]
    got = _engine(llm, ids, allowed_token_ids=allowed)
    assert all(set(g) <= set(allowed) for g in got) and len({t for g in got for t in g}) > 1
    # sampling honours them too
    sp = SamplingParams(temperature=1.0, seed=0, max_tokens=N, ignore_eos=True, allowed_token_ids=allowed)
    assert all(set(o.outputs[0].token_ids) <= set(allowed) for o in llm.generate(PROMPTS, sp))


def _two_token_word(llm: LLM, tok: Any, outputs: list[list[int]]) -> tuple[str, list[list[int]]]:
    """A two-token word of some output that tokenizes back to the same tokens (banning it changes that output),
    and the token sequences the engine bans for it."""
    for out in outputs:
        for i in range(
            1, len(out) - 1
        ):  # not the first output token: speculation drafts the word's first token
            text = tok.decode(out[i : i + 2])
            banned = llm.engine._bad_words_ids([text])
            if text.strip() and out[i : i + 2] in banned:
                return text, banned
    raise AssertionError("no two-token word in the outputs")


def test_bad_words(llm: LLM, smol_tokenizer: Any) -> None:
    """vLLM's bad_words: a word's token sequence (as written or after a space) never completes in the output."""
    ids = _ids(smol_tokenizer)
    plain = _engine(llm, ids)
    word, banned = _two_token_word(llm, smol_tokenizer, plain)
    got = _engine(llm, ids, bad_words=[word])
    assert got != plain
    for g in got:
        for b in banned:
            assert not any(g[i : i + len(b)] == b for i in range(len(g)))


def test_bad_words_lossless_when_drafts_spell_them(
    llm: LLM, tiny_qwen3_dir: str, smol_tokenizer: Any
) -> None:
    """The target drafting for itself proposes the banned word whole (its unconstrained continuation); the row
    after the word's first draft must ban its second token, as plain decoding does."""
    ids = _ids(smol_tokenizer)
    word, _ = _two_token_word(llm, smol_tokenizer, _engine(llm, ids))
    want = _engine(llm, ids, bad_words=[word])
    spec = {"method": "draft_model", "model": tiny_qwen3_dir, "num_speculative_tokens": 3}
    spec_llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=4, speculative_config=spec)
    assert _engine(spec_llm, ids, bad_words=[word]) == want


def test_bad_values_are_clear_errors(llm: LLM) -> None:
    for kw, words in (
        ({"presence_penalty": 2.5}, "presence_penalty must be in"),
        ({"frequency_penalty": -3.0}, "frequency_penalty must be in"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be greater than zero"),
        ({"allowed_token_ids": []}, "allowed_token_ids"),
    ):
        with pytest.raises(ValueError, match=words):
            SamplingParams(**kw)
    for kw, words in (
        ({"logit_bias": {VOCAB + 5: 1.0}}, "logit_bias"),
        ({"allowed_token_ids": [VOCAB]}, "allowed_token_ids"),
    ):
        with pytest.raises(ValueError, match=words):
            llm.generate(["x"], SamplingParams(**kw))
    assert llm.get_metrics()["num_free_blocks"] == llm.get_metrics()["num_gpu_blocks"]


@pytest.mark.parametrize(
    "spec",
    [
        {"method": "dflash", "num_speculative_tokens": 4},
        {"method": "draft_model", "num_speculative_tokens": 3},
    ],
    ids=["dflash", "draft_model"],
)
def test_speculative_decoding_is_lossless_with_penalties(
    spec: dict[str, Any], llm: LLM, tiny_qwen3_dir: str, smol_tokenizer: Any, tmp_path_factory: Any
) -> None:
    """Row j of a verify is penalized as if drafts[:j] were already output, so the accepted tokens equal plain
    decoding's with the same penalties."""
    spec = dict(spec)
    if spec["method"] == "dflash":
        spec["model"] = make_dflash(tmp_path_factory.mktemp("lp_dflash"), 64, 4, VOCAB, layer_ids=[0, 2])
    else:
        spec["model"] = tiny_qwen3_dir  # the target drafts its unpenalized picks: often right, sometimes not
    kw = {
        "frequency_penalty": 0.4,
        "presence_penalty": 0.2,
        "repetition_penalty": 1.2,
        "logit_bias": {101: 0.5},
    }
    ids = _ids(smol_tokenizer)
    kw["bad_words"] = [_two_token_word(llm, smol_tokenizer, _engine(llm, ids, **kw))[0]]
    want = _engine(llm, ids, **kw)
    spec_llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=4, speculative_config=spec)
    assert _engine(spec_llm, ids, **kw) == want
    m = spec_llm.get_metrics()
    assert m["spec_decode_num_drafts"] > 0
    if spec["method"] == "draft_model":
        assert 0 < m["spec_decode_num_accepted_tokens"] < m["spec_decode_num_draft_tokens"]


@pytest.fixture(scope="module")
def client(tiny_qwen3_dir: str) -> Iterator[openai.OpenAI]:
    yield from tiny_openai_client(tiny_qwen3_dir)


def test_over_http(client: openai.OpenAI, llm: LLM, smol_tokenizer: Any) -> None:
    ids = _ids(smol_tokenizer)[0]
    kw = {"frequency_penalty": 0.8, "presence_penalty": 0.3}
    r = client.completions.create(
        model="tiny",
        prompt=ids,
        max_tokens=N,
        temperature=0,
        logit_bias={"1234": 2.5},
        extra_body={"ignore_eos": True, "repetition_penalty": 1.2},
        **kw,
    )
    want = _engine(llm, [ids], logit_bias={1234: 2.5}, repetition_penalty=1.2, **kw)[0]
    assert r.choices[0].text == smol_tokenizer.decode(want)
    r = client.completions.create(
        model="tiny", prompt=ids, max_tokens=4, temperature=0, extra_body={"allowed_token_ids": [101, 202]}
    )
    assert r.choices[0].text == smol_tokenizer.decode(
        _engine(llm, [ids], allowed_token_ids=[101, 202])[0][:4]
    )
    for kw2, words in (
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"logit_bias": {"nope": 1}}, "logit_bias"),
        ({"logit_bias": {str(VOCAB + 1): 1}}, "logit_bias"),
    ):
        with pytest.raises(openai.BadRequestError, match=words):
            client.completions.create(model="tiny", prompt="x", max_tokens=2, **kw2)


def _hf_logprobs(hf: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)


def test_prompt_logprobs_match_transformers(tiny_qwen3_dir: str, hf: Any, smol_tokenizer: Any) -> None:
    """Every prompt token's logprob and rank and the top 3, across prefill chunks of 16 tokens and on a prompt
    whose prefix is cached (a prompt-logprobs request computes its whole prompt, as vLLM)."""
    ids = smol_tokenizer(" ".join(PROMPTS) + " and then some more words to make it long").input_ids
    assert len(ids) > 40
    ref = _hf_logprobs(hf, ids)
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=4, max_num_batched_tokens=16)
    sp = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3)
    llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1))  # fills the prefix cache
    for _ in range(2):
        (out,) = llm.generate([{"prompt_token_ids": ids}], sp)
        plp = out.prompt_logprobs
        assert plp is not None and len(plp) == len(ids) and plp[0] is None
        for p in range(1, len(ids)):
            d = plp[p]
            assert d is not None and abs(d[ids[p]].logprob - float(ref[p - 1, ids[p]])) < 1e-4
            v, row = float(ref[p - 1, ids[p]]), ref[p - 1]
            assert int((row > v + 1e-4).sum()) + 1 <= d[ids[p]].rank <= int((row > v - 1e-4).sum()) + 1
            top = sorted(d[t].logprob for t in d if d[t].rank is not None and d[t].rank <= 3)[::-1]
            assert torch.allclose(torch.tensor(top), row.topk(3).values, atol=1e-4)
    assert llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1))[0].prompt_logprobs is None


def test_echo_logprobs_and_prompt_logprobs_over_http(
    client: openai.OpenAI, hf: Any, smol_tokenizer: Any
) -> None:
    """lm-eval's loglikelihood request (echo + logprobs): the echoed prompt's tokens carry their logprobs."""
    ids = _ids(smol_tokenizer)[2]
    ref = _hf_logprobs(hf, ids)
    r = client.completions.create(
        model="tiny", prompt=ids, max_tokens=1, temperature=0, echo=True, logprobs=1
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for p in range(1, len(ids)):
        assert abs(lp.token_logprobs[p] - float(ref[p - 1, ids[p]])) < 1e-4
    assert r.choices[0].text.startswith(smol_tokenizer.decode(ids))
    # streamed (as vLLM): the first chunk leads with the echoed prompt, its tokens and their logprobs
    chunks = list(
        client.completions.create(
            model="tiny", prompt=ids, max_tokens=3, temperature=0, echo=True, logprobs=1, stream=True
        )
    )
    first = chunks[0].choices[0]
    assert first.text.startswith(smol_tokenizer.decode(ids))
    # the prompt's tokens and the first generated one (a loaded server may merge the next ones into this chunk)
    n_gen = len(first.logprobs.tokens) - len(ids)
    assert 1 <= n_gen <= 3 and first.logprobs.token_logprobs[0] is None
    for p in range(1, len(ids)):
        assert abs(first.logprobs.token_logprobs[p] - float(ref[p - 1, ids[p]])) < 1e-4
    assert first.logprobs.token_logprobs[len(ids)] == pytest.approx(lp.token_logprobs[-1], abs=1e-5)
    later = [c.choices[0].logprobs for c in chunks[1:]]
    assert (
        sum(len(x.tokens or []) for x in later if x is not None) == 3 - n_gen
    )  # the other generated tokens, no prompt again
    r = client.completions.create(model="tiny", prompt=ids, max_tokens=1, extra_body={"prompt_logprobs": 0})
    plp = r.choices[0].model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    assert abs(plp[1][str(ids[1])]["logprob"] - float(ref[0, ids[1]])) < 1e-4
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        client.completions.create(
            model="tiny", prompt=ids, max_tokens=1, stream=True, extra_body={"prompt_logprobs": 1}
        )


def test_max_logprobs_bounds_requests(tiny_qwen3_dir: str) -> None:
    """EngineConfig.max_logprobs (vLLM's --max-logprobs, default 20) bounds logprobs and prompt_logprobs; -1: the
    whole vocabulary, and a request may then ask for more than 20."""
    from specserve.errors import RequestValidationError

    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=2, max_logprobs=2)
    for kw in ({"logprobs": 3}, {"prompt_logprobs": 3}):
        with pytest.raises(RequestValidationError, match="greater than max allowed: 2"):
            llm.generate(["a b"], SamplingParams(max_tokens=1, **kw))
    (out,) = llm.generate(["a b"], SamplingParams(max_tokens=1, logprobs=2))
    assert out.outputs[0].logprobs is not None
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=2)
    with pytest.raises(RequestValidationError, match="greater than max allowed: 20"):
        llm.generate(["a b"], SamplingParams(max_tokens=1, logprobs=21))
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=2, max_logprobs=-1)
    (out,) = llm.generate(["a b"], SamplingParams(max_tokens=1, logprobs=30, prompt_logprobs=25))
    assert out.outputs[0].logprobs is not None and len(out.outputs[0].logprobs[0]) >= 30
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs[1]) >= 25

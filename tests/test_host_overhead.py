"""Host-side fast paths of the step loop answer exactly what the plain code does."""

from __future__ import annotations

import random

import pytest

from specserve.engine.engine import fast_decoder

TRICKY = [
    "Héllo wörld, naïve café — “quotes” ‘x’",
    "Emojis 😀🎉👍🏽 🇫🇷 and CJK 你好，世界。日本語",
    "  leading and   inner spaces\tand\ttabs\n\nnewlines ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n    return x ** 2  # ∑ x² ≤ ∞",
]


@pytest.mark.parametrize("skip", [True, False])
def test_fast_decoder_matches_tokenizer_decode(smol_tokenizer, skip):
    dec = fast_decoder(smol_tokenizer)
    assert dec.__name__ == "decode"  # the SmolLM2 tokenizer takes the direct backend path
    rng = random.Random(0)
    for text in TRICKY:
        ids = smol_tokenizer(text).input_ids
        for i in range(len(ids)):
            for j in range(i, len(ids) + 1):
                assert dec(ids[i:j], skip) == smol_tokenizer.decode(ids[i:j], skip_special_tokens=skip)
    for _ in range(200):  # random ids: partial UTF-8 sequences, special tokens anywhere
        ids = [rng.randrange(smol_tokenizer.vocab_size) for _ in range(rng.randrange(1, 8))]
        assert dec(ids, skip) == smol_tokenizer.decode(ids, skip_special_tokens=skip)


def test_fast_decoder_falls_back_when_cleanup_is_on(smol_tokenizer):
    import copy

    tok = copy.copy(smol_tokenizer)
    tok.clean_up_tokenization_spaces = True
    assert fast_decoder(tok).__name__ == "slow_decode"


def test_llm_generate_restores_final_outputs_flag(tiny_llama_dir):
    from specserve import LLM, SamplingParams

    llm = LLM(tiny_llama_dir, max_model_len=256, device="cpu", dtype="float32", max_num_seqs=2)
    assert llm.engine.final_outputs_only is False
    out = llm.generate(["Hello there", "a"], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in out] == [6, 6]
    assert llm.engine.final_outputs_only is False
    # engine users still get a snapshot per step
    llm.engine.add_request("r", "Hello", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    snaps = []
    while llm.engine.has_unfinished_requests():
        snaps += llm.engine.step()
    assert [len(s.outputs[0].token_ids) for s in snaps] == [1, 2, 3]
    assert [s.finished for s in snaps] == [False, False, True]

"""Engine foundation: logits and greedy generations match transformers; batching, prefix caching, chunked
prefill, preemption; sampling; bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import transformers

from specserve import LLM, SamplingParams
from specserve.engine.request import Request

PROMPTS = [
    "Hello there, how are you doing today? I wanted to ask",
    "The capital of France is",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30",
    "Once upon a time",
]


def hf_model(path: str):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_greedy(model, tok, prompt: str, n: int) -> list[int]:
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[1] :].tolist()


def engine_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """Run one full prefill through the paged engine model and return logits for every position."""
    eng = llm.engine
    req = Request("probe", ids, SamplingParams(), max_tokens=1)
    assert eng.block_manager.allocate(req, len(ids))
    runner = eng.runner
    slots = [runner.slot(req.block_table, p) for p in range(len(ids))]
    meta = runner.build_metadata([len(ids)], [len(ids)], [req.block_table], slots)
    with torch.inference_mode():
        h, _ = runner.model(torch.tensor(ids), torch.arange(len(ids)), meta)
        logits = runner.model.compute_logits(h)
    eng.block_manager.free_request(req)
    return logits


@pytest.mark.parametrize("arch", ["tiny_qwen3_dir", "tiny_llama_dir", "tiny_qwen2_dir"])
def test_logits_match_transformers(arch, request, smol_tokenizer):
    path = request.getfixturevalue(arch)
    llm = LLM(path, dtype="float32", device="cpu", num_gpu_blocks=64)
    ids = smol_tokenizer(PROMPTS[0] + " " + PROMPTS[2]).input_ids
    ours = engine_logits(llm, ids)
    with torch.no_grad():
        ref = hf_model(path)(torch.tensor([ids])).logits[0]
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < 1e-4


@pytest.fixture(scope="module")
def qwen3_reference(tiny_qwen3_dir, smol_tokenizer):
    model = hf_model(tiny_qwen3_dir)
    return {p: hf_greedy(model, smol_tokenizer, p, 64) for p in PROMPTS}


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_greedy_matches_transformers_alone_and_batched(tiny_qwen3_dir, qwen3_reference, prefix_caching):
    llm = LLM(
        tiny_qwen3_dir, dtype="float32", device="cpu", enable_prefix_caching=prefix_caching, max_num_seqs=4
    )
    sp = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    alone = llm.generate(PROMPTS[1], sp)[0]
    assert alone.outputs[0].token_ids == qwen3_reference[PROMPTS[1]]
    assert alone.outputs[0].finish_reason == "length"
    batch = llm.generate(PROMPTS, sp)
    assert [o.outputs[0].token_ids for o in batch] == [qwen3_reference[p] for p in PROMPTS]
    # second run of the same prompts: prefix-cache hits (when on) must not change anything
    again = llm.generate(PROMPTS, sp)
    assert [o.outputs[0].token_ids for o in again] == [qwen3_reference[p] for p in PROMPTS]
    m = llm.get_metrics()
    assert (m["prefix_cache_hits"] > 0) == prefix_caching
    # finished requests release every block (cached ones stay hashed but free)
    assert m["kv_cache_usage_perc"] == 0.0 and m["num_free_blocks"] == m["num_gpu_blocks"]


def test_llama_greedy_matches_transformers(tiny_llama_dir, smol_tokenizer):
    model = hf_model(tiny_llama_dir)
    llm = LLM(tiny_llama_dir, dtype="float32", device="cpu")
    sp = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    outs = llm.generate(PROMPTS[:2], sp)
    for p, o in zip(PROMPTS[:2], outs):
        assert o.outputs[0].token_ids == hf_greedy(model, smol_tokenizer, p, 64)


def test_preemption_and_chunked_prefill_keep_outputs(tiny_qwen3_dir, qwen3_reference):
    # 10 blocks of 16 tokens cannot hold 4 sequences of ~30 prompt + 64 output tokens: forces preemption.
    llm = LLM(
        tiny_qwen3_dir,
        dtype="float32",
        device="cpu",
        num_gpu_blocks=10,
        max_num_seqs=4,
        max_num_batched_tokens=16,
    )
    sp = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    outs = llm.generate(PROMPTS, sp)
    assert [o.outputs[0].token_ids for o in outs] == [qwen3_reference[p] for p in PROMPTS]
    m = llm.get_metrics()
    assert m["num_preemptions_total"] > 0
    assert m["num_free_blocks"] == m["num_gpu_blocks"]  # nothing leaked


def test_sampling_seeds_and_top_k(tiny_qwen3_dir):
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu")
    p = PROMPTS[3]
    a = llm.generate(p, SamplingParams(temperature=1.0, seed=7, max_tokens=24, ignore_eos=True))[0]
    b = llm.generate(p, SamplingParams(temperature=1.0, seed=7, max_tokens=24, ignore_eos=True))[0]
    c = llm.generate(p, SamplingParams(temperature=1.0, seed=8, max_tokens=24, ignore_eos=True))[0]
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert a.outputs[0].token_ids != c.outputs[0].token_ids
    greedy = llm.generate(p, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0]
    topk1 = llm.generate(p, SamplingParams(temperature=0.9, top_k=1, seed=3, max_tokens=24, ignore_eos=True))[
        0
    ]
    assert topk1.outputs[0].token_ids == greedy.outputs[0].token_ids
    # a seeded request gives the same tokens when batched with others
    batch = llm.generate(
        [PROMPTS[0], p, PROMPTS[1]],
        [
            SamplingParams(temperature=1.0, max_tokens=24),
            SamplingParams(temperature=1.0, seed=7, max_tokens=24, ignore_eos=True),
            SamplingParams(temperature=0.5, max_tokens=24),
        ],
    )
    assert batch[1].outputs[0].token_ids == a.outputs[0].token_ids


def test_stop_strings_stop_ids_min_tokens_n_logprobs(tiny_qwen3_dir):
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu")
    p = PROMPTS[0]
    full = llm.generate(p, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0].outputs[0]
    # stop string: a piece of the greedy text from its middle
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    if stop.strip():
        cut = llm.generate(p, SamplingParams(temperature=0, max_tokens=40, stop=[stop], ignore_eos=True))[
            0
        ].outputs[0]
        assert cut.finish_reason == "stop" and cut.stop_reason == stop
        assert cut.text == full.text[: full.text.index(stop)]
    # stop token id: the 5th generated token
    tid = full.token_ids[4]
    first = full.token_ids.index(tid)
    out = llm.generate(p, SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[tid]))[0].outputs[0]
    assert out.token_ids == full.token_ids[: first + 1] and out.stop_reason == tid
    # min_tokens forbids the stop token before it is reached
    out = llm.generate(
        p, SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[tid], min_tokens=first + 2)
    )[0]
    assert len(out.outputs[0].token_ids) >= first + 2
    # n=2 with seeds; logprobs of the chosen tokens
    res = llm.generate(
        p, SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=8, logprobs=3, ignore_eos=True)
    )[0]
    assert [c.index for c in res.outputs] == [0, 1]
    assert res.outputs[0].token_ids != res.outputs[1].token_ids
    for c in res.outputs:
        assert len(c.logprobs) == 8
        for tok, lp in zip(c.token_ids, c.logprobs):
            assert tok in lp and lp[tok].logprob <= 0.0 and len(lp) >= 3
    greedy_lp = llm.generate(p, SamplingParams(temperature=0, max_tokens=4, logprobs=1))[0].outputs[0]
    for tok, lp in zip(greedy_lp.token_ids, greedy_lp.logprobs):
        assert lp[tok].rank == 1


def test_eos_from_generation_config_stops(tiny_qwen3_dir):
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu")
    assert 2 in llm.engine.eos_token_ids
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(temperature=0, max_tokens=200))[0]
    comp = out.outputs[0]
    if comp.finish_reason == "stop":
        assert comp.token_ids[-1] == 2
    else:
        assert 2 not in comp.token_ids and len(comp.token_ids) == 200


def test_chat_and_prompt_forms(tiny_qwen3_dir, smol_tokenizer):
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu")
    sp = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    ids = smol_tokenizer(PROMPTS[1]).input_ids
    a, b, c = llm.generate([PROMPTS[1], {"prompt": PROMPTS[1]}, {"prompt_token_ids": ids}], sp)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids == c.outputs[0].token_ids
    assert c.prompt_token_ids == ids
    chat = llm.chat([{"role": "user", "content": "hi"}], sp)[0]
    templ = smol_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True
    )
    templ = templ["input_ids"] if hasattr(templ, "keys") else templ
    assert chat.prompt_token_ids == list(templ)


def test_bad_input_errors(tiny_qwen3_dir, tmp_path):
    llm = LLM(tiny_qwen3_dir, dtype="float32", device="cpu", max_model_len=64)
    with pytest.raises(ValueError, match="maximum context length is 64"):
        llm.generate("word " * 80, SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="maximum context length is 64 tokens. However, you requested 60"):
        llm.generate("word " * 10, SamplingParams(max_tokens=60))
    with pytest.raises(ValueError, match="cannot be greater than max_model_len"):
        llm.generate("hi", SamplingParams(max_tokens=65))
    for bad in (
        dict(temperature=-1),
        dict(top_p=0),
        dict(top_k=-3),
        dict(min_p=2),
        dict(n=0),
        dict(max_tokens=0),
    ):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    # a bad request in a batch is rejected before anything runs; the engine keeps serving
    with pytest.raises(ValueError):
        llm.generate(["hello", "word " * 80], SamplingParams(max_tokens=4))
    assert not llm.engine.has_unfinished_requests()
    ok = llm.generate("hello", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert len(ok.outputs[0].token_ids) == 4
    # engine level: a good request in flight is not disturbed by a bad one added meanwhile
    eng = llm.engine
    eng.add_request("good", "hello there", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    with pytest.raises(ValueError):
        eng.add_request("bad", "word " * 80, SamplingParams(max_tokens=4))
    done = []
    while eng.has_unfinished_requests():
        done += [o for o in eng.step() if o.finished]
    assert [o.request_id for o in done] == ["good"] and len(done[0].outputs[0].token_ids) == 6
    assert eng.get_metrics()["num_free_blocks"] == eng.get_metrics()["num_gpu_blocks"]  # nothing leaked


def test_bad_checkpoints(tmp_path, tiny_qwen3_dir):
    with pytest.raises(ValueError, match="not found"):
        LLM(str(tmp_path / "nope"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="config.json"):
        LLM(str(empty))
    gpt2 = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100)
    ).save_pretrained(gpt2)
    with pytest.raises(ValueError, match="Unsupported architecture 'GPT2LMHeadModel'"):
        LLM(str(gpt2))
    with pytest.raises(ValueError, match="dtype"):
        LLM(tiny_qwen3_dir, dtype="int8")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specserve", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_generate_and_errors(tiny_qwen3_dir, tmp_path):
    r = _cli(
        "generate",
        "--model",
        tiny_qwen3_dir,
        "--prompt",
        "Hello",
        "--max-tokens",
        "5",
        "--dtype",
        "float32",
        "--device",
        "cpu",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(d["token_ids"]) <= 5 and d["prompt"] == "Hello"
    r = _cli("generate", "--model", str(tmp_path / "missing"), "--prompt", "x")
    assert r.returncode == 2 and "not found" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _cli("generate", "--model", tiny_qwen3_dir, "--prompt", "x", "--temperature", "-2", "--device", "cpu")
    assert r.returncode == 2 and "temperature" in r.stderr
    r = _cli(
        "generate",
        "--model",
        tiny_qwen3_dir,
        "--prompt",
        "word " * 300,
        "--max-model-len",
        "64",
        "--max-tokens",
        "8",
        "--device",
        "cpu",
    )
    assert r.returncode == 2 and "maximum context length" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_smollm2_gguf_answers_paris():
    llm = LLM(None, dtype="float32", device="cpu", max_model_len=512, speculative_config=None)
    out = llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0, max_tokens=20),
    )[0]
    assert "Paris" in out.outputs[0].text


def test_incremental_detokenization_matches_full_decode(smol_tokenizer):
    from specserve.engine.engine import LLMEngine, fast_decoder

    class _Eng:
        tokenizer = smol_tokenizer
        _decode = staticmethod(fast_decoder(smol_tokenizer))

    text = "Héllo wörld — ünïcödé 日本語のテキスト 🙂🚀\n```python\ndef f(x):\n    return x**2\n```<|im_end|> tail"
    ids = smol_tokenizer(text).input_ids
    for skip in (True, False):
        req = Request(
            "d", smol_tokenizer("Q: ").input_ids, SamplingParams(skip_special_tokens=skip), max_tokens=999
        )
        full = smol_tokenizer.decode(ids, skip_special_tokens=skip)
        for tok in ids:
            req.token_ids.append(tok)
            LLMEngine._detokenize(_Eng(), req)  # type: ignore[arg-type]
            # never emits a broken multi-byte character, and is always a prefix of the final text
            assert "\ufffd" not in req.output_text and full.startswith(req.output_text)
        assert req.output_text == full


def test_load_format_dummy_needs_only_config(tiny_qwen3_dir, tmp_path):
    import shutil

    cfg_only = tmp_path / "cfg_only"
    cfg_only.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{tiny_qwen3_dir}/{name}", cfg_only / name)
    with pytest.raises(ValueError, match="No weights"):
        LLM(str(cfg_only), device="cpu")
    llm = LLM(str(cfg_only), device="cpu", load_format="dummy")
    out = llm.generate("hello", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 5
    real = LLM(tiny_qwen3_dir, device="cpu").generate(
        "hello", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    )[0]
    assert out.outputs[0].token_ids != real.outputs[0].token_ids  # random weights, not the checkpoint's

"""Drafter training (`specserve train dflash|eagle3`): data, masks, objectives, resume, export, DDP."""

from __future__ import annotations

import json
import os
import random
import socket

import pytest
import torch

from specserve.train.cli import main, parse_args, run
from specserve.train.data import (
    EngineGenerator,
    HFGenerator,
    Sample,
    check_not_eval_set,
    clean_question,
    load_prompts,
    load_samples,
    pick_mask_token_id,
    self_question_prompts,
)
from specserve.train.export import export_drafter, load_drafter
from specserve.train.losses import (
    Eagle3Objective,
    build_dflash_blocks,
    chain_acceptance,
    prefix_products,
    reach_weights,
    sample_anchors,
)
from specserve.train.models import (
    DFlashConfig,
    DFlashDrafter,
    Eagle3Config,
    Eagle3Drafter,
    apply_rope,
    grow_dflash,
)
from specserve.train.target import TrainError

VOCAB, HIDDEN = 256, 64
CYCLE = [17, 42, 99, 123, 7, 200, 64]


@pytest.fixture(autouse=True)
def _one_thread():
    # tiny tensors: one intra-op thread avoids oversubscription on small CI boxes
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _write_data(path: str, n: int = 48, seed: int = 0) -> None:
    """Repetitive synthetic samples: random prompt, then a fixed token cycle from a random phase, then EOS."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            p = [1] + [rng.randrange(10, 250) for _ in range(rng.randrange(3, 10))]
            ph = rng.randrange(len(CYCLE))
            r = [CYCLE[(ph + k) % len(CYCLE)] for k in range(rng.randrange(24, 40))] + [2]
            f.write(json.dumps({"input_ids": p + r, "loss_mask": [0] * len(p) + [1] * len(r)}) + "\n")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("tiny_llama")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        eos_token_id=2,
        bos_token_id=1,
    )
    LlamaForCausalLM(cfg).save_pretrained(str(d))
    data = str(d / "data.jsonl")
    _write_data(data)
    return {"target": str(d), "data": data}


def _dflash_args(tiny: dict[str, str], out: str, *extra: str) -> list[str]:
    return [
        "dflash", "--target", tiny["target"], "--data", tiny["data"], "--output", out, "--num-layers", "2",
        "--block-size", "4", "--num-anchors", "16", "--batch-size", "8", "--lr", "3e-3", "--log-every", "5",
        "--target-layer-ids", "0", "2", "--no-progress", "--save-every", "0", *extra,
    ]  # fmt: skip


def _eagle_args(tiny: dict[str, str], out: str, *extra: str) -> list[str]:
    return [
        "eagle3", "--target", tiny["target"], "--data", tiny["data"], "--output", out, "--ttt-steps", "3",
        "--batch-size", "8", "--lr", "3e-3", "--log-every", "5", "--no-progress", "--save-every", "0", *extra,
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------ data


def test_eval_guard_refuses_eval_sets(tmp_path, capsys):
    for name in ("mt_bench_question.jsonl", "gsm8k_test.jsonl", "math500_test.jsonl", "HumanEval.jsonl.gz"):
        with pytest.raises(TrainError):
            check_not_eval_set(str(tmp_path / name))
    with pytest.raises(TrainError):
        check_not_eval_set(str(tmp_path / "eagle" / "alpaca.jsonl"))
    check_not_eval_set(str(tmp_path / "gsm8k_train.jsonl"))  # allowed
    bad = tmp_path / "mt_bench_question.jsonl"
    bad.write_text(json.dumps({"turns": ["hi"], "category": "writing"}) + "\n")
    rc = main(["dflash", "--prompts", str(bad), "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and "evaluation set" in err
    assert not (tmp_path / "o" / "data.jsonl").exists()


def test_cli_user_errors_return_2(tmp_path, tiny, capsys):
    assert main(["dflash", "--prompts", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path)]) == 2
    assert main(_dflash_args(tiny, str(tmp_path / "o"), "--block-size", "1")) == 2
    assert main(["medusa", "--output", str(tmp_path)]) == 2
    assert main(_eagle_args(tiny, str(tmp_path / "o"), "--target-layer-ids", "1", "2")) == 2
    assert main(_eagle_args(tiny, str(tmp_path / "o"), "--position-weight", "prefix")) == 2
    errs = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(errs) == 5 and all(e.startswith("specserve train: error:") for e in errs)
    assert "--position-weight is a DFlash option" in errs[-1]


def test_load_prompts_formats(tmp_path):
    (tmp_path / "spec_bench_question.jsonl").write_text(
        "\n".join(
            json.dumps({"category": c, "turns": [f"{c} question", "second turn"]})
            for c in ("writing", "math_reasoning", "translation", "qa", "mt_bench")
        )
    )
    (tmp_path / "gsm8k_train.jsonl").write_text(
        "\n".join(json.dumps({"question": f"What is {i}+1?", "answer": "x"}) for i in range(6))
    )
    (tmp_path / "mbpp_sanitized.json").write_text(
        json.dumps([{"task_id": i, "prompt": f"Write function {i}."} for i in (2, 11, 12, 600)])
    )
    (tmp_path / "mbpp_sanitized_test.jsonl").write_text(
        "\n".join(json.dumps({"task_id": i, "prompt": "t"}) for i in (11, 12))
    )
    (tmp_path / "tinyshakespeare.txt").write_text(
        "\n".join(f"ROMEO: line number {i} of the play" for i in range(200))
    )
    sb = load_prompts([str(tmp_path / "spec_bench_question.jsonl")])
    assert sorted(sb) == ["qa question", "translation question"]
    mb = load_prompts([str(tmp_path / "mbpp_sanitized.json")])
    assert sorted(mb) == ["Write function 2.", "Write function 600."]
    gs = load_prompts([str(tmp_path / "gsm8k_train.jsonl") + ":4"])
    assert len(gs) == 4 and all(g.startswith("What is") for g in gs)
    assert sum("\\boxed{}" in g for g in gs) == 2
    # --gsm8k-suffix none / all: the same capped selection, without / with the instruction on every prompt
    for mode, n_boxed in (("none", 0), ("all", 4)):
        other = load_prompts([str(tmp_path / "gsm8k_train.jsonl") + ":4"], gsm8k_suffix=mode)
        assert sum("\\boxed{}" in g for g in other) == n_boxed
        assert sorted(g.split("\n")[0] for g in other) == sorted(g.split("\n")[0] for g in gs)
    with pytest.raises(TrainError):
        load_prompts([str(tmp_path / "gsm8k_train.jsonl")], gsm8k_suffix="some")
    sh = load_prompts([str(tmp_path / "tinyshakespeare.txt") + ":3"])
    assert len(sh) == 3 and all(s.startswith("Continue this scene in the same style:\nROMEO") for s in sh)


def test_mask_token_pick_avoids_data_and_stop_tokens():
    class Tok:
        eos_token_id, bos_token_id, pad_token_id, unk_token_id = 2, 1, 2, 0
        all_special_ids = [0, 1, 2, 5]
        added_tokens_decoder = {}

    samples = [Sample([1, 0, 3, 4], [0, 0, 1, 1])]
    assert pick_mask_token_id(Tok(), samples, 100) == 5  # pad = eos, unk occurs in data
    assert pick_mask_token_id(None, samples, 100) == 99


def _tiny_tokenizer_target(tmp_path) -> str:
    from drafters import tiny_chat_target

    words = ["write", "a", "poem", "about", "cats", "dogs", "the", "sea", "why", "is", "sky", "blue", "?"]
    return tiny_chat_target(
        tmp_path / "tiny_qwen3", words, seed=1, vocab_size=64, num_layers=2, max_position=256
    )


def test_generate_with_hf_generator(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = _tiny_tokenizer_target(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps({"question": q}) for q in ("write a poem about cats", "why is the sky blue ?", "a")
        )
    )
    out = tmp_path / "out"
    args = [
        "dflash",
        "--target",
        target,
        "--prompts",
        str(prompts),
        "--output",
        str(out),
        "--generator",
        "hf",
    ]
    args += ["--max-new-tokens", "6", "--gen-batch-size", "2", "--generate-only", "--dtype", "float32"]
    assert main(args) == 0
    samples = load_samples(str(out / "data.jsonl"))
    assert len(samples) == 3
    meta = json.loads((out / "data.jsonl.meta.json").read_text())
    assert meta["generator"] == "hf" and meta["prompts"] == 3 and meta["max_new_tokens"] == 6
    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    for s in samples:
        n_prompt = s.loss_mask.index(1)
        assert all(m == 0 for m in s.loss_mask[:n_prompt]) and all(m == 1 for m in s.loss_mask[n_prompt:])
        prompt = s.input_ids[:n_prompt]
        assert prompt[:2] == [1, tok.convert_tokens_to_ids("user")] and prompt[-2:] == [1, 4]
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=2)
        ref_resp = ref[0, n_prompt:].tolist()
        if 2 in ref_resp:
            ref_resp = ref_resp[: ref_resp.index(2) + 1]
        assert s.input_ids[n_prompt:] == ref_resp
    # two spawned generator processes (prompts sharded round-robin) produce the same samples
    args2 = [x if x != str(out) else str(tmp_path / "out2") for x in args] + ["--gen-procs", "2"]
    assert main(args2) == 0
    again = load_samples(str(tmp_path / "out2" / "data.jsonl"))
    assert sorted(x.input_ids for x in again) == sorted(x.input_ids for x in samples)
    # padded batches (batch 2, different prompt lengths) give the same tokens as one-by-one generation
    gen = HFGenerator(model, [2], 0, batch_size=3)
    assert gen.generate([samples[0].input_ids[:5], samples[1].input_ids[:9]], 4, 0.0) == [
        HFGenerator(model, [2], 0, batch_size=1).generate([samples[i].input_ids[:n]], 4, 0.0)[0]
        for i, n in ((0, 5), (1, 9))
    ]


def test_engine_generator_matches_hf_generator(tmp_path):
    """specserve's own engine (LLM.generate on prompt_token_ids) and HF generate give the same greedy data."""
    target = _tiny_tokenizer_target(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"turns": [q, "x"]}) for q in ("write a poem about cats", "why ?", "a"))
    )
    got = {}
    for g in ("engine", "hf"):
        args = ["dflash", "--target", target, "--prompts", str(prompts), "--output", str(tmp_path / g)]
        args += ["--generator", g, "--max-new-tokens", "6", "--gen-batch-size", "2", "--generate-only"]
        assert main(args + ["--dtype", "float32", "--device", "cpu"]) == 0
        got[g] = sorted(s.input_ids for s in load_samples(str(tmp_path / g / "data.jsonl")))
    assert len(got["engine"]) == 3 and got["engine"] == got["hf"]


def test_prompt_repeats_sample_distinct_answers(tmp_path, capsys):
    """--prompt-repeats R answers each file prompt R times with its own sampling seed (so sampled data can grow
    past the prompt files); with greedy generation the repeats would be copies, which is a one-line error."""
    target = _tiny_tokenizer_target(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"question": q}) for q in ("write a poem about cats", "why ?")))
    args = ["dflash", "--target", target, "--prompts", str(prompts), "--output", str(tmp_path / "o")]
    args += ["--generator", "engine", "--max-new-tokens", "12", "--gen-batch-size", "4", "--generate-only"]
    args += ["--dtype", "float32", "--device", "cpu", "--prompt-repeats", "3"]
    assert main(args) == 2
    assert "--gen-temperature" in capsys.readouterr().err
    assert main(args + ["--gen-temperature", "1.5"]) == 0
    samples = load_samples(str(tmp_path / "o" / "data.jsonl"))
    assert len(samples) == 6
    by_prompt: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for x in samples:
        n = x.loss_mask.index(1)
        by_prompt.setdefault(tuple(x.input_ids[:n]), []).append(tuple(x.input_ids[n:]))
    assert sorted(len(v) for v in by_prompt.values()) == [3, 3]
    assert all(len(set(v)) > 1 for v in by_prompt.values())  # the repeats sampled different answers
    meta = json.loads((tmp_path / "o" / "data.jsonl.meta.json").read_text())
    assert meta["prompt_repeats"] == 3 and meta["gsm8k_suffix"] == "half" and meta["prompts"] == 6
    # --gen-seed: the same prompts (same --seed), other sampling seeds -> other answers; the same one -> the same
    for out, gen_seed in (("o2", "0"), ("o3", "100000")):
        a2 = [x if x != str(tmp_path / "o") else str(tmp_path / out) for x in args]
        assert main(a2 + ["--gen-temperature", "1.5", "--gen-seed", gen_seed]) == 0
    same = load_samples(str(tmp_path / "o2" / "data.jsonl"))
    other = load_samples(str(tmp_path / "o3" / "data.jsonl"))
    assert [x.input_ids for x in same] == [x.input_ids for x in samples]
    assert [x.input_ids for x in other] != [x.input_ids for x in samples]
    assert {tuple(x.input_ids[: x.loss_mask.index(1)]) for x in other} == set(by_prompt)


def test_several_data_files_train_together(tmp_path, tiny):
    """--data A B: one run trains on both files' samples; training.json records each file and its generation."""
    second = tmp_path / "more.jsonl"
    _write_data(str(second), n=16, seed=1)
    (tmp_path / "more.jsonl.meta.json").write_text(json.dumps({"temperature": 0.7, "prompt_repeats": 2}))
    args = _dflash_args(tiny, str(tmp_path / "o"), "--max-steps", "2", "--epochs", "100")
    i = args.index("--data")
    args[i + 1 : i + 2] = [tiny["data"], str(second)]
    res = run(parse_args(args))
    info = json.loads((tmp_path / "o" / "training.json").read_text())
    assert info["data"]["samples"] == 48 + 16 and res.metrics["steps"] == 2
    files = info["data"]["generation"]["files"]
    assert [f["samples"] for f in files] == [48, 16] and files[1]["generation"]["prompt_repeats"] == 2
    assert info["data"]["path"] == [os.path.abspath(tiny["data"]), os.path.abspath(str(second))]
    bad = args.copy()
    bad[i + 2] = str(tmp_path / "missing.jsonl")
    assert main(bad) == 2


# ------------------------------------------------------------------------------------------ DFlash mask


def _dflash(block: int = 4, layers: int = 2) -> DFlashDrafter:
    torch.manual_seed(0)
    cfg = DFlashConfig(
        hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, target_layer_ids=[0, 2], num_target_layers=4,
        target_hidden_size=HIDDEN, block_size=block, mask_token_id=255,
    )  # fmt: skip
    d = DFlashDrafter(cfg)
    for p in d.parameters():  # non-trivial norms
        if p.dim() == 1:
            p.data.uniform_(0.5, 1.5)
    return d.eval()


def _block_logits(d, embed, head, taps, ids, anchors, backend="split"):
    b, s = ids.shape
    mask = torch.ones_like(ids)
    valid = torch.ones_like(anchors, dtype=torch.bool)
    blk = build_dflash_blocks(ids, mask, anchors, valid, d.config.block_size, d.config.mask_token_id)
    emb = torch.nn.functional.embedding(blk["block_ids"], embed)
    ctx_pos = torch.arange(s).expand(b, s)
    h = d(emb, taps, blk["positions"], ctx_pos, blk["mask"], backend)
    return (h @ head.T).view(b, anchors.shape[1], d.config.block_size, -1)


def test_dflash_block_attention_mask():
    d = _dflash()
    torch.manual_seed(1)
    s, k = 20, 4
    embed, head = torch.randn(VOCAB, HIDDEN), torch.randn(VOCAB, HIDDEN)
    taps = torch.randn(1, s, 2 * HIDDEN)
    ids = torch.randint(3, 250, (1, s))
    anchors = torch.tensor([[6, 12, 3]])
    with torch.no_grad():
        base = _block_logits(d, embed, head, taps, ids, anchors)
        # split (efficient) and dense-mask SDPA backends agree
        dense = _block_logits(d, embed, head, taps, ids, anchors, backend="sdpa")
        torch.testing.assert_close(base, dense, rtol=1e-4, atol=1e-4)
        # context at positions >= anchor (and later tokens) cannot influence block 0 (anchor 6)
        taps2, ids2 = taps.clone(), ids.clone()
        taps2[:, 6:] += torch.randn_like(taps2[:, 6:]) * 3
        ids2[0, 7:] = torch.randint(3, 250, (s - 7,))  # keeps x_6 (block 0's first token)
        pert = _block_logits(d, embed, head, taps2, ids2, anchors)
        torch.testing.assert_close(pert[:, 0], base[:, 0], rtol=0, atol=1e-5)
        assert not torch.allclose(pert[:, 1], base[:, 1], atol=1e-3)  # anchor 12 does see positions 6..11
        # context just before the anchor IS visible
        taps3 = taps.clone()
        taps3[:, 5] += 3.0
        assert not torch.allclose(
            _block_logits(d, embed, head, taps3, ids, anchors)[:, 0], base[:, 0], atol=1e-3
        )
        # its own block is visible (non-causal): changing x_a changes every position of that block only
        ids4 = ids.clone()
        ids4[0, 6] = (ids[0, 6] + 1) % 250 + 3
        own = _block_logits(d, embed, head, taps, ids4, anchors)
        for j in range(k):
            assert not torch.allclose(own[0, 0, j], base[0, 0, j], atol=1e-4)
        torch.testing.assert_close(own[:, 2], base[:, 2], rtol=0, atol=1e-5)  # anchor 3 never sees 6
        # training forward == an inference-style pass with only the context before the anchor
        a = 12
        short = taps[:, : a + 1].clone()
        short[:, a] = torch.randn(2 * HIDDEN) * 5  # position a itself is not visible either
        alone = _block_logits(d, embed, head, short, ids[:, : a + 1], torch.tensor([[a]]))
        torch.testing.assert_close(alone[:, 0], base[:, 1], rtol=1e-4, atol=1e-4)


def test_grow_dflash_keeps_the_function_then_trains_the_new_capacity():
    """Widened MLPs (zero new down-projection columns) and appended layers (zero o_proj / down_proj) compute
    what the smaller drafter did; the new weights get gradients; shrinking is refused."""
    import copy

    d = _dflash(layers=2)
    torch.manual_seed(3)
    embed, head = torch.randn(VOCAB, HIDDEN), torch.randn(VOCAB, HIDDEN)
    ids = torch.randint(3, VOCAB, (2, 24))
    taps = torch.randn(2, 24, 2 * HIDDEN)
    anchors = torch.tensor([[3, 9, 15], [5, 11, 17]])
    before = _block_logits(d, embed, head, taps, ids, anchors)
    g = copy.deepcopy(d)
    assert grow_dflash(g, 4, 160) and not grow_dflash(g, None, None)
    assert len(g.layers) == 4 and g.config.num_hidden_layers == 4 and g.config.intermediate_size == 160
    assert all(layer.mlp.down_proj.weight.shape == (HIDDEN, 160) for layer in g.layers)
    torch.testing.assert_close(
        _block_logits(g, embed, head, taps, ids, anchors), before, atol=1e-4, rtol=1e-5
    )
    g.train()
    _block_logits(g, embed, head, taps, ids, anchors).logsumexp(-1).mean().backward()
    new_layer, wide = g.layers[3], g.layers[0].mlp
    assert new_layer.self_attn.o_proj.weight.grad.abs().sum() > 0
    assert wide.down_proj.weight.grad[:, 96:].abs().sum() > 0
    with pytest.raises(ValueError, match="shrink"):
        grow_dflash(copy.deepcopy(d), 1, None)
    # more taps: the fused-feature projection gets zero columns for layers 1 and 3, which it then learns to use
    t = copy.deepcopy(d)
    assert grow_dflash(t, None, None, [0, 1, 2, 3]) and not grow_dflash(t, None, None, [0, 1, 2, 3])
    assert t.config.target_layer_ids == [0, 1, 2, 3] and t.fc.weight.shape == (HIDDEN, 4 * HIDDEN)
    extra = torch.randn(2, 24, HIDDEN) * 3
    taps4 = torch.cat([taps[..., :HIDDEN], extra, taps[..., HIDDEN:], -extra], -1)
    torch.testing.assert_close(
        _block_logits(t, embed, head, taps4, ids, anchors), before, atol=1e-4, rtol=1e-5
    )
    t.train()
    _block_logits(t, embed, head, taps4, ids, anchors).logsumexp(-1).mean().backward()
    assert t.fc.weight.grad[:, HIDDEN : 2 * HIDDEN].abs().sum() > 0
    for bad in ([0, 1], [2, 0, 3], [0, 0, 2]):  # drops a tap / unsorted / repeated
        with pytest.raises(ValueError, match="keep the drafter's taps"):
            grow_dflash(copy.deepcopy(d), None, None, bad)


def test_int8_rows_roundtrip_and_state():
    from specserve.loading import int8

    torch.manual_seed(0)
    w = torch.randn(48, 80) * torch.logspace(-3, 1, 48)[:, None]  # rows of very different scales
    w[5] = 0.0
    q, scale = int8.quantize_rows(w)
    assert q.dtype == torch.int8 and scale.shape == (48, 1) and q.abs().max() == 127
    err = (int8.dequantize(q, scale, torch.float32) - w).abs()
    assert bool((err <= scale * 0.5 + 1e-12).all()) and torch.count_nonzero(q[5]) == 0
    state = {"a.weight": w, "norm.weight": torch.ones(80), "d2t": torch.arange(4)}
    packed = int8.quantize_state(state)
    assert sorted(packed) == ["a.weight", "a.weight_scale", "d2t", "norm.weight"]
    back = int8.dequantize_state(packed, torch.float32)
    assert sorted(back) == sorted(state) and torch.equal(back["d2t"], state["d2t"])
    torch.testing.assert_close(back["a.weight"], w, atol=float(scale.max()) / 2, rtol=0)
    assert int8.dequantize_state(state, torch.float32).keys() == state.keys()
    with pytest.raises(ValueError):
        int8.quantize_rows(torch.randn(3))


def test_dflash_anchor_sampling_and_labels():
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0, 0, 0]])
    ids = torch.arange(16).view(2, 8) + 10
    g = torch.Generator().manual_seed(0)
    anchors, valid = sample_anchors(mask, 8, g)
    assert anchors.shape == (2, 3)  # most valid anchors in the batch: row 0 has {2, 3, 4}
    assert anchors[0].tolist() == [2, 3, 4] and valid[0].all()  # sorted ascending
    assert valid[1].tolist() == [True, False, False] and anchors[1].tolist() == [1, 0, 0]  # valid first
    blk = build_dflash_blocks(ids, mask, anchors, valid, 4, 255)
    row = anchors[0].tolist().index(3)
    assert blk["block_ids"][0, row * 4 : row * 4 + 4].tolist() == [13, 255, 255, 255]
    assert blk["labels"][0, row].tolist() == [13, 14, 15, 16]
    assert blk["label_ok"][0, row].tolist() == [False, True, True, False]  # position 6 is outside the mask
    assert blk["mask"].ctx_mask()[0, row * 4].tolist() == [True] * 3 + [False] * 5
    assert not blk["mask"].ctx_mask()[1, 4:].any()  # invalid anchors see no context


# ------------------------------------------------------------------------------------------ DFlash attention backends


# torch warns (once) that eager flex_attention is unfused; on CPU that is the point
_eager_flex = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.fixture
def flex_cpu_backward(monkeypatch):
    """torch refuses FlexAttention backward on CPU (compiled or eager) in ``_validate_device``; its eager
    path (unfused math reference, HOP autograd) does differentiate correctly, so tests skip that check to
    exercise the flex mask plumbing end to end. On CUDA the compiled Triton kernels run instead."""
    import torch.nn.attention.flex_attention as fa

    monkeypatch.setattr(fa, "_validate_device", lambda *a: None)


def _dense_tiles(n: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    cols = torch.arange(idx.shape[-1])
    dense = torch.zeros(*idx.shape, dtype=torch.bool)
    dense.scatter_(-1, idx.long(), (cols < n[..., None]).expand_as(idx))
    return dense


@_eager_flex
def test_flex_block_mask_tiles_match_create_block_mask():
    """The directly built tile structure equals create_block_mask's (which evaluates mask_mod densely), for
    blocks dividing the 128-tile and not, sorted and unsorted anchors, invalid ones, S not a multiple of 128."""
    from torch.nn.attention.flex_attention import create_block_mask

    from specserve.train.models import BlockVisibility

    g = torch.Generator().manual_seed(0)
    for block, n, s in [(4, 40, 150), (6, 30, 300), (16, 9, 100), (128, 3, 500)]:
        for ordered in (True, False):
            ctx_len = torch.randint(0, s + 1, (3, n), generator=g)
            ctx_len[0, -2:] = 0  # invalid anchors: no context
            if ordered:
                ctx_len = ctx_len.sort(dim=1).values
            fm = BlockVisibility(ctx_len, block, s).flex()
            bm = fm.block_mask
            assert fm.ctx_pad >= s and fm.ctx_pad % 128 == 0 and fm.q_pad >= n * block and fm.q_pad % 128 == 0
            ref = create_block_mask(bm.mask_mod, 3, None, fm.q_pad, fm.ctx_pad + fm.q_pad, device="cpu")
            part, full = (
                _dense_tiles(bm.kv_num_blocks, bm.kv_indices),
                _dense_tiles(bm.full_kv_num_blocks, bm.full_kv_indices),
            )
            rpart = _dense_tiles(ref.kv_num_blocks, ref.kv_indices)
            rfull = _dense_tiles(ref.full_kv_num_blocks, ref.full_kv_indices)
            assert torch.equal(part | full, rpart | rfull), (block, n, s, ordered)
            assert not (full & ~rfull).any() and not (part & full).any()
            if block < 128:
                assert torch.equal(full, rfull)
            # the transposed (backward) indices agree with the forward ones
            q_dense = _dense_tiles(bm.q_num_blocks, bm.q_indices).transpose(-1, -2)
            assert torch.equal(q_dense[..., : part.shape[-2], :], part)
            # the dense mask_mod equals the backends' visibility (ctx_mask + own block), padding excluded
            q_len = n * block
            qi, kv = torch.arange(fm.q_pad)[:, None], torch.arange(fm.ctx_pad + fm.q_pad)[None]
            dense = torch.stack([bm.mask_mod(torch.tensor(b), 0, qi, kv) for b in range(3)])
            ctx = BlockVisibility(ctx_len, block, s).ctx_mask()
            assert torch.equal(dense[:, :q_len, :s], ctx) and not dense[:, :q_len, s : fm.ctx_pad].any()
            bid = torch.arange(q_len) // block
            assert torch.equal(dense[0, :q_len, fm.ctx_pad : fm.ctx_pad + q_len], bid[:, None] == bid[None])
            assert not dense[:, :q_len, fm.ctx_pad + q_len :].any()


def _backend_case(b: int = 3, s: int = 37):
    torch.manual_seed(3)
    ids = torch.randint(3, 250, (b, s))
    mask = torch.ones(b, s, dtype=torch.long)
    mask[1, 20:] = 0
    mask[2, :30] = 0  # few valid anchors: row 2 gets invalid ones
    taps = torch.randn(b, s, 2 * HIDDEN)
    embed, head = torch.randn(VOCAB, HIDDEN), torch.randn(VOCAB, HIDDEN) * 0.2
    anchors, valid = sample_anchors(mask, 12, torch.Generator().manual_seed(0))
    assert not valid.all() and valid.any(dim=1).all()
    return ids, mask, taps, embed, head, anchors, valid


@_eager_flex
def test_attention_backends_agree_values_and_grads(flex_cpu_backward):
    """flex == split == sdpa (fp32, block 4, GQA 2:1, S=37, invalid anchors): hidden states of every query,
    the DFlash loss, and the gradients of the loss and of all outputs w.r.t. every drafter parameter."""
    from specserve.train.losses import DFlashObjective

    d = _dflash()
    ids, mask, taps, embed, head, anchors, valid = _backend_case()
    b, s = ids.shape
    got = {}
    for backend in ("sdpa", "split", "flex"):
        obj = DFlashObjective(d, embed, head, backend=backend)
        d.zero_grad()
        loss, stats = obj(taps, ids, mask, anchors, valid)
        loss.backward()
        g_loss = {n: p.grad.clone() for n, p in d.named_parameters()}
        d.zero_grad()
        blk = build_dflash_blocks(ids, mask, anchors, valid, 4, 255)
        emb = torch.nn.functional.embedding(blk["block_ids"], embed)
        h = d(emb, taps, blk["positions"], torch.arange(s).expand(b, s), blk["mask"], backend)
        (h * torch.linspace(-1, 1, h.shape[-1])).square().sum().backward()  # every row, invalid ones too
        g_all = {n: p.grad.clone() for n, p in d.named_parameters()}
        got[backend] = (h.detach(), loss.detach(), stats, g_loss, g_all)
    ref = got["sdpa"]
    for backend in ("split", "flex"):
        h, loss, stats, g_loss, g_all = got[backend]
        assert torch.isfinite(h).all() and torch.isfinite(loss)
        torch.testing.assert_close(h, ref[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(loss, ref[1], rtol=1e-5, atol=1e-6)
        for k in ("pos_correct", "pos_total", "chains"):
            assert torch.equal(stats[k], ref[2][k]), (backend, k)
        for name in g_loss:
            assert torch.isfinite(g_loss[name]).all() and torch.isfinite(g_all[name]).all(), (backend, name)
            torch.testing.assert_close(
                g_loss[name], ref[3][name], rtol=1e-3, atol=1e-6, msg=f"{backend} {name}"
            )
            torch.testing.assert_close(
                g_all[name], ref[4][name], rtol=1e-3, atol=1e-5, msg=f"{backend} {name}"
            )
    with pytest.raises(TypeError, match="BlockVisibility"):  # flex needs the structured mask
        blk = build_dflash_blocks(ids, mask, anchors, valid, 4, 255)
        d(torch.nn.functional.embedding(blk["block_ids"], embed), taps, blk["positions"],
          torch.arange(s).expand(b, s), blk["mask"].ctx_mask(), "flex")  # fmt: skip


def test_anchor_order_is_sorted_and_keeps_the_sampled_set():
    """Sorting only reorders the anchors that the same random draw selects (resume / RNG unchanged)."""
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    mask = (torch.rand(4, 60, generator=torch.Generator().manual_seed(1)) > 0.3).long()
    mask[3] = 0
    mask[3, 10:14] = 1
    anchors, valid = sample_anchors(mask, 16, g1)
    lm = mask.bool()
    ok = torch.zeros_like(lm)
    ok[:, :-1] = lm[:, :-1] & lm[:, 1:]
    scores = torch.rand(4, 60, generator=g2).masked_fill(~ok, -1.0)
    vals, idx = scores.topk(anchors.shape[1], dim=1)
    for r in range(4):
        a = anchors[r][valid[r]]
        assert a.tolist() == sorted(idx[r][vals[r] >= 0].tolist())
        assert valid[r].tolist() == sorted(valid[r].tolist(), reverse=True)  # valid first
        assert (anchors[r][~valid[r]] == 0).all()
    assert torch.equal(g1.get_state(), g2.get_state())


# ------------------------------------------------------------------------------------------ EAGLE-3 TTT


def test_eagle3_ttt_matches_naive_chain_drafting():
    """Training step j at index t equals drafting a chain by hand: step-0 keys at indices <= t, plus the
    chain's own step-1..j keys; positions t+j; hidden = previous step's pre-norm output."""
    torch.manual_seed(0)
    cfg = Eagle3Config(
        hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=VOCAB, target_layer_ids=[0, 1, 2], num_target_layers=4, target_hidden_size=HIDDEN,
    )  # fmt: skip
    d = Eagle3Drafter(cfg).eval()
    s, steps = 12, 3
    embed, head = torch.randn(VOCAB, HIDDEN), torch.randn(VOCAB, HIDDEN)
    taps = torch.randn(1, s, 3 * HIDDEN)
    ids = torch.randint(3, 250, (1, s))
    captured = []
    orig_step = d.step

    def spy(*a, **kw):
        out = orig_step(*a, **kw)
        captured.append(out.detach())
        return out

    d.step = spy  # type: ignore[method-assign]
    obj = Eagle3Objective(d, embed, head, ttt_steps=steps)
    with torch.no_grad():
        obj(taps, ids, torch.ones_like(ids))
    d.step = orig_step  # type: ignore[method-assign]

    layer = d.midlayer
    att = layer.self_attn

    def qkv(tok: int, hid: torch.Tensor, pos: int):
        x = torch.cat([layer.input_layernorm(embed[tok]), layer.hidden_norm(hid)])
        cos, sin = d.rotary(torch.tensor([[pos]]))
        q = apply_rope(att.q_proj(x).view(1, 4, 1, 16), cos, sin)[0, :, 0]
        k = apply_rope(att.k_proj(x).view(1, 2, 1, 16), cos, sin)[0, :, 0]
        return q, k, att.v_proj(x).view(2, 16)

    def finish(hid, q, keys, vals):
        o = []
        for h in range(4):
            kk = torch.stack([k[h // 2] for k in keys])
            vv = torch.stack([v[h // 2] for v in vals])
            o.append(torch.softmax(kk @ q[h] / 4.0, 0) @ vv)
        h1 = hid + att.o_proj(torch.cat(o))
        return h1 + layer.mlp(layer.post_attention_layernorm(h1))

    with torch.no_grad():
        f = d.combine(taps)[0]
        k0, v0 = [], []
        for t in range(s):
            tok = int(ids[0, t + 1]) if t + 1 < s else 0
            _, k, v = qkv(tok, f[t], t)
            k0.append(k)
            v0.append(v)
        for t in (0, 4, 8):
            keys, vals = k0[: t + 1], v0[: t + 1]
            hid = f[t]
            for j in range(steps):
                tok = int(ids[0, t + 1 + j])
                q, k, v = qkv(tok, hid, t + j)
                if j > 0:
                    keys, vals = keys + [k], vals + [v]
                hid = finish(hid, q, keys, vals)
                torch.testing.assert_close(captured[j][0, t], hid, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------ training


def _first_last(history: list[dict]) -> tuple[dict, dict]:
    return history[0], history[-1]


def test_dflash_training_reduces_loss(tmp_path, tiny):
    res = run(parse_args(_dflash_args(tiny, str(tmp_path / "o"), "--max-steps", "40", "--epochs", "100")))
    first, last = _first_last(res.metrics["history"])
    # the tiny target's LM head has small random weights, so CE falls slowly while top-1 accuracy rises fast
    assert last["loss"] < first["loss"] - 0.5, res.metrics["history"]
    assert last["acc"][0] > 0.8 and last["tau"] > first["tau"] + 1.0
    info = json.loads((tmp_path / "o" / "training.json").read_text())
    assert info["data"]["samples"] == 48 and info["train"]["steps"] == 40 and info["history"]
    assert info["train"]["attn_backend"] == "split"  # auto on CPU


def test_prefix_position_weights():
    """--position-weight prefix: each labelled offset weighted by a detached product over its block's earlier
    offsets of exp(label logit - top logit) (1 where the greedy pick is right; unlabelled offsets count as
    reached); chunked_cross_entropy returns those gaps."""
    p = torch.tensor([[1.0, 0.5, 0.2, 0.9], [1.0, 1.0, 0.25, 1.0]])
    assert torch.allclose(prefix_products(p), torch.tensor([[1.0, 1.0, 0.5, 0.1], [1.0, 1.0, 1.0, 0.25]]))
    # two blocks of 4: offset 0 (the anchor) never labelled; block 1's offset 3 past the end
    flat_ok = torch.tensor([False, True, True, True, False, True, True, False])
    reach = torch.tensor([0.5, 0.2, 0.9, 0.8, 0.25])
    w = reach_weights(-reach.log(), flat_ok, 4)
    assert torch.allclose(w, torch.tensor([1.0, 0.5, 0.1, 1.0, 0.8]))
    # the gaps: 0 where the label is the top logit, top - label otherwise; no gradient through them
    from specserve.train.losses import chunked_cross_entropy

    h = torch.randn(5, 8, requires_grad=True)
    wt = torch.randn(16, 8)
    logits = (h @ wt.T).detach()
    labels = torch.tensor([int(logits[0].argmax()), 3, 5, int(logits[3].argmax()), 9])
    ce, ok, gap = chunked_cross_entropy(h, wt, labels, chunk=2)
    want = logits.max(1).values - logits[torch.arange(5), labels]
    assert torch.allclose(gap, want) and gap[0] == 0 and gap[3] == 0 and ok[0] and ok[3]
    assert not gap.requires_grad and ce.requires_grad


def test_dflash_training_prefix_weights_reduce_loss(tmp_path, tiny):
    args = _dflash_args(tiny, str(tmp_path / "o"), "--max-steps", "30", "--epochs", "100")
    res = run(parse_args([*args, "--position-weight", "prefix"]))
    first, last = _first_last(res.metrics["history"])
    assert last["loss"] < first["loss"] - 0.3, res.metrics["history"]
    assert last["acc"][0] > 0.8 and last["tau"] > first["tau"] + 1.0
    info = json.loads((tmp_path / "o" / "training.json").read_text())
    assert info["train"]["position_weight"] == "prefix"


@_eager_flex
def test_dflash_training_with_flex_reduces_loss(tmp_path, tiny, flex_cpu_backward):
    args = _dflash_args(
        tiny, str(tmp_path / "o"), "--max-steps", "40", "--epochs", "100", "--attn-backend", "flex"
    )
    res = run(parse_args(args))
    first, last = _first_last(res.metrics["history"])
    assert res.metrics["attn_backend"] == "flex"
    assert last["loss"] < first["loss"] - 0.5, res.metrics["history"]
    assert last["acc"][0] > 0.8 and last["tau"] > first["tau"] + 1.0


def test_auto_flex_falls_back_to_split_once(tmp_path, tiny, monkeypatch, capsys):
    """auto on CUDA = flex with a one-time fallback: simulated here by a flex path that fails to compile."""
    import specserve.train.models as models
    from specserve.train.trainer import Trainer

    calls = []

    def broken(*a, **kw):
        calls.append(1)
        raise RuntimeError("simulated inductor failure")

    monkeypatch.setattr(models, "_flex_block_attention", broken)
    init = Trainer.__init__

    def init_as_on_cuda(self, *a, **kw):
        init(self, *a, **kw)
        self.flex_fallback = True  # what auto selects on a CUDA device

    monkeypatch.setattr(Trainer, "__init__", init_as_on_cuda)
    res = run(
        parse_args(_dflash_args(tiny, str(tmp_path / "o"), "--max-steps", "3", "--attn-backend", "flex"))
    )
    assert res.metrics["steps"] == 3 and res.metrics["attn_backend"] == "split" and len(calls) == 1
    err = capsys.readouterr().err
    assert err.count("falling back to --attn-backend split") == 1 and "simulated inductor failure" in err
    assert all(torch.isfinite(p).all() for p in res.drafter.parameters())


def test_eagle3_training_reduces_loss(tmp_path, tiny):
    res = run(parse_args(_eagle_args(tiny, str(tmp_path / "o"), "--max-steps", "30", "--epochs", "100")))
    first, last = _first_last(res.metrics["history"])
    assert last["loss"] < first["loss"] - 0.5, res.metrics["history"]
    assert len(last["acc"]) == 3 and last["acc"][0] > 0.8 and last["tau"] > first["tau"] + 1.0


def test_resume_equals_uninterrupted_run(tmp_path, tiny):
    """Property: 4 steps + checkpoint + --resume to 8 gives bit-identical weights and optimizer state to an
    uninterrupted 8-step run with the same seed (data order, anchors, LR schedule and RNG all restored)."""
    part = str(tmp_path / "part")
    common = ("--max-steps", "8", "--epochs", "100", "--save-every", "4", "--batch-size", "16")
    # batch 16 x 48 samples = 3 batches per epoch: the resume point (4) lies inside the second epoch
    full = run(parse_args(_dflash_args(tiny, str(tmp_path / "full"), *common)))
    first = run(parse_args(_dflash_args(tiny, part, *common, "--stop-after", "4")))
    assert first.metrics["steps"] == 4
    ckpt = torch.load(os.path.join(part, "checkpoint.pt"), weights_only=False)
    assert ckpt["step"] == 4 and ckpt["total_steps"] == 8
    second = run(parse_args(_dflash_args(tiny, part, *common, "--resume")))
    assert second.metrics["steps"] == 8 and second.metrics["steps_this_run"] == 4
    for (name, a), (_, b) in zip(full.drafter.state_dict().items(), second.drafter.state_dict().items()):
        assert torch.equal(a, b), name
    assert not torch.equal(first.drafter.fc.weight, second.drafter.fc.weight)
    c2 = torch.load(os.path.join(part, "checkpoint.pt"), weights_only=False)
    assert c2["step"] == 8 and c2["scheduler"]["last_epoch"] == 8
    # the exported training.json names both parts of the schedule: the stopped run and the resumed one
    with open(os.path.join(part, "training.json")) as f:
        parts = json.load(f)["train"]["parts"]
    assert [p["steps"] for p in parts] == [[0, 4], [4, 8]]
    assert "--stop-after 4" in parts[0]["command"] and "--resume" in parts[1]["command"]
    assert [p["steps"] for p in full.metrics["parts"]] == [[0, 8]]
    assert all(int(s["step"]) == 8 for s in c2["optimizer"]["state"].values())
    # --stop-after leaves a checkpoint even without --save-every (how the demo drafter's one schedule spans two
    # time-limited calls); a step count <= 0 is an error
    nosave = str(tmp_path / "nosave")
    split = ("--max-steps", "8", "--epochs", "100", "--save-every", "0", "--batch-size", "16")
    run(parse_args(_dflash_args(tiny, nosave, *split, "--stop-after", "3")))
    assert torch.load(os.path.join(nosave, "checkpoint.pt"), weights_only=False)["step"] == 3
    with pytest.raises(TrainError, match="--stop-after must be > 0"):
        run(parse_args(_dflash_args(tiny, nosave, *split, "--stop-after", "0")))


def test_stop_after_time_leaves_a_resumable_checkpoint(tmp_path, tiny):
    """--stop-after-time: the run stops after the first step past the limit (here at once: step 1) with a
    checkpoint, its LR schedule unchanged; --resume continues it to the end; a limit <= 0 is an error."""
    out = str(tmp_path / "t")
    split = ("--max-steps", "6", "--epochs", "100", "--save-every", "0", "--batch-size", "16")
    first = run(parse_args(_dflash_args(tiny, out, *split, "--stop-after-time", "1e-9")))
    assert first.metrics["steps"] == 1 and first.metrics["total_steps"] == 6
    ckpt = torch.load(os.path.join(out, "checkpoint.pt"), weights_only=False)
    assert ckpt["step"] == 1 and ckpt["total_steps"] == 6
    second = run(parse_args(_dflash_args(tiny, out, *split, "--resume")))
    assert second.metrics["steps"] == 6 and second.metrics["steps_this_run"] == 5
    with pytest.raises(TrainError, match="--stop-after-time must be > 0"):
        run(parse_args(_dflash_args(tiny, out, *split, "--stop-after-time", "0")))


def test_init_from_continues_an_exported_drafter(tmp_path, tiny, capsys):
    """--init-from starts from an exported drafter: its first loss is the first run's last, far below a fresh
    start's; a drafter of the other method or a missing directory is a one-line error."""
    first = run(parse_args(_dflash_args(tiny, str(tmp_path / "a"), "--max-steps", "30", "--epochs", "100")))
    more = run(parse_args(_dflash_args(tiny, str(tmp_path / "b"), "--max-steps", "5", "--epochs", "100",
                                       "--log-every", "1", "--init-from", str(tmp_path / "a"))))  # fmt: skip
    fresh0 = first.metrics["history"][0]["loss"]
    assert more.metrics["history"][0]["loss"] < fresh0 - 0.5
    assert more.metrics["history"][0]["loss"] < first.metrics["history"][-1]["loss"] + 0.3
    # training.json tells the whole lineage: a third generation lists both earlier runs, oldest first
    run(parse_args(_dflash_args(tiny, str(tmp_path / "g3"), "--max-steps", "3", "--epochs", "100",
                                "--init-from", str(tmp_path / "b"))))  # fmt: skip
    with open(tmp_path / "a" / "training.json") as f:
        assert "earlier_runs" not in json.load(f)
    with open(tmp_path / "g3" / "training.json") as f:
        info = json.load(f)
    runs = info["earlier_runs"]
    assert [r["steps"] for r in runs] == [30, 5] and info["total_steps_all_runs"] == 38
    assert "--max-steps 30" in runs[0]["command"] and str(tmp_path / "a") in runs[1]["command"]
    assert runs[1]["final"]["loss"] == more.metrics["final"]["loss"]
    assert runs[0]["data"]["samples"] == runs[1]["data"]["samples"] == info["data"]["samples"] > 0
    # growing works (tests below); shrinking is a one-line error
    assert main(_dflash_args(tiny, str(tmp_path / "s"), "--max-steps", "1", "--init-from", str(tmp_path / "a"))
                + ["--num-layers", "1"]) == 2  # fmt: skip
    assert "cannot shrink" in capsys.readouterr().err
    # more taps: the exported drafter taps the new layers too; dropping one is a one-line error
    assert main(_dflash_args(tiny, str(tmp_path / "t"), "--max-steps", "1", "--init-from", str(tmp_path / "a"))
                + ["--target-layer-ids", "0", "1", "2"]) == 0  # fmt: skip
    with open(tmp_path / "t" / "config.json") as f:
        assert json.load(f)["dflash_config"]["target_layer_ids"] == [0, 1, 2]
    assert main(_dflash_args(tiny, str(tmp_path / "u"), "--max-steps", "1", "--init-from", str(tmp_path / "a"))
                + ["--target-layer-ids", "0"]) == 2  # fmt: skip
    assert "keep the drafter's taps" in capsys.readouterr().err
    for extra in (["--init-from", str(tmp_path / "a")], []):  # a layer the target lacks: grown or fresh
        assert main(_dflash_args(tiny, str(tmp_path / "v"), "--max-steps", "1", *extra)
                    + ["--target-layer-ids", "0", "2", "9"]) == 2  # fmt: skip
        assert "--target-layer-ids must be in [0, 3]" in capsys.readouterr().err
    bad = str(tmp_path / "a")
    assert main(["eagle3", "--target", tiny["target"], "--data", tiny["data"], "--output", str(tmp_path / "c"),
                 "--init-from", bad]) == 2  # fmt: skip
    assert main(["dflash", "--target", tiny["target"], "--data", tiny["data"], "--output", str(tmp_path / "d"),
                 "--init-from", str(tmp_path / "nope")]) == 2  # fmt: skip


def test_max_time_shrinks_the_schedule_to_the_budget(tmp_path, tiny):
    """--max-time: after the calibration steps the run's length (and cosine schedule) is cut to fit the budget;
    the final LR reaches the schedule's end, and a budget that fits changes nothing."""
    res = run(parse_args(_dflash_args(tiny, str(tmp_path / "a"), "--max-steps", "400", "--epochs", "100",
                                      "--max-time", "0.001")))  # fmt: skip
    assert res.metrics["total_steps"] == res.metrics["steps"] < 400
    assert res.metrics["steps"] == 20  # min(20, 400 // 10) calibration steps, then no time left
    # a budget the estimate overshoots still ends the run (single process): past calibration it stops at max_time
    late = run(parse_args(_dflash_args(tiny, str(tmp_path / "late"), "--max-steps", "400", "--epochs", "100",
                                       "--max-time", "1.5")))  # fmt: skip
    assert late.metrics["steps"] < 400 and late.metrics["seconds"] < 10  # 400 steps take ~20-40 s here
    roomy = run(parse_args(_dflash_args(tiny, str(tmp_path / "b"), "--max-steps", "6", "--epochs", "100",
                                        "--max-time", "3600")))  # fmt: skip
    assert roomy.metrics["total_steps"] == roomy.metrics["steps"] == 6
    assert main(["dflash", "--target", tiny["target"], "--data", tiny["data"], "--output", str(tmp_path / "c"),
                 "--max-time", "-1"]) == 2  # fmt: skip


def test_chain_acceptance_walks_in_inference_order():
    # runs at every anchor 10..19 of a response spanning positions 10..19 (end 20)
    runs = {a: 0 for a in range(10, 20)}
    assert chain_acceptance(runs, 10, 20) == (
        8,
        8,
    )  # no draft accepted: one token per step; the last is plain
    runs.update({10: 3, 14: 2})
    # 10 -> accepts 3 (+ bonus) -> 14 -> accepts 2 -> 17 -> 0 -> 18 (the last token, 19, has no draft)
    assert chain_acceptance(runs, 10, 20) == (8, 3)
    runs[10] = 15  # a run past the end is capped by the drafts allowed before max_tokens: 8 + the bonus
    assert chain_acceptance(runs, 10, 20) == (9, 1)
    # anchors the walk jumps over do not count (uniform-anchor average would): only 10 and 14 here
    assert chain_acceptance({10: 3, 11: 0, 12: 0, 13: 0, 14: 0, 15: 0}, 10, 17) == (5, 2)
    # a gap (another turn) resumes at the next anchor: 2, 3, then 8 (accepts 1 + bonus)
    assert chain_acceptance({2: 0, 3: 0, 8: 1, 9: 0}, 2, 11) == (4, 3)
    assert chain_acceptance({}, 0, 5) == (0, 0)


def test_validation_set_tracks_held_out_acceptance(tmp_path, tiny):
    """--val-samples holds samples out of training and validates before, every --eval-every steps and after;
    held-out loss falls and acceptance (all-anchor and inference-order) rises on this learnable data."""
    out = tmp_path / "o"
    res = run(parse_args(_dflash_args(tiny, str(out), "--max-steps", "30", "--epochs", "100",
                                      "--val-samples", "8", "--eval-every", "10")))  # fmt: skip
    vh = res.metrics["val_history"]
    assert [v["step"] for v in vh] == [0, 10, 20, 30]
    assert all(v["samples"] == 8 and len(v["acc"]) == 3 for v in vh)
    assert vh[-1]["loss"] < vh[0]["loss"] - 0.5
    assert vh[-1]["chain_tau"] > vh[0]["chain_tau"] + 0.5 and vh[-1]["tau"] > vh[0]["tau"] + 0.5
    assert 1.0 <= vh[-1]["chain_tau"] <= 4.0
    info = json.loads((out / "training.json").read_text())
    assert info["data"]["samples"] == 40 and info["data"]["validation"]["samples"] == 8
    assert info["train"]["val"] == vh[-1] and info["val_history"] == vh
    # --val-data: an explicit (gzipped) file; the training data stays whole
    import gzip

    vfile = tmp_path / "val.jsonl.gz"
    with gzip.open(vfile, "wt") as f, open(tiny["data"]) as src:
        f.writelines(src.readlines()[:3])
    res2 = run(
        parse_args(_dflash_args(tiny, str(tmp_path / "v"), "--max-steps", "2", "--val-data", str(vfile)))
    )
    assert [v["step"] for v in res2.metrics["val_history"]] == [0, 2]
    assert res2.metrics["val_history"][0]["samples"] == 3
    eag = run(parse_args(_eagle_args(tiny, str(tmp_path / "e"), "--max-steps", "2", "--val-samples", "4")))
    assert [len(v["acc"]) for v in eag.metrics["val_history"]] == [3, 3]


def test_eval_only_validates_an_exported_drafter(tmp_path, tiny, capsys):
    vfile = tmp_path / "val.jsonl"
    with open(tiny["data"]) as src:
        vfile.write_text("".join(src.readlines()[:6]))
    trained = run(parse_args(_dflash_args(tiny, str(tmp_path / "d"), "--max-steps", "25", "--epochs", "100",
                                          "--val-data", str(vfile))))  # fmt: skip
    final = trained.metrics["val_history"][-1]
    capsys.readouterr()
    rc = main(["dflash", "--target", tiny["target"], "--init-from", str(tmp_path / "d"), "--val-data", str(vfile),
               "--eval-only", "--output", str(tmp_path / "ev"), "--num-anchors", "16"])  # fmt: skip
    assert rc == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")][-1]
    got = json.loads(line)
    assert got == json.loads((tmp_path / "ev" / "validation.json").read_text())
    assert got["samples"] == 6 and got["method"] == "dflash" and len(got["acc"]) == 3
    # the exported (bf16-rounded) weights validate like the final fp32 ones did at the end of training
    assert final["chain_tau"] > 1.5 and got["chain_tau"] == pytest.approx(final["chain_tau"], abs=0.3)
    assert not (tmp_path / "ev" / "model.safetensors").exists()  # nothing trained, nothing exported
    assert main(["dflash", "--target", tiny["target"], "--val-data", str(vfile), "--eval-only"]) == 2
    assert (
        main(["dflash", "--target", tiny["target"], "--data", tiny["data"]]) == 2
    )  # training needs --output


@pytest.mark.parametrize(
    "extra",
    [
        ("--val-samples", "4", "--val-data", "x.jsonl"),
        (
            "--eval-every",
            "5",
        ),
        (
            "--val-samples",
            "48",
        ),
        ("--val-data", "missing.jsonl"),
        (
            "--val-samples",
            "-1",
        ),
    ],
)
def test_validation_user_errors(tmp_path, tiny, capsys, extra):
    assert main(_dflash_args(tiny, str(tmp_path / "o"), "--max-steps", "1", *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specserve train: error: ")


# ------------------------------------------------------------------------------------------ export


def test_export_dflash_names_config_and_reload(tmp_path):
    d = _dflash(block=16, layers=2)
    paths = export_drafter(d, str(tmp_path), {"note": "x"})
    from safetensors.torch import load_file

    state = load_file(paths["weights"])
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(2):
        expected |= {f"layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"}
        expected |= {f"layers.{i}.self_attn.{p}_norm.weight" for p in "qk"}
        expected |= {f"layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        expected |= {f"layers.{i}.{p}_layernorm.weight" for p in ("input", "post_attention")}
    assert set(state) == expected
    assert state["fc.weight"].shape == (HIDDEN, 2 * HIDDEN) and state["fc.weight"].dtype == torch.bfloat16
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["block_size"] == 16 and cfg["num_target_layers"] == 4
    assert cfg["dflash_config"] == {"mask_token_id": 255, "target_layer_ids": [0, 2]}
    for key, val in dict(
        hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, sliding_window=None, attention_bias=False, tie_word_embeddings=False, vocab_size=VOCAB,
        torch_dtype="bfloat16", layer_types=["full_attention"] * 2, rope_theta=10000.0,
    ).items():  # fmt: skip
        assert cfg[key] == val, key
    assert {"rms_norm_eps", "max_position_embeddings"} <= set(cfg)
    assert json.loads((tmp_path / "training.json").read_text()) == {"note": "x"}
    back = load_drafter(str(tmp_path))
    for name, t in d.state_dict().items():
        assert torch.equal(back.state_dict()[name], t.to(torch.bfloat16).float()), name


def test_export_eagle3_shared_and_reduced_vocab(tmp_path, tiny):
    res = run(parse_args(_eagle_args(tiny, str(tmp_path / "shared"), "--max-steps", "2")))
    from safetensors.torch import load_file

    state = load_file(str(tmp_path / "shared" / "model.safetensors"))
    names = {f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"}
    names |= {f"midlayer.{p}.weight" for p in ("input_layernorm", "hidden_norm", "post_attention_layernorm")}
    names |= {f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    names |= {"norm.weight", "fc.weight", "d2t", "t2d"}
    assert set(state) == names  # no lm_head: shared with the target
    assert state["midlayer.self_attn.q_proj.weight"].shape == (64, 2 * HIDDEN)
    assert state["fc.weight"].shape == (HIDDEN, 3 * HIDDEN)
    assert state["d2t"].dtype == torch.int64 and not state["d2t"].any()
    assert state["t2d"].dtype == torch.bool and state["t2d"].all()
    cfg = json.loads((tmp_path / "shared" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 1 and cfg["vocab_size"] == cfg["draft_vocab_size"] == VOCAB
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 2, 1] and cfg["target_hidden_size"] == HIDDEN
    assert cfg["tie_word_embeddings"] is False
    for name, t in load_drafter(str(tmp_path / "shared")).state_dict().items():
        ref = res.drafter.state_dict()[name]
        assert torch.equal(t, ref.to(torch.bfloat16).float() if ref.is_floating_point() else ref), name

    run(parse_args(_eagle_args(tiny, str(tmp_path / "red"), "--max-steps", "2", "--draft-vocab-size", "16")))
    state = load_file(str(tmp_path / "red" / "model.safetensors"))
    assert state["lm_head.weight"].shape == (16, HIDDEN) and state["d2t"].shape == (16,)
    draft_ids = torch.arange(16) + state["d2t"]
    assert set(CYCLE) | {2} <= set(draft_ids.tolist())  # the most frequent response tokens
    assert state["t2d"].sum() == 16 and state["t2d"][draft_ids].all()
    assert json.loads((tmp_path / "red" / "config.json").read_text())["draft_vocab_size"] == 16


# ------------------------------------------------------------------------------------------ DDP


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, argv: list[str], out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    res = run(parse_args(argv))
    torch.save(res.drafter.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_ddp_two_cpu_processes_stay_in_sync(tmp_path, tiny):
    import torch.multiprocessing as mp

    argv = _dflash_args(
        tiny, str(tmp_path / "o"), "--max-steps", "2", "--device", "cpu", "--val-samples", "5"
    )
    # fork: the children inherit the imported torch / transformers (spawn would re-import them, ~10 s each)
    mp.start_processes(
        _ddp_worker, args=(2, _free_port(), argv, str(tmp_path)), nprocs=2, join=True, start_method="fork"
    )
    s0 = torch.load(tmp_path / "rank0.pt")
    s1 = torch.load(tmp_path / "rank1.pt")
    init = _dflash_init_state(tiny, tmp_path)
    assert s0.keys() == s1.keys()
    for k in s0:
        assert torch.equal(s0[k], s1[k]), k
    assert not torch.equal(s0["fc.weight"], init["fc.weight"])  # it trained
    info = json.loads((tmp_path / "o" / "training.json").read_text())
    assert info["world_size"] == 2 and info["train"]["steps"] == 2
    # validation is sharded over the ranks (3 + 2 samples) and all-reduced: before training (same initial
    # weights) it equals a single process's validation of all 5
    assert [v["step"] for v in info["val_history"]] == [0, 2] and info["data"]["validation"]["samples"] == 5
    single = run(
        parse_args(_dflash_args(tiny, str(tmp_path / "s"), "--max-steps", "1", "--val-samples", "5"))
    )
    v_ddp, v_one = info["val_history"][0], single.metrics["val_history"][0]
    assert v_ddp["samples"] == v_one["samples"] == 5
    for key in ("loss", "tau", "chain_tau"):
        assert v_ddp[key] == pytest.approx(v_one[key], rel=1e-4), key
    assert v_ddp["acc"] == pytest.approx(v_one["acc"], abs=1e-4)


def _dflash_init_state(tiny: dict[str, str], tmp_path) -> dict[str, torch.Tensor]:
    res = run(parse_args(_dflash_args(tiny, str(tmp_path / "init"), "--max-steps", "1", "--lr", "1e-12")))
    return res.drafter.state_dict()


def test_self_question_prompts_cover_math_and_repeat_past_the_grid():
    """The self-written prompt instructions: general questions and math problems, deterministic per seed; past
    the grids' size the instructions repeat (each repeat is sampled with its own seed, see the next test)."""
    from specserve.train.data import SELF_MATH_STYLES, SELF_MATH_TOPICS, SELF_STYLES, SELF_TOPICS

    size = len(SELF_TOPICS) * len(SELF_STYLES) + len(SELF_MATH_TOPICS) * len(SELF_MATH_STYLES)
    few = self_question_prompts(200, seed=3)
    assert len(few) == len(set(few)) == 200 and few == self_question_prompts(200, seed=3)
    assert few != self_question_prompts(200, seed=4)
    assert any("math problem about" in p for p in few) and any("AI assistant" in p for p in few)
    many = self_question_prompts(size + 50, seed=3)
    assert len(many) == size + 50 and len(set(many)) == size  # every instruction once, then 50 repeats


def test_self_question_prompts_latex_grid():
    """``--self-grid latex``: competition-style math instructions that ask for LaTeX, over the whole topic x
    instruction grid before any repeats; an unknown grid is refused; the CLI passes the choice through."""
    from specserve.train.data import SELF_LATEX_STYLES, SELF_LATEX_TOPICS

    size = len(SELF_LATEX_TOPICS) * len(SELF_LATEX_STYLES)
    ps = self_question_prompts(size, seed=1, grid="latex")
    assert len(set(ps)) == size and ps != self_question_prompts(size, seed=2, grid="latex")
    assert all("LaTeX" in p and p.endswith("Reply with the problem only.") for p in ps)
    assert not set(ps) & set(self_question_prompts(size, seed=1))  # the mixed grid is another set
    assert any("$\\frac{a}{b}$" in p for p in ps)  # the format braces came out as LaTeX braces
    assert all(any(t in p for p in ps) for t in SELF_LATEX_TOPICS)
    with pytest.raises(TrainError, match="unknown self-prompt grid"):
        self_question_prompts(3, grid="poems")
    assert parse_args(["dflash", "--self-prompts", "5", "--self-grid", "latex"]).self_grid == "latex"
    # the LaTeX grid keeps the first line with math in it; the mixed grid the first usable line
    text = "Here's a problem using LaTeX:\n\nFind $x$ if $x^2 = 4$.\n"
    assert clean_question(text, prefer="$") == "Find $x$ if $x^2 = 4$."
    assert clean_question(text) == "Here's a problem using LaTeX:"
    assert clean_question("No math in this line at all.", prefer="$") == "No math in this line at all."
    assert parse_args(["dflash", "--self-prompts", "5"]).self_grid == "mixed"


def test_self_grid_reaches_the_question_writer(tmp_path, monkeypatch):
    """--self-grid goes from the command line to the generator: the LaTeX grid's instructions, 128-token problem
    drafts and the "$" line preference; the mixed grid's 64 tokens and first line; the choice in the data's meta."""
    from transformers import AutoTokenizer

    import specserve.train.cli as cli_mod

    target = _tiny_tokenizer_target(tmp_path)
    tok = AutoTokenizer.from_pretrained(target)
    asked: list[int] = []  # max_new_tokens per generate call
    prefer: list[str | None] = []

    class FakeGenerator:  # stands in for the engine: records what it is asked, answers two tokens
        def __init__(self, *args, **kwargs) -> None:
            self.stops: list[int] = []

        def tokenizer(self):
            return tok

        def generate(self, ids, max_new_tokens, temperature, seed=0):
            asked.append(max_new_tokens)
            return [[5, 6] for _ in ids]

        def close(self) -> None:
            pass

    def fake_clean(text, prefer_=None):
        prefer.append(prefer_)
        return "why is the sky blue ?"

    texts: list[list[str]] = []  # the chat prompts as text, per call
    real_chat_prompt_ids = cli_mod.chat_prompt_ids

    def recording_chat_prompt_ids(tokenizer, prompts):
        texts.append(list(prompts))
        return real_chat_prompt_ids(tokenizer, prompts)

    monkeypatch.setattr(cli_mod, "chat_prompt_ids", recording_chat_prompt_ids)
    monkeypatch.setattr(cli_mod, "EngineGenerator", FakeGenerator)
    monkeypatch.setattr(cli_mod, "clean_question", fake_clean)
    for grid, ask_tokens, want in (("latex", 128, "$"), ("mixed", 64, None)):
        asked.clear(), prefer.clear(), texts.clear()
        out = tmp_path / grid
        args = [
            "dflash",
            "--target",
            target,
            "--self-prompts",
            "3",
            "--self-grid",
            grid,
            "--output",
            str(out),
        ]
        args += ["--generator", "engine", "--generate-only", "--max-new-tokens", "4", "--device", "cpu"]
        assert main(args + ["--dtype", "float32"]) == 0
        assert asked == [ask_tokens, 4] and prefer == [want] * 3
        assert len(texts[0]) == 3 and all(("LaTeX" in p) == (grid == "latex") for p in texts[0])
        assert texts[1] == ["why is the sky blue ?"]  # then the question it wrote is answered
        assert json.loads((out / "data.jsonl.meta.json").read_text())["self_grid"] == grid
        assert len(load_samples(str(out / "data.jsonl"))) == 1  # the three identical questions deduplicated


def test_engine_generator_samples_repeated_prompts_apart(tiny_qwen3_dir):
    """Request i samples with seed + i: a prompt asked twice gets two answers, and a rerun the same ones."""
    ids = [[1, 2, 3, 4]] * 3 + [[5, 6, 7]]
    gen = EngineGenerator(tiny_qwen3_dir, dtype="float32", device="cpu", max_model_len=64, max_num_seqs=4)
    try:
        first = gen.generate(ids, 10, 1.0, seed=7)
        again = gen.generate(ids, 10, 1.0, seed=7)
        greedy = gen.generate(ids, 6, 0.0, seed=7)
    finally:
        gen.close()
    assert first == again
    assert len({tuple(r) for r in first[:3]}) == 3
    assert greedy[0] == greedy[1] == greedy[2]


def test_target_labels_are_the_targets_greedy_choices(tmp_path, tiny):
    """``features_and_labels``: the same taps as ``features`` and, at every position p >= 1, the argmax of the HF
    model's logits at p - 1. ``--labels target`` trains on those: identical to ``--labels data`` on answers the
    target wrote greedily, different on answers it did not write (the synthetic data here)."""
    from transformers import LlamaForCausalLM

    from specserve.train.target import load_target

    target = load_target(tiny["target"], "cpu", torch.float32)
    target.tap_indices = [1, 3]
    torch.manual_seed(0)
    ids = torch.randint(3, VOCAB, (3, 21))
    taps, labels = target.features_and_labels(ids, chunk=16)  # several chunks of rows
    torch.testing.assert_close(taps, target.features(ids), rtol=0, atol=0)
    hf = LlamaForCausalLM.from_pretrained(tiny["target"]).eval()
    with torch.no_grad():
        want = hf(ids).logits.argmax(-1)
    assert torch.equal(labels[:, 0], ids[:, 0]) and torch.equal(labels[:, 1:], want[:, :-1])
    # greedy answers of the target itself: both label sources give the same training run
    greedy = str(tmp_path / "greedy.jsonl")
    with open(greedy, "w") as f:
        for i in range(8):
            p = [1] + [
                int(t) for t in torch.randint(10, 250, (5,), generator=torch.Generator().manual_seed(i))
            ]
            with torch.no_grad():
                out = hf.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, min_new_tokens=24)
            r = out[0, len(p) :].tolist()
            f.write(json.dumps({"input_ids": p + r, "loss_mask": [0] * len(p) + [1] * len(r)}) + "\n")
    own = {**tiny, "data": greedy}
    steps = ("--max-steps", "3", "--epochs", "100", "--log-every", "1")
    hist = {
        lab: run(parse_args(_dflash_args(own, str(tmp_path / lab), *steps, "--labels", lab))).metrics[
            "history"
        ]
        for lab in ("data", "target")
    }
    assert [h["loss"] for h in hist["data"]] == pytest.approx([h["loss"] for h in hist["target"]], rel=1e-5)
    for make in (_dflash_args, _eagle_args):  # the synthetic answers: the tiny target never wrote these
        h_data, h_tgt = (
            run(parse_args(make(tiny, str(tmp_path / f"s{lab}"), *steps, "--labels", lab))).metrics["history"]
            for lab in ("data", "target")
        )
        assert h_data[0]["loss"] != pytest.approx(h_tgt[0]["loss"], rel=1e-3)
    assert main(_dflash_args(tiny, str(tmp_path / "bad"), "--labels", "sampled")) == 2

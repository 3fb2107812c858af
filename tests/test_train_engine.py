"""Drafters trained by `specserve train` load in the engine, stay lossless, and the engine drafts exactly what
the training-time module predicts (no silent train/inference mismatch: taps, RoPE, masks, mask token)."""

from __future__ import annotations

import json
import random

import pytest
import torch
import transformers

from specserve import LLM, SamplingParams
from specserve.train.cli import main as train_main
from specserve.train.export import load_drafter

CYCLE = [1017, 4242, 999, 12345, 707, 20000, 640]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> str:
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("data") / "data.jsonl"
    with open(path, "w") as f:
        for _ in range(32):
            p = [1] + [rng.randrange(100, 40000) for _ in range(rng.randrange(3, 10))]
            ph = rng.randrange(len(CYCLE))
            r = [CYCLE[(ph + k) % len(CYCLE)] for k in range(rng.randrange(24, 40))] + [2]
            f.write(json.dumps({"input_ids": p + r, "loss_mask": [0] * len(p) + [1] * len(r)}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def trained(tiny_qwen3_dir, data_file, tmp_path_factory) -> dict[str, str]:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("drafters")
    common = [
        "--target",
        tiny_qwen3_dir,
        "--data",
        data_file,
        "--batch-size",
        "8",
        "--lr",
        "3e-3",
        "--max-steps",
        "6",
        "--epochs",
        "100",
        "--no-progress",
        "--save-every",
        "0",
        "--device",
        "cpu",
    ]
    assert (
        train_main(
            [
                "dflash",
                *common,
                "--output",
                str(out / "dflash"),
                "--num-layers",
                "2",
                "--block-size",
                "8",
                "--num-anchors",
                "16",
                "--target-layer-ids",
                "0",
                "2",
            ]
        )
        == 0
    )
    assert train_main(["eagle3", *common, "--output", str(out / "eagle3"), "--ttt-steps", "3"]) == 0
    # compact exports: the DFlash drafter grown to 3 layers and a wider MLP, stored int8; the EAGLE-3 head int8
    short = [*common[: common.index("--max-steps")], "--max-steps", "2", *common[common.index("--epochs") :]]
    assert (
        train_main(
            [
                "dflash",
                *short,
                "--init-from",
                str(out / "dflash"),
                "--num-layers",
                "3",
                "--intermediate-size",
                "160",
                "--num-anchors",
                "16",
                "--export-format",
                "int8",
                "--output",
                str(out / "dflash-int8"),
            ]
        )  # fmt: skip
        == 0
    )
    assert (
        train_main(
            [
                "eagle3",
                *short,
                "--init-from",
                str(out / "eagle3"),
                "--ttt-steps",
                "3",
                "--export-format",
                "int8",
                "--output",
                str(out / "eagle3-int8"),
            ]
        )  # fmt: skip
        == 0
    )
    return {
        "dflash": str(out / "dflash"),
        "eagle3": str(out / "eagle3"),
        "dflash-int8": str(out / "dflash-int8"),
        "eagle3-int8": str(out / "eagle3-int8"),
    }


PROMPTS = ["The capital of France is", "1 2 3 4 5 6 7 8 9 10 1 2 3 4 5", "Once upon a time"]


def test_trained_drafters_load_and_stay_lossless(tiny_qwen3_dir, trained):
    sp = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    base = [
        o.outputs[0].token_ids
        for o in LLM(tiny_qwen3_dir, dtype="float32", device="cpu").generate(PROMPTS, sp)
    ]
    for name, k in (("dflash", 7), ("eagle3", 3), ("dflash-int8", 7), ("eagle3-int8", 3)):
        method = name.split("-")[0]
        llm = LLM(
            tiny_qwen3_dir,
            dtype="float32",
            device="cpu",
            speculative_config={"method": method, "model": trained[name], "num_speculative_tokens": k},
        )
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp)] == base
        assert llm.get_metrics()["spec_decode_num_drafts"] > 0


@pytest.mark.parametrize("name", ["dflash", "dflash-int8"])
def test_engine_dflash_drafts_equal_training_module(tiny_qwen3_dir, trained, smol_tokenizer, name):
    """Also for the grown drafter stored in int8: the engine dequantizes exactly as the trainer's loader."""
    k = 7
    llm = LLM(
        tiny_qwen3_dir,
        dtype="float32",
        device="cpu",
        speculative_config={"method": "dflash", "model": trained[name], "num_speculative_tokens": k},
    )
    eng = llm.engine
    prompt = smol_tokenizer(PROMPTS[0] + " and the answer is").input_ids
    eng.add_request(
        "r", {"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    )
    eng.step()  # prefill: samples x_a and drafts the block [x_a, MASK x k] at position a
    req = eng.requests["r"]
    seq, engine_drafts = list(req.token_ids), list(req.spec_token_ids)
    assert len(engine_drafts) == k

    # the same block through the training-time module, with taps from transformers' forward
    drafter = load_drafter(trained[name]).eval()
    cfg = json.loads(open(f"{trained[name]}/config.json").read())
    ids = cfg["dflash_config"]["target_layer_ids"]
    mask = cfg["dflash_config"]["mask_token_id"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()
    a = len(seq) - 1
    with torch.no_grad():
        hs = hf(torch.tensor([seq[:a]]), output_hidden_states=True).hidden_states
        taps = torch.cat([hs[i + 1] for i in ids], dim=-1)
        block = torch.tensor([[seq[a]] + [mask] * k])
        embeds = hf.get_input_embeddings()(block)
        out = drafter(
            embeds,
            taps,
            torch.arange(a, a + k + 1)[None],
            torch.arange(a)[None],
            torch.ones(1, k + 1, a, dtype=torch.bool),
            backend="sdpa",
        )
        train_drafts = hf.lm_head(out[0, 1:]).argmax(-1).tolist()
    assert engine_drafts == train_drafts


@pytest.mark.parametrize("method,k", [("dflash", 7), ("eagle3", 3)])
def test_validation_chain_tau_equals_engine_acceptance(often_qwen3_dir, trained, smol_tokenizer, method, k):
    """The trainer's validation ``chain_tau`` on the target's own greedy outputs is exactly the acceptance
    length the engine reports when it decodes the same prompts with that drafter (fp32): validation during
    training predicts serving acceptance, with no engine run (``tau``, the all-anchor average, is not it).
    The target is the tiny one with two boosted LM-head rows, so drafts are right about half the time."""
    from specserve.train.data import Sample
    from specserve.train.target import load_target
    from specserve.train.trainer import TrainArgs, Trainer

    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [smol_tokenizer(p).input_ids for p in PROMPTS + ["1 2 3 1 2 3 1 2 3", "Hello world"]]
    llm = LLM(
        often_qwen3_dir,
        dtype="float32",
        device="cpu",
        speculative_config={"method": method, "model": trained[method], "num_speculative_tokens": k},
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp)
    m = llm.get_metrics()
    engine_tau = 1 + m["spec_decode_num_accepted_tokens"] / m["spec_decode_num_drafts"]
    val = [
        Sample(p + list(o.outputs[0].token_ids), [0] * len(p) + [1] * len(o.outputs[0].token_ids))
        for p, o in zip(prompts, outs)
    ]
    target = load_target(often_qwen3_dir, "cpu", torch.float32)
    drafter = load_drafter(trained[method])
    ids = drafter.config.target_layer_ids
    target.tap_indices = [i + 1 for i in ids] if method == "dflash" else list(ids)
    args = TrainArgs(work_dir="unused", batch_size=2, num_anchors=8, ttt_steps=k, progress=False)
    v = Trainer(drafter, target, val[:1], args, val_samples=val).evaluate()
    assert v["samples"] == len(val) and len(v["acc"]) == k
    assert 1.0 < engine_tau and v["chain_tau"] == pytest.approx(engine_tau, abs=1e-4), (v, m)


def test_int8_export_is_compact_and_grown_drafter_recorded(trained):
    """The int8 files: int8 weights + float32 row scales, norms kept, about half the bf16 size per weight,
    the config marks the format and the grown shape; the trainer's loader reads them back."""
    from safetensors.torch import load_file

    from specserve.loading import int8

    cfg = json.loads(open(f"{trained['dflash-int8']}/config.json").read())
    assert cfg["num_hidden_layers"] == 3 and cfg["intermediate_size"] == 160
    assert cfg["quantization_config"]["quant_method"] == int8.QUANT_METHOD
    assert "quantization_config" not in json.loads(open(f"{trained['dflash']}/config.json").read())
    state = load_file(f"{trained['dflash-int8']}/model.safetensors")
    weights = [n for n, t in state.items() if t.dtype == torch.int8]
    assert weights and all(state[n + "_scale"].shape == (state[n].shape[0], 1) for n in weights)
    assert all(t.dim() == 1 for n, t in state.items() if t.is_floating_point() and not n.endswith("_scale"))
    assert len(load_drafter(trained["dflash-int8"]).layers) == 3
    info = json.loads(open(f"{trained['dflash-int8']}/training.json").read())
    assert info["args"]["export_format"] == "int8" and info["earlier_runs"]
    e8 = load_file(f"{trained['eagle3-int8']}/model.safetensors")
    eb = load_file(f"{trained['eagle3']}/model.safetensors")
    b8 = sum(
        t.numel() * t.element_size() for t in e8.values() if t.is_floating_point() or t.dtype == torch.int8
    )
    b16 = sum(t.numel() * t.element_size() for t in eb.values() if t.is_floating_point())
    assert 0 < b8 < 0.6 * b16  # weights (the int64 / bool vocab maps stay as they are)


def test_eagle3_init_from_refuses_a_resize(tiny_qwen3_dir, data_file, trained, tmp_path, capsys):
    args = ["eagle3", "--target", tiny_qwen3_dir, "--data", data_file, "--init-from", trained["eagle3"],
            "--intermediate-size", "999", "--max-steps", "1", "--output", str(tmp_path / "e"), "--device", "cpu"]  # fmt: skip
    assert train_main(args) == 2
    assert "EAGLE-3 heads are not resized" in capsys.readouterr().err
    assert not (tmp_path / "e" / "model.safetensors").exists()

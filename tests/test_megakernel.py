"""The persistent one-launch decode step (layers/triton_megakernel.py, issue #6): under the Triton interpreter (one
program walks every unit) it equals its torch reference step after step, across attention chunks and the blocks of a
shuffled paged KV cache, in both GEMV forms (register double buffer, software-pipelined) and both merges of the chunks
(a loop, one load); compiled for sm_90 its registers fit one CTA per SM without a spill."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton decorates the kernels

import pytest
import torch

from specserve.layers.triton_megakernel import MegaConfig, MegaDecoder, reference_step


def _layers(cfg: MegaConfig, seed: int = 0) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    h, i, d = cfg.hidden, cfg.intermediate, cfg.head_dim

    def lin(o: int, k: int) -> torch.Tensor:
        return (torch.randn(o, k, generator=g) / k**0.5).to(torch.bfloat16)

    def norm(n: int) -> torch.Tensor:
        return (1 + 0.1 * torch.randn(n, generator=g)).to(torch.bfloat16)

    layers = [
        {
            "q_proj": lin(cfg.heads * d, h),
            "k_proj": lin(cfg.kv_heads * d, h),
            "v_proj": lin(cfg.kv_heads * d, h),
            "o_proj": lin(h, cfg.heads * d),
            "gate_proj": lin(i, h),
            "up_proj": lin(i, h),
            "down_proj": lin(h, i),
            "input_layernorm": norm(h),
            "post_attention_layernorm": norm(h),
            "q_norm": norm(d),
            "k_norm": norm(d),
        }
        for _ in range(cfg.layers)
    ]
    embed = torch.randn(cfg.vocab, h, generator=g).to(torch.bfloat16)
    return layers, MegaDecoder.pack(cfg, layers, embed, lin(cfg.vocab, h), norm(h))


def _weights(cfg: MegaConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    return _layers(cfg, seed)[1]


@pytest.mark.parametrize(
    "stages,merge,preload,am", [(1, 0, 1, 0), (3, 2, 0, 0), (3, 0, 1, 0), (3, 4, 1, 1), (3, 4, 1, 8)]
)
def test_megakernel_matches_reference_across_chunks(stages: int, merge: int, preload: int, am: int) -> None:
    # vocab 100: the LM head's last unit is partial; chunk 16: positions 0-19 use one and two attention chunks
    cfg = MegaConfig(
        hidden=64,
        heads=2,
        kv_heads=1,
        head_dim=32,
        intermediate=128,
        layers=2,
        vocab=100,
        max_tokens=32,
        chunk=16,
        rows=8,
        rope_theta=10000.0,
        stages=stages,
        merge_splits=merge,
        res_preload=preload,
        attn_merge=am,  # 1: a merge of two chunks takes two rounds; 8 (the default) one, masked past the second
    )
    w = _weights(cfg)
    # blocks of 4 positions in a shuffled order: an attention chunk (16) gathers rows from four scattered blocks
    order = torch.randperm(8, generator=torch.Generator().manual_seed(2)).tolist()
    dec = MegaDecoder(cfg, w, torch.device("cpu"), block_size=4, block_table=order)
    kc = torch.zeros(cfg.layers, cfg.kv_heads, cfg.max_tokens, cfg.head_dim, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    g = torch.Generator().manual_seed(1)
    toks = torch.randint(0, cfg.vocab, (20,), generator=g)
    worst = 0.0
    for pos, tok in enumerate(toks.tolist()):
        got = dec.launch(torch.tensor(tok), pos).clone()
        ref = reference_step(cfg, w, kc, vc, tok, pos)
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        worst = max(worst, err)
        assert err < 2e-2, (pos, err)
        # greedy: the kernel's pick is the reference's or within the tolerance of its best logit
        assert ref[got.argmax()] >= ref.max() - 2e-2 * ref.abs().max(), pos
        # the kernel's cache rows equal the reference's (bf16 rounding of the same fp32 values, or one ulp)
        k_row, v_row = dec.cache_rows(pos)
        torch.testing.assert_close(k_row.float(), kc[:, :, pos].float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(v_row.float(), vc[:, :, pos].float(), atol=2e-2, rtol=2e-2)
    # the shuffled table was followed: position 0's rows sit in block order[0], nowhere else
    assert dec.k_caches[0][order[0], 0].abs().sum() > 0 and dec.k_caches[0][order[-1]].abs().sum() == 0
    assert worst > 0.0  # the comparison saw real numbers, not two zero buffers


def test_pack_fuses_as_the_engine_does() -> None:
    # q / k / v and gate / up stacked in the engine's fused order (layers read them in place there)
    cfg = MegaConfig(
        hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=192, layers=2, vocab=16, rows=4
    )
    layers, w = _layers(cfg)
    x = torch.randn(cfg.hidden, generator=torch.Generator().manual_seed(3))
    for n, ly in enumerate(layers):
        f = {k: v.float() for k, v in ly.items()}
        p = w["layers"][n]
        qkv = torch.cat([f["q_proj"] @ x, f["k_proj"] @ x, f["v_proj"] @ x])
        torch.testing.assert_close(p["qkv"].float() @ x, qkv)
        gu = p["gate_up"].float() @ x
        torch.testing.assert_close(gu, torch.cat([f["gate_proj"] @ x, f["up_proj"] @ x]))
        assert p["down"].data_ptr() == ly["down_proj"].data_ptr()  # already contiguous: no copy


def test_megakernel_rejects_unsupported_shapes() -> None:
    with pytest.raises(ValueError, match="intermediate_size"):
        MegaDecoder(
            MegaConfig(hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=96, layers=1, vocab=16),
            {},
            torch.device("cpu"),
        )
    with pytest.raises(ValueError, match="heads \\* head_dim"):
        MegaDecoder(
            MegaConfig(hidden=64, heads=4, kv_heads=1, head_dim=32, intermediate=128, layers=1, vocab=16),
            {},
            torch.device("cpu"),
        )
    # the engine's tensors in another layout (a transposed down_proj: the kn layout) are refused, not misread
    from specserve.layers.triton_megakernel import MegaKernel

    cfg = MegaConfig(
        hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128, layers=1, vocab=16, rows=4
    )
    w = _weights(cfg)
    ly = dict(w["layers"][0])
    ly["down"] = ly["down"].t().contiguous()
    cache = torch.zeros(4, 16, 1, 32, dtype=torch.bfloat16)
    rope = torch.zeros(64, 32)
    with pytest.raises(ValueError, match="layer 0 down"):
        MegaKernel(cfg, [ly], [cache], [cache], w["final_norm"], rope, rope, None, 64)


_HOPPER_SCRIPT = r"""
from specserve.layers.triton_megakernel import _mega_decode_kernel
from sm90 import compile_sm90

ptrs = {n: "bf16" for n in ("wlm", "final_norm", "x0")}
ptrs.update({n: "fp32" for n in ("cos_tab", "sin_tab", "qkv_buf", "att_o", "att_lse", "att_x", "h_mid", "act",
                                 "dpart", "out")})
ptrs.update(table="i64", block_table="i32", pos_ptr="i64", counters="i32", stamps="i64")
# the Qwen3-8B shape, the benchmark's default unit (4 rows): both GEMV forms, with the L2 prefetches and stamps
# (and the attention's own merge, AM)
for stages, pf, pfo, opad, am in [(1, 0, 0, 0, 0), (3, 2, 7, 8, 0), (3, 1, 0, 8, 8)]:
    const = dict(L=36, H=4096, NH=32, NKV=8, D=128, I=12288, V=151936, CH=128, RB=4, BS=16, HAS_LM=True,
                 PF=pf, UPCAST=False, STAMP=True, STAGES=stages, SP=4 if stages > 1 else 1,
                 PFO=pfo, OPAD=opad, AM=am)
    kernel, reg, stack = compile_sm90(_mega_decode_kernel, ptrs, const, num_warps=8, num_stages=1,
                                      floats=("eps", "scale"))
    smem = kernel.metadata.shared
    print(stages, pf, f"REG:{reg} STACK:{stack} SMEM:{smem}")
    assert stack == 0 and reg * 256 <= 65536 and smem <= 227 * 1024, (stages, pf)  # one resident CTA per SM
    ptx = kernel.asm["ptx"]
    assert "ld.global.gpu.acquire" in ptx and "red.global.gpu.release" in ptx  # the arrival counters
    assert ("cp.async" in ptx) == (stages > 1) and ("prefetch.global.L2" in ptx) == (pf > 0)
    assert ("atom.global.gpu.acq_rel.add" in ptx) == (am > 0), am  # the KV heads' chunk counters
print("OK")
"""


def test_megakernel_compiles_for_hopper_one_cta_per_sm() -> None:
    from sm90 import run_script

    run_script(_HOPPER_SCRIPT)


def test_config_from_hf_qwen3() -> None:
    from transformers import Qwen3Config

    hf = Qwen3Config(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                     intermediate_size=128, num_hidden_layers=3, vocab_size=100, rms_norm_eps=1e-5,
                     rope_theta=12345.0)  # fmt: skip
    cfg = MegaConfig.from_hf(hf, chunk=16)
    assert (cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim) == (64, 2, 1, 32)
    assert (cfg.intermediate, cfg.layers, cfg.vocab, cfg.eps, cfg.chunk) == (128, 3, 100, 1e-5, 16)
    assert cfg.rope_theta == 12345.0  # transformers 5 keeps it in rope_parameters
    scaled = Qwen3Config(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6})
    with pytest.raises(ValueError, match="default RoPE"):
        MegaConfig.from_hf(scaled)


def test_engine_decode_steps_run_the_megakernel(tiny2_qwen3_dir, monkeypatch) -> None:
    # SPECSERVE_MEGAKERNEL=1 (interpreter on CPU): the runner keeps nn.Linear's layout, binds the kernel to its KV
    # caches and one-row decode steps run it. Oracle: transformers in float32 over the engine's own sequence; every
    # token the kernel picks is the oracle's greedy one up to bf16 noise (the random tiny model has near-ties of
    # 0.002 in its logits, where the fused bf16 layers and the kernel's fp32 residual stream may each go either way)
    from transformers import AutoModelForCausalLM

    from specserve import LLM, SamplingParams
    from specserve.layers import triton_megakernel as tm

    launches = []
    real = tm.MegaKernel.launch

    def counted(self, *a, **k):  # type: ignore[no-untyped-def]
        launches.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(tm.MegaKernel, "launch", counted)
    monkeypatch.setenv("SPECSERVE_MEGAKERNEL", "1")
    monkeypatch.setenv("SPECSERVE_MEGAKERNEL_OPTS", "mg=2")
    prompts = ["The capital of France is", "1 2 3 4 5 6"]
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    llm = LLM(tiny2_qwen3_dir, dtype="bfloat16", device="cpu", attention_backend="triton", num_gpu_blocks=16)
    model = llm.engine.runner.model
    assert model.megakernel is not None and isinstance(model.layers[0].self_attn.qkv_proj, torch.nn.Linear)
    assert model.megakernel.cfg.merge_splits == 2  # SPECSERVE_MEGAKERNEL_OPTS reached the engine's kernel
    # one request at a time: batch-1 decode steps (a batch of two runs the layers)
    outs = [llm.generate([p], sp)[0] for p in prompts]
    assert len(launches) == 2 * 7  # every decode step after the prefill's token
    llm.generate(prompts, sp)
    assert len(launches) == 2 * 7  # none of the batched steps
    hf = AutoModelForCausalLM.from_pretrained(tiny2_qwen3_dir, dtype=torch.float32)
    for o in outs:
        p, toks = list(o.prompt_token_ids), list(o.outputs[0].token_ids)
        with torch.no_grad():
            logits = hf(torch.tensor([p + toks])).logits[0, len(p) - 1 : -1]
        spread = logits.max(-1).values - logits.min(-1).values
        gap = logits.max(-1).values - logits[torch.arange(len(toks)), torch.tensor(toks)]
        assert (gap <= 0.01 * spread).all(), (gap, spread)
        assert (gap == 0).sum() >= len(toks) - 2  # mostly exactly the oracle's pick


def test_engine_runs_its_layers_when_the_kernel_cannot_bind(tiny2_qwen3_dir, monkeypatch) -> None:
    # a cache the kernel cannot address (bind_model's ValueError): the engine logs it and its layers decode
    from specserve import LLM, SamplingParams
    from specserve.layers import triton_megakernel as tm

    def refuse(model, **kw):  # type: ignore[no-untyped-def]
        raise ValueError("layer 0: a KV cache of 2147483648 elements (the kernel's limit: 2**31)")

    monkeypatch.setattr(tm, "bind_model", refuse)
    monkeypatch.setenv("SPECSERVE_MEGAKERNEL", "1")
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm = LLM(tiny2_qwen3_dir, dtype="bfloat16", device="cpu", attention_backend="triton", num_gpu_blocks=16)
    assert llm.engine.runner.use_megakernel and llm.engine.runner.model.megakernel is None
    assert len(llm.generate(["The capital of France is"], sp)[0].outputs[0].token_ids) == 4


def test_megakernel_eligibility(monkeypatch) -> None:
    from specserve.config import ModelConfig
    from specserve.layers.triton_megakernel import megakernel_mode, unsupported, use_megakernel

    base = dict(architecture="Qwen3ForCausalLM", model_type="qwen3", vocab_size=151936, hidden_size=4096,
                intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6, rope_scaling=None, max_position_embeddings=40960,
                tie_word_embeddings=False, attention_bias=False, qk_norm=True)  # fmt: skip
    assert unsupported(ModelConfig(**base), torch.bfloat16) is None  # Qwen3-8B
    assert "bf16" in unsupported(ModelConfig(**base), torch.float32)
    assert "Qwen3-style" in unsupported(ModelConfig(**{**base, "qk_norm": False}), torch.bfloat16)
    # Llama-3-8B's MLP (14336 = 3.5 x 4096) and Qwen3-4B's hidden size (2560) do not fit the kernel's units
    assert "intermediate_size" in unsupported(
        ModelConfig(**{**base, "intermediate_size": 14336}), torch.bfloat16
    )
    qwen3_4b = {**base, "hidden_size": 2560, "intermediate_size": 7680, "num_attention_heads": 20}
    assert unsupported(ModelConfig(**qwen3_4b), torch.bfloat16) is not None
    from specserve.layers import triton_megakernel as tm

    monkeypatch.delenv("SPECSERVE_MEGAKERNEL", raising=False)
    monkeypatch.setattr(tm, "AUTO_ON", True)
    assert use_megakernel("cuda", ModelConfig(**base), torch.bfloat16)
    # speculative targets keep the transposed layout their verify GEMMs run faster on (and the kernel has no taps)
    assert not use_megakernel("cuda", ModelConfig(**base), torch.bfloat16, speculative=True)
    assert not use_megakernel("cpu", ModelConfig(**base), torch.bfloat16)
    # auto: only where every decode step is a batch-1 step (its layout slows the engine's 4- / 8-row steps), not
    # under MPS (the spin waits need every SM)
    mc = ModelConfig(**base)
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)
    assert use_megakernel("cuda", mc, torch.bfloat16, max_num_seqs=1)
    assert not use_megakernel("cuda", mc, torch.bfloat16, max_num_seqs=2)
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50")
    assert not use_megakernel("cuda", mc, torch.bfloat16, max_num_seqs=1)
    monkeypatch.setenv("SPECSERVE_MEGAKERNEL", "1")  # asked for: any max_num_seqs (batch-1 steps only)
    assert use_megakernel("cuda", mc, torch.bfloat16, max_num_seqs=8)
    monkeypatch.delenv("SPECSERVE_MEGAKERNEL")
    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    monkeypatch.setattr(tm, "AUTO_ON", False)
    assert not use_megakernel("cuda", ModelConfig(**base), torch.bfloat16)
    monkeypatch.setenv("SPECSERVE_MEGAKERNEL", "1")
    assert use_megakernel("cpu", ModelConfig(**base), torch.bfloat16)  # the interpreter (these tests)
    assert not use_megakernel("cuda", ModelConfig(**base), torch.bfloat16, speculative=True)
    monkeypatch.setenv("SPECSERVE_WEIGHT_LAYOUT", "kn")  # a layout the kernel cannot read
    assert not use_megakernel("cpu", ModelConfig(**base), torch.bfloat16)
    monkeypatch.setenv("SPECSERVE_MEGAKERNEL", "yes")
    with pytest.raises(ValueError, match="SPECSERVE_MEGAKERNEL must be 0, 1 or auto"):
        megakernel_mode()


def test_megakernel_opts(monkeypatch) -> None:
    # SPECSERVE_MEGAKERNEL_OPTS (the benchmark's variant keys) reach the engine's kernel; bad ones are a clear error
    from specserve.layers.triton_megakernel import parse_opts

    assert parse_opts("rb=8, st=2,mg=0,po=7") == {"rows": 8, "stages": 2, "merge_splits": 0, "o_prefetch": 7}
    assert parse_opts("") == {}
    for bad in ("rb=x", "speed=3", "rb"):
        with pytest.raises(ValueError, match="SPECSERVE_MEGAKERNEL_OPTS: expected key=N"):
            parse_opts(bad)

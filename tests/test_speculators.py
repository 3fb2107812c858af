"""vLLM's "speculators" EAGLE-3 format (RedHatAI ``*-speculator.eagle3``): a tiny head written in both formats
drafts the same tokens with the same acceptance, stays lossless, takes its method and K from its config, and a
speculators checkpoint served as the model runs its verifier with itself as the drafter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from drafters import make_eagle3
from safetensors.torch import load_file, save_file

from specserve import LLM, SamplingParams
from specserve.config import SpeculativeConfig
from specserve.loading import speculators

VOCAB = 49152
PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,", "1, 2, 3, 4,"]
PARAMS = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
LAYER_KEYS = (
    "model_type", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size",
)  # fmt: skip


def to_speculators(
    src: str, dst: Path, verifier: str | None, k: int | None = 3, norm_before_residual: bool = False
) -> str:
    """The LlamaForCausalLMEagle3 head in ``src`` rewritten as a speculators checkpoint (the layer config nested,
    ``midlayer.`` -> ``layers.0.``, the proposal method and the verifier in ``speculators_config``)."""
    raw = json.loads((Path(src) / "config.json").read_text())
    layer = {key: raw[key] for key in LAYER_KEYS}
    methods = [{"proposal_type": "tree", "speculative_tokens": 9}]  # not the default: never chosen below
    if k is not None:
        methods.append({"proposal_type": "greedy", "speculative_tokens": k, "accept_tolerance": 0.0})
    cfg: dict[str, Any] = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "transformer_layer_config": {**layer, "num_hidden_layers": 1},
        "draft_vocab_size": raw["draft_vocab_size"],
        "norm_before_residual": norm_before_residual,
        "target_hidden_size": raw["target_hidden_size"],
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": methods if k is not None else [],
            "verifier": {"name_or_path": verifier, "architectures": ["Qwen3ForCausalLM"]},
        },
    }
    if verifier is None:
        del cfg["speculators_config"]["verifier"]
    dst.mkdir(parents=True)
    w = load_file(str(Path(src) / "model.safetensors"))
    save_file({n.replace("midlayer.", "layers.0."): t for n, t in w.items()}, str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def _llm(target: str, spec: dict[str, Any] | None) -> LLM:
    return LLM(target, dtype="float32", device="cpu", max_num_seqs=4, speculative_config=spec)


def _run(llm: LLM) -> tuple[list[list[int]], int, int]:
    outs = llm.generate(PROMPTS, PARAMS)
    m = llm.get_metrics()
    return (
        [o.outputs[0].token_ids for o in outs],
        m["spec_decode_num_drafts"],
        m["spec_decode_num_accepted_tokens"],
    )


@pytest.fixture(scope="module")
def heads(often_qwen3_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("speculators")
    eagle = make_eagle3(d / "eagle", 64, 4, VOCAB, seed=3)  # the target's LM head: often right
    return {
        "eagle": eagle,
        # no "eagle" in the directory name: the method comes from the config, not the path
        "spec": to_speculators(eagle, d / "head-a", verifier=often_qwen3_dir, k=3),
        "nbr": to_speculators(eagle, d / "head-b", verifier=often_qwen3_dir, k=3, norm_before_residual=True),
        "no_verifier": to_speculators(eagle, d / "head-c", verifier=None, k=3),
        "no_k": to_speculators(eagle, d / "head-d", verifier=often_qwen3_dir, k=None),
    }


def test_config_reading(heads: dict[str, str]) -> None:
    raw = speculators.read_config(heads["spec"])
    assert raw is not None and speculators.read_config(heads["eagle"]) is None
    assert speculators.method_of(raw) == "eagle3" and speculators.num_speculative_tokens(raw) == 3
    flat = speculators.flatten(raw)
    assert flat["hidden_size"] == 64 and flat["draft_vocab_size"] == VOCAB and flat["num_hidden_layers"] == 1
    with pytest.raises(ValueError, match="'mlp_speculator' is not supported"):
        speculators.method_of({**raw, "speculators_model_type": "mlp_speculator"})
    # method and K inferred from the checkpoint when the speculative config leaves them out
    sc = SpeculativeConfig.from_dict({"model": heads["spec"]})
    assert (sc.method, sc.num_speculative_tokens) == ("eagle3", 3)
    assert (
        SpeculativeConfig.from_dict(
            {"model": heads["spec"], "num_speculative_tokens": 2}
        ).num_speculative_tokens
        == 2
    )
    with pytest.raises(ValueError, match="'num_speculative_tokens' is required"):
        SpeculativeConfig.from_dict({"model": heads["no_k"]})


def test_same_drafts_as_the_eagle3_format_and_lossless(often_qwen3_dir: str, heads: dict[str, str]) -> None:
    plain, _, _ = _run(_llm(often_qwen3_dir, None))
    ref = _run(
        _llm(often_qwen3_dir, {"method": "eagle3", "model": heads["eagle"], "num_speculative_tokens": 3})
    )
    got = _run(_llm(often_qwen3_dir, {"model": heads["spec"]}))
    assert got[0] == plain == ref[0]
    assert got[1:] == ref[1:] and got[2] > 0  # the same drafts, accepted as often
    # norm_before_residual (the residual taken after hidden_norm) is a different head: same tokens, other drafts
    nbr = _run(_llm(often_qwen3_dir, {"model": heads["nbr"]}))
    assert nbr[0] == plain and nbr[1:] != ref[1:]


def test_served_directly_runs_its_verifier(often_qwen3_dir: str, heads: dict[str, str]) -> None:
    llm = LLM(heads["spec"], dtype="float32", device="cpu", max_num_seqs=4)
    spec = llm.engine.config.speculative_config
    assert spec is not None and (spec.method, spec.num_speculative_tokens) == ("eagle3", 3)
    assert llm.engine.checkpoint.path == str(Path(often_qwen3_dir).resolve())
    ref = _run(
        _llm(often_qwen3_dir, {"method": "eagle3", "model": heads["eagle"], "num_speculative_tokens": 3})
    )
    assert _run(llm) == ref
    with pytest.raises(ValueError, match="names no verifier"):
        LLM(heads["no_verifier"], dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="gives no speculative_tokens"):
        LLM(heads["no_k"], dtype="float32", device="cpu")

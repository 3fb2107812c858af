"""benchmarks/train_demo_drafters.sh, the recipe of the bundled drafters, end to end on a tiny random target (CPU):
greedy + sampled data sets, both drafters trained on both, the copies in $OUT; then a DFlash-only round continuing
from the exported drafter on the data files of the first run (what the H200 sessions do), and one schedule split
over two runs (--stop-after, then --resume)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from drafters import tiny_chat_target

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "train_demo_drafters.sh"


def _data_dir(d: Path) -> Path:
    (d / "corpus").mkdir(parents=True)
    qs = ["what is the sum of two and three ?", "what is two and two ?", "the sum of three and three ?"]
    (d / "gsm8k_train.jsonl").write_text("\n".join(json.dumps({"question": q, "answer": "5"}) for q in qs))
    (d / "extra.jsonl").write_text(json.dumps({"question": "what is three and two ?"}))
    (d / "mbpp_sanitized.json").write_text(json.dumps([{"task_id": 7, "prompt": "write a function ."}]))
    (d / "mbpp_sanitized_test.jsonl").write_text(json.dumps({"task_id": 11, "prompt": "t"}))
    (d / "spec_bench_question.jsonl").write_text(
        "\n".join(json.dumps({"category": c, "turns": ["what is the sum ?"]}) for c in ("qa", "mt_bench"))
    )
    (d / "corpus" / "tinyshakespeare.txt").write_text(
        "\n".join("continue the scene of two and three ." for _ in range(40))
    )
    return d


def _run(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("SAMPLED_", "EAGLE_", "DATA_FILE", "EXTRA_"))
    }
    base.update(PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    base["PATH"] = (
        os.path.dirname(sys.executable) + os.pathsep + base.get("PATH", "")
    )  # the script runs `python`
    base.update(env)
    res = subprocess.run(
        ["bash", str(SCRIPT)], env=base, capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _lines(path: Path) -> int:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return sum(1 for ln in f if ln.strip())


@pytest.mark.timeout(900)
def test_demo_recipe_runs_end_to_end(tmp_path):
    words = [
        "what",
        "is",
        "the",
        "sum",
        "of",
        "two",
        "and",
        "three",
        "write",
        "a",
        "function",
        "scene",
        "continue",
    ]
    target = tiny_chat_target(  # vocab well above what the data uses: DFlash needs an unused mask token id
        tmp_path / "target", words + ["?", "."], seed=3, vocab_size=4096, num_layers=4, max_position=2048
    )
    data = _data_dir(tmp_path / "data")
    assets, out = tmp_path / "assets", tmp_path / "out"
    common = dict(
        SMOLLM2_GGUF=target, DATA_DIR=str(data), ASSETS_DIR=str(assets), GEN_PROCS="1", BATCH_SIZE="2",
        DFLASH_STEPS="2", EAGLE_STEPS="2", BUDGET="100000", DFLASH_LAYERS="1", DFLASH_INTERMEDIATE="32",
    )  # fmt: skip
    _run(
        dict(common, WORK_DIR=str(tmp_path / "w1"), OUT=str(out), SELF_PROMPTS="0",
             EXTRA_PROMPTS=str(data / "extra.jsonl"), SAMPLED_REPEATS="2", SAMPLED_TEMPERATURE="0.9"),
        tmp_path,
    )  # fmt: skip
    # greedy set: 3 gsm8k + 1 extra + 1 mbpp + 1 spec-bench (mt_bench dropped) + 2 shakespeare chunks + 0 self
    n_greedy = _lines(out / "data.jsonl.gz")
    n_sampled = _lines(out / "data-sampled.jsonl.gz")
    assert n_greedy == 8 and n_sampled == 2 * 4  # the 4 gsm8k-style prompts, each answered twice
    for method in ("dflash", "eagle3"):
        info = json.loads((assets / f"smollm2-135m-{method}" / "training.json").read_text())
        assert info["data"]["samples"] == n_greedy + n_sampled and info["train"]["steps"] == 2
        files = info["data"]["generation"]["files"]
        assert [f["samples"] for f in files] == [n_greedy, n_sampled]
        assert (
            files[1]["generation"]["prompt_repeats"] == 2 and files[1]["generation"]["gsm8k_suffix"] == "none"
        )
        assert files[1]["generation"]["temperature"] == 0.9 and files[0]["generation"]["temperature"] == 0.0
        assert (out / "assets" / f"smollm2-135m-{method}" / "model.safetensors").is_file()
    # unset EXPORT_FORMAT stores as shipped: DFlash int8, EAGLE-3 bf16
    quant = {m: json.loads((assets / f"smollm2-135m-{m}" / "config.json").read_text()).get("quantization_config")
             for m in ("dflash", "eagle3")}  # fmt: skip
    assert quant["dflash"]["quant_method"] == "specserve_int8_rows" and quant["eagle3"] is None
    sampled = [json.loads(ln) for ln in gzip.open(out / "data-sampled.jsonl.gz", "rt")]
    assert all(r["loss_mask"].count(0) > 0 for r in sampled)

    # a DFlash-only round from the exported drafter, on the two files the first run left in $OUT (each with its
    # .meta.json, so this round's training.json still says how they were generated); no EAGLE-3 drafter needed;
    # the drafter grows a layer and is stored int8
    os.rename(assets / "smollm2-135m-eagle3", tmp_path / "eagle3-elsewhere")
    out2 = tmp_path / "out2"
    res = _run(
        dict(common, WORK_DIR=str(tmp_path / "w2"), OUT=str(out2), INIT_FROM_ASSETS="1", EAGLE_TIME_PCT="0",
             DATA_FILE=str(out / "data.jsonl.gz"), EXTRA_DATA=str(out / "data-sampled.jsonl.gz"),
             DFLASH_LAYERS="2", EXPORT_FORMAT="int8"),
        tmp_path,
    )  # fmt: skip
    assert "EAGLE-3: 0 s" in res.stderr
    info = json.loads((assets / "smollm2-135m-dflash" / "training.json").read_text())
    assert info["data"]["samples"] == n_greedy + n_sampled
    files = info["data"]["generation"]["files"]
    assert [f["generation"]["temperature"] for f in files] == [0.0, 0.9]
    assert files[1]["generation"]["prompt_repeats"] == 2
    cfg = json.loads((assets / "smollm2-135m-dflash" / "config.json").read_text())
    assert (
        cfg["num_hidden_layers"] == 2 and cfg["quantization_config"]["quant_method"] == "specserve_int8_rows"
    )
    assert len(info["earlier_runs"]) == 1 and info["total_steps_all_runs"] == 4
    assert (out2 / "assets" / "smollm2-135m-dflash" / "model.safetensors").is_file()
    assert not (out2 / "assets" / "smollm2-135m-eagle3").exists()

    # one LR schedule over two runs (how the shipped drafter's last round was trained): part 1 stops after 2 of 4
    # steps with a checkpoint and exports the partial drafter beside it, the assets untouched; part 2 resumes it
    before = (assets / "smollm2-135m-dflash" / "model.safetensors").read_bytes()
    two = dict(common, WORK_DIR=str(tmp_path / "w3"), INIT_FROM_ASSETS="1", EAGLE_TIME_PCT="0",
               DATA_FILE=str(out / "data.jsonl.gz"), DFLASH_LAYERS="2", DFLASH_STEPS="4", SEED="2")  # fmt: skip
    _run(dict(two, DFLASH_STOP_AFTER="2"), tmp_path)
    assert (assets / "smollm2-135m-dflash" / "model.safetensors").read_bytes() == before
    part = json.loads((tmp_path / "w3" / "dflash-part" / "training.json").read_text())
    assert part["train"]["steps"] == 2 and part["train"]["total_steps"] == 4 and part["args"]["seed"] == 2
    _run(dict(two, DFLASH_RESUME="1"), tmp_path)
    info = json.loads((assets / "smollm2-135m-dflash" / "training.json").read_text())
    assert info["train"]["steps"] == 4 and info["train"]["steps_this_run"] == 2 and info["args"]["resume"]
    assert (assets / "smollm2-135m-dflash" / "model.safetensors").read_bytes() != before

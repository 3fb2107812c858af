"""`specserve eval-acceptance`: the report on a tiny model with n-gram drafting (lossless on CPU, fp32)."""

from __future__ import annotations

import json

from specserve.spec import eval_acceptance


def test_eval_acceptance_report(often_qwen3_dir, tmp_path, capsys):
    data = tmp_path / "mt_bench_question.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"turns": [f"Repeat after me: {w} {w} {w} {w}"]}) for w in ("red", "blue", "green")
        )
    )
    out = tmp_path / "eval.json"
    spec = json.dumps(
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    )
    rc = eval_acceptance.main(
        ["--model", often_qwen3_dir, "--dtype", "float32", "--device", "cpu", "-sc", spec, "--dataset", str(data),
         "--num-prompts", "2", "--max-tokens", "24", "--batch-size", "2", "--max-model-len", "256", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["dataset"] == "mt_bench_question" and row["prompts"] == 2 and row["tokens"] > 0
    assert row["acceptance_length"] >= 1.0 and len(row["per_position"]) == 4
    # fp32 on the CPU: speculation is lossless token for token
    assert row["identical_prompts"] == 2 and row["common_prefix_frac"] == 1.0 and row["identical_to_baseline"]
    printed = capsys.readouterr().out
    assert "accept len" in printed and "2/2" in printed


def test_eval_acceptance_bad_dataset(tmp_path, capsys):
    rc = eval_acceptance.main(["--model", "x", "-sc", "{}", "--dataset", str(tmp_path / "missing.jsonl")])
    assert rc == 2
    assert "error" in capsys.readouterr().err


def test_eval_acceptance_draft_model_inferred(often_qwen3_dir, tmp_path, capsys):
    """A spec without 'method' is reported under the method it infers (vLLM: a plain LM is a draft model); the
    target as its own draft model has every draft accepted."""
    data = tmp_path / "gsm8k_test.jsonl"
    data.write_text(
        "\n".join(json.dumps({"question": q}) for q in ("What is 2 + 3?", "Name a prime number."))
    )
    out = tmp_path / "eval.json"
    spec = json.dumps({"model": often_qwen3_dir, "num_speculative_tokens": 2})
    rc = eval_acceptance.main(
        ["--model", often_qwen3_dir, "--dtype", "float32", "--device", "cpu", "-sc", spec, "--dataset", str(data),
         "--num-prompts", "2", "--max-tokens", "16", "--batch-size", "2", "--max-model-len", "256", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["method"] == "draft_model" and row["identical_prompts"] == 2
    assert row["per_position"][0] == 1.0  # every first draft accepted
    assert row["acceptance_length"] > 2.5  # K=2: 3 tokens a step but for drafts cut short near max_tokens
    assert "draft_model" in capsys.readouterr().out

"""Drafter training: ``specserve train dflash|eagle3`` (see :mod:`specserve.train.cli`).

Modules: ``data`` (prompts, eval-set guard, response regeneration, batching), ``target`` (frozen target and
its online feature taps), ``models`` (DFlash / EAGLE-3 drafters with checkpoint parameter names),
``losses`` (anchored-block DFlash loss, EAGLE-3 training-time test), ``trainer`` (AdamW, cosine, bf16,
checkpoint/resume, DDP), ``export`` (vLLM-loadable config.json + model.safetensors).
"""

from specserve.train.target import TrainError


def main(argv: list[str] | None = None) -> int:
    """``specserve train ...`` entry point (``argv`` excludes 'train')."""
    from specserve.train.cli import main as _main

    return _main(argv)


__all__ = ["TrainError", "main"]

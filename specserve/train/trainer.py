"""The training loop: AdamW + warmup/cosine, bf16 autocast on CUDA, grad clipping, checkpoint/resume, DDP."""

from __future__ import annotations

import math
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from specserve.train.data import Sample, batch_plan, collate
from specserve.train.losses import (
    DFlashObjective,
    Eagle3Objective,
    chain_acceptance,
    sample_anchors,
    summarize,
)
from specserve.train.models import ATTN_BACKENDS, DFlashDrafter, Eagle3Drafter
from specserve.train.target import Target, TrainError

CHECKPOINT_NAME = "checkpoint.pt"


@dataclass
class TrainArgs:
    work_dir: str
    epochs: float = 1.0
    max_steps: int | None = None
    batch_size: int = 8
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_length: int = 2048
    save_every: int = 0
    resume: bool = False
    seed: int = 0
    num_anchors: int = 512
    gamma: float | None = None
    position_weight: str = "decay"  # DFlash: "decay" or "prefix" (losses.POSITION_WEIGHTS)
    ttt_steps: int = 7
    labels: str = "data"  # "data": the training tokens; "target": the target's greedy next tokens
    attn_backend: str = "auto"
    ce_chunk: int = 8192
    log_every: int = 10
    stop_after: int | None = None  # stop early (as if interrupted) after this step; schedule unchanged
    max_time: float | None = None  # wall-clock budget (s): the schedule shrinks to fit it
    stop_after_time: float | None = None  # stop early (as if interrupted) once this run passed S seconds
    progress: bool = True
    eval_every: int = 0  # validation every N steps (0: only before and after training); needs val samples
    command: str | None = None  # this run's command line, recorded per part of a schedule split by --resume


def dist_info() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) of an initialised process group, else (0, 1, 0)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    return 0, 1, 0


def cosine_schedule(step: int, total: int, warmup: int, min_ratio: float) -> float:
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


class Trainer:
    def __init__(
        self,
        drafter: DFlashDrafter | Eagle3Drafter,
        target: Target,
        samples: list[Sample],
        args: TrainArgs,
        val_samples: list[Sample] | None = None,
    ) -> None:
        self.rank, self.world, self.local_rank = dist_info()
        self.args = args
        self.target = target
        self.device = target.device
        self.samples = samples
        self.val_samples = list(val_samples or [])
        self.lengths = [min(len(s.input_ids), args.max_length) for s in samples]
        self.drafter = drafter.to(self.device)
        self.is_dflash = isinstance(drafter, DFlashDrafter)
        self.autocast = self.device.type == "cuda" and target.dtype in (torch.bfloat16, torch.float16)
        backend = args.attn_backend
        # auto: FlexAttention on CUDA, falling back to "split" once if compiling / running it raises
        self.flex_fallback = backend == "auto" and self.is_dflash and self.device.type == "cuda"
        if backend == "auto":
            backend = "flex" if self.flex_fallback else "split"
        if backend not in ATTN_BACKENDS:
            raise TrainError(f"unknown attention backend {backend!r} (auto, {', '.join(ATTN_BACKENDS)})")
        embed, head = target.embed_weight.detach(), target.lm_head_weight.detach()
        obj: nn.Module
        if self.is_dflash:
            obj = DFlashObjective(
                drafter,  # type: ignore[arg-type]
                embed,
                head,
                args.gamma,
                backend,
                args.ce_chunk,
                position_weight=args.position_weight,
            )
        else:
            obj = Eagle3Objective(drafter, embed, head, args.ttt_steps, ce_chunk=args.ce_chunk)  # type: ignore[arg-type]
        self.objective = obj
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.model: nn.Module = DDP(obj, device_ids=ids, broadcast_buffers=False)
        else:
            self.model = obj
        params = [p for p in drafter.parameters() if p.requires_grad]
        fused = self.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(
            params, lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay, fused=fused
        )
        self.steps_per_epoch = len(
            batch_plan(self.lengths, args.batch_size, 0, args.seed, self.rank, self.world)
        )
        total = int(math.ceil(args.epochs * self.steps_per_epoch))
        if args.max_steps is not None:
            total = min(total, args.max_steps) if args.epochs > 0 else args.max_steps
        self.total_steps = max(1, total)
        self.warmup_steps = int(math.ceil(args.warmup_ratio * self.total_steps))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: cosine_schedule(s, self.total_steps, self.warmup_steps, args.min_lr_ratio),
        )
        self.generator = torch.Generator().manual_seed(args.seed * 7919 + self.rank)
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.val_history: list[dict[str, Any]] = []
        self.tokens_seen = 0
        # earlier runs of this schedule (from the checkpoint), oldest first
        self.parts: list[dict[str, Any]] = []
        self._part_start = 0

    # ------------------------------------------------------------------ checkpoints

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.args.work_dir, CHECKPOINT_NAME)

    def _gather_generator_states(self) -> list[torch.Tensor]:
        state = self.generator.get_state()
        if self.world == 1:
            return [state]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, state)
        return out

    def save_checkpoint(self) -> None:
        gen_states = self._gather_generator_states()  # collective: every rank calls it
        if self.rank != 0:
            return
        os.makedirs(self.args.work_dir, exist_ok=True)
        state = dict(
            model=self.drafter.state_dict(),
            optimizer=self.optimizer.state_dict(),
            scheduler=self.scheduler.state_dict(),
            step=self.step,
            total_steps=self.total_steps,
            world_size=self.world,
            tokens_seen=self.tokens_seen,
            history=self.history,
            val_history=self.val_history,
            parts=self.schedule_parts(),
            rng=dict(
                generators=gen_states,
                torch=torch.get_rng_state(),
                cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                python=random.getstate(),
                numpy=np.random.get_state(),
            ),
        )
        tmp = self.checkpoint_path + ".tmp"
        torch.save(state, tmp)
        os.replace(tmp, self.checkpoint_path)

    def load_checkpoint(self) -> bool:
        if not os.path.isfile(self.checkpoint_path):
            return False
        state = torch.load(self.checkpoint_path, map_location="cpu", weights_only=False)
        self.drafter.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        self.tokens_seen = int(state.get("tokens_seen", 0))
        self.history = list(state.get("history", []))
        self.val_history = list(state.get("val_history", []))
        self.parts = list(state.get("parts", []))
        rng = state["rng"]
        gens = rng["generators"]
        if len(gens) == self.world:
            self.generator.set_state(gens[self.rank])
        torch.set_rng_state(rng["torch"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            try:
                torch.cuda.set_rng_state_all(rng["cuda"])
            except (RuntimeError, IndexError):
                pass
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        return True

    # ------------------------------------------------------------------ loop

    def _reduce(self, stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.world == 1:
            return stats
        out = {}
        for k, v in stats.items():
            v = v.clone()
            dist.all_reduce(v)
            out[k] = v / self.world if k == "loss" else v
        return out

    def train_step(self, idx: list[int]) -> dict[str, torch.Tensor]:
        args = self.args
        ids, mask = collate(self.samples, idx, args.max_length)
        ids = ids.to(self.device, non_blocking=True)
        mask = mask.to(self.device, non_blocking=True)
        self.tokens_seen += int(mask.sum()) * self.world
        if args.labels == "target":
            taps, label_ids = self.target.features_and_labels(ids)
        else:
            taps, label_ids = self.target.features(ids), ids
        if self.is_dflash:
            anchors, valid = sample_anchors(mask, args.num_anchors, self.generator)
            stats = self._dflash_forward_backward(taps, ids, mask, anchors, valid, label_ids)
        else:
            stats = self._forward_backward(taps, ids, mask, label_ids)
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), args.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return stats

    def _forward_backward(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            loss, stats = self.model(*inputs)
        loss.backward()
        return stats

    def _dflash_forward_backward(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        obj = self.objective
        try:
            return self._forward_backward(*inputs)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - any compile / kernel failure of the auto-selected flex path
            if obj.backend == "flex" and self.device.type == "cpu" and isinstance(e, NotImplementedError):
                raise TrainError(
                    f"--attn-backend flex cannot train on CPU with this torch ({e}); use split"
                ) from e
            if not self.flex_fallback:
                raise
            tag = f"[rank {self.rank}] " if self.world > 1 else ""
            msg = (
                f"{tag}warning: FlexAttention failed at step {self.step} ({type(e).__name__}: {e}); "
                "falling back to --attn-backend split"
            )
        # one-time fallback: redo this step (same batch and anchors) with the split backend
        print(msg, file=sys.stderr, flush=True)
        self.flex_fallback = False
        obj.backend = "split"
        self.optimizer.zero_grad(set_to_none=True)
        return self._forward_backward(*inputs)

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Loss, per-position accuracy and acceptance on the validation samples (every anchor, no sampling).

        ``tau`` averages over all anchors (the training proxy); ``chain_tau`` walks each sequence in inference
        order (:func:`chain_acceptance`): the mean acceptance length greedy decoding of these responses with this
        drafter reports (the engine's ``1 + accepted / drafts``, up to bf16 rounding), since the responses are the
        target's own greedy outputs. Each rank evaluates a shard; the sums are all-reduced.
        """
        args = self.args
        obj = self.objective
        was_training = self.drafter.training
        self.drafter.eval()
        mine = list(range(self.rank, len(self.val_samples), self.world))
        sums: dict[str, torch.Tensor] = {}
        loss_sum = torch.zeros((), device=self.device)
        loss_n = torch.zeros((), device=self.device)
        chain = torch.zeros(2, device=self.device)  # tokens, steps
        backend = str(getattr(obj, "backend", "split"))
        if self.is_dflash:
            obj.backend = "split"  # no FlexAttention recompiles for the odd shapes of a validation pass
        try:
            bs = max(1, min(args.batch_size, 8))  # every anchor of a sequence at once: keep the batch small
            for i in range(0, len(mine), bs):
                idx = mine[i : i + bs]
                ids, mask = collate(self.val_samples, idx, args.max_length)
                ids, mask = ids.to(self.device), mask.to(self.device)
                taps = self.target.features(ids)
                all_stats, anchor_runs = self._eval_batch(taps, ids, mask)
                for stats in all_stats:
                    for k, v in stats.items():
                        if k in ("loss", "runs"):
                            continue
                        sums[k] = sums[k] + v.float() if k in sums else v.float().clone()
                    w = stats["pos_total"].sum()
                    loss_sum += stats["loss"].float() * w
                    loss_n += w
                for row, runs in enumerate(anchor_runs):
                    if not runs:
                        continue
                    resp = mask[row].bool().nonzero().flatten()
                    tokens, steps = chain_acceptance(runs, int(resp[0]), int(resp[-1]) + 1)
                    chain += torch.tensor([tokens, steps], device=self.device, dtype=chain.dtype)
        finally:
            if self.is_dflash:
                obj.backend = backend
            self.drafter.train(was_training)
        if not sums:  # this rank had no validation samples (more ranks than samples)
            n_pos = (self.drafter.config.block_size - 1) if self.is_dflash else args.ttt_steps
            sums = {
                k: torch.zeros(n_pos if k.startswith("pos_") else (), device=self.device)
                for k in ("pos_correct", "pos_total", "accept_sum", "chains")
            }
        sums["loss_sum"], sums["loss_n"], sums["chain"] = loss_sum, loss_n, chain
        if self.world > 1:
            for v in sums.values():
                dist.all_reduce(v)
        sums["loss"] = sums.pop("loss_sum") / sums.pop("loss_n").clamp(min=1)
        tok, steps = sums.pop("chain").tolist()
        out = summarize(sums)
        out["chain_tau"] = round(tok / steps, 4) if steps else float("nan")
        out["samples"] = len(self.val_samples)
        return out

    def _eval_batch(
        self, taps: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor
    ) -> tuple[list[dict[str, torch.Tensor]], list[dict[int, int]]]:
        """One validation batch -> (stats of each forward, per row {anchor: run}); DFlash runs every anchor of
        the response, in windows of ``num_anchors`` per forward."""
        b, s = ids.shape
        m = mask.bool()
        ok = torch.zeros_like(m)
        ok[:, :-1] = m[:, :-1] & m[:, 1:]  # anchors a with a and a+1 in the response (as in training)
        if not self.is_dflash:
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                _, stats = self.objective(taps, ids, mask, return_runs=True)
            runs = stats["runs"].tolist()
            okl = ok.tolist()
            # index t drafts from anchor t + 1; the first anchor is the first response token
            rows = [{t + 1: runs[r][t] for t in range(s - 1) if okl[r][t + 1]} for r in range(b)]
            return [stats], rows
        n = int(ok.sum(1).max())
        rows = [{} for _ in range(b)]
        if n == 0:
            return [], rows
        order = torch.where(ok, torch.arange(s, device=ids.device), torch.full_like(ids, s)).sort(1).values
        anchors_all = order[:, :n]
        valid_all = anchors_all < s
        anchors_all = torch.where(valid_all, anchors_all, torch.zeros_like(anchors_all))
        out = []
        w = max(1, self.args.num_anchors)
        for j in range(0, n, w):
            anchors = anchors_all[:, j : j + w].contiguous()
            valid = valid_all[:, j : j + w].contiguous()
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                _, stats = self.objective(taps, ids, mask, anchors, valid, return_runs=True)
            al, vl, rl = anchors.tolist(), valid.tolist(), stats["runs"].tolist()
            for i in range(b):
                rows[i].update((a, r) for a, v, r in zip(al[i], vl[i], rl[i]) if v)
            out.append(stats)
        return out, rows

    def train(self) -> dict[str, Any]:
        from tqdm import tqdm

        args = self.args
        if args.resume and self.load_checkpoint() and self.rank == 0:
            print(f"resumed from {self.checkpoint_path} at step {self.step}/{self.total_steps}", flush=True)
        self._part_start = self.step
        self.drafter.train()
        end = self.total_steps if args.stop_after is None else min(self.total_steps, args.stop_after)
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            desc="train " + ("dflash" if self.is_dflash else "eagle3"),
            disable=not args.progress or self.rank != 0,
            dynamic_ncols=True,
        )
        window: dict[str, torch.Tensor] = {}
        n_window = 0
        last: dict[str, Any] = {}
        t0 = time.time()
        start_step = self.step
        calib = min(20, max(2, self.total_steps // 10))
        step_times: list[float] = []
        if self.val_samples and self.step < end:
            self._validate(bar)
        while self.step < end:
            epoch, offset = divmod(self.step, self.steps_per_epoch)
            plan = batch_plan(self.lengths, args.batch_size, epoch, args.seed, self.rank, self.world)
            for idx in plan[offset:]:
                if self.step >= end:
                    break
                t_step = time.time()
                stats = self.train_step(idx)
                if len(step_times) < calib:
                    step_times.append(time.time() - t_step)
                for k, v in stats.items():
                    window[k] = window[k] + v.detach() if k in window else v.detach().clone()
                n_window += 1
                bar.update(1)
                if args.max_time is not None and self.step - start_step == calib:
                    end = self._fit_time_budget(time.time() - t0, step_times, end)
                    bar.total = self.total_steps
                elif (
                    args.max_time is not None
                    and self.world == 1
                    and self.step - start_step > calib
                    and time.time() - t0 > args.max_time
                ):
                    end = self.step  # the estimate was short: stop at the budget anyway (single process)
                if args.stop_after_time is not None and self._time_is_up(time.time() - t0):
                    end = self.step  # schedule unchanged: --resume continues it
                if self.step % max(1, args.log_every) == 0 or self.step == end:
                    red = self._reduce({k: (v / n_window if k == "loss" else v) for k, v in window.items()})
                    last = summarize(red)
                    acc = last["acc"]
                    bar.set_postfix(
                        loss=f"{last['loss']:.3f}",
                        acc1=f"{acc[0]:.3f}",
                        acc_mean=f"{sum(acc) / max(1, len(acc)):.3f}",
                        tau=f"{last['tau']:.2f}",
                        lr=f"{self.scheduler.get_last_lr()[0]:.1e}",
                    )
                    self.history.append(dict(step=self.step, **last))
                    window, n_window = {}, 0
                if (
                    self.val_samples
                    and args.eval_every
                    and self.step % args.eval_every == 0
                    and self.step != end
                ):
                    self._validate(bar)
                if args.save_every and self.step % args.save_every == 0:
                    self.save_checkpoint()
        if self.val_samples and (not self.val_history or self.val_history[-1]["step"] != self.step):
            self._validate(bar)
        bar.close()
        saved = bool(args.save_every) and self.step % args.save_every == 0
        stopped_early = (
            args.stop_after is not None or args.stop_after_time is not None
        ) and self.step < self.total_steps
        if not saved and (args.save_every or stopped_early):
            self.save_checkpoint()  # an early stop always leaves a checkpoint: --resume continues from it
        elapsed = time.time() - t0
        return dict(
            steps=self.step,
            total_steps=self.total_steps,
            steps_this_run=self.step - start_step,
            seconds=round(elapsed, 2),
            tokens_seen=self.tokens_seen,
            attn_backend=getattr(self.objective, "backend", None),
            position_weight=getattr(self.objective, "position_weight", None),
            final=last,
            val=self.val_history[-1] if self.val_history else None,
            parts=self.schedule_parts(),
            history=self.history,
            val_history=self.val_history,
        )

    def _time_is_up(self, elapsed: float) -> bool:
        """``--stop-after-time``: has this run passed its wall-clock limit? Ranks follow rank 0's clock (one
        broadcast per step), so every process stops after the same step."""
        assert self.args.stop_after_time is not None
        up = torch.tensor([int(elapsed > self.args.stop_after_time)], dtype=torch.long)
        if self.world > 1:
            up = up.to(self.device)
            dist.broadcast(up, src=0)
        return bool(up.item())

    def schedule_parts(self) -> list[dict[str, Any]]:
        """The runs that trained this schedule so far, oldest first: each one's command and [first, last) steps (one
        entry for an uninterrupted run; one per --resume)."""
        return self.parts + [dict(command=self.args.command, steps=[self._part_start, self.step])]

    def _validate(self, bar: Any) -> None:
        t = time.time()
        v = self.evaluate()
        self.val_history.append(dict(step=self.step, seconds=round(time.time() - t, 2), **v))
        if self.rank == 0:
            msg = (
                f"validation at step {self.step}: loss {v['loss']:.4f}, tau {v['tau']:.3f}, "
                f"chain tau {v['chain_tau']:.3f} ({v['samples']} samples, {time.time() - t:.1f} s)"
            )
            if bar.disable:
                print(msg, flush=True)
            else:
                bar.write(msg)

    def _fit_time_budget(self, elapsed: float, step_times: list[float], end: int) -> int:
        """Shrink ``total_steps`` (the cosine schedule's length) so the run ends within ``max_time`` seconds.

        The estimate uses the median time of the first steps of this run (robust to the few slow steps that
        compile FlexAttention kernels); ranks agree on rank 0's choice.
        """
        assert self.args.max_time is not None
        per_step = statistics.median(step_times) if step_times else elapsed
        fit = self.step + int(max(0.0, self.args.max_time - elapsed) / max(per_step, 1e-9))
        total = torch.tensor([min(self.total_steps, max(self.step, fit))], dtype=torch.long)
        if self.world > 1:
            total = total.to(self.device)
            dist.broadcast(total, src=0)
        new_total = int(total.item())
        if new_total < self.total_steps and self.rank == 0:
            print(
                f"time budget {self.args.max_time:.0f} s at {per_step:.3f} s/step: "
                f"{self.total_steps} -> {new_total} steps",
                flush=True,
            )
        self.total_steps = new_total
        self.warmup_steps = int(math.ceil(self.args.warmup_ratio * new_total))
        return min(end, new_total)

    def args_dict(self) -> dict[str, Any]:
        return asdict(self.args)

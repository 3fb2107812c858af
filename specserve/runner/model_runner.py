"""The model runner owns every tensor: weights, paged KV caches, the step's input buffers, sampling.

``execute`` runs one engine step: the target over every scheduled token (prefill chunks, decode tokens and
draft blocks to verify, in one varlen batch), verification / sampling of the rows that end a request's known
tokens, then the proposer, which drafts the next step's tokens from this step's target features.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specserve.config import EngineConfig, ModelConfig
from specserve.engine.scheduler import SchedulerOutput
from specserve.layers.attention import AttnMetadata, make_backend
from specserve.layers.sampler import (
    SamplingTensors,
    compute_logprobs,
    gather_logprobs,
    param_row,
    row_seed_key,
    sample,
    sort_free,
    sort_free_graphs_on,
)
from specserve.models.llama import DecoderLM
from specserve.runner.cuda_graphs import BucketedGraphs, PaddedBatch, batch_buckets, capture_limit
from specserve.spec.proposer import DraftInput, Proposer
from specserve.spec.rejection import greedy_verify, rejection_sample, sample_verify

logger = logging.getLogger("specserve")

# Token buckets of the prefill graphs (one request's prefill chunk, padded up to the next bucket): without them a
# prefill step is hundreds of eagerly launched kernels, host-bound on a slow CPU (session 10, H200: ~15-25 ms for a
# 128-token SmolLM2 prompt, most of the time to first token). Longer chunks run eagerly (their launches amortize).
PREFILL_GRAPH_TOKENS = (16, 32, 64, 128, 256, 512)


@dataclass
class RequestStepOutput:
    new_token_ids: list[int] = field(default_factory=list)
    num_draft: int = 0
    num_accepted: int = 0
    # per new token: (chosen logprob, chosen rank, top ids, top logprobs)
    logprobs: list[tuple[float, int, list[int], list[float]]] | None = None
    # prompt_logprobs: (first prompt position p + 1 it covers, one tuple per position as in logprobs)
    prompt_logprobs: tuple[int, list[tuple[float, int, list[int], list[float]]]] | None = None


@dataclass
class StepOutput:
    outputs: dict[str, RequestStepOutput]
    drafts: dict[str, list[int]]


@dataclass
class InflightDecode:
    """A launched async decode step: its requests, the device output the next step reads its input tokens from
    (packed [b, 2]: token, n_match), the host rows it is being copied to, and the event that marks the copy."""

    items: list[Any]
    packed: torch.Tensor
    host: torch.Tensor
    done: Any


@dataclass
class InflightSpec:
    """A launched fused speculative step (verify graph + fused drafter graph): its requests, the device
    output (packed [n, 2K+2]: q verified tokens | n_match | K drafts, -1 where none), the pinned host rows it is
    being copied to, the copy's event, and on the device per request its number of drafts verified, its draft
    budget before n_acc (aux of the step) and its first position: what the next step's inputs are built from."""

    items: list[Any]
    packed: torch.Tensor
    host: torch.Tensor
    done: Any
    num_draft: torch.Tensor
    budget: torch.Tensor
    first: torch.Tensor


@torch.no_grad()
def init_dummy_weights(model: torch.nn.Module, seed: int = 0, std: float = 0.02) -> None:
    """Random weights (``load_format="dummy"``): normal(0, std) matrices, unit norms."""
    g = torch.Generator(device=next(model.parameters()).device)
    g.manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            p.normal_(0.0, std, generator=g)
        elif "norm" in name:
            p.fill_(1.0)
        else:
            p.zero_()


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no CUDA device is available.")
    return torch.device(device)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 dot-product instructions (AVX512-BF16 or AMX tiles) torch's GEMMs use."""
    cpu = getattr(torch, "cpu", None)
    try:
        return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())  # type: ignore[union-attr]
    except (AttributeError, RuntimeError):
        return False


def resolve_dtype(dtype: str, hf_dtype: object, device: torch.device) -> torch.dtype:
    names = {
        "float32": torch.float32,
        "float": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "half": torch.float16,
        "fp16": torch.float16,
    }
    if dtype != "auto":
        return names[dtype]
    if device.type == "cpu":
        # vLLM's CPU backend defaults to bf16. Here: bf16 where the CPU multiplies bf16 natively (AVX512-BF16 / AMX:
        # a GEMM of 1-16 rows then costs what one row does, which speculative verification needs; on the 2-core
        # VM DFlash K=4 at batch 1 ran 30.2 tok/s in bf16 vs 20.9 in fp32, plain 29.3 vs 30.7), unless the
        # checkpoint is float32; fp32 on other CPUs (emulated bf16 is slower than fp32 there).
        declared = names.get(hf_dtype) if isinstance(hf_dtype, str) else hf_dtype
        if declared == torch.float32 or not cpu_has_native_bf16():
            return torch.float32
        return torch.bfloat16
    if isinstance(hf_dtype, torch.dtype):
        return torch.bfloat16 if hf_dtype == torch.float32 else hf_dtype
    if isinstance(hf_dtype, str) and hf_dtype in names:
        d = names[hf_dtype]
        return torch.bfloat16 if d == torch.float32 else d
    return torch.bfloat16


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        weights: object,
        device: torch.device,
        dtype: torch.dtype,
        max_model_len: int,
        checkpoint: object = None,
    ) -> None:
        self.config = config
        self.model_config = model_config
        self.device = device
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.block_size = config.block_size
        spec = config.speculative_config
        k = spec.num_speculative_tokens if spec else 0
        self.num_speculative_tokens = k
        self.draft_max_model_len = spec.max_model_len if spec and spec.max_model_len else max_model_len
        self.disable_by_batch_size = spec.disable_by_batch_size if spec else None
        self.gate: Any = None  # speculative_config.disable_when_slower: the engine's SpeculationGate
        with torch.device(device):
            prev = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            try:
                # positions past the sequence: a verify block's padding (2K + 8) or a padded prefill chunk's
                pad = max(2 * k + 8, PREFILL_GRAPH_TOKENS[-1])
                self.model = DecoderLM(model_config, max_position=max_model_len + pad)
            finally:
                torch.set_default_dtype(prev)
        if weights is None:
            init_dummy_weights(self.model, config.seed)
        else:
            self.model.load_weights(weights)  # type: ignore[arg-type]
        self.model.eval().requires_grad_(False)
        from specserve.layers.linear import (
            cpu_mm_enabled,
            split_gemm_config,
            transpose_decoder_linears,
            triton_gemm_enabled,
            use_cpu_mm,
            weight_layout,
        )

        # batch-1 decode steps as one persistent kernel (bound with the KV caches); it reads nn.Linear's layout
        self.use_megakernel = False
        if torch.device(device).type == "cuda" or os.environ.get("SPECSERVE_MEGAKERNEL") == "1":
            from specserve.layers.triton_megakernel import use_megakernel  # imports triton

            self.use_megakernel = use_megakernel(
                device, model_config, dtype, speculative=spec is not None, max_num_seqs=config.max_num_seqs
            )
        # decode GEMM layout (layers/linear.py); the drafters follow the target's
        self.weight_layout = (
            "nk" if self.use_megakernel else weight_layout(device, int(model_config.hidden_size))
        )
        if self.weight_layout == "kn":
            transpose_decoder_linears(self.model.layers)
        triton_gemm = triton_gemm_enabled(device)
        self.model.split_gemm = split_gemm_config(device, self.weight_layout, triton_gemm)
        self.model.triton_gemm = bool(self.model.split_gemm) and triton_gemm
        self.model.rope.to(device)
        self.backend = make_backend(config.attention_backend, device)
        self.model.backend = self.backend
        if self.model.triton_gemm:  # the Triton GEMMs run on the fused path, where the shapes fit their tiles
            from specserve.models.llama import triton_gemm_fits

            self.model.triton_gemm = self.backend.fused and triton_gemm_fits(
                self.model.layers, self.model.split_gemm
            )
            if not self.model.triton_gemm:  # cuBLAS's splits (none on nn.Linear's layout)
                self.model.split_gemm = split_gemm_config(device, self.weight_layout, False)
        self.proposer: Proposer | None = None
        if spec is not None:
            from specserve.spec import build_proposer

            self.proposer = build_proposer(spec, self)
            self.model.tap_indices = list(self.proposer.tap_indices)
        # float32 CPU: the decode / verify / drafter GEMMs as W @ x.T (layers/linear.py CPU_MM_MAX_ROWS)
        self.cpu_mm = cpu_mm_enabled(device, dtype)
        if self.cpu_mm:
            use_cpu_mm(self.model)
            from specserve.models.dflash import DFlashDraftModel

            draft = getattr(self.proposer, "model", None)
            if isinstance(draft, torch.nn.Module):
                use_cpu_mm(draft)
            if isinstance(draft, DFlashDraftModel):  # its stacked context K/V GEMM too
                draft.cpu_mm = True
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(config.seed)
        self.num_blocks = 0
        self.num_fast_steps = 0  # steps answered by the in-graph verify / sampling (tests, benchmarks)
        self.num_sampling_steps = 0  # of those, steps with random (temperature > 0) requests (tests)
        self.num_fused_steps = 0  # of those, steps whose drafter ran on the device too (tests, benchmarks)
        self.num_async_steps = 0  # decode steps launched while the previous one was still in flight (tests)
        self.num_async_spec_steps = 0  # fused speculative steps launched while the previous one was in flight
        self.async_spec = False  # set up with the uniform path (_setup_uniform_path)
        self.use_fused_step = False  # set up with the uniform path (_setup_uniform_path)
        self.async_scheduling = False  # likewise
        self.use_context_step = False  # likewise: plain steps feed the drafter from a graph (launch_decode)
        self.prefill_graphs: BucketedGraphs | None = None  # likewise (padded path only)
        self.num_prefill_graph_steps = 0  # prefill steps run through the prefill graphs (tests, benchmarks)
        self.profile = False  # benchmarks: per step (target+verify ms, drafter ms, batch) in self.timings
        self.timings: list[tuple[float, float, int]] = []

    # ------------------------------------------------------------------ KV cache
    def kv_bytes_per_block(self) -> int:
        c = self.model_config
        per_layer = 2 * self.block_size * c.num_key_value_heads * c.head_dim
        total = per_layer * c.num_hidden_layers
        spec = self.proposer.kv_cache_spec() if self.proposer else None
        if spec:
            total += 2 * self.block_size * spec[0] * spec[1] * spec[2]
        return total * torch.empty((), dtype=self.dtype).element_size()

    def determine_num_blocks(self, max_num_batched_tokens: int = 2048) -> int:
        """KV blocks for target + drafter. On CUDA: what ``gpu_memory_utilization`` of the device leaves after the
        loaded weights, the peak activations of a profiling forward (the largest prefill chunk) and a reserve for
        the CUDA graphs (the activations of their largest batch: verify or prefill chunk, measured the same way)."""
        if self.config.num_gpu_blocks:
            return self.config.num_gpu_blocks
        per_block = self.kv_bytes_per_block()
        if self.device.type == "cuda":
            prefill_peak = self.profile_forward(max_num_batched_tokens)
            graph_peak = 0
            if not self.config.enforce_eager:
                graph_peak = self.profile_forward(
                    max(
                        self.config.max_num_seqs * (1 + self.num_speculative_tokens),
                        self._prefill_graph_max(),
                    )
                )
            torch.cuda.empty_cache()
            free, total = torch.cuda.mem_get_info(self.device)
            used = total - free
            budget = int(total * self.config.gpu_memory_utilization) - used - prefill_peak - graph_peak
            logger.info(
                "memory profile: weights and runtime %.2f GiB, profiling forward of %d tokens %.2f GiB, CUDA graph "
                "reserve %.2f GiB; KV cache budget %.2f GiB (gpu_memory_utilization %.2f of %.1f GiB)",
                used / 2**30,
                max_num_batched_tokens,
                prefill_peak / 2**30,
                graph_peak / 2**30,
                max(0, budget) / 2**30,
                self.config.gpu_memory_utilization,
                total / 2**30,
            )
            if budget < per_block:
                raise ValueError(
                    f"No memory left for the KV cache: weights, runtime and activations use "
                    f"{(used + prefill_peak + graph_peak) / 2**30:.1f} GiB of {total / 2**30:.1f} GiB; raise "
                    f"--gpu-memory-utilization ({self.config.gpu_memory_utilization}) or lower "
                    "--max-num-batched-tokens / --max-num-seqs."
                )
        else:
            budget = int(self.config.cpu_kv_cache_gb * 2**30)
        # never more than needed for max_num_seqs full-length sequences (keeps CPU memory modest)
        cap = self.config.max_num_seqs * (-(-(self.max_model_len + 64) // self.block_size) + 1)
        return max(1, min(budget // per_block, cap))

    @torch.inference_mode()
    def profile_forward(self, num_tokens: int) -> int:
        """Peak bytes allocated by an eager forward of ``num_tokens`` tokens (one request) plus the LM head over
        the rows a step can sample. K/V go nowhere (slot -1) and attention reads a one-block scratch cache, so the
        measurement costs no KV memory."""
        c = self.model_config
        num_tokens = max(1, min(num_tokens, self.max_model_len))
        scratch = (1, self.block_size, c.num_key_value_heads, c.head_dim)
        saved = self.model.kv_caches
        self.model.kv_caches = [
            (torch.zeros(scratch, dtype=self.dtype, device=self.device),) * 2
            for _ in range(c.num_hidden_layers)
        ]
        try:
            torch.cuda.synchronize(self.device)
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            meta = self.build_metadata(
                [num_tokens], [num_tokens], [[0] * (-(-num_tokens // self.block_size))], [-1] * num_tokens
            )
            ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
            pos = torch.arange(num_tokens, dtype=torch.long, device=self.device)
            hidden, _ = self.model(ids, pos, meta)
            rows = min(num_tokens, self.config.max_num_seqs * (1 + self.num_speculative_tokens))
            logits = self.model.compute_logits(hidden[-rows:]).float()
            logits.softmax(-1)
            # the temporaries of sampling these rows (sample_verify: the sampling graph; the host sampler needs less)
            self._profile_sampling(logits, ids[-rows:])
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device) - base
        finally:
            self.model.kv_caches = saved
            torch.cuda.empty_cache()
        return int(peak)

    @staticmethod
    def _profile_sampling(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """sample_verify over every row as a seeded random row of its own (every filter and the seeded noise run
        in the graphs anyway)."""
        rows = logits.shape[0]
        ones = torch.ones(rows, dtype=torch.float32, device=logits.device)
        zeros = torch.zeros(rows, dtype=torch.int32, device=logits.device)
        pos = torch.arange(rows, device=logits.device)
        return sample_verify(
            logits, ids, ones, zeros, ones, ones * 0, zeros, rows, 1, seed_key=zeros + 1, pos=pos
        )

    def allocate_kv_cache(self, num_blocks: int) -> None:
        c = self.model_config
        shape = (num_blocks, self.block_size, c.num_key_value_heads, c.head_dim)
        self.model.kv_caches = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(c.num_hidden_layers)
        ]
        if self.use_megakernel:
            from specserve.layers.triton_megakernel import bind_model

            try:
                self.model.megakernel = bind_model(self.model)
            except ValueError as e:  # e.g. a KV cache past the kernel's int32 offsets: the layers decode
                self.model.megakernel = None
                logger.warning("megakernel not used: %s", e)
            else:
                self.model.megakernel_caches = self.model.kv_caches
                logger.info(
                    "megakernel: batch-1 decode steps run as one persistent kernel of %d programs",
                    self.model.megakernel.grid,
                )
        spec = self.proposer.kv_cache_spec() if self.proposer else None
        if spec and self.proposer is not None:
            layers, heads, hd = spec
            dshape = (num_blocks, self.block_size, heads, hd)
            # the drafter's graphs (built here) serve speculative steps: captured as the q = K+1 verify step's
            with capture_limit(self.config.max_cudagraph_capture_size, self.num_speculative_tokens + 1):
                self.proposer.bind_kv_caches(
                    [
                        (
                            torch.zeros(dshape, dtype=self.dtype, device=self.device),
                            torch.zeros(dshape, dtype=self.dtype, device=self.device),
                        )
                        for _ in range(layers)
                    ],
                    self.block_size,
                )
        self.num_blocks = num_blocks
        self._setup_uniform_path()
        logger.info(
            "KV cache: %d blocks of %d tokens (%.1f MiB); max concurrency for %d-token requests: %.2fx",
            num_blocks,
            self.block_size,
            num_blocks * self.kv_bytes_per_block() / 2**20,
            self.max_model_len,
            num_blocks * self.block_size / self.max_model_len,
        )

    # ------------------------------------------------------------------ uniform (graph) path
    @property
    def max_blocks_per_seq(self) -> int:
        return -(-(self.max_model_len + 2 * self.num_speculative_tokens + 8) // self.block_size) + 1

    def _setup_uniform_path(self) -> None:
        """Static buffers + bucketed CUDA graphs for decode / verify steps (every request runs q tokens)."""
        cfg = self.config
        self.graphs: dict[int, BucketedGraphs] = {}
        self.use_fused_step = False
        # --enforce-eager keeps the padded path (same kernels, same shapes as the graphs) and only skips capture
        padded = self._padded_path()
        self.use_padded = padded
        self.async_scheduling = self.async_spec = self.use_context_step = False
        if not padded:
            return
        capture = self.device.type == "cuda" and not cfg.enforce_eager
        if capture and self.backend.name != "triton":
            raise ValueError("CUDA graphs need the triton attention backend (or pass enforce_eager=True).")
        max_b, dev, limit = cfg.max_num_seqs, self.device, cfg.max_cudagraph_capture_size
        self.padded: dict[int, PaddedBatch] = {}
        self._greedy_host: dict[int, torch.Tensor] = {}
        self._d2h_done = torch.cuda.Event() if dev.type == "cuda" else None
        pool = None
        self.sample_graphs: dict[int, BucketedGraphs] = {}
        # batches without top-k / top-p: the sort-free Triton sampler (SPECSERVE_SAMPLER=auto on CUDA)
        self.sort_free_graphs: dict[int, BucketedGraphs] = {}
        self.num_sort_free_steps = 0
        self._sample_in: tuple[torch.Tensor, torch.Tensor] | None = None
        for q in sorted({1, self.num_speculative_tokens + 1}, reverse=True):
            # per request: ints (num_draft, draft budget, top_k, seed key), floats (temperature, top_p, min_p); the
            # first two for a fused step, all for in-graph sampling (see _forward_uniform)
            buf = self.padded[q] = PaddedBatch(max_b, q, self.max_blocks_per_seq, dev, num_aux=4, num_faux=3)

            def fn(b: int, buf: PaddedBatch = buf) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
                v = buf.views(b)
                meta = buf.meta(b, self.max_model_len + buf.q)
                hidden, feats = self.model(v.ids, v.pos, meta)
                logits = self.model.compute_logits(hidden)
                # logits stay in the model dtype (the float copy is the sampling graphs' and the host path's, not
                # every greedy step's); the argmax of the model dtype equals the float one's
                return logits, feats, greedy_verify(logits, v.ids, b, buf.q)

            def prepare(b: int, buf: PaddedBatch = buf) -> None:
                buf.fill(b, [], self.block_size)

            # max_cudagraph_capture_size: a bucket's graphs (target, sampling) are captured when its b*q tokens fit
            with capture_limit(limit, q):
                self.graphs[q] = BucketedGraphs(
                    f"target q_len={q}", fn, batch_buckets(max_b), dev, capture, pool, prepare=prepare
                )
                pool = self.graphs[q].pool
                self.sample_graphs[q] = self._sampling_graphs(q, capture, pool)
                if sort_free_graphs_on(dev):
                    self.sort_free_graphs[q] = self._sampling_graphs(
                        q, capture, pool, use_triton=True, searches=False
                    )
        with capture_limit(limit, 1):  # a prefill bucket of t tokens
            self._setup_prefill_graphs(capture, pool)
        # the fused step: the drafter's half of a greedy verify step as a second graph on the same buffers
        k = self.num_speculative_tokens
        if k and self.proposer is not None:
            with capture_limit(limit, k + 1):  # captured exactly where the q = K+1 target graph is
                self.use_fused_step = self.proposer.setup_fused_step(self.graphs[k + 1], self.padded[k + 1])
        # plain steps while drafting is off (disable_when_slower / disable_by_batch_size) feed the drafter's
        # context from a graph after the target's, so they pipeline as plain decoding does (launch_decode)
        with capture_limit(limit, 1):  # captured exactly where the q = 1 target graph is
            self.use_context_step = (
                bool(k)
                and self.proposer is not None
                and self.proposer.setup_context_step(self.graphs[1], self.padded[1])
            )
        # the step's single device-to-host copy lands here (pinned, so it can be asynchronous), by row width
        widths = {2, k + 2} | ({2 * k + 2} if self.use_fused_step else set())
        for w in widths:
            self._greedy_host[w] = torch.zeros((max_b, w), dtype=torch.int64, pin_memory=dev.type == "cuda")
        # async decode: two steps in flight at most, so two pinned landing buffers (+ events) used alternately
        self.async_scheduling = cfg.async_scheduling if cfg.async_scheduling is not None else capture
        self.async_scheduling = self.async_scheduling and (self.proposer is None or self.use_context_step)
        cuda = dev.type == "cuda"
        self._async_host = [torch.zeros((max_b, 2), dtype=torch.int64, pin_memory=cuda) for _ in range(2)]
        self._async_events = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self._async_flip = 0
        # async fused speculative steps (see launch_spec): likewise, rows of q + 1 + K; on by default with CUDA
        # graphs, as async_scheduling (session 18 measured it engaged: benchmarks/README.md; sessions 10-15 timed
        # 48-token runs, which never leave the synchronous tail at K=15)
        self.async_spec = (cfg.async_spec if cfg.async_spec is not None else capture) and self.use_fused_step
        self._spec_host = [
            torch.zeros((max_b, 2 * k + 2), dtype=torch.int64, pin_memory=cuda) for _ in range(2)
        ]
        self._spec_events = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self._spec_flip = 0
        # step N+1's inputs from step N's output: one Triton kernel on the fused path (one launch instead of ~25
        # eager ops: host time), else its torch specification (spec/step_inputs.py)
        if self.use_fused_step:
            from specserve.spec.step_inputs import step_input_fns

            self._async_step_inputs = step_input_fns(self.backend.fused)[1]
            if self.async_spec and self.backend.fused:
                self._warm_async_step_inputs()
        if capture:
            self._warm_seeded_host_kernels()
        if capture and self.proposer is not None:
            t0 = time.perf_counter()
            n = self.proposer.warm_eager_passes()
            if n:
                torch.cuda.synchronize(dev)
                logger.info("warmed %d eager drafter passes in %.2fs", n, time.perf_counter() - t0)

    def _warm_seeded_host_kernels(self) -> None:
        """Compile the seeded noise kernels the host sampler launches on CUDA (a seeded request on the host path:
        logprobs, structured outputs, ...) now rather than inside its first request: the race noise at this
        vocabulary, the acceptance uniforms for 1 and up to K drafts (Triton specialises an int argument equal
        to 1)."""
        from specserve.layers.seeded_noise import accept_uniform, race_exponential

        one = torch.ones(1, dtype=torch.int64, device=self.device)
        race_exponential(one, one, self.model_config.vocab_size)
        for k in sorted({1, 2, self.num_speculative_tokens} - {0}):
            accept_uniform(one, one, k)

    def _warm_async_step_inputs(self) -> None:
        """Compile the async step's bookkeeping kernel (``launch_spec``) now rather than at the first pipelined
        step: Triton compiles on first use per variant and pointer alignment, so each bucket's static inputs are
        written once as ``launch_spec`` writes them (``into``: that variant; session 28 found the warm-up compiling
        the other one, and the first pipelined request of a fresh process paying ~0.5 s), then filled again."""
        k = self.num_speculative_tokens
        q, buf = k + 1, self.padded[k + 1]
        packed = torch.full((1, 2 * k + 2), -1, dtype=torch.int64, device=self.device)
        zero = torch.zeros(1, dtype=torch.int64, device=self.device)
        for b in self.graphs[q].buckets:
            v = buf.views(b)
            into = (v.ids[:q], v.pos[:q], v.slots[:q], v.seq[:1], v.aux[:1])
            self._async_step_inputs(packed, zero, zero, zero, v.bt[:1], k, self.block_size, into=into)
            buf.fill(b, [], self.block_size)

    def _padded_path(self) -> bool:
        """Decode / verify (and prefill) steps padded to static shapes: ``padded_decode``, by default on CUDA."""
        cfg = self.config
        return cfg.padded_decode if cfg.padded_decode is not None else (self.device.type == "cuda")

    def _prefill_graph_max(self) -> int:
        """Largest prefill-graph bucket (0: none, also with ``SPECSERVE_PREFILL_GRAPHS=0``): the buckets up to the
        first that holds max_model_len tokens, on the padded path."""
        if not self._padded_path() or os.environ.get("SPECSERVE_PREFILL_GRAPHS", "1").strip() == "0":
            return 0
        fits = [t for t in PREFILL_GRAPH_TOKENS if t < self.max_model_len]
        return PREFILL_GRAPH_TOKENS[len(fits)] if len(fits) < len(PREFILL_GRAPH_TOKENS) else fits[-1]

    def _setup_prefill_graphs(self, capture: bool, pool: Any) -> None:
        """One request's prefill chunk padded to a token bucket (:data:`PREFILL_GRAPH_TOKENS`): the target forward
        (hidden states + tap features) as a graph per bucket, on the uniform path's pool. Padding rows are token 0
        at the positions after the chunk and write no KV (slot -1); causal attention keeps them out of the real
        rows. Sampling and the drafter's prefill stay eager (a few kernels)."""
        top = self._prefill_graph_max()
        buckets = [t for t in PREFILL_GRAPH_TOKENS if t <= top]
        if not buckets:
            return
        bufs = {t: PaddedBatch(1, t, self.max_blocks_per_seq, self.device) for t in buckets}
        self._prefill_bufs = bufs

        def fn(t: int) -> tuple[torch.Tensor, torch.Tensor | None]:
            buf = bufs[t]
            v = buf.views(1)
            return self.model(v.ids, v.pos, buf.meta(1, self.max_model_len + t))

        def prepare(t: int) -> None:
            bufs[t].fill(1, [], self.block_size)

        self.prefill_graphs = BucketedGraphs("prefill", fn, buckets, self.device, capture, pool, prepare)

    def _prefill_graph_ok(self, items: list) -> bool:  # type: ignore[type-arg]
        """A step the prefill graphs run: one request's chunk of prompt (or recomputed) tokens, no drafts."""
        g = self.prefill_graphs
        return (
            g is not None
            and len(items) == 1
            and not items[0].spec_token_ids
            and 1 < items[0].num_new_tokens <= g.max_batch
        )

    def _forward_prefill(self, s: Any) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
        """``_forward_ragged`` for a single prefill chunk through its bucket's graph; the outputs have the
        bucket's rows, of which the first ``num_new_tokens`` are the chunk's."""
        assert self.prefill_graphs is not None
        n = s.num_new_tokens
        t = self.prefill_graphs.bucket(n)
        self._prefill_bufs[t].fill(1, [(s.req.token_ids[s.start : s.start + n], s.start, s.req.block_table)], self.block_size)  # fmt: skip
        hidden, features = self.prefill_graphs.run(t)
        self.num_prefill_graph_steps += 1
        return hidden, features, [n]

    def _sampling_graphs(
        self, q: int, capture: bool, pool: Any, use_triton: bool | None = None, searches: bool = True
    ) -> BucketedGraphs:
        """Random sampling + acceptance of a uniform step as a second graph per bucket, replayed right after the
        target's on its outputs (only on steps with random requests: greedy steps pay nothing for it).  It
        overwrites the target graph's packed output in place with sample_verify's (same layout, greedy rows
        unchanged), so everything downstream (the fused step, the one copy back) reads the same tensor.
        ``use_triton``: sample_verify's form (default: SPECSERVE_SAMPLER's); ``searches=False``: the Triton form
        without its top-k / top-p rounds, for batches that use neither."""
        buf, target = self.padded[q], self.graphs[q]

        def fn(b: int) -> torch.Tensor:
            assert self._sample_in is not None
            logits, packed = self._sample_in
            v = buf.views(b)
            temp, top_p, min_p = v.faux.unbind(1)
            num_draft, _, top_k, key = v.aux.unbind(1)
            out = sample_verify(
                logits,
                v.ids,
                temp,
                top_k,
                top_p,
                min_p,
                num_draft,
                b,
                q,
                packed,
                seed_key=key,
                pos=v.pos,
                use_triton=use_triton,
                searches=searches,
            )
            return packed.copy_(out)

        def prepare(b: int) -> None:
            # an empty batch (all greedy, no KV writes) and the target's outputs to read during warm-up and capture
            buf.fill(b, [], self.block_size)
            logits, _, packed = target.run(b)
            self._sample_in = (logits, packed)

        name = f"sampling q_len={q}" + (" (sort-free)" if use_triton else "")
        graphs = BucketedGraphs(name, fn, target.buckets, self.device, capture, pool, prepare)
        self._sample_in = None
        return graphs

    def _sample_uniform(
        self, q: int, logits: torch.Tensor, packed: torch.Tensor, items: list
    ) -> torch.Tensor:  # type: ignore[type-arg]
        b = packed.shape[0]
        graphs = self.sample_graphs[q]
        if q in self.sort_free_graphs and sort_free([s.req.params for s in items]):
            graphs = self.sort_free_graphs[q]
            self.num_sort_free_steps += 1
        if b in graphs.graphs:  # a captured graph reads (and writes) the target graph's static outputs
            assert packed is self.graphs[q].outputs[b][2]
        self._sample_in = (logits, packed)
        try:
            return graphs.run(b)
        finally:
            self._sample_in = None

    def _param_columns(self, s, drafts: bool = True) -> tuple[list[int], list[float]]:  # type: ignore[no-untyped-def]
        """A request's row of the padded batch's int columns (num_draft, draft budget, top_k, seed key; the first
        two 0 without ``drafts``: written on the device) and float columns (temperature, top_p, min_p)."""
        temp, top_k, top_p, min_p = param_row(s.req.params)
        lead = [len(s.spec_token_ids), self._draft_budget(s.req, 1)] if drafts else [0, 0]
        return lead + [top_k, row_seed_key(s.req.params)], [temp, top_p, min_p]

    def _forward_uniform(
        self,
        items: list,  # type: ignore[type-arg]
        q: int,
        with_params: bool = False,
        feed: tuple[torch.Tensor, list[int]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Pad every request to q tokens (drafts padded with token 0, no KV write) and replay the bucket.
        ``feed`` (async decode, q == 1): (previous step's packed output, row of each request in it): the input
        tokens are copied from there on the device instead of coming from the host.

        Returns (logits [b*q, V] in the model dtype, tap features or None, greedy_verify's packed [b, q+1] int64).
        ``with_params``: also put each request's (num_draft, draft budget, top_k, seed key) and (temperature, top_p,
        min_p) on the device, for the fused step and in-graph sampling (otherwise zeros: all greedy).
        """
        graphs = self.graphs[q]
        b = graphs.bucket(len(items))
        # an async step's input tokens are still on the device (feed): placeholder 0 here, gathered below
        rows = [
            ([s.req.token_ids[s.start] if feed is None else 0] + s.spec_token_ids, s.start, s.req.block_table)
            for s in items
        ]
        aux: list[list[int]] | None = None
        faux: list[list[float]] | None = None
        if with_params:
            cols = [self._param_columns(s) for s in items]
            aux, faux = [a for a, _ in cols], [f for _, f in cols]
        self.padded[q].fill(b, rows, self.block_size, aux, faux)
        if feed is not None:
            # stream-ordered after the previous step's graph and this step's upload, before this replay
            src, idx = feed
            ids = self.padded[q].views(b).ids
            if idx == list(range(len(items))):
                ids[: len(items)].copy_(src[: len(items), 0])
            else:
                pinned = torch.tensor(idx, dtype=torch.int64, pin_memory=self.device.type == "cuda")
                ids[: len(items)].copy_(src[:, 0].index_select(0, pinned.to(self.device, non_blocking=True)))
        return graphs.run(b)

    def drafting_on(self, batch_size: int) -> bool:
        """speculative_config.disable_by_batch_size, as vLLM: while more requests than that are in the batch
        (SchedulerOutput.batch_size: running or admissible, whether or not this step schedules each), a step
        proposes no drafts for the next one. The drafter still reads the step's target features, so its context
        is whole when the batch shrinks and drafting resumes. The same for disable_when_slower (the gate: while it
        measures speculation slower than plain decoding at this batch size)."""
        t = self.disable_by_batch_size
        if t is not None and batch_size > t:
            return False
        return self.gate is None or self.gate.drafting_on(batch_size)

    def _draft_budget(self, req, num_new: int) -> int:  # type: ignore[no-untyped-def]
        """max_drafts before the floor at 0 for req once num_new tokens are appended to it: the drafter's own
        context cap (speculative_config.max_model_len) and max_tokens, as vLLM: no drafts past either.  Linear
        in num_new, so budget(1) - n_acc = budget(1 + n_acc): the fused step's device-side test."""
        committed = len(req.token_ids) + num_new
        remaining_len = min(self.max_model_len, self.draft_max_model_len) - committed - 1
        remaining_out = req.max_tokens - (req.num_output_tokens + num_new) - 1
        return min(remaining_len, remaining_out)

    @staticmethod
    def _graph_sampling_ok(items: list) -> bool:  # type: ignore[type-arg]
        """True when the graphs' argmax / random sampling and acceptance are the whole answer: no logprobs, and
        nothing edits logits (min_tokens still masking stop tokens; see _process_logits). Greedy, random and
        seeded random requests are eligible, mixed too (a seeded request's draws are the counter-based noise of
        its seed and positions: the same in the graphs as on the host path)."""
        for s in items:
            p = s.req.params
            if p.logprobs is not None:
                return False
            if p.min_tokens and p._all_stop_token_ids and s.req.num_output_tokens < p.min_tokens:
                return False
            if s.req.grammar is not None or p.processes_logits:  # the host edits the logits (_process_logits)
                return False
        return True

    def _fetch_packed(self, packed: torch.Tensor, n: int) -> list[list[int]]:
        """The step's one device-to-host copy: rows [:n] of the packed verify output (+ the fused step's drafts),
        as Python lists."""
        src = packed[:n]
        if self._d2h_done is None:
            return src.tolist()
        dst = self._greedy_host[packed.shape[1]][:n]
        dst.copy_(src, non_blocking=True)
        self._d2h_done.record(torch.cuda.current_stream(self.device))
        self._d2h_done.synchronize()
        return dst.tolist()

    def _forward_ragged(self, items: list) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:  # type: ignore[type-arg]
        """Eager varlen forward over any mix of prefill chunks, decode tokens and draft blocks."""
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        q_lens: list[int] = []
        seq_lens: list[int] = []
        for s in items:
            req, start = s.req, s.start
            toks = req.token_ids[start : start + s.num_new_tokens] + s.spec_token_ids
            input_ids.extend(toks)
            pos = range(start, start + len(toks))
            positions.extend(pos)
            slots.extend(self.slot(req.block_table, p) for p in pos)
            q_lens.append(len(toks))
            seq_lens.append(start + len(toks))
        meta = self.build_metadata(q_lens, seq_lens, [s.req.block_table for s in items], slots)
        ids_t = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos_t = torch.tensor(positions, dtype=torch.long, device=self.device)
        hidden, features = self.model(ids_t, pos_t, meta)
        return hidden, features, q_lens

    # ------------------------------------------------------------------ helpers
    def build_metadata(
        self,
        q_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        slots: list[int],
        causal: bool = True,
    ) -> AttnMetadata:
        dev = self.device
        qsl = [0]
        for n in q_lens:
            qsl.append(qsl[-1] + n)
        # the Triton kernels: one width for every eager step, the graphs' (a block table's row stride is a kernel
        # argument, and Triton compiles a form per stride class: 1, a multiple of 16, other)
        width = max([1, *(len(b) for b in block_tables)])
        if self.backend.name == "triton":
            width = max(width, self.max_blocks_per_seq)
        bt = torch.zeros((len(block_tables), width), dtype=torch.int32)
        for i, b in enumerate(block_tables):
            if b:
                bt[i, : len(b)] = torch.tensor(b, dtype=torch.int32)
        return AttnMetadata(
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=bt.to(dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            max_query_len=max(q_lens, default=1),
            max_seq_len=max(seq_lens, default=1),
            causal=causal,
        )

    def slot(self, block_table: list[int], pos: int) -> int:
        return block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def _prompt_logprobs(self, items: list, hidden: torch.Tensor, offsets: list[int], outputs: dict) -> None:  # type: ignore[type-arg]
        """SamplingParams.prompt_logprobs: the logprobs of the prompt tokens this chunk predicts (position p's row
        gives token p + 1's), the raw model's, with the top ones."""
        for i, s in enumerate(items):
            k = s.req.params.prompt_logprobs
            if k is None:
                continue
            last = min(s.start + s.num_new_tokens, s.req.num_prompt_tokens - 1)
            if last <= s.start:
                continue
            rows = torch.arange(offsets[i], offsets[i] + last - s.start, device=self.device)
            lp = compute_logprobs(self.model.compute_logits(hidden[rows]).float())
            nxt = torch.tensor(s.req.prompt_token_ids[s.start + 1 : last + 1], device=self.device)
            chosen, ranks, top_ids, top_lps = gather_logprobs(lp, nxt, k)
            outputs[s.req.request_id].prompt_logprobs = (
                s.start + 1,
                list(zip(chosen.tolist(), ranks.tolist(), top_ids.tolist(), top_lps.tolist())),
            )

    def _process_logits(self, logits: torch.Tensor, items: list) -> None:  # type: ignore[type-arg]
        """The host path's logits processing, in vLLM's order: the structured-output mask, allowed_token_ids,
        bad_words, min_tokens (stop tokens forbidden below it), logit_bias, then the repetition / frequency /
        presence penalties. Each request's row j (after its first j drafts) is processed as if those drafts were
        already output, so verification stays exact."""
        self._mask_grammar(logits, items)
        row = 0
        for s in items:
            p = s.req.params
            n = 1 + len(s.spec_token_ids)
            rows = logits[row : row + n]
            row += n
            if p.allowed_token_ids is not None:
                keep = torch.zeros(rows.shape[1], dtype=torch.bool, device=rows.device)
                keep[torch.tensor(p.allowed_token_ids, device=rows.device)] = True
                rows.masked_fill_(~keep, float("-inf"))
            if p._bad_words_token_ids:
                past = s.req.output_token_ids + s.spec_token_ids
                base = s.req.num_output_tokens
                for j in range(n):  # row j follows the output and the first j drafts
                    for seq in p._bad_words_token_ids:
                        if len(seq) == 1 or past[max(0, base + j - len(seq) + 1) : base + j] == seq[:-1]:
                            rows[j, seq[-1]] = float("-inf")
            below = p.min_tokens - s.req.num_output_tokens  # rows [0, below) may not stop
            if below > 0 and p._all_stop_token_ids:
                rows[:below, torch.tensor(sorted(p._all_stop_token_ids), device=rows.device)] = float("-inf")
            if p.logit_bias:
                ids = torch.tensor(list(p.logit_bias), device=rows.device)
                rows[:, ids] += torch.tensor(
                    list(p.logit_bias.values()), dtype=rows.dtype, device=rows.device
                )
            if p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0:
                self._apply_penalties(rows, s, p)

    def _apply_penalties(self, rows: torch.Tensor, s: Any, p: Any) -> None:
        """vLLM's (and the OpenAI API's) penalties on one request's rows: repetition over prompt + output tokens
        (logits above 0 divided by it, others multiplied), then ``frequency * count + presence * (count > 0)``
        subtracted over output tokens; row j counts the first j drafts as output."""
        n, vocab = rows.shape
        dev = rows.device
        out = s.req.output_token_ids
        counts = torch.zeros((n, vocab), dtype=rows.dtype, device=dev)
        if out:
            counts += torch.bincount(torch.tensor(out, device=dev), minlength=vocab)[:vocab].to(rows.dtype)
        if n > 1:
            step = torch.zeros((n, vocab), dtype=rows.dtype, device=dev)
            step[torch.arange(1, n, device=dev), torch.tensor(s.spec_token_ids, device=dev)] = 1
            counts += step.cumsum(0)
        seen = counts > 0
        if p.repetition_penalty != 1.0:
            prompt = torch.zeros(vocab, dtype=torch.bool, device=dev)
            prompt[torch.tensor(s.req.prompt_token_ids, device=dev)] = True
            hit = seen | prompt
            rp = p.repetition_penalty
            rows.copy_(torch.where(hit, torch.where(rows > 0, rows / rp, rows * rp), rows))
        if p.frequency_penalty:
            rows -= p.frequency_penalty * counts
        if p.presence_penalty:
            rows -= p.presence_penalty * seen.to(rows.dtype)

    def _mask_grammar(self, logits: torch.Tensor, items: list) -> None:  # type: ignore[type-arg]
        """Structured outputs: forbid the tokens the request's grammar rejects, on each of its rows (row j: after
        its output and its first j drafts). Greedy, random and rejection sampling then stay exact for the
        constrained distribution, and a draft the grammar rejects is rejected."""
        row = 0
        rows: list[int] = []
        masks: list[Any] = []
        for s in items:
            n = 1 + len(s.spec_token_ids)
            if s.req.grammar is not None:
                rows.extend(range(row, row + n))
                masks.append(s.req.grammar.rows(s.req.output_token_ids, s.spec_token_ids))
            row += n
        if not rows:
            return
        allowed = torch.from_numpy(np.concatenate(masks)).to(self.device, non_blocking=True)
        width = min(allowed.shape[1], logits.shape[1])
        idx = torch.tensor(rows, device=self.device)
        sub = logits[idx]
        sub[:, :width].masked_fill_(~allowed[:, :width], float("-inf"))
        sub[:, width:] = float("-inf")
        logits[idx] = sub

    # ------------------------------------------------------------------ async decode (see LLMEngine.step)
    def can_launch_async(self, items: list) -> bool:  # type: ignore[type-arg]
        """A plain decode step (1 token per request, no drafts) that the graphs answer alone: no drafter, or one
        whose context step feeds it while drafting is off (the step proposes no drafts). Not while profiling:
        the per-step device timings need synchronous steps."""
        return (
            self.async_scheduling
            and not self.profile
            and 0 < len(items) <= self.config.max_num_seqs
            and all(s.num_new_tokens == 1 and not s.spec_token_ids for s in items)
            and (self.proposer is None or not self.drafting_on(len(items)))
            and self._graph_sampling_ok(items)
        )

    @torch.inference_mode()
    def launch_decode(self, items: list, prev: InflightDecode | None = None) -> InflightDecode:  # type: ignore[type-arg]
        """Enqueue a plain decode step (graph replay + a non-blocking copy of its tokens to pinned memory) and
        return without waiting for it. With ``prev`` (still in flight) each request's input token is taken from
        prev's device output, so the host never waits for it; ``collect_decode`` reads the tokens later."""
        feed = None
        if prev is not None:
            rows = {id(s.req): i for i, s in enumerate(prev.items)}
            feed = (prev.packed, [rows[id(s.req)] for s in items])
            self.num_async_steps += 1
        random_rows = not all(s.req.params.greedy for s in items)
        logits, features, packed = self._forward_uniform(items, 1, random_rows, feed)
        if self.proposer is not None:  # drafting is off (can_launch_async): the drafter reads the features
            self.proposer.run_context_step(features, self.graphs[1].bucket(len(items)))
        if random_rows:
            packed = self._sample_uniform(1, logits, packed, items)
        self.num_fast_steps += 1
        self.num_sampling_steps += int(random_rows)
        n, ev = len(items), self._async_events[self._async_flip]
        if ev is None:  # CPU: already computed; keep a copy (the next eager step makes new tensors anyway)
            return InflightDecode(list(items), packed, packed[:n].clone(), None)
        host = self._async_host[self._async_flip][:n]
        self._async_flip ^= 1
        host.copy_(packed[:n], non_blocking=True)
        ev.record(torch.cuda.current_stream(self.device))
        return InflightDecode(list(items), packed, host, ev)

    @staticmethod
    def collect_decode(step: InflightDecode) -> list[int]:
        """Wait for a launched decode step; its one new token per request (in ``step.items`` order)."""
        if step.done is not None:
            step.done.synchronize()
        return [row[0] for row in step.host.tolist()]

    # ------------------------------------------------------------------ async fused speculative steps
    def can_launch_spec_async(self, items: list) -> bool:  # type: ignore[type-arg]
        """A step that ``execute`` runs as a fused step: every request runs one committed token (+ its drafts,
        some request has drafts) and samples, greedy or random, answered by the graphs alone (the
        in-graph rejection sampler for random rows). Not while profiling."""
        return (
            self.async_spec
            and self.use_fused_step
            and not self.profile
            and 0 < len(items) <= self.config.max_num_seqs
            and all(s.num_new_tokens == 1 and s.samples for s in items)
            and any(s.spec_token_ids for s in items)
            and self._graph_sampling_ok(items)
        )

    @torch.inference_mode()
    def launch_spec(self, items: list, prev: InflightSpec | None = None) -> InflightSpec:  # type: ignore[type-arg]
        """Enqueue a fused speculative step (verify graph [+ in-graph sampling] + fused drafter graph + a copy of
        its packed output to pinned memory) and return without waiting.

        Without ``prev`` the inputs come from the host exactly as in ``execute``. With ``prev`` (still in flight,
        its requests' confirmed state being prev's start) the host fills block tables and placeholders and each
        request's ids / positions / slots / seq_len / (num_draft, budget) are written on the device from prev's
        output, stream-ordered after prev's graphs and before this replay: n_acc = min(n_match, num_draft), the
        input block is [bonus, prev's drafts] at prev's first position + n_acc + 1, num_draft = number of real
        drafts capped by the budget, budget = prev's budget - (n_acc + 1) (``_draft_budget`` is linear)."""
        assert self.proposer is not None
        K = self.num_speculative_tokens
        q, n, bs = K + 1, len(items), self.block_size
        graphs, buf = self.graphs[q], self.padded[q]
        b = graphs.bucket(n)
        v = buf.views(b)
        # (num_draft, budget, top_k, seed key), (temperature, top_p, min_p); with prev the first two come from it
        cols = [self._param_columns(s, drafts=prev is None) for s in items]
        random_rows = any(f[0] > 0 for _, f in cols)
        faux = [f for _, f in cols] if random_rows else None
        if prev is None:
            rows = [
                ([s.req.token_ids[s.start]] + s.spec_token_ids, s.start, s.req.block_table) for s in items
            ]
            buf.fill(b, rows, bs, [a for a, _ in cols], faux)
            # this step's own copies (the next step's fill overwrites the buffers read here): .long() of the
            # int32 columns copies; first is copied contiguous for the bookkeeping kernel of the next step
            num_draft = v.aux[:n, 0].long()
            budget = v.aux[:n, 1].long()
            first = v.pos.view(b, q)[:n, 0].clone(memory_format=torch.contiguous_format)
        else:
            # block tables (allocated for the worst case) and sampling parameters on the host; everything else
            # from prev on the device (aux columns 0-1, num_draft and budget, are overwritten below)
            aux = [a for a, _ in cols] if random_rows else None
            buf.fill(b, [([0], s.req.num_computed_tokens, s.req.block_table) for s in items], bs, aux, faux)
            order = {id(s.req): i for i, s in enumerate(prev.items)}
            idx = [order[id(s.req)] for s in items]
            src_packed, src_nd, src_budget, src_first = prev.packed, prev.num_draft, prev.budget, prev.first
            if idx != list(range(n)):
                sel = torch.tensor(idx, dtype=torch.int64, pin_memory=self.device.type == "cuda").to(
                    self.device, non_blocking=True
                )
                src_packed, src_nd = src_packed.index_select(0, sel), src_nd.index_select(0, sel)
                src_budget, src_first = src_budget.index_select(0, sel), src_first.index_select(0, sel)
            else:  # the same requests in the same order, or a prefix of them (the last ones finished)
                src_packed, src_nd = src_packed[:n], src_nd[:n]
                src_budget, src_first = src_budget[:n], src_first[:n]
            # written straight into the static inputs (one kernel on the fused path, no copies after it)
            into = (v.ids[: n * q], v.pos[: n * q], v.slots[: n * q], v.seq[:n], v.aux[:n])
            _, _, _, _, num_draft, budget, first = self._async_step_inputs(
                src_packed, src_nd, src_budget, src_first, v.bt[:n], K, bs, into=into
            )
            self.num_async_spec_steps += 1
        logits, features, packed = graphs.run(b)
        if random_rows:  # the in-graph rejection sampler, as execute's fused step
            self.num_sampling_steps += 1
            packed = self._sample_uniform(q, logits, packed, items)
        out = self.proposer.run_fused_step(features, packed)
        self.num_fast_steps += 1
        self.num_fused_steps += 1
        ev = self._spec_events[self._spec_flip]
        if ev is None:  # CPU: already computed
            return InflightSpec(list(items), out, out[:n].clone(), None, num_draft, budget, first)
        host = self._spec_host[self._spec_flip][:n]
        self._spec_flip ^= 1
        host.copy_(out[:n], non_blocking=True)
        ev.record(torch.cuda.current_stream(self.device))
        return InflightSpec(list(items), out, host, ev, num_draft, budget, first)

    @staticmethod
    def collect_spec(step: InflightSpec) -> list[list[int]]:
        """Wait for a launched speculative step; its packed rows (in ``step.items`` order)."""
        if step.done is not None:
            step.done.synchronize()
        return step.host.tolist()  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ the step
    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> StepOutput:
        items = sched.scheduled
        uniform_q = 0
        if self.use_padded and all(s.num_new_tokens == 1 and s.samples for s in items):
            if len(items) <= self.config.max_num_seqs:
                uniform_q = 1 + self.num_speculative_tokens if any(s.spec_token_ids for s in items) else 1
        # in-graph step: argmax / random sampling and acceptance on the device, one copy back; fused step: the
        # drafter's half runs on the device too, right after the verify graph
        in_graph = bool(uniform_q) and self._graph_sampling_ok(items)
        random_rows = in_graph and not all(s.req.params.greedy for s in items)
        fused = uniform_q > 1 and self.use_fused_step and in_graph
        all_logits: torch.Tensor | None = None
        t_start = self._mark()
        if uniform_q:
            all_logits, features, packed = self._forward_uniform(items, uniform_q, fused or random_rows)
            if random_rows:
                packed = self._sample_uniform(uniform_q, all_logits, packed, items)
            q_lens = [uniform_q] * len(items)
        elif self._prefill_graph_ok(items):
            hidden, features, q_lens = self._forward_prefill(items[0])
        else:
            hidden, features, q_lens = self._forward_ragged(items)

        # rows to verify / sample: for each sampling request its last 1 + num_spec rows
        sampling = [i for i, s in enumerate(items) if s.samples]
        outputs: dict[str, RequestStepOutput] = {s.req.request_id: RequestStepOutput() for s in items}
        offsets = [0]
        for n in q_lens:
            offsets.append(offsets[-1] + n)
        emitted: list[list[int]] = [[] for _ in items]
        if not uniform_q:
            self._prompt_logprobs(items, hidden, offsets, outputs)
        if in_graph:
            # fast path: argmax / sampling and acceptance were computed in the graphs; one copy, no other syncs
            # (every item samples on the uniform path). Greedy: drafts past num_draft are padding token 0, which
            # may happen to match, hence the cap: this is exactly rejection_sample's greedy result (random rows
            # come capped already; see sample_verify).
            self.num_fast_steps += 1
            self.num_sampling_steps += int(random_rows)
            if fused:
                assert self.proposer is not None
                self.num_fused_steps += 1
                t_mid = self._mark()
                packed = self.proposer.run_fused_step(features, packed)
            host = self._fetch_packed(packed, len(items))
            fused_drafts: dict[str, list[int]] = {}
            for i, s in enumerate(items):
                nd = len(s.spec_token_ids)
                vals = host[i]  # q tokens, then n_match / n_acc (then, fused, K drafts)
                toks = vals[: min(vals[uniform_q], nd) + 1]
                emitted[i] = toks
                o = outputs[s.req.request_id]
                o.new_token_ids, o.num_draft, o.num_accepted = toks, nd, len(toks) - 1
                if fused:
                    # what propose() returns: drafts[:max_drafts]; -1: the device made none (no budget, or a
                    # block table that does not cover the query block)
                    d = vals[uniform_q + 1 : uniform_q + 1 + max(0, self._draft_budget(s.req, len(toks)))]
                    if d and d[0] >= 0:
                        fused_drafts[s.req.request_id] = d
            if fused:
                if not self.drafting_on(max(sched.batch_size, len(items))):
                    fused_drafts = {}
                if self.profile:
                    self.timings.append(
                        (self._elapsed(t_start, t_mid), self._elapsed(t_mid, self._mark()), len(items))
                    )
                return StepOutput(outputs, fused_drafts)
        elif sampling:
            rows: list[int] = []
            for i in sampling:
                s = items[i]
                first = offsets[i] + s.num_new_tokens - 1
                rows.extend(range(first, first + 1 + len(s.spec_token_ids)))
            rows_t = torch.tensor(rows, device=self.device)
            if all_logits is not None:
                logits = all_logits[rows_t].float()  # a copy (the graph's output stays as it is)
            else:
                logits = self.model.compute_logits(hidden[rows_t]).float()
            reqs = [items[i].req for i in sampling]
            want_lp = [r.params.logprobs is not None for r in reqs]
            # logprobs are the raw model's (vLLM's default raw_logprobs), taken before any processing
            lp_all = compute_logprobs(logits) if any(want_lp) else None
            self._process_logits(logits, [items[i] for i in sampling])
            # the position each request samples first (its seeded draws are keyed by it)
            first_pos = [items[i].start + items[i].num_new_tokens for i in sampling]
            st = SamplingTensors.from_params([r.params for r in reqs], first_pos, self.device)
            num_draft = [len(items[i].spec_token_ids) for i in sampling]
            kmax = max(num_draft)
            if kmax == 0:
                tokens = sample(logits, st, self.generator).tolist()
                per_req = [[t] for t in tokens]
            else:
                drafts = torch.full((len(sampling), kmax), -1, dtype=torch.long)
                for j, i in enumerate(sampling):
                    d = items[i].spec_token_ids
                    if d:
                        drafts[j, : len(d)] = torch.tensor(d)
                out, num_emitted = rejection_sample(
                    logits,
                    drafts.to(self.device),
                    torch.tensor(num_draft, device=self.device),
                    st,
                    fallback=self.generator,
                )
                out_l, ne_l = out.tolist(), num_emitted.tolist()
                per_req = [out_l[j][: ne_l[j]] for j in range(len(sampling))]
            row = 0
            for j, i in enumerate(sampling):
                s = items[i]
                toks = per_req[j]
                emitted[i] = toks
                o = outputs[s.req.request_id]
                o.new_token_ids = toks
                o.num_draft = num_draft[j]
                o.num_accepted = len(toks) - 1
                if lp_all is not None and want_lp[j]:
                    nt = reqs[j].params.logprobs or 0
                    r_idx = torch.arange(row, row + len(toks), device=self.device)
                    chosen, ranks, top_ids, top_lps = gather_logprobs(
                        lp_all[r_idx], torch.tensor(toks, device=self.device), nt
                    )
                    o.logprobs = list(
                        zip(chosen.tolist(), ranks.tolist(), top_ids.tolist(), top_lps.tolist())
                    )
                row += 1 + num_draft[j]

        drafts_out: dict[str, list[int]] = {}
        if self.proposer is not None:
            inputs: list[DraftInput] = []
            drafting_on = self.drafting_on(max(sched.batch_size, len(items)))
            for i, s in enumerate(items):
                req = s.req
                new = emitted[i]
                committed = req.token_ids + new if new else req.token_ids
                num_valid = s.num_new_tokens + (len(new) - 1 if new else 0)
                inputs.append(
                    DraftInput(
                        token_ids=committed,
                        start=s.start,
                        num_valid=num_valid,
                        row_offset=offsets[i],
                        block_table=req.block_table,
                        draft=bool(new),
                        max_drafts=max(0, self._draft_budget(req, len(new))) if drafting_on else 0,
                    )
                )
            t_mid = self._mark()
            proposals = self.proposer.propose(inputs, features)
            if self.profile:
                self.timings.append(
                    (self._elapsed(t_start, t_mid), self._elapsed(t_mid, self._mark()), len(items))
                )
            for s, d in zip(items, proposals):
                if d:
                    drafts_out[s.req.request_id] = d
        elif self.profile:
            self.timings.append((self._elapsed(t_start, self._mark()), 0.0, len(items)))
        return StepOutput(outputs, drafts_out)

    # ------------------------------------------------------------------ profiling (benchmarks only)
    def _mark(self) -> Any:
        if not self.profile:
            return None
        if self.device.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        import time

        return time.perf_counter()

    def _elapsed(self, a: Any, b: Any) -> float:
        """Milliseconds between two marks (synchronizes on CUDA: profiling only)."""
        if self.device.type == "cuda":
            b.synchronize()
            return float(a.elapsed_time(b))
        return (b - a) * 1e3

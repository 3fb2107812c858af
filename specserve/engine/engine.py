"""The step loop: schedule -> run the model (verify + draft) -> commit tokens, check stops, emit outputs."""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specserve.config import EngineConfig, ModelConfig, SpeculativeConfig
from specserve.engine.block_manager import BlockManager
from specserve.engine.request import Request, RequestStatus
from specserve.engine.scheduler import ScheduledRequest, Scheduler, SchedulerOutput
from specserve.errors import RequestValidationError
from specserve.outputs import CompletionOutput, Logprob, RequestOutput
from specserve.sampling_params import SamplingParams
from specserve.spec.gate import PLAIN, SPEC, TRANSITION, SpeculationGate

if TYPE_CHECKING:
    from specserve.runner.model_runner import InflightDecode, InflightSpec

logger = logging.getLogger("specserve")

PromptType = str | list[int] | dict[str, Any]


@dataclass
class SpecStats:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def observe(self, num_draft: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_draft:
            self.accepted_per_pos.extend([0] * (num_draft - len(self.accepted_per_pos)))
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1

    def snapshot(self) -> SpecStats:
        return SpecStats(
            self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens, list(self.accepted_per_pos)
        )


def spec_log_line(cur: SpecStats, prev: SpecStats, elapsed: float, k: int) -> str:
    drafts = cur.num_drafts - prev.num_drafts
    drafted = cur.num_draft_tokens - prev.num_draft_tokens
    accepted = cur.num_accepted_tokens - prev.num_accepted_tokens
    per_pos = [
        (cur.accepted_per_pos[i] if i < len(cur.accepted_per_pos) else 0)
        - (prev.accepted_per_pos[i] if i < len(prev.accepted_per_pos) else 0)
        for i in range(k)
    ]
    mean_len = 1 + accepted / drafts if drafts else 1.0
    rates = ", ".join(f"{(p / drafts if drafts else 0.0):.3f}" for p in per_pos)
    elapsed = max(elapsed, 1e-9)
    return (
        f"SpecDecoding metrics: Mean acceptance length: {mean_len:.2f}, "
        f"Accepted throughput: {accepted / elapsed:.2f} tokens/s, Drafted throughput: {drafted / elapsed:.2f} tokens/s, "
        f"Accepted: {accepted} tokens, Drafted: {drafted} tokens, Per-position acceptance rate: {rates}, "
        f"Avg Draft acceptance rate: {100.0 * accepted / drafted if drafted else 0.0:.1f}%"
    )


def fast_decoder(tokenizer: Any) -> Callable[[list[int], bool], str]:
    """``decode(ids, skip_special_tokens)`` answering exactly what ``tokenizer.decode`` does.

    For a transformers fast tokenizer (the ``tokenizers`` backend, decode/_decode not overridden) without
    ``clean_up_tokenization_spaces``, ``tokenizer.decode`` is the backend's ``Tokenizer.decode`` plus argument
    conversions that cost several times the decode itself on short inputs (the detokenizer decodes twice per
    token): call the backend directly. Anything else: the tokenizer's own decode."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # pragma: no cover - older transformers
        TokenizersBackend = None  # type: ignore[assignment,misc]
    backend = getattr(tokenizer, "_tokenizer", None)
    if (
        TokenizersBackend is not None
        and isinstance(tokenizer, TokenizersBackend)
        and type(tokenizer).decode is PreTrainedTokenizerBase.decode
        and type(tokenizer)._decode is TokenizersBackend._decode
        and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False
        and callable(getattr(backend, "decode", None))
    ):
        raw = backend.decode

        def decode(ids: list[int], skip: bool) -> str:
            return raw(ids, skip_special_tokens=skip)  # type: ignore[no-any-return]

        return decode

    def slow_decode(ids: list[int], skip: bool) -> str:
        return tokenizer.decode(ids, skip_special_tokens=skip)  # type: ignore[no-any-return]

    return slow_decode


@dataclass
class _Parent:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[Request]


def _serve_speculator(config: EngineConfig, path: str, raw: dict[str, Any]) -> Any:
    """``config.model`` is a speculators-format head: load the verifier it names as the target and (unless a
    speculative config was given) draft with the head, K from its config; returns the verifier's checkpoint."""
    from specserve.loading import config_only_checkpoint, resolve_checkpoint, speculators

    verifier = speculators.verifier_of(raw)
    if verifier is None:
        raise ValueError(
            f"'{config.model}' is a speculators drafter that names no verifier (speculators_config.verifier."
            "name_or_path); serve the target model and pass the drafter in --speculative-config."
        )
    if config.speculative_config is None:
        k = speculators.num_speculative_tokens(raw)
        if k is None:
            raise ValueError(
                f"'{config.model}' gives no speculative_tokens; pass --speculative-config with num_speculative_tokens."
            )
        config.speculative_config = SpeculativeConfig.from_dict(
            {"method": speculators.method_of(raw), "model": path, "num_speculative_tokens": k}
        )
    logger.info(
        "%s is a speculators checkpoint: serving its verifier %s with it as the %s drafter (K=%d)",
        config.model,
        verifier,
        config.speculative_config.method,
        config.speculative_config.num_speculative_tokens,
    )
    if config.load_format == "dummy":
        return config_only_checkpoint(verifier, trust_remote_code=config.trust_remote_code)
    return resolve_checkpoint(
        verifier, trust_remote_code=config.trust_remote_code, download_dir=config.download_dir
    )


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        import torch

        from specserve.loading import (
            apply_hf_overrides,
            config_only_checkpoint,
            load_tokenizer,
            resolve_checkpoint,
            speculators,
        )
        from specserve.runner.model_runner import ModelRunner, resolve_device, resolve_dtype

        self.config = config
        t0 = time.perf_counter()
        dummy = config.load_format == "dummy"
        if dummy:
            if config.model is None:
                raise ValueError("load_format='dummy' needs a model directory with config.json.")
            ckpt = config_only_checkpoint(config.model, trust_remote_code=config.trust_remote_code)
        else:
            ckpt = resolve_checkpoint(
                config.model,
                trust_remote_code=config.trust_remote_code,
                revision=config.revision,
                download_dir=config.download_dir,
            )
        # a speculators checkpoint served directly (as vLLM): the verifier it names is the target
        spec_raw = None if ckpt.gguf_file else speculators.read_config(ckpt.path)
        if spec_raw is not None:
            ckpt = _serve_speculator(config, ckpt.path, spec_raw)
        # vLLM's --hf-overrides: the target's config (whatever its source), never the drafter's
        ckpt = apply_hf_overrides(ckpt, config.hf_overrides)
        self.checkpoint = ckpt
        self.model_path = ckpt.path if not ckpt.gguf_file else f"{ckpt.path}/{ckpt.gguf_file}"
        self.tokenizer = load_tokenizer(
            config.tokenizer or ckpt,
            trust_remote_code=config.trust_remote_code,
            revision=config.tokenizer_revision if config.tokenizer else None,
            download_dir=config.download_dir,
            tokenizer_mode=config.tokenizer_mode,
        )
        self._decode = fast_decoder(self.tokenizer)
        self.model_config = mc = ModelConfig.from_hf(ckpt.hf_config)
        max_len = config.max_model_len or mc.max_position_embeddings
        if config.max_model_len and config.max_model_len > mc.max_position_embeddings:
            raise ValueError(
                f"max_model_len ({config.max_model_len}) is greater than the model's max_position_embeddings "
                f"({mc.max_position_embeddings})."
            )
        self.max_model_len = max_len
        device = resolve_device(config.device)
        # the checkpoint's declared dtype: `dtype` (transformers 5; reading `torch_dtype` there logs a deprecation
        # warning at every start), an older config's `torch_dtype` field otherwise
        hf_dtype = getattr(ckpt.hf_config, "dtype", None) or vars(ckpt.hf_config).get("torch_dtype")
        dtype = resolve_dtype(config.dtype, hf_dtype, device)
        if device.type == "cpu" and dtype == torch.float16:
            logger.warning("float16 on CPU is slow; consider bfloat16 or float32")
        weights = None if dummy else ckpt.iter_weights(dtype)
        self.runner = ModelRunner(config, mc, weights, device, dtype, max_len, ckpt)
        self.num_spec = self.runner.num_speculative_tokens
        mnbt = config.max_num_batched_tokens or max(2048, config.max_num_seqs * (self.num_spec + 1))
        num_blocks = self.runner.determine_num_blocks(mnbt)
        self.runner.allocate_kv_cache(num_blocks)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        if self.runner.proposer is not None:
            self.block_manager.drop_last_cached_block = self.runner.proposer.drop_last_cached_block
        if mnbt < config.max_num_seqs * (self.num_spec + 1) and self.num_spec:
            logger.warning(
                "max_num_batched_tokens=%d leaves no room to verify drafts for every sequence", mnbt
            )
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_seqs,
            mnbt,
            max_len,
            num_lookahead_slots=self.num_spec + 1 if self.num_spec else 0,
            policy=config.scheduling_policy,
        )
        # prefill chunks the runner's prefill graphs take run as steps of their own (see the scheduler)
        pg = self.runner.prefill_graphs
        self.scheduler.prefill_alone = pg.max_batch if pg is not None else 0
        self.eos_token_ids = self._eos_ids(mc)
        self.default_sampling_overrides = self._generation_defaults(ckpt.generation_config)
        self.parents: dict[str, _Parent] = {}
        self.requests: dict[str, Request] = {}
        self.counter = itertools.count()
        self._grammars: OrderedDict[str, Any] = OrderedDict()  # structured outputs: compiled grammars by spec
        self._vocab: Any = None  # structured outputs: the tokenizer's vocabulary trie (built on first use)
        # True: step() returns outputs only for finished requests (LLM.generate: no per-step snapshots to build)
        self.final_outputs_only = False
        self._inflight: InflightDecode | None = None  # async scheduling: the decode step on the device
        self._inflight_spec: InflightSpec | None = None  # likewise, a fused greedy speculative step
        # metrics
        self.spec_stats = SpecStats()
        # speculative_config.disable_when_slower (specserve/spec/gate.py); the runner asks it in drafting_on
        self.gate: SpeculationGate | None = None
        spec = config.speculative_config
        if spec is not None and spec.disable_when_slower and self.runner.proposer is not None:
            self.gate = self.runner.gate = SpeculationGate()
        # (kind, batch size, tokens per request whose drafts max_tokens did not cut) of the step, for the gate
        self._step_info: tuple[str, int, float | None] | None = None
        self._clock: Callable[[], float] = time.perf_counter  # the gate's step timer (tests replace it)
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.request_success: dict[str, int] = {}
        self._last_log = time.monotonic()
        self._last_spec = SpecStats()
        self._last_tokens = (0, 0)
        logger.info(
            "Engine ready in %.1fs: %s (%s, %s, %s), max_model_len=%d, speculative=%s",
            time.perf_counter() - t0,
            self.model_path,
            mc.architecture,
            dtype,
            device,
            max_len,
            config.speculative_config.to_dict() if config.speculative_config else None,
        )

    # ------------------------------------------------------------------ setup helpers
    def _eos_ids(self, mc: ModelConfig) -> set[int]:
        ids = set(mc.eos_token_ids)
        gen_eos = self.checkpoint.generation_config.get("eos_token_id")
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, list):
            ids.update(int(e) for e in gen_eos)
        tok_eos = getattr(self.tokenizer, "eos_token_id", None)
        if tok_eos is not None:
            ids.add(int(tok_eos))
        return ids

    def _generation_defaults(self, gen: dict[str, Any]) -> dict[str, Any]:
        if self.config.generation_config == "vllm":
            return {}
        if self.config.generation_config not in ("auto", ""):
            import json
            import os

            path = self.config.generation_config
            path = os.path.join(path, "generation_config.json") if os.path.isdir(path) else path
            with open(path) as f:
                gen = json.load(f)
        out: dict[str, Any] = {}
        for key in ("temperature", "top_p", "top_k", "min_p"):
            if key in gen and gen[key] is not None:
                out[key] = gen[key]
        if "max_new_tokens" in gen and gen["max_new_tokens"]:
            out["max_tokens"] = gen["max_new_tokens"]
        return out

    def get_tokenizer(self):  # type: ignore[no-untyped-def]
        return self.tokenizer

    # ------------------------------------------------------------------ requests
    def tokenize_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("A prompt dict needs 'prompt' or 'prompt_token_ids'.")
        if isinstance(prompt, str):
            return prompt, self.tokenizer(prompt).input_ids
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise ValueError(f"Unsupported prompt type {type(prompt).__name__}; pass str, list[int] or a dict.")

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> int:
        """Return the resolved max_tokens or raise RequestValidationError with vLLM's wording."""
        L, P = self.max_model_len, len(prompt_ids)
        if P == 0:
            raise RequestValidationError("The prompt cannot be empty.", "prompt")
        vocab = self.model_config.vocab_size
        if any(t < 0 or t >= vocab for t in prompt_ids):
            raise RequestValidationError(
                f"Token id out of vocabulary (0..{vocab - 1}) in the prompt.", "prompt"
            )
        for name, ids in (
            ("logit_bias", params.logit_bias or ()),
            ("allowed_token_ids", params.allowed_token_ids or ()),
        ):
            bad = sorted(t for t in ids if t >= vocab)
            if bad:
                raise RequestValidationError(
                    f"token_id(s) {bad} in {name} contain out-of-vocab token ids (vocabulary size {vocab}).",
                    name,
                )
        cap = self.config.max_logprobs if self.config.max_logprobs >= 0 else vocab
        for name, n in (("logprobs", params.logprobs), ("prompt_logprobs", params.prompt_logprobs)):
            if n is not None and n > cap:
                raise RequestValidationError(
                    f"Requested {name} of {n}, which is greater than max allowed: {cap} (--max-logprobs).",
                    name,
                )
        mt = params.max_tokens
        if mt is not None and mt > L:
            raise RequestValidationError(
                f"max_tokens={mt} cannot be greater than max_model_len={L}. Please request fewer output tokens.",
                "max_tokens",
            )
        if mt is None:
            if P >= L:
                raise RequestValidationError(
                    f"This model's maximum context length is {L} tokens. However, your request has {P} input "
                    "tokens. Please reduce the length of the input messages.",
                    "input_tokens",
                )
            mt = L - P
        elif P + mt > L:
            raise RequestValidationError(
                f"This model's maximum context length is {L} tokens. However, you requested {mt} output tokens "
                f"and your prompt contains {P} input tokens, for a total of {P + mt} tokens. Please reduce the "
                "length of the input prompt or the number of requested output tokens.",
                "input_tokens",
            )
        need = self.block_manager.blocks_needed(P + mt + self.scheduler.lookahead)
        if need > self.block_manager.num_blocks:
            raise RequestValidationError(
                f"The request needs {need} KV-cache blocks ({P} prompt + {mt} output tokens) but the cache holds "
                f"only {self.block_manager.num_blocks}; request fewer tokens.",
                "max_tokens",
            )
        return mt

    def check_priority(self, priority: int) -> None:
        """Raise ValueError unless ``priority`` is an int that the scheduling policy accepts (fcfs: only 0)."""
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an integer, got {priority!r}.")
        if priority != 0 and self.config.scheduling_policy != "priority":
            raise ValueError(
                f"Got priority {priority} but priority scheduling is not enabled (--scheduling-policy priority)."
            )

    def add_request(
        self,
        request_id: str | None,
        prompt: PromptType,
        params: SamplingParams | None = None,
        priority: int = 0,
    ) -> str:
        """Queue a request (n > 1: one child per completion, each with ``priority``); returns its id. ``priority``
        (lower first) needs ``scheduling_policy="priority"``; anything but 0 is a ValueError under fcfs."""
        self.check_priority(priority)
        params = params.clone() if params is not None else SamplingParams()
        rid = request_id if request_id is not None else str(next(self.counter))
        if rid in self.parents:
            raise ValueError(f"Request id {rid!r} is already in use.")
        text, ids = self.tokenize_prompt(prompt)
        max_tokens = self.validate(ids, params)
        params._all_stop_token_ids = set(params.stop_token_ids or [])
        if not params.ignore_eos:
            params._all_stop_token_ids |= self.eos_token_ids
        params._bad_words_token_ids = self._bad_words_ids(params.bad_words or [])
        grammar = self._grammar(params.structured_outputs) if params.structured_outputs is not None else None
        children = []
        for i in range(params.n):
            p = params
            if params.n > 1 and params.seed is not None:
                p = params.clone()
                p.seed = params.seed + i
            req = Request(
                request_id=rid if params.n == 1 else f"{rid}#{i}",
                prompt_token_ids=ids,
                params=p,
                max_tokens=max_tokens,
                prompt=text,
                parent_id=rid,
                index=i,
                priority=priority,
            )
            if grammar is not None:
                from specserve.structured import GrammarMatcher

                req.grammar = GrammarMatcher(
                    grammar, self._vocab, params._all_stop_token_ids or self.eos_token_ids
                )
            children.append(req)
        self.parents[rid] = _Parent(rid, text, ids, children)
        for req in children:
            self.requests[req.request_id] = req
            self.scheduler.add(req)
        return rid

    def _bad_words_ids(self, words: list[str]) -> list[list[int]]:
        """vLLM's bad_words as token sequences: each word as written, and with a leading space where that gives
        a different first token and as many tokens (the word inside a text)."""
        out: list[list[int]] = []
        for w in words:
            plain = self.tokenizer.encode(w.lstrip(), add_special_tokens=False)
            out.append(plain)
            spaced = self.tokenizer.encode(" " + w.lstrip(), add_special_tokens=False)
            if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
                out.append(spaced)
        return [ids for ids in out if ids]

    def _grammar(self, so: Any) -> Any:
        """The compiled grammar of a structured-outputs request (compiled grammars are kept by spec, so their
        cached masks serve every request with the same schema); a bad spec is a RequestValidationError."""
        from specserve.structured import Grammar, GrammarError, TokenVocab
        from specserve.structured.grammar import MAX_WS

        key = so.cache_key()
        cache = self._grammars
        g = cache.get(key)
        if g is None:
            try:
                if so.choice is not None:
                    g = Grammar.choice(so.choice)
                elif so.json is not None:
                    g = Grammar.json_schema(so.json, 0 if so.disable_any_whitespace else MAX_WS)
                elif so.regex is not None:
                    g = Grammar.regex(so.regex)
                else:
                    g = Grammar.json_any(max_ws=0 if so.disable_any_whitespace else MAX_WS)
            except GrammarError as e:
                raise RequestValidationError(
                    f"Invalid structured outputs request: {e}", "structured_outputs"
                ) from None
            cache[key] = g
            if len(cache) > 64:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        if self._vocab is None:
            self._vocab = TokenVocab.from_tokenizer(self.tokenizer, self.model_config.vocab_size)
        return g

    def abort_request(self, request_id: str) -> None:
        parent = self.parents.pop(request_id, None)
        if parent is None:
            return
        for req in parent.children:
            if not req.is_finished:
                self.scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
                self.request_success["abort"] = self.request_success.get("abort", 0) + 1
            self.requests.pop(req.request_id, None)

    def has_unfinished_requests(self) -> bool:
        return (
            self.scheduler.has_unfinished() or self._inflight is not None or self._inflight_spec is not None
        )

    # ------------------------------------------------------------------ the step
    def step(self) -> list[RequestOutput]:
        """Run one step and return its outputs (see _step); the speculation gate, when on, times it."""
        self._step_info = None
        out = self._step()
        if self.gate is not None:
            if self._step_info is None:
                self.gate.record(None, 0, 0.0)
            else:
                self.gate.record(self._step_info[0], self._step_info[1], self._clock(), self._step_info[2])
        return out

    def _gate_sample(self, req: Request, num_draft: int) -> bool:
        """Whether this request's verified drafts (before committing them) tell the gate about the text: it
        drafted, more than 2(K+1) tokens before its max_tokens (drafts cut short there say nothing)."""
        return num_draft > 0 and req.max_tokens - req.num_output_tokens > 2 * (self.num_spec + 1)

    def _step(self) -> list[RequestOutput]:
        """Run one step and return its outputs.

        Async scheduling (plain decode on the in-graph path, see ModelRunner.launch_decode): step N is launched
        without waiting; step N+1 is scheduled assuming each request gets one token from N, and launched with its
        input tokens gathered on the device from N's output; only then does the host wait for N and process its
        tokens, so this host work overlaps N+1 on the device. Each call still returns one step's outputs, in the
        order the synchronous engine would. Fused speculative steps (DFlash, EAGLE-3) are pipelined the same way (see _step_spec).
        Anything else (prefill, admissions, logprobs requests, host-side drafting, running out
        of blocks, requests near their end) drains the pipeline and runs synchronously.
        """
        if self._inflight_spec is not None:
            return self._step_spec(self._inflight_spec)
        if self._inflight is None:
            sched = self.scheduler.schedule()
            items = sched.scheduled
            if self.runner.can_launch_spec_async(items):
                return self._step_spec(self.runner.launch_spec(items, None))
            if not (all(s.samples for s in items) and self.runner.can_launch_async(items)):
                return self._step_sync(sched)
            self._inflight = self._launch(items, None)
        step = self._inflight
        nxt = self._schedule_next(step)
        self._inflight = self._launch(nxt, step) if nxt else None
        return self._collect(step)

    def _launch(self, items: list[ScheduledRequest], prev: InflightDecode | None) -> InflightDecode:
        step = self.runner.launch_decode(items, prev)
        for s in items:  # the input token's KV is being written; its output token is not known yet
            s.req.num_computed_tokens += 1
        return step

    def _schedule_next(self, step: InflightDecode) -> list[ScheduledRequest] | None:
        """Step N+1 while N is in flight, or None (drain): every running request was in N and decodes again,
        nobody waits for admission, and each one's KV slot for N's token (the position after it) is allocated
        now (N+1 writes it). Requests that N's token finishes by length are left out (known on the host)."""
        sch = self.scheduler
        if sch.waiting and len(sch.running) < sch.max_num_seqs:
            return None
        in_step = {id(s.req) for s in step.items}
        if len(sch.running) > sch.max_num_batched_tokens or any(id(r) not in in_step for r in sch.running):
            return None
        reqs = [
            r
            for r in sch.running
            if r.num_output_tokens + 1 < r.max_tokens and r.num_tokens + 1 < self.max_model_len
        ]
        items = [ScheduledRequest(r, 1, []) for r in reqs]
        if not self.runner.can_launch_async(items):
            return None
        for r in reqs:  # no preemption here: when blocks run out, the synchronous step handles it
            if not self.block_manager.allocate(r, r.num_computed_tokens + 1 + sch.lookahead):
                return None
        return items

    def _collect(self, step: InflightDecode) -> list[RequestOutput]:
        """Wait for a launched decode step and process its tokens as the synchronous step does. A request that
        finished (or was aborted) after this step was launched gets nothing: its token is discarded."""
        tokens = self.runner.collect_decode(step)
        if self.gate is not None:
            self._step_info = (PLAIN, len(step.items), None)
        touched: set[str] = set()
        now = time.monotonic()
        for s, tok in zip(step.items, tokens):
            req = s.req
            if not req.is_finished:
                self._commit(req, [tok], None, now, touched)
        self._maybe_log()
        return self._outputs_for(touched)

    # ------------------------------------------------------------------ async fused speculative steps
    def _step_spec(self, step: InflightSpec) -> list[RequestOutput]:
        """Async scheduling of fused speculative steps (ModelRunner.launch_spec): with step N in flight,
        schedule step N+1 without knowing N's n_acc (worst case: every draft accepted), launch it with its inputs
        built on the device from N's output, then collect N."""
        nxt = self._schedule_next_spec(step)
        self._inflight_spec = self.runner.launch_spec(nxt, step) if nxt else None
        return self._collect_spec(step)

    def _schedule_next_spec(self, step: InflightSpec) -> list[ScheduledRequest] | None:
        """Step N+1 while N is in flight, or None (drain). The running requests are N's minus those that
        finished since N was launched (their N output is discarded); their confirmed state is N's start. Drain
        when someone waits for admission, a running request was not in N, N could finish a request by length
        (it yields up to K+1 tokens: N+1 would be wasted), a request nears the context cap (3(K+1) slots), or
        blocks run out (no preemption with a step in flight). Drafts cut by the draft budget near max_tokens are
        fine: N+1's num_draft and budget are derived on the device as the host would (``launch_spec``; until
        session 18 the pipeline drained 3(K+1) tokens before max_tokens, a third of a 128-token answer at K=15).
        Blocks are allocated for the worst case: N and N+1 accept everything (2(K+1) tokens) and N+1's drafter
        query block writes K+1 more slots."""
        sch, runner = self.scheduler, self.runner
        if not sch.running or (sch.waiting and len(sch.running) < sch.max_num_seqs):
            return None
        in_step = {id(s.req) for s in step.items}
        if any(id(r) not in in_step for r in sch.running):
            return None
        q = self.num_spec + 1
        cap = min(self.max_model_len, runner.draft_max_model_len)
        for r in sch.running:
            if r.num_output_tokens + q + 1 >= r.max_tokens or r.num_tokens + 3 * q + 1 >= cap:
                return None
        if len(sch.running) * q > sch.max_num_batched_tokens or not runner.drafting_on(len(sch.running)):
            return None
        # the same order as the synchronous scheduler would give (running order)
        items = [ScheduledRequest(r, 1, []) for r in sch.running]
        if (
            not (runner.async_spec and runner.use_fused_step)
            or runner.profile
            or len(items) > sch.max_num_seqs
        ):
            return None
        if not runner._graph_sampling_ok(items):  # greedy, random and seeded rows pipeline alike
            return None
        for r in sch.running:  # no preemption here: when blocks run out, the synchronous step handles it
            if not self.block_manager.allocate(r, r.num_computed_tokens + 3 * q):
                return None
        return items

    def _collect_spec(self, step: InflightSpec) -> list[RequestOutput]:
        """Wait for a launched speculative step and process it as the synchronous fused step does. A request
        that finished (or was aborted) after the step was launched gets nothing: its output is discarded. Each
        request's drafts verified by this step are req.spec_token_ids (set by the previous step's processing)."""
        rows = self.runner.collect_spec(step)
        q = self.num_spec + 1
        touched: set[str] = set()
        now = time.monotonic()
        drafting_on = self.runner.drafting_on(len(step.items))
        gate_on = self.gate is not None
        emitted = full = 0  # for the gate: tokens of the requests whose drafts max_tokens did not cut
        for s, vals in zip(step.items, rows):
            req = s.req
            if req.is_finished:
                continue
            nd = len(req.spec_token_ids)
            toks = vals[: min(vals[q], nd) + 1]
            n_acc = len(toks) - 1
            if gate_on and self._gate_sample(req, nd):
                emitted, full = emitted + len(toks), full + 1
            if nd:
                self.spec_stats.observe(nd, n_acc)
            max_drafts = max(0, self.runner._draft_budget(req, len(toks))) if drafting_on else 0
            req.num_computed_tokens += 1 + n_acc
            if self._commit(req, toks, None, now, touched):
                d = vals[q + 1 : q + 1 + max_drafts]
                req.spec_token_ids = d if d and d[0] >= 0 else []
        if gate_on:
            self._step_info = (SPEC, len(step.items), emitted / full if full else None)
        self._maybe_log()
        return self._outputs_for(touched)

    def _step_sync(self, sched: SchedulerOutput) -> list[RequestOutput]:
        if not sched.scheduled:
            if self.scheduler.waiting and not self.scheduler.running:
                # nothing fits even alone (should have been rejected at add time): fail the head request
                req = self.scheduler.waiting[0]
                self.scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
                return self._outputs_for({req.parent_id or req.request_id})
            return []
        result = self.runner.execute(sched)
        items = sched.scheduled
        if self.gate is not None and all(s.num_new_tokens == 1 and s.samples for s in items):  # what it times
            outs = [result.outputs[s.req.request_id] for s in items]
            kind = SPEC if any(o.num_draft for o in outs) else (TRANSITION if result.drafts else PLAIN)
            full = [
                len(o.new_token_ids) for s, o in zip(items, outs) if self._gate_sample(s.req, o.num_draft)
            ]
            self._step_info = (kind, len(items), sum(full) / len(full) if full else None)
        touched: set[str] = set()
        now = time.monotonic()
        for s in sched.scheduled:
            req = s.req
            out = result.outputs[req.request_id]
            if out.prompt_logprobs is not None:
                first, lps = out.prompt_logprobs
                if len(req.prompt_logprobs) < req.num_prompt_tokens:
                    req.prompt_logprobs = [None] * req.num_prompt_tokens
                for j, lp in enumerate(lps):  # by position: a recomputed chunk writes the same entries again
                    req.prompt_logprobs[first + j] = self._logprob_dict(req.prompt_token_ids[first + j], lp)
            if not out.new_token_ids:
                req.num_computed_tokens += s.num_new_tokens
                self.block_manager.cache_full_blocks(req)
                continue
            if out.num_draft:
                self.spec_stats.observe(out.num_draft, out.num_accepted)
            # tokens run through the target and committed: the chunk plus the accepted drafts
            req.num_computed_tokens += s.num_new_tokens + out.num_accepted
            if self._commit(req, out.new_token_ids, out.logprobs, now, touched):
                req.spec_token_ids = result.drafts.get(req.request_id, [])
        self._maybe_log()
        return self._outputs_for(touched)

    def _commit(
        self,
        req: Request,
        tokens: list[int],
        logprobs: list[tuple[float, int, list[int], list[float]]] | None,
        now: float,
        touched: set[str],
    ) -> bool:
        """Append a step's tokens to req (stops, metrics), then finish it or cache its full blocks; True while it
        keeps running. An async step's request finishes while the next step is enqueued: freeing its blocks is
        still safe (device work is stream-ordered)."""
        if req.first_token_time is None:
            req.first_token_time = now
            self.prompt_tokens_total += req.num_prompt_tokens
        self._append_tokens(req, tokens, logprobs)
        touched.add(req.parent_id or req.request_id)
        if req.is_finished:
            # its full blocks stay in the prefix cache once freed: also those of a request that ends in the step
            # of its (last) prefill chunk, e.g. max_tokens=1, which no later step registers
            self.block_manager.cache_full_blocks(req)
            self.scheduler.finish(req, req.status)
            self.request_success[req.status.value] = self.request_success.get(req.status.value, 0) + 1
            return False
        self.block_manager.cache_full_blocks(req)
        return True

    def _append_tokens(
        self,
        req: Request,
        tokens: list[int],
        logprobs: list[tuple[float, int, list[int], list[float]]] | None,
    ) -> None:
        p = req.params
        stop_ids = p._all_stop_token_ids
        for j, tok in enumerate(tokens):
            req.token_ids.append(tok)
            self.generation_tokens_total += 1
            if logprobs is not None:
                self._record_logprob(req, tok, logprobs[j])
            n_out = req.num_output_tokens
            if n_out >= p.min_tokens and tok in stop_ids:
                req.status = RequestStatus.FINISHED_STOPPED
                req.stop_reason = (
                    None if tok in self.eos_token_ids and tok not in (p.stop_token_ids or []) else tok
                )
                self._detokenize(req)
                return
            stop = self._detokenize(req)
            if stop is not None and n_out >= p.min_tokens:
                req.status = RequestStatus.FINISHED_STOPPED
                req.stop_reason = stop
                return
            if n_out >= req.max_tokens or req.num_tokens >= self.max_model_len:
                req.status = RequestStatus.FINISHED_LENGTH
                return

    def _record_logprob(self, req: Request, tok: int, lp: tuple[float, int, list[int], list[float]]) -> None:
        req.output_logprobs.append(self._logprob_dict(tok, lp))
        req.cumulative_logprob += lp[0]

    def _logprob_dict(self, tok: int, lp: tuple[float, int, list[int], list[float]]) -> dict[int, Logprob]:
        """vLLM's logprobs entry: the token's Logprob (rank among all tokens), then the top ones, ranked 1..N."""
        chosen, rank, top_ids, top_lps = lp
        dec = self._decode
        d: dict[int, Logprob] = {tok: Logprob(chosen, rank, dec([tok], False))}
        for tid, tl in zip(top_ids, top_lps):
            if tid not in d:
                d[tid] = Logprob(tl, len(d) if tid != tok else rank, dec([tid], False))
        for r, tid in enumerate(top_ids):
            if tid in d and tid != tok:
                d[tid].rank = r + 1
        return d

    def _detokenize(self, req: Request) -> str | None:
        """Append the text of the newest token(s) to req.output_text (incrementally: two short decodes per token,
        holding back an incomplete UTF-8 character); return the stop string that matched (text truncated
        before it, or after it with include_stop_str_in_output), if any."""
        p = req.params
        ids = req.token_ids
        skip = p.skip_special_tokens
        prefix_text = self._decode(ids[req.prefix_offset : req.read_offset], skip)
        new_text = self._decode(ids[req.prefix_offset :], skip)
        prev_len = len(req.output_text)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            req.output_text += new_text[len(prefix_text) :]
            req.prefix_offset, req.read_offset = req.read_offset, len(ids)
        if not p.stop or len(req.output_text) == prev_len:
            return None
        text = req.output_text
        longest = max(len(s) for s in p.stop)
        search_from = max(0, prev_len - longest + 1)
        best: tuple[int, str] | None = None
        for s in p.stop:
            i = text.find(s, search_from)
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        req.output_text = text[: i + len(s)] if p.include_stop_str_in_output else text[:i]
        return s

    def _outputs_for(self, parent_ids: set[str]) -> list[RequestOutput]:
        outs = []
        final_only = self.final_outputs_only
        for pid in parent_ids:
            parent = self.parents.get(pid)
            if parent is None:
                continue
            finished = all(c.is_finished for c in parent.children)
            if final_only and not finished:
                continue
            outs.append(self.make_output(parent, finished))
            if finished:
                self.parents.pop(pid, None)
                for c in parent.children:
                    self.requests.pop(c.request_id, None)
        return outs

    def make_output(self, parent: _Parent, finished: bool) -> RequestOutput:
        comps = []
        for c in parent.children:
            comps.append(
                CompletionOutput(
                    index=c.index,
                    text=c.output_text,
                    token_ids=c.token_ids[c.num_prompt_tokens :],
                    cumulative_logprob=c.cumulative_logprob if c.params.logprobs is not None else None,
                    logprobs=list(c.output_logprobs) if c.params.logprobs is not None else None,
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                )
            )
        first = parent.children[0]
        plp: list[dict[int, Logprob] | None] | None = None
        if first.params.prompt_logprobs is not None:  # entry 0 None, as vLLM; the rest as prefill got to them
            plp = [None] * len(first.prompt_token_ids)
            plp[1 : len(first.prompt_logprobs)] = first.prompt_logprobs[1:]
        return RequestOutput(
            request_id=parent.request_id,
            prompt=parent.prompt,
            prompt_token_ids=parent.prompt_token_ids,
            outputs=comps,
            finished=finished,
            num_cached_tokens=first.num_cached_tokens,
            prompt_logprobs=plp,
            metrics={
                "arrival_time": first.arrival_time,
                "first_token_time": first.first_token_time or 0.0,
            },
        )

    # ------------------------------------------------------------------ metrics
    def get_metrics(self) -> dict[str, Any]:
        s = self.spec_stats
        return {
            "num_requests_running": len(self.scheduler.running),
            "num_requests_waiting": len(self.scheduler.waiting),
            "kv_cache_usage_perc": self.block_manager.usage(),
            "num_gpu_blocks": self.block_manager.num_blocks,
            "num_free_blocks": self.block_manager.num_free_blocks,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "num_preemptions_total": self.scheduler.num_preemptions,
            "request_success_total": dict(self.request_success),
            "prefix_cache_queries": self.block_manager.prefix_queries,
            "prefix_cache_hits": self.block_manager.prefix_hits,
            "num_speculative_tokens": self.num_spec,
            "spec_decode_num_drafts": s.num_drafts,
            "spec_decode_num_draft_tokens": s.num_draft_tokens,
            "spec_decode_num_accepted_tokens": s.num_accepted_tokens,
            "spec_decode_num_accepted_tokens_per_pos": (
                (s.accepted_per_pos + [0] * self.num_spec)[: self.num_spec] if self.num_spec else []
            ),
        }

    def _maybe_log(self) -> None:
        if self.config.disable_log_stats:
            return
        now = time.monotonic()
        elapsed = now - self._last_log
        if elapsed < self.config.log_stats_interval:
            return
        p0, g0 = self._last_tokens
        logger.info(
            "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, "
            "Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
            (self.prompt_tokens_total - p0) / elapsed,
            (self.generation_tokens_total - g0) / elapsed,
            len(self.scheduler.running),
            len(self.scheduler.waiting),
            100 * self.block_manager.usage(),
            100 * self.block_manager.prefix_hits / max(1, self.block_manager.prefix_queries),
        )
        if self.num_spec:
            logger.info(spec_log_line(self.spec_stats, self._last_spec, elapsed, self.num_spec))
        self._last_log = now
        self._last_spec = self.spec_stats.snapshot()
        self._last_tokens = (self.prompt_tokens_total, self.generation_tokens_total)

"""Offline API shaped like vLLM's ``LLM``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specserve.config import EngineConfig, SpeculativeConfig, resolve_cudagraphs
from specserve.engine.engine import LLMEngine, PromptType
from specserve.outputs import RequestOutput
from specserve.sampling_params import SamplingParams


class LLM:
    """``LLM(model).generate(prompts, SamplingParams(...))`` -> list of RequestOutput in input order."""

    def __init__(
        self,
        model: str | None = None,
        tokenizer: str | None = None,
        dtype: str = "auto",
        device: str = "auto",
        max_model_len: int | None = None,
        max_num_seqs: int = 8,
        max_num_batched_tokens: int | None = None,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        speculative_config: dict[str, Any] | str | SpeculativeConfig | None = None,
        enforce_eager: bool = False,
        gpu_memory_utilization: float = 0.9,
        num_gpu_blocks: int | None = None,
        block_size: int = 16,
        trust_remote_code: bool = False,
        generation_config: str = "auto",
        disable_log_stats: bool = True,
        attention_backend: str = "auto",
        padded_decode: bool | None = None,
        async_scheduling: bool | None = None,
        async_spec: bool | None = None,
        load_format: str = "auto",
        max_logprobs: int = 20,
        revision: str | None = None,
        tokenizer_revision: str | None = None,
        download_dir: str | None = None,
        scheduling_policy: str = "fcfs",
        hf_overrides: dict[str, Any] | None = None,
        tokenizer_mode: str = "auto",
        compilation_config: dict[str, Any] | int | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs:
            raise ValueError(f"Unknown LLM argument(s): {', '.join(sorted(kwargs))}.")
        # vLLM's compilation_config: cudagraph_mode "NONE" (no graphs) and the capture sizes (see resolve_cudagraphs)
        no_graphs, max_capture = resolve_cudagraphs(compilation_config)
        self.config = EngineConfig(
            model=model,
            tokenizer=tokenizer,
            dtype=dtype,
            device=device,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching,
            seed=seed,
            speculative_config=speculative_config,  # type: ignore[arg-type]
            enforce_eager=enforce_eager or no_graphs,
            gpu_memory_utilization=gpu_memory_utilization,
            num_gpu_blocks=num_gpu_blocks,
            block_size=block_size,
            trust_remote_code=trust_remote_code,
            generation_config=generation_config,
            disable_log_stats=disable_log_stats,
            attention_backend=attention_backend,
            padded_decode=padded_decode,
            async_scheduling=async_scheduling,
            async_spec=async_spec,
            load_format=load_format,
            max_logprobs=max_logprobs,
            revision=revision,
            tokenizer_revision=tokenizer_revision,
            download_dir=download_dir,
            scheduling_policy=scheduling_policy,
            hf_overrides=hf_overrides,
            tokenizer_mode=tokenizer_mode,
            max_cudagraph_capture_size=max_capture,
        )
        self.engine = LLMEngine(self.config)

    @classmethod
    def from_engine_config(cls, config: EngineConfig) -> LLM:
        """An LLM over an ``EngineConfig`` built elsewhere (the CLI's engine flags)."""
        self = cls.__new__(cls)
        self.config = config
        self.engine = LLMEngine(config)
        return self

    def get_tokenizer(self):  # type: ignore[no-untyped-def]
        return self.engine.tokenizer

    def get_metrics(self) -> dict[str, Any]:
        return self.engine.get_metrics()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        priority: list[int] | None = None,
    ) -> list[RequestOutput]:
        """Outputs in input order. ``priority``: one per prompt (lower first), with scheduling_policy="priority"
        (as vLLM's LLM.generate); a non-zero priority under fcfs is a ValueError."""
        batch: list[Any]
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts)
        ):
            batch = [prompts]
        else:
            batch = list(prompts)
        prompts = batch
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError("The lengths of prompts and sampling_params must be the same.")
        if priority is None:
            priorities = [0] * len(prompts)
        else:
            priorities = list(priority)
            if len(priorities) != len(prompts):
                raise ValueError("The lengths of prompts and priority must be the same.")
        # validate everything before adding anything, so a bad prompt does not leave others half-queued
        for prio in priorities:
            self.engine.check_priority(prio)
        tokenized = []
        for prompt, params in zip(prompts, params_list):
            text, toks = self.engine.tokenize_prompt(prompt)
            self.engine.validate(toks, params)
            tokenized.append({"prompt_token_ids": toks, "prompt": text})
        ids = [
            self.engine.add_request(None, p, sp, prio)
            for p, sp, prio in zip(tokenized, params_list, priorities)
        ]
        return self._run(ids, use_tqdm)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        tok = self.engine.tokenizer
        prompts: list[PromptType] = []
        for conv in convs:
            ids = tok.apply_chat_template(
                conv,
                add_generation_prompt=add_generation_prompt,
                tokenize=True,
                **(chat_template_kwargs or {}),
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            prompts.append({"prompt_token_ids": list(ids)})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc="Processed prompts", dynamic_ncols=True)
        wanted = set(ids)
        # only finished outputs are used here: skip building every step's cumulative snapshots
        final_only = self.engine.final_outputs_only
        self.engine.final_outputs_only = True
        try:
            while len(results) < len(ids) and self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished and out.request_id in wanted:
                        results[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        finally:
            self.engine.final_outputs_only = final_only
            if bar is not None:
                bar.close()
        return [results[i] for i in ids]

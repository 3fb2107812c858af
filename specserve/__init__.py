"""specserve: a compact LLM serving engine with lossless speculative decoding."""

from specserve.outputs import CompletionOutput, Logprob, RequestOutput
from specserve.sampling_params import SamplingParams, StructuredOutputsParams

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "SamplingParams",
    "StructuredOutputsParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "__version__",
]


def __getattr__(name: str):  # lazy: importing LLM pulls in torch and transformers
    if name == "LLM":
        from specserve.llm import LLM

        return LLM
    raise AttributeError(name)

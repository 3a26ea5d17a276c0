"""testbed: a research LLM-serving engine (paged KV cache, continuous batching, swappable policies)."""

from testbed.config import EngineConfig
from testbed.engine import Engine
from testbed.executor.logprobs import Logprob
from testbed.llm import LLM
from testbed.outputs import CompletionOutput, RequestOutput
from testbed.sampling_params import SamplingParams
from testbed.structured import StructuredOutputsParams

__all__ = [
    "LLM",
    "Engine",
    "EngineConfig",
    "SamplingParams",
    "StructuredOutputsParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
]

"""testbed: a research LLM-serving engine (paged KV cache, continuous batching, swappable policies)."""

from testbed.config import EngineConfig
from testbed.engine import Engine
from testbed.llm import LLM
from testbed.outputs import CompletionOutput, RequestOutput
from testbed.sampling_params import SamplingParams

__all__ = ["LLM", "Engine", "EngineConfig", "SamplingParams", "RequestOutput", "CompletionOutput"]

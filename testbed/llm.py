"""Offline batch inference in vLLM's shape: LLM(...).generate(prompts, sampling_params)."""

from collections.abc import Sequence

from tqdm.auto import tqdm

from testbed.config import EngineConfig
from testbed.engine import Engine
from testbed.outputs import RequestOutput
from testbed.sampling_params import SamplingParams


def check_messages(conversation, index: int = 0) -> None:
    """Each message a dict with a string role and content (the template would fail deep inside jinja2)."""
    if not isinstance(conversation, (list, tuple)) or not conversation:
        raise ValueError(
            f"conversation {index}: a non-empty list of {{'role', 'content'}} messages, got {conversation!r}"
        )
    for i, m in enumerate(conversation):
        if not isinstance(m, dict):
            raise ValueError(f"conversation {index}, message {i}: a dict with role and content, got {m!r}")
        if not isinstance(m.get("role"), str):
            raise ValueError(f"conversation {index}, message {i}: role must be a string, got {m.get('role')!r}")
        if not isinstance(m.get("content"), (str, list)):
            raise ValueError(
                f"conversation {index}, message {i}: content must be a string or a list of parts, "
                f"got {m.get('content')!r}"
            )


class LLM:
    def __init__(
        self,
        model: str = "smollm2-135m",
        kernel: str = "auto",
        block_size: int = 16,
        num_blocks: int | None = None,
        enable_prefix_caching: bool = True,
        max_num_batched_tokens: int = 512,
        max_num_seqs: int = 64,
        dtype: str | None = None,
        seed: int = 0,
        speculative_config: dict | None = None,
        **kwargs,
    ):
        self.engine = Engine(
            EngineConfig.from_kwargs(
                model=model,
                kernel=kernel,
                block_size=block_size,
                num_blocks=num_blocks,
                enable_prefix_caching=enable_prefix_caching,
                max_num_batched_tokens=max_num_batched_tokens,
                max_num_seqs=max_num_seqs,
                dtype=dtype,
                seed=seed,
                speculative_config=speculative_config,
                **kwargs,
            )
        )
        self._next_id = 0

    def get_tokenizer(self):
        return self.engine.tokenizer

    def _to_token_ids(self, prompt) -> list[int]:
        if isinstance(prompt, dict):
            prompt = prompt.get("prompt_token_ids", prompt.get("prompt"))
        if isinstance(prompt, str):
            if self.engine.tokenizer is None:
                raise ValueError(f"model {self.engine.model_name!r} has no tokenizer: pass token ids")
            return self.engine.tokenizer.encode(prompt)
        if isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise TypeError(
            f"a prompt is a string, a list of token ids or {{'prompt_token_ids': ...}}, got {type(prompt).__name__}"
        )

    def generate(
        self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None, use_tqdm: bool = False
    ) -> list[RequestOutput]:
        """One output per prompt, in order. Every prompt is validated before any is run."""
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        token_ids = [self._to_token_ids(p) for p in prompts]
        params = sampling_params or SamplingParams()
        params = params if isinstance(params, list) else [params] * len(token_ids)
        if len(params) != len(token_ids):
            raise ValueError(f"{len(params)} sampling params for {len(token_ids)} prompts")
        for ids, p in zip(token_ids, params):
            self.engine.validate(ids, p)
        ids_in_order = []
        for ids, p in zip(token_ids, params):
            rid = str(self._next_id)
            self._next_id += 1
            self.engine.add_request(rid, ids, p)
            ids_in_order.append(rid)
        return self._run(ids_in_order, prompts, use_tqdm)

    def _run(self, ids_in_order, prompts, use_tqdm) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids_in_order), desc="generate", disable=not use_tqdm)
        try:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.finished:  # finish_reason "error": a request that failed alone (out.error says why)
                        finished[out.request_id] = out
                        bar.update(1)
        except BaseException:  # Ctrl-C, or a failure outside every request: leave the engine empty, usable
            for rid in ids_in_order:
                if rid not in finished:
                    self.engine.abort(rid)
            raise
        finally:
            bar.close()
        results = [finished[rid] for rid in ids_in_order]
        for out, prompt in zip(results, prompts):
            out.prompt = prompt if isinstance(prompt, str) else None
        return results

    def chat(self, messages, sampling_params=None, use_tqdm: bool = False) -> list[RequestOutput]:
        """messages: one conversation (list of {role, content}) or a list of them."""
        tokenizer = self.engine.tokenizer
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"model {self.engine.model_name!r} has no chat template")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        for c, conversation in enumerate(conversations):
            check_messages(conversation, c)
        prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations]
        token_ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        return self.generate(token_ids, sampling_params, use_tqdm)

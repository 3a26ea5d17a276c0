"""Batched sampling with per-request settings: greedy, temperature, top-k, top-p, min-p, seeds, logprobs."""

import torch

from testbed.sampling_params import SamplingParams


def filter_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature-scaled logits with top-k / top-p / min-p applied (masked to -inf). Rows: requests."""
    device = logits.device
    temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=device)
    logits = logits / temps.unsqueeze(1)
    vocab = logits.shape[1]
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_p = [p.top_p for p in params]
    min_p = [p.min_p for p in params]
    if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=device).unsqueeze(0)
        drop = ranks >= torch.tensor(top_k, device=device).unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the token crossing it stays)
        mass_before = probs.cumsum(dim=-1) - probs
        drop = mass_before >= torch.tensor(top_p, device=device).unsqueeze(1)
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
    if any(m > 0 for m in min_p):
        probs = logits.softmax(dim=-1)
        threshold = probs.max(dim=-1, keepdim=True).values * torch.tensor(min_p, device=device).unsqueeze(1)
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    return logits


class Sampler:
    def __init__(self, seed: int = 0, device="cpu"):
        self.default_generator = torch.Generator(device=device).manual_seed(seed)
        self.generators: dict[str, torch.Generator] = {}
        self.device = device

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self.default_generator
        gen = self.generators.get(request_id)
        if gen is None:
            gen = self.generators[request_id] = torch.Generator(device=self.device).manual_seed(params.seed)
        return gen

    def forget(self, request_ids) -> None:
        for rid in request_ids:
            self.generators.pop(rid, None)

    def sample(self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]):
        """logits [n, vocab] fp32 -> (token ids, chosen-token logprobs under the model's raw distribution)."""
        greedy = [p.greedy for p in params]
        if all(greedy):
            tokens = logits.argmax(dim=-1)
        else:
            probs = filter_logits(logits, params).softmax(dim=-1)
            tokens = logits.argmax(dim=-1)
            for i, (rid, p) in enumerate(zip(request_ids, params)):
                if not greedy[i]:
                    tokens[i] = torch.multinomial(probs[i], 1, generator=self._generator(rid, p))[0]
        logprobs = None
        if any(p.logprobs is not None for p in params):
            logprobs = logits.log_softmax(dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
        return tokens.tolist(), logprobs

"""prompt_logprobs: each prompt token's logprob under the model given the tokens before it, plus the k
most likely tokens there (vLLM's SamplingParams.prompt_logprobs; raw log-softmax, no processors).

Scored as prefill chunks run: the hidden state at position q gives the logprobs of prompt token q + 1.
A request records each position once (`request.prompt_logprobs` grows in order), so a recompute after
preemption scores nothing twice. Prefix-cache hits would skip positions, so, as in vLLM v1
(PagedAllocator.get_computed_blocks), a request asking for prompt logprobs bypasses the prefix cache.
"""

import torch

from testbed.executor.logprobs import logprob_entries

ROWS_PER_CHUNK = 256  # logits rows materialised at once ([rows, vocab] fp32: 50 MB at a 49k vocabulary)


def wanting_prompt_logprobs(out) -> list[int]:
    """Indices of the scheduled requests that ask for prompt logprobs."""
    return [i for i, r in enumerate(out.requests) if r.prompt_logprobs is not None]


def prompt_logprobs(
    out, hidden: torch.Tensor, compute_logits, wanted: list[int] | None = None
) -> list[list[dict] | None] | None:
    """Per scheduled request, the entries for the prompt tokens this step scored (None where none).
    out: the SchedulerOutput (its num_computed_tokens: before the step); hidden: [tokens, d] in the same
    flat order; wanted: the requests to score (default: every one that asks). None when no request in the
    step asks for prompt logprobs."""
    if wanted is None:
        wanted = wanting_prompt_logprobs(out)
    if not wanted:
        return None
    offsets, total = [], 0
    for n in out.num_new_tokens:
        offsets.append(total)
        total += n
    results: list[list[dict] | None] = [None] * len(out.requests)
    for i in wanted:
        request, start, num_new = out.requests[i], out.num_computed_tokens[i], out.num_new_tokens[i]
        prompt, recorded = request.prompt_token_ids, len(request.prompt_logprobs)
        # positions q in this chunk whose next token is a prompt token not yet scored
        first, last = max(start, recorded - 1), min(start + num_new, len(prompt) - 1)
        if first >= last:
            continue
        rows = hidden[offsets[i] + first - start : offsets[i] + last - start]
        targets = torch.tensor(prompt[first + 1 : last + 1], dtype=torch.long, device=hidden.device)
        k = request.sampling_params.prompt_logprobs
        entries = []
        for c in range(0, len(rows), ROWS_PER_CHUNK):
            logprobs = compute_logits(rows[c : c + ROWS_PER_CHUNK]).float().log_softmax(dim=-1)
            part = targets[c : c + ROWS_PER_CHUNK]
            entries += logprob_entries(logprobs, part, [k] * len(part))
        results[i] = entries
    return results

"""Parallel sampling (SamplingParams n / best_of): one request, several sequences over one shared prompt.

How the sequences share the prompt (PagedAttention, Kwon et al., SOSP'23, Sec. 4.4 and Fig. 8; vLLM v0's
fork with copy on write): the group's first sequence (index 0, the leader) is scheduled alone until it samples
its first token, so the prompt's KV is computed once. At that step the scheduler forks the other best_of - 1
sequences (`Scheduler._fork`): each takes a reference on the leader's blocks holding the first L - 1 prompt
tokens (L = prompt length) and starts with L - 1 tokens computed, so its first step computes the prompt's last
token again and gets its own logits row, from which it draws its first token with its own seed stream. The
last shared block is partly filled (or holds the prompt's last token): whichever sequence writes into it while
others still hold it first gets a private copy (`PagedAllocator.allocate_slots`, copy on write), a copy that
reaches the executor in the SchedulerOutput's `kv_copies`, run before the forward.

Why fork after the leader's first token and recompute one token per sibling, instead of drawing best_of tokens
from the leader's one logits row as vLLM v0 does: the executor, the sampler's per-request state and the
speculative verifier stay one logits row per sequence, at the cost of best_of - 1 one-token rows in the step
after the fork. Memory: after that step the group holds what v0 holds (the shared full blocks plus one private
tail block per sequence) unless L is a multiple of the block size: then each sibling copies the full block
holding the prompt's last token, which v0 keeps shared (one more block per sibling). vLLM v1 (children
as independent requests sharing full blocks through the prefix cache, each recomputing the partial block)
holds the same as this scheme, but only with prefix caching on, and only for blocks whose hashes are
registered when a child is admitted. results/parallel_sampling/ measures this scheme against v1's and
against no sharing.

Scheduling rule: before the fork, the group is its leader (admitted, chunked, preempted, swapped as one
request) holding seats for all its sequences, so the fork never exceeds max_num_seqs. After the fork every
sequence is scheduled and preempted on its own; a preempted sequence frees its references and recomputes
alone (through the prefix cache when it is on: its siblings' prompt blocks are usually still there), as in
vLLM v1. Aborting the request (or any of its sequences) aborts every sequence. A group is refused at
admission (Engine.validate) when it can never run as one: more sequences than max_num_seqs, or more blocks
than the whole cache for all its sequences at their final length (the shared full prompt blocks once).

Seeds: sequence i uses seed + i (vLLM's ParentRequest rule), so sequence 0 is the same request with n=1.
best_of > n: the n sequences with the highest cumulative logprob are returned, best first, each keeping its
index (vLLM v0's RequestOutput.from_seq_group). Cumulative logprobs sum raw logprobs (the model's, before
temperature and penalties: vLLM v1's default logprobs mode; v0 summed the processed ones), so with best_of > n
every sequence computes its sampled tokens' logprobs, returned only if the request asked for them.

Outputs: see testbed.outputs.RequestOutput (one output per progressing sequence, then the group's final one).
Beam search is not implemented.
"""

from __future__ import annotations

import dataclasses

from testbed.outputs import CompletionOutput, RequestMetrics, RequestOutput
from testbed.request import Request
from testbed.sampling_params import SamplingParams


def sequence_params(params: SamplingParams, index: int) -> SamplingParams:
    """Sequence index's own params: one sequence, seed + index, the prompt scored once (by the leader), and
    the sampled tokens' logprobs computed when best_of ranks by them."""
    logprobs = params.logprobs
    if logprobs is None and params.num_sequences > params.n:
        logprobs = 0
    return dataclasses.replace(
        params,
        n=1,
        best_of=None,
        seed=None if params.seed is None else params.seed + index,
        logprobs=logprobs,
        prompt_logprobs=params.prompt_logprobs if index == 0 else None,
    )


class SequenceGroup:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float,
        priority: int = 0,
        eos_token_ids=(),
    ):
        self.request_id = request_id
        self.params = params  # the request's own: n, best_of, logprobs as asked
        self.sequences = [
            Request(
                f"{i}_{request_id}",  # vLLM v1's child request ids
                prompt_token_ids,
                sequence_params(params, i),
                arrival_time,
                priority,
                eos_token_ids,
                group=self,
                index=i,
            )
            for i in range(params.num_sequences)
        ]
        self.forked = False  # set by the scheduler when the siblings start
        self.completions: list[CompletionOutput | None] = [None] * len(self.sequences)
        self.num_finished = 0

    @property
    def leader(self) -> Request:
        return self.sequences[0]

    def sequence_finished(self, seq_output: RequestOutput) -> RequestOutput | None:
        """Record a finished sequence's output; the group's final output once every sequence has finished."""
        completion = seq_output.outputs[0]
        if self.completions[completion.index] is None:
            self.num_finished += 1
        self.completions[completion.index] = completion
        return self.final_output() if self.num_finished == len(self.sequences) else None

    def final_output(self) -> RequestOutput:
        completions: list[CompletionOutput] = list(self.completions)  # type: ignore[arg-type]
        if len(completions) > self.params.n:  # best_of: the n most likely, best first
            completions.sort(key=_cumulative, reverse=True)
            completions = completions[: self.params.n]
        seqs, leader = self.sequences, self.leader
        first_tokens = [s.first_token_time for s in seqs if s.first_token_time is not None]
        finishes = [s.finish_time for s in seqs if s.finish_time is not None]
        metrics = RequestMetrics(
            leader.arrival_time,
            leader.first_scheduled_time,
            min(first_tokens, default=None),
            max(finishes, default=None),
            sorted(t for s in seqs for t in s.token_times),
            max(leader.num_cached_tokens, 0),
            sum(s.num_preemptions for s in seqs),
        )
        return RequestOutput(
            self.request_id,
            leader.prompt_token_ids,
            completions,
            True,
            [],
            metrics,
            prompt_logprobs=leader.prompt_logprobs,
        )


def _cumulative(c: CompletionOutput) -> float:
    return c.cumulative_logprob if c.cumulative_logprob is not None else float("-inf")

"""What a cost model prices: the shape of one scheduled step, from its SchedulerOutput.

A request whose new tokens reach its last known token (all but the last computed before the step, i.e.
decode, with or without drafts) is a decode row set; any other is a prefill chunk. Attention work is
counted as causal query-key pairs for prefill chunks and as KV tokens read for decode rows.
"""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepShape:
    num_seqs: int
    num_tokens: int  # new tokens computed: rows through every linear layer
    num_logits: int  # rows turned into logits (sampled, or drafts verified)
    prefill_seqs: int
    prefill_tokens: int
    prefill_pairs: float  # sum over chunks of q * (context before + (q + 1) / 2): causal query-key pairs
    prefill_context: int  # sum over chunks of their context at the end of the chunk (KV read)
    decode_seqs: int
    decode_tokens: int  # 1 per decoding request, 1 + k with k drafts
    decode_context: int  # sum over decode rows of the context each attends to (KV tokens read)

    @classmethod
    def of(cls, out) -> "StepShape":
        """The shape of a SchedulerOutput (from what it recorded of each request before the step)."""
        num_logits = prefill_seqs = prefill_tokens = prefill_context = 0
        decode_seqs = decode_tokens = decode_context = 0
        prefill_pairs = 0.0
        for n, c, known in zip(out.num_new_tokens, out.num_computed_tokens, out.num_known_tokens):
            end = c + n
            if c >= known - 1:  # decode: the last sampled token (+ drafts)
                decode_seqs += 1
                decode_tokens += n
                decode_context += n * c + n * (n + 1) // 2
                num_logits += n
            else:
                prefill_seqs += 1
                prefill_tokens += n
                prefill_pairs += n * (c + (n + 1) / 2)
                prefill_context += end
                num_logits += max(0, end - known + 1)
        return cls(
            len(out.requests),
            prefill_tokens + decode_tokens,
            num_logits,
            prefill_seqs,
            prefill_tokens,
            prefill_pairs,
            prefill_context,
            decode_seqs,
            decode_tokens,
            decode_context,
        )

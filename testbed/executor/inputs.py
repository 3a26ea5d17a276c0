"""Flatten a SchedulerOutput into the model's inputs: token ids, positions, slots, attention metadata."""
from dataclasses import dataclass

import numpy as np
import torch

from testbed.attention.backend import AttentionMetadata
from testbed.core.scheduler import SchedulerOutput


@dataclass
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor        # rows of the hidden states to turn into logits
    num_logits: list[int]               # per scheduled request: how many of those rows (0 = mid-prefill)


def prepare_inputs(out: SchedulerOutput, block_ids_of, block_size: int, device) -> ModelInputs:
    """block_ids_of(request_id) -> that request's block ids, in order."""
    n_reqs = len(out.requests)
    total = sum(out.num_new_tokens)
    input_ids = np.empty(total, dtype=np.int64)
    positions = np.empty(total, dtype=np.int64)
    slots = np.empty(total, dtype=np.int64)
    query_start = np.zeros(n_reqs + 1, dtype=np.int32)
    seq_lens = np.empty(n_reqs, dtype=np.int32)
    tables = [block_ids_of(r.request_id) for r in out.requests]
    max_blocks = max((len(t) for t in tables), default=1)
    block_tables = np.zeros((n_reqs, max(max_blocks, 1)), dtype=np.int32)
    logits_indices, num_logits = [], []
    offset = 0
    for i, (request, n) in enumerate(zip(out.requests, out.num_new_tokens)):
        start = request.num_computed_tokens
        end = start + n
        tokens = request.all_token_ids[start:end]
        if end > request.num_tokens:                       # speculative drafts ride at the end
            tokens = tokens + request.spec_token_ids[: end - request.num_tokens]
        input_ids[offset:offset + n] = tokens
        pos = np.arange(start, end)
        positions[offset:offset + n] = pos
        table = np.asarray(tables[i], dtype=np.int64)
        block_tables[i, :len(table)] = table
        slots[offset:offset + n] = table[pos // block_size] * block_size + pos % block_size
        seq_lens[i] = end
        offset += n
        query_start[i + 1] = offset
        # logits wherever a next token must be sampled or a draft verified
        k = end - request.num_tokens + 1 if end >= request.num_tokens else 0
        num_logits.append(k)
        logits_indices.extend(range(offset - k, offset))
    as_tensor = lambda a: torch.from_numpy(a).to(device, non_blocking=True)
    meta = AttentionMetadata(slot_mapping=as_tensor(slots), query_start_loc=as_tensor(query_start),
                             seq_lens=as_tensor(seq_lens), block_tables=as_tensor(block_tables),
                             max_query_len=max(out.num_new_tokens, default=0), max_seq_len=int(seq_lens.max(initial=0)))
    return ModelInputs(as_tensor(input_ids), as_tensor(positions), meta,
                       torch.tensor(logits_indices, dtype=torch.long, device=device), num_logits)

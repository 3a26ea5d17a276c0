"""Model-based proposers: a separate draft model, or the target's first L layers (layerskip).

KV layout: the draft's KV lives in the target's block ids. Its verified part is written whenever the
target's is (the draft model runs on the same inputs and slot mapping after every target forward;
for layerskip the target's own first L layers are that KV), so prefix-cache hits, preemption and
rejection rewinds keep both in step with no bookkeeping of their own. The proposal loop writes the
speculative positions (>= num_computed_tokens) into the request's own blocks, which no one else holds
there (shared blocks are full of computed tokens) and which the target overwrites before it reads
them, and into scratch blocks past the pool (ids >= num_blocks) where the request has no block yet.
A request's block ids come from the executor's block tables (kept by the SchedulerOutputs): at proposal
time it holds exactly the blocks of its computed tokens, and those rows are up to date.
"""

import torch

from testbed.attention.backend import AttentionMetadata
from testbed.executor.block_tables import BlockTables
from testbed.executor.sampler import Sampler, filter_logits
from testbed.spec.base import Proposer


def num_scratch_blocks(k: int, block_size: int, max_num_seqs: int) -> int:
    """Blocks past the pool a proposal round may write into: the positions of up to k drafts per request."""
    return max_num_seqs * (-(-k // block_size) + 1)


class ModelProposer(Proposer):
    name = "model"

    def __init__(
        self,
        model,
        num_layers: int,
        kv_caches: list,
        tables: BlockTables,
        sampler: Sampler,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        k: int,
        device,
    ):
        self.model = model
        self.num_layers = num_layers
        self.kv_caches = kv_caches  # the draft's KV: num_blocks + num_scratch blocks per layer
        self.tables = tables
        self.sampler = sampler
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = device
        self.num_scratch = num_scratch_blocks(k, block_size, max_num_seqs)

    def _held_block_ids(self, request) -> list[int]:
        held = -(-request.num_computed_tokens // self.block_size)
        return self.tables.row(request.request_id)[:held].tolist()

    @torch.inference_mode()
    def propose(self, requests, num_tokens):
        results: list[tuple[list[int], torch.Tensor | None]] = [([], None) for _ in requests]
        group: list[int] = []
        used = 0
        for i, (r, k) in enumerate(zip(requests, num_tokens)):
            need = self._scratch_needed(r, k)
            if group and used + need > self.num_scratch:
                self._propose_group(requests, num_tokens, group, results)
                group, used = [], 0
            group.append(i)
            used += need
        if group:
            self._propose_group(requests, num_tokens, group, results)
        return results

    def _scratch_needed(self, request, k: int) -> int:
        last_pos = request.num_tokens - 1 + k - 1
        return max(0, last_pos // self.block_size + 1 - -(-request.num_computed_tokens // self.block_size))

    def _propose_group(self, requests, num_tokens, group, results) -> None:
        bs, dev = self.block_size, self.device
        reqs = [requests[i] for i in group]
        ks = [num_tokens[i] for i in group]
        tables, next_scratch = [], self.num_blocks
        for r, k in zip(reqs, ks):
            table = self._held_block_ids(r)
            need = self._scratch_needed(r, k)
            tables.append(table + list(range(next_scratch, next_scratch + need)))
            next_scratch += need
        width = max(len(t) for t in tables)
        block_tables = torch.zeros((len(reqs), width), dtype=torch.int32)
        for i, t in enumerate(tables):
            block_tables[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        block_tables = block_tables.to(dev)
        gens = [self.sampler._generator(r.request_id, r.sampling_params) for r in reqs]
        drafts: list[list[int]] = [[] for _ in reqs]
        probs: list[list[torch.Tensor]] = [[] for _ in reqs]
        last = [r.all_token_ids[-1] for r in reqs]
        active = list(range(len(reqs)))
        step = 0
        while active:
            pos = [reqs[i].num_tokens - 1 + step for i in active]
            slots = [tables[i][p // bs] * bs + p % bs for i, p in zip(active, pos)]
            idx = torch.tensor(active, dtype=torch.long, device=dev)
            seq_lens = torch.tensor([p + 1 for p in pos], dtype=torch.int32, device=dev)
            meta = AttentionMetadata(
                slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
                query_start_loc=torch.arange(len(active) + 1, dtype=torch.int32, device=dev),
                seq_lens=seq_lens,
                block_tables=block_tables[idx],
                max_query_len=1,
                max_seq_len=max(pos) + 1,
            )
            hidden = self.model(
                torch.tensor([last[i] for i in active], dtype=torch.long, device=dev),
                torch.tensor(pos, dtype=torch.long, device=dev),
                self.kv_caches,
                meta,
                num_layers=self.num_layers,
            )
            logits = self.model.compute_logits(hidden)
            params = [reqs[i].sampling_params for i in active]
            tokens = logits.argmax(dim=-1).tolist()
            sampling = [j for j, p in enumerate(params) if not p.greedy]
            if sampling:
                q = filter_logits(logits[sampling], [params[j] for j in sampling]).softmax(dim=-1)
                by_gen: dict[int, list[int]] = {}  # rows sharing a generator draw together
                for row, j in enumerate(sampling):
                    by_gen.setdefault(id(gens[active[j]]), []).append(row)
                for rows in by_gen.values():
                    drawn = torch.multinomial(q[rows], 1, generator=gens[active[sampling[rows[0]]]]).squeeze(1)
                    for row, token in zip(rows, drawn.tolist()):
                        tokens[sampling[row]] = token
                for row, j in enumerate(sampling):
                    probs[active[j]].append(q[row])
            for j, i in enumerate(active):
                drafts[i].append(tokens[j])
                last[i] = tokens[j]
            step += 1
            active = [i for i in active if len(drafts[i]) < ks[i]]
        for n, i in enumerate(group):
            results[i] = (drafts[n], torch.stack(probs[n]) if probs[n] else None)


class DraftModelProposer(ModelProposer):
    """A separate, smaller model with the target's vocabulary and its own KV tensors (see build_speculator)."""

    name = "draft"

    @classmethod
    def build(cls, config, ctx) -> "DraftModelProposer":
        from testbed.executor.kv_cache import allocate_kv_cache
        from testbed.models.build import build_model, load_model_spec

        k = config.num_speculative_tokens
        spec = load_model_spec(config.model, ctx.max_model_len)
        vocab = ctx.target.arch.vocab_size
        if spec.arch.vocab_size != vocab:
            raise ValueError(
                f"draft model {config.model!r} has vocab_size {spec.arch.vocab_size}, the target has "
                f"{vocab}: they must share the tokenizer"
            )
        layers = spec.arch.num_hidden_layers if config.num_layers is None else config.num_layers
        if not 1 <= layers <= spec.arch.num_hidden_layers:
            raise ValueError(f"draft num_layers must be in [1, {spec.arch.num_hidden_layers}], got {layers}")
        model = build_model(spec, ctx.backend, ctx.dtype, ctx.device, ctx.seed)
        if layers < spec.arch.num_hidden_layers:  # drop the unused layers' weights
            del model.model.layers[layers:]
        scratch = num_scratch_blocks(k, ctx.block_size, ctx.max_num_seqs)
        kv_caches = allocate_kv_cache(
            spec.arch, ctx.num_blocks + scratch, ctx.block_size, layers, ctx.dtype, ctx.device
        )
        return cls(
            model,
            layers,
            kv_caches,
            ctx.tables,
            ctx.sampler,
            ctx.num_blocks,
            ctx.block_size,
            ctx.max_num_seqs,
            k,
            ctx.device,
        )

    @torch.inference_mode()
    def observe(self, inputs) -> None:
        self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, num_layers=self.num_layers)


class LayerSkipProposer(ModelProposer):
    """Self-speculation: the target's first L layers, its final norm and LM head. No extra weights; the
    target's own KV of those layers is the draft's (its tensors carry the scratch blocks), so observe()
    has nothing to do."""

    name = "layerskip"
    writes_target_kv = True

    @classmethod
    def build(cls, config, ctx) -> "LayerSkipProposer":
        total = ctx.target.arch.num_hidden_layers
        layers = config.num_layers
        if not 1 <= layers < total:
            raise ValueError(
                f"layerskip num_layers must be in [1, {total - 1}] for a model of {total} layers, got {layers}"
            )
        return cls(
            ctx.target,
            layers,
            ctx.target_kv_caches[:layers],
            ctx.tables,
            ctx.sampler,
            ctx.num_blocks,
            ctx.block_size,
            ctx.max_num_seqs,
            config.num_speculative_tokens,
            ctx.device,
        )

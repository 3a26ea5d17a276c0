"""The engine's side of speculative decoding: ask the proposer for drafts, verify them, count."""

import time
from dataclasses import dataclass

import torch

from testbed.executor.logprobs import logprob_entries
from testbed.executor.sampler import filter_logits
from testbed.isolation import find_culprits
from testbed.request import Request
from testbed.spec.base import Proposer
from testbed.spec.config import SpeculativeConfig
from testbed.spec.metrics import SpecMetrics
from testbed.spec.rejection import greedy_verify, rejection_sample


@dataclass
class Proposal:
    """What Speculator.propose decided: drafts per request (to verify in the next step) and the requests
    whose proposal failed, with why."""

    drafts: list[tuple[Request, list[int]]]
    failed: list[tuple[Request, str]]


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer, max_model_len: int):
        self.config = config
        self.proposer = proposer
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.metrics = SpecMetrics(config.method, self.k)
        self.draft_probs: dict[str, torch.Tensor] = {}  # request id -> q of its pending drafts

    # ---- drafting (engine, after each step) ---------------------------------------------------
    def num_drafts_allowed(self, request: Request) -> int:
        """Drafts beyond these could never be emitted (max_tokens, the model's context)."""
        k = min(self.k, self.max_model_len - request.num_tokens - 1)
        max_tokens = request.sampling_params.max_tokens
        if max_tokens is not None:
            k = min(k, max_tokens - request.num_output_tokens - 1)
        return k

    def propose(self, running: list[Request]) -> Proposal:
        """Drafts for the running requests that are decoding and hold no unverified drafts, and the requests
        whose proposal failed, with why (testbed.isolation). The engine gives the drafts to the scheduler
        and ends the failed requests; nothing here changes a request."""
        start = time.perf_counter()
        live = {r.request_id for r in running}
        for rid in [rid for rid in self.draft_probs if rid not in live]:
            del self.draft_probs[rid]
        reqs, ks = [], []
        for r in running:
            if r.is_finished or r.spec_token_ids or r.num_computed_tokens != r.num_tokens - 1:
                continue
            if not r.output_token_ids:  # a just-forked sequence (parallel sampling): no block-table row yet
                continue
            if r.sampling_params.uses_processors:  # penalties, bans, grammars: verified rows would skip them
                continue
            k = self.num_drafts_allowed(r)
            if k > 0:
                reqs.append(r)
                ks.append(k)
        drafted: list[tuple[Request, list[int]]] = []
        failed: list[tuple[Request, str]] = []
        if reqs:
            proposals, failed = self._propose(reqs, ks)
            for r, (drafts, probs) in zip(reqs, proposals):
                self.metrics.num_proposed_tokens += len(drafts)
                if drafts:
                    drafted.append((r, list(drafts)))
                if probs is not None and drafts:
                    self.draft_probs[r.request_id] = probs
                else:
                    self.draft_probs.pop(r.request_id, None)
        self.metrics.propose_time_s += time.perf_counter() - start
        return Proposal(drafted, failed)

    def _propose(self, reqs: list[Request], ks: list[int]):
        """The proposer over the batch; if it raises, request by request (no drafts for those that fail)."""
        try:
            return self.proposer.propose(reqs, ks), []
        except Exception as e:
            alone, failed = find_culprits(
                lambda j: self.proposer.propose([reqs[j]], [ks[j]])[0], range(len(reqs)), e, "speculative proposal"
            )
        proposals = [alone.get(j, ([], None)) for j in range(len(reqs))]
        return proposals, [(reqs[j], message) for j, message in failed.items()]

    # ---- the executor's side ------------------------------------------------------------------
    def observe(self, inputs) -> None:
        start = time.perf_counter()
        self.proposer.observe(inputs)
        self.metrics.propose_time_s += time.perf_counter() - start

    def verify(self, requests: list[Request], num_logits: list[int], logits: torch.Tensor, sampler):
        """logits: the rows of every request with num_logits > 0, concatenated in order.
        Returns (sampled, logprobs) aligned with requests, like the plain sampling path."""
        sampled: list[list[int] | None] = [None] * len(requests)
        want_logprobs = any(r.sampling_params.logprobs is not None for r, n in zip(requests, num_logits) if n)
        logprobs: list[list[dict] | None] | None = [None] * len(requests) if want_logprobs else None
        offsets, off = [], 0
        for n in num_logits:
            offsets.append(off)
            off += n
        # plain rows (no drafts scheduled) go through the sampler together, as without speculation
        plain = [i for i, n in enumerate(num_logits) if n == 1]
        if plain:
            rows = torch.tensor([offsets[i] for i in plain], device=logits.device)
            toks, lps = sampler.sample(logits[rows], [requests[i] for i in plain])
            for j, i in enumerate(plain):
                sampled[i] = [toks[j]]
                if logprobs is not None:  # want_logprobs
                    logprobs[i] = [lps[j]] if lps is not None and lps[j] is not None else None
        # greedy requests: the longest prefix of drafts matching the target's argmax
        emitted: dict[int, list[int]] = {}
        for i, n in enumerate(num_logits):
            if n > 1 and requests[i].sampling_params.greedy:
                rows = logits[offsets[i] : offsets[i] + n]
                emitted[i] = greedy_verify(rows.argmax(dim=-1).tolist(), requests[i].spec_token_ids[: n - 1])
        # sampling requests: rejection sampling, batched over requests sharing a generator, length and q kind
        sampling = [i for i, n in enumerate(num_logits) if n > 1 and not requests[i].sampling_params.greedy]
        if sampling:
            idx = torch.cat([torch.arange(offsets[i], offsets[i] + num_logits[i]) for i in sampling]).to(logits.device)
            params = [requests[i].sampling_params for i in sampling for _ in range(num_logits[i])]
            probs = filter_logits(logits[idx], params).softmax(dim=-1)  # the target's p, as the sampler's
            groups: dict[tuple, list[tuple[int, torch.Tensor]]] = {}
            start = 0
            for i in sampling:
                n, r = num_logits[i], requests[i]
                gen = sampler._generator(r.request_id, r.sampling_params)
                has_q = r.request_id in self.draft_probs
                groups.setdefault((id(gen), n, has_q), []).append((i, probs[start : start + n]))
                start += n
            for (_, n, has_q), members in groups.items():
                rs = [requests[i] for i, _ in members]
                p = torch.stack([pi for _, pi in members])
                drafts = torch.tensor([r.spec_token_ids[: n - 1] for r in rs], dtype=torch.long, device=p.device)
                q = torch.stack([self.draft_probs[r.request_id][: n - 1] for r in rs]).to(p) if has_q else None
                gen = sampler._generator(rs[0].request_id, rs[0].sampling_params)
                out, num_acc = rejection_sample(p, drafts, q, gen)
                for b, (i, _) in enumerate(members):
                    emitted[i] = out[b, : int(num_acc[b]) + 1].tolist()
        for i, tokens in emitted.items():
            sampled[i] = tokens
            k = requests[i].sampling_params.logprobs
            if logprobs is not None and k is not None:  # want_logprobs
                lp = logits[offsets[i] : offsets[i] + len(tokens)].log_softmax(dim=-1)
                logprobs[i] = logprob_entries(lp, torch.tensor(tokens, device=lp.device), [k] * len(tokens))
        # counted once everything above succeeded: a batch that raises is verified again request by request
        # (testbed.isolation), and its drafts must not count twice
        for i, tokens in emitted.items():
            self.draft_probs.pop(requests[i].request_id, None)
            self.metrics.record(num_logits[i] - 1, len(tokens) - 1)
        return sampled, logprobs

    def stats(self) -> dict:
        return self.metrics.as_dict()

"""Pricing a tensor-parallel step in the simulator: one rank's compute and memory time plus the collectives.

    t = t_rank(step) + (2 * L + 1) * allreduce(tokens * hidden * b) + gather(logit rows * vocab * b)

Per rank (Megatron-LM layout, as vLLM and the real engine here lay it): a 1/N share of the heads, KV heads,
MLP width and vocabulary (embedding and LM head vocabulary-parallel). The collectives are the real engine's
(testbed/parallel/sharding.py): the vocabulary-parallel embedding's all-reduce (once per step), two per
layer, and the logits slices gathered to rank 0 only. The roofline prices that rank's shape
directly; a measured profile (one device) is scaled: its per-step and per-sequence terms stay, the rest is divided by N
(an assumption: perfect per-rank scaling of the fitted rates, no smaller-GEMM inefficiency).

Collectives over the replica's intra-node link (parallel.link, a testbed/specs/link spec), ring algorithms
(Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication Operations in MPICH", IJHPCA
2005; Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 2009),
each rank sending and receiving at the link's one-way bandwidth:
    all-reduce of B bytes   2 (N-1)/N * B / bw + 2 (N-1) * latency
    gather to one rank       (N-1)/N * B / bw +   (N-1) * latency   (the root's ingress; latency as a ring)
Two all-reduces per layer (after the attention output and the MLP down projection), one after the embedding,
and one logits gather per step. Not modelled: overlap of communication with compute (vLLM's default TP does not
overlap them either), the reduction's own arithmetic, NCCL protocol choices (tree / LL128) and contention.
"""

import math
from dataclasses import replace

from testbed.models.arch import ModelArch
from testbed.parallel.config import shard_arch
from testbed.sim.cost_models.base import CostModel


def rank_arch(arch: ModelArch, n: int) -> ModelArch:
    """One rank's shape as the simulator prices and sizes it: heads, KV heads, MLP width and vocabulary / n."""
    return replace(shard_arch(arch, n), vocab_size=math.ceil(arch.vocab_size / n)) if n > 1 else arch


def all_reduce_s(num_bytes: float, n: int, link) -> float:
    """Ring all-reduce of num_bytes over n ranks (bandwidth and latency terms)."""
    if n == 1:
        return 0.0
    return 2 * (n - 1) / n * num_bytes / (link.bandwidth_gbs * 1e9) + 2 * (n - 1) * link.latency_us * 1e-6


def gather_s(num_bytes: float, n: int, link) -> float:
    """Gather of num_bytes to one rank: the root receives (n-1)/n of it over its link; the latency of a ring's
    n-1 hops (an upper bound: a direct gather's messages may overlap)."""
    if n == 1:
        return 0.0
    return (n - 1) / n * num_bytes / (link.bandwidth_gbs * 1e9) + (n - 1) * link.latency_us * 1e-6


class ScaledProfile(CostModel):
    """A one-device profile as one rank's share: fixed per-step and per-sequence terms, the rest / n."""

    def __init__(self, profile, n: int):
        self.profile, self.n = profile, n

    @property
    def identity(self) -> dict:
        return {**self.profile.identity, "tp_scaling": f"profile terms other than step and seqs divided by {self.n}"}

    def step_time(self, s) -> float:
        fixed = self.profile.coef[0] + self.profile.coef[1] * s.num_seqs
        return fixed + (self.profile.step_time(s) - fixed) / self.n


class TensorParallelCost(CostModel):
    """A rank's cost model plus the step's collectives over `link`."""

    def __init__(self, per_rank, arch: ModelArch, dtype_bytes: int, n: int, link):
        self.per_rank, self.n, self.link = per_rank, n, link
        self.layers = arch.num_hidden_layers
        self.row_bytes = arch.hidden_size * dtype_bytes  # one token's hidden state
        self.logit_bytes = arch.vocab_size * dtype_bytes  # one row's full logits

    @property
    def identity(self) -> dict:
        link = self.link
        return {
            **self.per_rank.identity,
            "tensor_parallel_size": self.n,
            "tp_link": {"name": link.name, "bandwidth_gbs": link.bandwidth_gbs, "latency_us": link.latency_us},
        }

    def comm_time(self, s) -> float:
        reduce = (2 * self.layers + 1) * all_reduce_s(s.num_tokens * self.row_bytes, self.n, self.link)
        return reduce + (gather_s(s.num_logits * self.logit_bytes, self.n, self.link) if s.num_logits else 0.0)

    def step_time(self, s) -> float:
        return self.per_rank.step_time(s) + self.comm_time(s)

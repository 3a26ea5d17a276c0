"""Verification of drafts against the target's distributions.

Greedy: accept the longest prefix of drafts equal to the target's argmax, then emit the target's
own token at the first mismatch (or the bonus token after the last draft).

Sampling (Leviathan et al. 2023, Chen et al. 2023): accept draft d_j with probability
min(1, p_j(d_j) / q_j(d_j)); at the first rejection emit a token drawn from
normalise(max(0, p_j - q_j)); if all k are accepted emit a bonus token drawn from p_k. Every emitted
token is then distributed exactly as the target would have sampled it. A deterministic proposer
(n-gram) has q_j = one-hot(d_j): acceptance probability p_j(d_j), residual p_j with d_j removed.
"""

import torch


def greedy_verify(target_argmax: list[int], draft_tokens: list[int]) -> list[int]:
    """target_argmax has len(draft_tokens) + 1 entries (one per verified position plus the bonus)."""
    out = []
    for j, d in enumerate(draft_tokens):
        out.append(target_argmax[j])
        if target_argmax[j] != d:
            return out
    out.append(target_argmax[len(draft_tokens)])
    return out


def rejection_sample(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched speculative sampling.

    target_probs [B, k+1, V]: the target's (filtered) distributions at the k draft positions and the bonus.
    draft_tokens [B, k] (long); draft_probs [B, k, V], or None for a deterministic proposer (one-hot q).
    Returns (tokens [B, k+1] with -1 past each row's end, num_accepted [B]); row b emits
    tokens[b, :num_accepted[b] + 1].
    """
    B, k = draft_tokens.shape
    device = target_probs.device
    rows = torch.arange(B, device=device)
    p_draft = target_probs[:, :k].gather(2, draft_tokens.unsqueeze(2)).squeeze(2)  # p_j(d_j)
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)
    else:
        q_draft = draft_probs.gather(2, draft_tokens.unsqueeze(2)).squeeze(2)  # q_j(d_j)
    uniform = torch.rand(B, k, generator=generator, device=device, dtype=p_draft.dtype)
    accepted = uniform * q_draft < p_draft  # u < p/q
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # [B]
    # the distribution of the one token after the accepted drafts: residual at a rejection, p at the end
    pos = num_accepted.clamp(max=k)
    p_last = target_probs[rows, pos]  # [B, V]
    rejected = num_accepted < k
    dist = p_last.clone()
    if rejected.any():
        rj = rows[rejected]
        residual = p_last[rj]
        if draft_probs is None:
            residual = residual.scatter(1, draft_tokens[rj, pos[rj]].unsqueeze(1), 0.0)
        else:
            residual = (residual - draft_probs[rj, pos[rj]]).clamp(min=0.0)
        mass = residual.sum(dim=1, keepdim=True)
        # p <= q everywhere only when p == q, where rejection has probability zero: fall back to p
        residual = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(residual.dtype).tiny), p_last[rj])
        dist[rj] = residual
    last = torch.multinomial(dist, 1, generator=generator).squeeze(1)
    tokens = torch.full((B, k + 1), -1, dtype=torch.long, device=device)
    keep = torch.arange(k, device=device).unsqueeze(0) < num_accepted.unsqueeze(1)
    tokens[:, :k] = torch.where(keep, draft_tokens, tokens[:, :k])
    tokens[rows, pos] = last
    return tokens, num_accepted

"""Hugging Face transformers' greedy continuations, the reference several tests compare the engine with."""

import torch


@torch.no_grad()
def hf_greedy(model, prompt_ids: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Each prompt's greedy continuation (EOS ignored) from one batched `generate`: the prompts left-padded and
    masked out, so HF derives each row's positions from its mask and the rows do not see each other. One
    decode pass per token for all prompts, where a call per prompt reads the weights once per prompt per token."""
    width = max(map(len, prompt_ids))
    pad = [width - len(ids) for ids in prompt_ids]
    x = torch.tensor([[0] * n + ids for n, ids in zip(pad, prompt_ids)])
    mask = torch.tensor([[0] * n + [1] * len(ids) for n, ids in zip(pad, prompt_ids)])
    out = model.generate(
        x, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[:, width:].tolist()

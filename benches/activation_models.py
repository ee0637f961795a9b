"""The models of benches/bench_activation.py: a pre-norm residual MLP block (the feed-forward half of
a transformer layer), and a small GPT-like stack whose layers differ in cost on purpose."""

from __future__ import annotations

import torch

__all__ = ["Block", "Attention", "MLP", "Head", "gpt_like", "uniform_mlp"]


class Block(torch.nn.Module):
    """Pre-norm residual MLP block, the feed-forward half of a transformer layer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))))


class Attention(torch.nn.Module):
    """Pre-norm causal self-attention with residual."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(torch.nn.Module):
    """Pre-norm MLP with residual and a chosen expansion factor."""

    def __init__(self, width: int, expansion: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, expansion * width)
        self.down = torch.nn.Linear(expansion * width, width)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(torch.nn.functional.gelu(self.up(self.norm(x)))))


class Head(torch.nn.Module):
    def __init__(self, width: int, vocab: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.out = torch.nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def gpt_like(layers: int = 8, width: int = 128, vocab: int = 512) -> torch.nn.Sequential:
    """Embedding, ``layers`` x (attention, MLP) with MLP expansions cycling 1, 2, 8 (layers of
    very different cost on purpose), final norm + vocabulary head: 2 * layers + 2 functions."""
    torch.manual_seed(0)
    parts: list[torch.nn.Module] = [torch.nn.Embedding(vocab, width)]
    for i in range(layers):
        parts.append(Attention(width, heads=4))
        parts.append(MLP(width, expansion=(1, 2, 8)[i % 3]))
    parts.append(Head(width, vocab))
    return torch.nn.Sequential(*parts)


def uniform_mlp(blocks: int, width: int) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block(width) for _ in range(blocks)])

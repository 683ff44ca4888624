"""Six small models covering the graph shapes the spine must handle (chains, residual adds,
concatenation, multi-branch blocks, attention with dropout, BatchNorm in training mode)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.BatchNorm1d(32),
                                 nn.Dropout(0.3), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class VGGChain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = 3
        for width in (8, 8, "M", 16, 16, "M"):
            if width == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(c, int(width), 3, padding=1), nn.BatchNorm2d(int(width)),
                           nn.ReLU()]
                c = int(width)
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class ResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(Block(8), Block(8))
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.stem(x))
        return self.head(h.mean(dim=(2, 3)))


class DenseNet(nn.Module):
    def __init__(self, growth: int = 4, layers: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.layers = nn.ModuleList()
        c = 8
        for _ in range(layers):
            self.layers.append(nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(),
                                             nn.Conv2d(c, growth, 3, padding=1)))
            c += growth
        self.head = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [self.stem(x)]
        for layer in self.layers:
            features.append(layer(torch.cat(features, 1)))
        return self.head(torch.cat(features, 1).mean(dim=(2, 3)))


class Inception(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.b1 = nn.Conv2d(8, 4, 1)
        self.b2 = nn.Sequential(nn.Conv2d(8, 4, 1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
        self.b3 = nn.Sequential(nn.Conv2d(8, 2, 1), nn.ReLU(), nn.Conv2d(2, 4, 5, padding=2))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(8, 4, 1))
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.stem(x))
        h = torch.cat([self.b1(h), self.b2(h), self.b3(h), self.b4(h)], 1)
        return self.head(F.relu(h).mean(dim=(2, 3)))


class TransformerBlock(nn.Module):
    def __init__(self, vocab: int = 20, d: int = 16, heads: int = 2, seq: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.1, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d),
                                 nn.Dropout(0.1))
        self.drop = nn.Dropout(0.1)
        self.out = nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.embed(tokens) + self.pos)
        a = self.ln1(h)
        h = h + self.attn(a, a, a, attn_mask=self.mask, need_weights=False)[0]
        h = h + self.mlp(self.ln2(h))
        return self.out(h).flatten(0, 1)


def _image_batch(n: int = 4, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 16, 16), torch.randint(0, classes, (n,))


def _token_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, y.flatten())


def make(name: str, seed: int = 0):
    """(model, loss_fn, batch) for one of MODELS, deterministic under ``seed``."""
    torch.manual_seed(seed)
    if name == "mlp":
        return MLP(), nn.CrossEntropyLoss(), (torch.randn(8, 16), torch.randint(0, 5, (8,)))
    if name == "transformer":
        return (TransformerBlock(), _token_loss,
                (torch.randint(0, 20, (3, 6)), torch.randint(0, 20, (3, 6))))
    model = {"vgg": VGGChain, "resnet": ResNet, "densenet": DenseNet,
             "inception": Inception}[name]()
    return model, nn.CrossEntropyLoss(), _image_batch()


MODELS = ["mlp", "vgg", "resnet", "densenet", "inception", "transformer"]

"""The small pre-norm ViT shared by tests/python/test_vit_mnist.py and
bench/python_step.py: patches -> Linear, CLS token, learned positions, blocks
of (LayerNorm, attention, LayerNorm, GELU MLP), LayerNorm, linear head on the
CLS token. attn(dim, heads) builds each block's attention module with the
torch.nn.MultiheadAttention(batch_first=True) call convention."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim, attn, mlp):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = attn
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    def __init__(self, attn, image, patch, dim, heads, depth, mlp, classes=10):
        super().__init__()
        self.patch, self.grid = patch, image // patch
        n = self.grid * self.grid
        self.embed = nn.Linear(patch * patch, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.ModuleList([Block(dim, attn(dim, heads), mlp) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, img):
        B, p, g = img.shape[0], self.patch, self.grid
        x = img.reshape(B, g, p, g, p).permute(0, 1, 3, 2, 4).reshape(B, g * g, p * p)
        x = torch.cat([self.cls.expand(B, -1, -1), self.embed(x)], dim=1) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x[:, 0]))

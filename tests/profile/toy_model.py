"""A small model named like the embedded engine's, profiled on CPU to make real Kineto traces for tests.

The indexer scores a capacity-shaped tensor [B, (ceil(capacity/page) + 1) * page, H], as the
graph-safe decode indexers in public engines do; `bound="actual"` scores only the actual context.
"""

import math
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

PAGE = 64


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


class Indexer(nn.Module):
    def __init__(self, d, heads, capacity, bound):
        super().__init__()
        self.wq = nn.Linear(d, heads * 16, bias=False)
        self.heads, self.capacity, self.bound = heads, capacity, bound

    def forward(self, x, actual_len):
        b = x.shape[0]
        length = self.capacity if self.bound == "capacity" else actual_len
        n = (math.ceil(length / PAGE) + 1) * PAGE if self.bound == "capacity" else length
        keys = torch.ones(b, n, 16).to(torch.float32)  # an FP8 -> fp32 cast in the real thing
        q = self.wq(x).view(b, self.heads, 16)
        scores = torch.bmm(keys, q.transpose(1, 2))  # [B, n, H]
        scores = torch.relu(scores) * 0.5
        return scores.sum(-1)[:, :actual_len].topk(min(8, actual_len), dim=-1).indices


class SparseAttention(nn.Module):
    def forward(self, q, kv, idx):
        sel = kv.gather(1, idx.unsqueeze(-1).expand(-1, -1, kv.shape[-1]))
        w = torch.softmax(torch.bmm(q.unsqueeze(1), sel.transpose(1, 2)), dim=-1)
        return torch.bmm(w, sel).squeeze(1)


class MLAttention(nn.Module):
    def __init__(self, d, capacity, bound):
        super().__init__()
        self.q = nn.Linear(d, d, bias=False)
        self.indexer = Indexer(d, 4, capacity, bound)
        self.sparse_attn = SparseAttention()
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x, kv):
        idx = self.indexer(x, kv.shape[1])
        return self.o(self.sparse_attn(self.q(x), kv, idx))


class MoE(nn.Module):
    def __init__(self, d, experts=4):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(experts))

    def forward(self, x):
        top = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            out = out + expert(x) * (top == e).unsqueeze(-1)
        return out


class DecoderLayer(nn.Module):
    def __init__(self, d, capacity, bound):
        super().__init__()
        self.attn_norm, self.ffn_norm = RMSNorm(d), RMSNorm(d)
        self.attn = MLAttention(d, capacity, bound)
        self.moe = MoE(d)

    def forward(self, x, kv):
        x = x + self.attn(self.attn_norm(x), kv)
        return x + self.moe(self.ffn_norm(x))


class Sampler(nn.Module):
    def forward(self, logits):
        return logits.argmax(-1)


class DSAModel(nn.Module):
    def __init__(self, d=32, layers=2, vocab=64, capacity=8192, bound="capacity"):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(DecoderLayer(d, capacity, bound) for _ in range(layers))
        self.final_norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids, kv):
        x = self.embedding(ids)
        for layer in self.layers:
            x = layer(x, kv)
        return self.lm_head(self.final_norm(x))


@torch.inference_mode()
def make_trace(path: Path, *, capacity=8192, bound="capacity", steps=3, batch=2, context=100, layers=2,
               with_stack=True, gzip=False) -> Path:
    """Profile `steps` decode steps of the toy model on CPU; write the Kineto trace to `path`."""
    torch.manual_seed(0)
    model, sampler = DSAModel(layers=layers, capacity=capacity, bound=bound), Sampler()
    ids = torch.zeros(batch, dtype=torch.long)
    kv = torch.randn(batch, context, 32)
    out = Path(path)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=with_stack,
                 with_modules=with_stack, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(out))) as prof:
        for _ in range(steps + 1):
            ids = sampler(model(ids, kv))
            prof.step()
    if gzip:
        import gzip as gz

        gz_path = out.with_name(out.name + ".gz")
        gz_path.write_bytes(gz.compress(out.read_bytes()))
        out.unlink()
        return gz_path
    return out

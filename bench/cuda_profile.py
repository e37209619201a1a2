"""Two forwards of Sinkhorn attention (S = 5, bf16, B*H = 32, N = 4096,
d = 64) through birkhoff.torch on the GPU, then a forward and backward: the
workload scripts/gpu/check.sh profiles with Nsight Compute (the second
forward's five passes, the third forward's and the backward's seven)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch  # noqa: E402

import birkhoff.torch as bt  # noqa: E402

if not torch.cuda.is_available():
    print("SKIP: no CUDA device")
    sys.exit(0)
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(4, 8, 4096, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
with torch.no_grad():
    for _ in range(2):
        out = bt.sinkhorn_attention(q, k, v, iters=5, eps=1.0)
for x in (q, k, v):
    x.requires_grad_(True)
out = bt.sinkhorn_attention(q, k, v, iters=5, eps=1.0)
grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
torch.cuda.synchronize()
print("out", tuple(out.shape), float(out.float().abs().mean()), "dq", float(grads[0].float().abs().mean()))

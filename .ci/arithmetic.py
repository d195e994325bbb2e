"""A fingerprint of this process's floating-point arithmetic: a hash of the bits of a few matrix products
(MKL's), reductions and fused elementwise kernels (ATen's vectorised ones). .ci/run compares it under each of
its other-CPU settings: a setting under which the bits are this CPU's own reruns the same arithmetic, so its
tier is skipped (MKL takes one generic path on AMD CPUs whatever MKL_ENABLE_INSTRUCTIONS says)."""

import hashlib

import torch
import torch.nn.functional as F

torch.manual_seed(0)
digest = hashlib.sha256()
for n in (3, 17, 64, 100, 257, 768):
    a, b = torch.randn(n, n + 5), torch.randn(n + 5, 2 * n + 1)
    q = torch.randn(2, 3, n, 16)
    for t in (a @ b, torch.bmm(a.expand(2, -1, -1), b.expand(2, -1, -1)), F.linear(a, b.T),
              a.sum(-1), a.exp(), F.gelu(a), F.softmax(a, -1), F.layer_norm(a, a.shape[-1:]),
              F.scaled_dot_product_attention(q, q, q, is_causal=True)):  # fmt: skip
        digest.update(t.contiguous().numpy().tobytes())
print(digest.hexdigest())

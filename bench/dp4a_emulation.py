# The CUDA q4 GEMV's arithmetic emulated in f32 with PyTorch, shared by
# bench/dp4a_accuracy.py and bench/dp4a_logit_shift.py: kiln's q4 grid on a Linear weight
# (groups of 32 along K, f16 scale and min, codes 0..15) and the dp4a kernel's rounding of a
# Linear input to int8 per group of 32 (d = max|x| / 127).
import torch


def q4(w):
    n, k = w.shape
    g = w.reshape(n, k // 32, 32)
    lo, hi = g.min(-1, keepdim=True).values, g.max(-1, keepdim=True).values
    s = ((hi - lo) / 15).half().float()
    m = lo.half().float()
    q = torch.where(s > 0, torch.round((g - m) / torch.where(s > 0, s, 1)), torch.zeros_like(g)).clamp(0, 15)
    return (q * s + m).reshape(n, k)


def xint8(x):
    sh = x.shape
    g = x.reshape(*sh[:-1], sh[-1] // 32, 32)
    dd = g.abs().amax(-1, keepdim=True) / 127
    return (torch.round(g / torch.where(dd > 0, dd, 1)) * dd).reshape(sh)

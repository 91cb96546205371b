"""The shared convolutions against naive loops and against each other: the direct (grouped
conv1d with a hand-written backward) and FFT long convolutions, and the short depthwise conv."""
import pytest
import torch
from torch.nn import functional as F

from hf_mecheval.models.convolutions import ShortConv
from hf_mecheval.models.ops_long_conv import (DirectCausalConv, FFTCausalConv, _fft_causal_conv, _grouped_causal_conv,
                                              causal_conv)


def naive_causal_conv(u, k):
    """y[b, t, c] = sum_{s <= t} k[c, t - s] u[b, s, c], one term at a time."""
    B, L, C = u.shape
    y = torch.zeros_like(u)
    for t in range(L):
        for s in range(t + 1):
            y[:, t] += k[:, t - s] * u[:, s]
    return y


def _inputs(B=3, L=9, C=4, extra_taps=2, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, L, C, generator=g, dtype=dtype), torch.randn(C, L + extra_taps, generator=g, dtype=dtype)


@pytest.mark.parametrize("use_fft", [False, True])
def test_long_conv_equals_naive_sum(use_fft):
    u, k = _inputs(dtype=torch.float32)     # the FFT path computes in float32
    torch.testing.assert_close(causal_conv(u, k, use_fft=use_fft), naive_causal_conv(u, k[:, :u.shape[1]]),
                               atol=1e-5, rtol=1e-5)


def test_long_conv_is_causal():
    u, k = _inputs()
    u2 = u.clone()
    u2[:, 5] += 1.0
    y, y2 = causal_conv(u, k), causal_conv(u2, k)
    torch.testing.assert_close(y[:, :5], y2[:, :5], rtol=0, atol=0)
    assert (y[:, 5:] - y2[:, 5:]).abs().max() > 0


def test_direct_conv_backward_matches_autograd_and_gradcheck():
    u, k = _inputs(B=2, L=6, C=3)
    u.requires_grad_(True)
    k = k[:, :6].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(DirectCausalConv.apply, (u, k))
    g = torch.randn(2, 6, 3, dtype=torch.float64)
    want = torch.autograd.grad(_grouped_causal_conv(u, k), (u, k), g)
    got = torch.autograd.grad(DirectCausalConv.apply(u, k), (u, k), g)
    for w, h in zip(want, got):
        torch.testing.assert_close(h, w)


def fft_conv(u, k):
    return FFTCausalConv.apply(u, k)[0]


def test_fft_conv_backward_matches_autograd_and_gradcheck():
    """The real-FFT backward against autograd through the same FFTs and through the direct form."""
    u, k = _inputs(B=2, L=6, C=3)
    u.requires_grad_(True)
    k = k[:, :6].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(fft_conv, (u, k))
    g = torch.randn(2, 6, 3, dtype=torch.float64)
    got = torch.autograd.grad(fft_conv(u, k), (u, k), g)
    for reference in (_fft_causal_conv, _grouped_causal_conv):
        want = torch.autograd.grad(reference(u, k), (u, k), g)
        for w, h in zip(want, got):
            torch.testing.assert_close(h, w)


def test_fft_conv_in_float32_matches_the_direct_form_at_an_mqar_length():
    u, k = _inputs(B=4, L=128, C=8, extra_taps=0, dtype=torch.float32, seed=3)
    k = (k / 128 ** 0.5).requires_grad_(True)
    u.requires_grad_(True)
    g = torch.randn(4, 128, 8, generator=torch.Generator().manual_seed(4))
    y_fft, y_direct = causal_conv(u, k), causal_conv(u, k, use_fft=False)        # the default at L 128: FFT
    torch.testing.assert_close(y_fft, y_direct, atol=1e-5, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(y_fft, (u, k), g), torch.autograd.grad(y_direct, (u, k), g)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("conv", [DirectCausalConv.apply, fft_conv], ids=["direct", "fft"])
def test_conv_under_vmap_equals_each_copy(conv):
    """Stacked runs vmap the convolution over copies, each with its own kernel."""
    g = torch.Generator().manual_seed(1)
    u = torch.randn(3, 2, 7, 4, generator=g, requires_grad=True)      # (copies, B, L, C)
    k = torch.randn(3, 4, 7, generator=g, requires_grad=True)         # (copies, C, L)
    up = torch.randn(3, 2, 7, 4, generator=g)
    y = torch.func.vmap(conv)(u, k)
    gu, gk = torch.autograd.grad((y * up).sum(), (u, k))
    for i in range(3):
        yi = naive_causal_conv(u[i], k[i])
        torch.testing.assert_close(y[i], yi, atol=1e-5, rtol=1e-5)
        wu, wk = torch.autograd.grad((yi * up[i]).sum(), (u, k))
        torch.testing.assert_close(gu[i], wu[i], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(gk[i], wk[i], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("width", [1, 2, 4])
def test_short_conv_equals_depthwise_conv1d(width):
    torch.manual_seed(0)
    conv = ShortConv(5, width, bias=True).double()
    x = torch.randn(2, 8, 5, dtype=torch.float64)
    want = F.conv1d(F.pad(x.transpose(1, 2), (width - 1, 0)), conv.weight, conv.bias, groups=5).transpose(1, 2)
    torch.testing.assert_close(conv(x), want)


def test_direct_conv_under_bfloat16_autocast_matches_plain_autograd():
    u, k = _inputs(dtype=torch.float32)
    k = k[:, :u.shape[1]].contiguous()
    grads = []
    for conv in (DirectCausalConv.apply, _grouped_causal_conv):
        a, b = u.clone().requires_grad_(), k.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = conv(a, b)
        y.float().square().sum().backward()
        assert a.grad.dtype == torch.float32 and b.grad.dtype == torch.float32
        grads.append((a.grad, b.grad))
    for mine, want in zip(*grads):
        torch.testing.assert_close(mine, want, atol=0.05, rtol=0.02)

"""The shared convolutions against naive loops and against each other: the direct (grouped
conv1d with a hand-written backward, or the compiled CPU convolution) and FFT long convolutions,
and the short depthwise conv."""
import pytest
import torch
from torch.nn import functional as F

from hf_mecheval.models import cpu_kernels
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


needs_compiler = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler: the kernels are not built")


def compiled_conv(u, k):
    """The direct form on the compiled CPU convolution (``kernels="auto"``, as runs train)."""
    return causal_conv(u, k, use_fft=False, kernels="auto")


@pytest.mark.parametrize("use_fft, kernels", [(False, "torch"), (True, "torch"),
                                              pytest.param(False, "auto", marks=needs_compiler)],
                         ids=["direct", "fft", "compiled"])
def test_long_conv_equals_naive_sum(use_fft, kernels):
    u, k = _inputs(dtype=torch.float32)     # the FFT path computes in float32
    torch.testing.assert_close(causal_conv(u, k, use_fft=use_fft, kernels=kernels),
                               naive_causal_conv(u, k[:, :u.shape[1]]), atol=1e-5, rtol=1e-5)


@needs_compiler
@pytest.mark.parametrize("L", [1, 6, 37])
def test_compiled_direct_conv_matches_the_grouped_conv_and_gradcheck(L):
    """Values and both gradients against autograd through the grouped conv1d, in float64 (where
    the kernel computes in float64: equal to rounding), at lengths down to one tap."""
    u, k = _inputs(B=2, L=L, C=5, extra_taps=0, seed=L)
    u.requires_grad_(True)
    k.requires_grad_(True)
    g = torch.randn(2, L, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    y = compiled_conv(u, k)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, _grouped_causal_conv(u, k))
    want = torch.autograd.grad(_grouped_causal_conv(u, k), (u, k), g)
    for w, h in zip(want, torch.autograd.grad(y, (u, k), g)):
        torch.testing.assert_close(h, w)
    if L <= 6:
        assert torch.autograd.gradcheck(compiled_conv, (u, k))


@needs_compiler
def test_compiled_direct_conv_is_chosen_by_the_kernels_mode(monkeypatch):
    """kernels="auto" on a CPU runs the compiled kernel, "torch" the grouped conv1d: each path
    is what it says (a spy on the kernel), and the two agree in float32."""
    calls = []
    real = cpu_kernels.short_conv_cpu
    monkeypatch.setattr(cpu_kernels, "short_conv_cpu", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    u, k = _inputs(B=4, L=37, C=16, extra_taps=0, dtype=torch.float32)
    y_torch = causal_conv(u, k, kernels="torch")
    assert not calls
    y_auto = causal_conv(u, k, kernels="auto")
    assert calls == [1]
    torch.testing.assert_close(y_auto, y_torch, atol=1e-5, rtol=1e-5)


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


@pytest.mark.parametrize("conv", [DirectCausalConv.apply, fft_conv, pytest.param(compiled_conv, marks=needs_compiler)],
                         ids=["direct", "fft", "compiled"])
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


def test_direct_conv_under_bfloat16_autocast_within_bfloat16_rounding_of_exact():
    """Under bfloat16 autocast each direct path (the hand-written backward, grouped conv1d under
    autograd, the compiled convolution) returns float32 gradients within bfloat16's rounding of
    the exact float64 ones. The bound is per element, first-order rounding analysis: about six
    roundings of 2^-9 each (u, k, y, y's gradient, the gradient out) times the same gradient taken
    on |u| and |k| (what the sums' magnitudes are), i.e. 3 * 2^-8 * that; asserted at twice that.
    Measured: at most 2.8 * 2^-8 over 300 seeds (x86 without AVX-512); comparing the bfloat16
    paths with each other elementwise instead failed on another CPU, whose bfloat16 kernels round
    differently."""
    u, k = _inputs(dtype=torch.float32)
    k = k[:, :u.shape[1]].contiguous()
    exact_u, exact_k = u.double().requires_grad_(), k.double().requires_grad_()
    DirectCausalConv.apply(exact_u, exact_k).square().sum().backward()
    size_u, size_k = u.double().abs().requires_grad_(), k.double().abs().requires_grad_()
    DirectCausalConv.apply(size_u, size_k).square().sum().backward()
    convs = (DirectCausalConv.apply, _grouped_causal_conv) + ((compiled_conv,) if cpu_kernels.available() else ())
    for conv in convs:
        a, b = u.clone().requires_grad_(), k.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = conv(a, b)
        y.float().square().sum().backward()
        assert a.grad.dtype == torch.float32 and b.grad.dtype == torch.float32
        for got, exact, size in ((a.grad, exact_u.grad, size_u.grad), (b.grad, exact_k.grad, size_k.grad)):
            error = (got.double() - exact).abs()
            assert (error <= 6 * 2 ** -8 * size + 1e-6).all(), (conv, (error / size).max().item() * 2 ** 8)


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("architecture, fields", [
    ("h3", dict(hidden_size=16, d_state=8)),
    ("h3", dict(hidden_size=16, d_state=8, ssm_form="mecheval-v1")),
    ("hyena", dict(hidden_size=16)),
    ("baseconv", dict(hidden_size=16, kernel_schedule=["long", 3])),
    ("baseconv", dict(hidden_size=16, kernel_schedule=["long", 3], long_conv_form="mecheval-v1")),
], ids=["h3", "h3-v1", "hyena", "baseconv", "baseconv-v1"])
def test_a_training_step_with_long_convolutions_is_the_same_on_both_kernel_paths(architecture, fields, dtype,
                                                                                monkeypatch):
    """Every mixer with a direct long convolution: a training step as a run takes it (length 23)
    on the compiled convolution (kernels="auto") and on the grouped conv1d ("torch"): the loss
    and every parameter's gradient to 1e-12 / 1e-10 in float64 and 1e-6 / 1e-5 in float32 (of the
    loss and of each gradient's largest entry). A spy checks that the long convolution (23 taps,
    not a short one's few) did run compiled, and for H3's reference form that its heads ran
    compiled too, at every position in layer 0 and at the answer in layer 1."""
    from recurrent_mixers import assert_training_step_equal_across_kernels
    taps, kept_heads = [], []
    real, real_heads = cpu_kernels.short_conv_cpu, cpu_kernels.h3_kept_heads_cpu
    monkeypatch.setattr(cpu_kernels, "short_conv_cpu", lambda x, w, *a, **kw: taps.append(w.shape[-1]) or real(x, w, *a, **kw))
    monkeypatch.setattr(cpu_kernels, "h3_kept_heads_cpu", lambda *a: kept_heads.append(a[4].shape) or real_heads(*a))
    tolerance = (1e-12, 1e-10) if dtype == torch.float64 else (1e-6, 1e-5)
    assert_training_step_equal_across_kernels(architecture, dtype, *tolerance, **fields)
    assert 23 in taps
    assert kept_heads == ([(4, 23), (4, 1)] if architecture == "h3" and "ssm_form" not in fields else [])

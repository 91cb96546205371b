"""ops.short_conv: the hand-written backward against the reference and ShortConv itself; the
compiled CPU kernel (cpu_kernels.short_conv_cpu) against the same reference."""
import pytest
import torch

from hf_mecheval.models import cpu_kernels
from hf_mecheval.models.convolutions import ShortConv, short_conv_on
from torch.nn import functional as F

from hf_mecheval.models.ops_short_conv import ShortConvFunction, short_conv, short_conv_reference

needs_compiler = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler: the kernels are not built")


@pytest.mark.parametrize("K, L", [(4, 11), (1, 5), (3, 2), (6, 3)])    # taps longer than the sequence too
@pytest.mark.parametrize("bias", [True, False])
def test_fast_form_equals_reference_and_shortconv(K, L, bias):
    # ShortConv (which runs short_conv) and short_conv against the readable reference: values and
    # the gradients of input, weight and bias, to 1e-12 in float64
    torch.manual_seed(0)
    conv = ShortConv(5, K, bias=bias).double()
    x = torch.randn(2, L, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, L, 5, dtype=torch.float64)
    params = [x, *conv.parameters()]
    ref = short_conv_reference(x, conv.weight, conv.bias)
    ref_grads = torch.autograd.grad((ref * w).sum(), params)
    for y in (short_conv(x, conv.weight, conv.bias), conv(x)):
        assert (y - ref).abs().max() <= 1e-12
        for g, r in zip(torch.autograd.grad((y * w).sum(), params), ref_grads):
            assert (g - r).abs().max() <= 1e-12


def test_gradcheck_and_vmap():
    x = torch.randn(2, 6, 3, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 1, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ShortConvFunction.apply, (x, weight))
    xs, ws = torch.randn(3, 2, 6, 3, dtype=torch.float64), torch.randn(3, 3, 1, 4, dtype=torch.float64)
    ys = torch.func.vmap(short_conv)(xs, ws)
    shared = torch.func.vmap(short_conv, in_dims=(0, None))(xs, ws[0])   # one weight for every copy
    for k in range(3):
        assert torch.allclose(ys[k], short_conv_reference(xs[k], ws[k]))
        assert torch.allclose(shared[k], short_conv_reference(xs[k], ws[0]))
    # gradients under vmap (stacked copies): per-copy weight gradients
    ws.requires_grad_()
    grads = torch.autograd.grad(torch.func.vmap(short_conv)(xs, ws).square().sum(), ws)[0]
    for k in range(3):
        wk = ws[k].detach().requires_grad_()
        want = torch.autograd.grad(short_conv_reference(xs[k], wk).square().sum(), wk)[0]
        assert torch.allclose(grads[k], want)


@needs_compiler
@pytest.mark.parametrize("K, L", [(4, 11), (1, 5), (3, 2), (6, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_compiled_form_equals_reference(K, L, bias):
    # the compiled kernel, alone and as ShortConv(kernels="auto") runs it, against the readable
    # reference: values and the gradients of input, weight and bias, to 1e-12 in float64
    assert short_conv_on("auto", torch.device("cpu")) is cpu_kernels.short_conv_cpu
    assert short_conv_on("torch", torch.device("cpu")) is short_conv
    torch.manual_seed(0)
    conv = ShortConv(5, K, bias=bias, kernels="auto").double()
    x = torch.randn(2, L, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, L, 5, dtype=torch.float64)
    params = [x, *conv.parameters()]
    ref = short_conv_reference(x, conv.weight, conv.bias)
    ref_grads = torch.autograd.grad((ref * w).sum(), params)
    for y in (cpu_kernels.short_conv_cpu(x, conv.weight, conv.bias), conv(x)):
        assert (y - ref).abs().max() <= 1e-12
        for g, r in zip(torch.autograd.grad((y * w).sum(), params), ref_grads):
            assert (g - r).abs().max() <= 1e-12


@needs_compiler
def test_compiled_form_gradcheck_vmap_and_threads(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "WORK_PER_THREAD", 1)    # split even these small calls
    x = torch.randn(3, 6, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 1, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: cpu_kernels.CpuShortConv.apply(x, w, None, False), (x, weight))
    # stacked copies: a weight per copy (per-copy weight gradients) or one shared by every copy
    xs = torch.randn(3, 2, 6, 5, dtype=torch.float64)
    ws = torch.randn(3, 5, 1, 4, dtype=torch.float64, requires_grad=True)
    ys = torch.func.vmap(cpu_kernels.short_conv_cpu)(xs, ws)
    shared = torch.func.vmap(cpu_kernels.short_conv_cpu, in_dims=(0, None))(xs, ws[0].detach())
    grads = torch.autograd.grad(ys.square().sum(), ws)[0]
    for k in range(3):
        wk = ws[k].detach().requires_grad_()
        ref = short_conv_reference(xs[k], wk)
        assert (ys[k] - ref).abs().max() <= 1e-12
        assert (shared[k] - short_conv_reference(xs[k], ws[0].detach())).abs().max() <= 1e-12
        assert (grads[k] - torch.autograd.grad(ref.square().sum(), wk)[0]).abs().max() <= 1e-10
    # rows split between 3 threads give the 1-thread result exactly, gradients included
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 3):
            torch.set_num_threads(n)
            y = cpu_kernels.short_conv_cpu(x, weight)
            results.append((y, *torch.autograd.grad(y.square().sum(), (x, weight))))
        assert all(torch.equal(a, b) for a, b in zip(*results))
    finally:
        torch.set_num_threads(threads)


@needs_compiler
def test_compiled_form_in_float32_at_width_256():
    # DeltaNet's three convolutions at width 256 (768 channels), batch 4, length 37, 4 taps, in
    # float32 against the float64 reference: to float32 rounding of each tensor's scale
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 37, 768, generator=g, dtype=torch.float64)
    weight = torch.randn(768, 1, 4, generator=g, dtype=torch.float64) / 2
    w = torch.randn(4, 37, 768, generator=g, dtype=torch.float64)
    x64, w64 = x.clone().requires_grad_(), weight.clone().requires_grad_()
    ref = short_conv_reference(x64, w64)
    ref_grads = torch.autograd.grad((ref * w).sum(), (x64, w64))
    x32, w32 = x.float().requires_grad_(), weight.float().requires_grad_()
    y = cpu_kernels.short_conv_cpu(x32, w32)
    assert y.dtype == torch.float32
    assert (y.double() - ref).abs().max() <= 1e-6 * ref.abs().max()
    for got, want in zip(torch.autograd.grad((y * w.float()).sum(), (x32, w32)), ref_grads):
        assert (got.double() - want).abs().max() <= 1e-6 * want.abs().max()


def silu_reference(x, weight, bias=None):
    """The readable form of ``activation="silu"``: SiLU after the reference convolution and bias."""
    return F.silu(short_conv_reference(x, weight, bias))


@pytest.mark.parametrize("kernels", ["torch", "auto"])
@pytest.mark.parametrize("K, L", [(4, 11), (1, 5), (6, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_silu_activation_equals_the_reference(kernels, K, L, bias):
    # ShortConv(x, activation="silu") on either path (the compiled kernel takes the bias and SiLU
    # into its pass) against SiLU after the readable reference: values and the gradients of input,
    # weight and bias, float64, to 1e-12 of each tensor's largest entry
    if kernels == "auto" and not cpu_kernels.available():
        pytest.skip("no C++ compiler: the kernels are not built")
    torch.manual_seed(0)
    conv = ShortConv(21, K, bias=bias, kernels=kernels).double()      # 21 channels: a partial vector
    x = torch.randn(2, L, 21, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, L, 21, dtype=torch.float64)
    params = [x, *conv.parameters()]
    ref = silu_reference(x, conv.weight, conv.bias)
    ref_grads = torch.autograd.grad((ref * w).sum(), params)
    y = conv(x, activation="silu")
    assert (y - ref).abs().max() <= 1e-12 * ref.abs().max()
    for g, r in zip(torch.autograd.grad((y * w).sum(), params), ref_grads):
        assert (g - r).abs().max() <= 1e-12 * r.abs().max()


@needs_compiler
def test_compiled_silu_gradcheck_and_vmap_with_a_bias_per_copy():
    x = torch.randn(3, 6, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 1, 4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: cpu_kernels.short_conv_cpu(*t, activation="silu"), (x, weight, bias))
    xs = torch.randn(3, 2, 6, 5, dtype=torch.float64)
    ws = torch.randn(3, 5, 1, 4, dtype=torch.float64, requires_grad=True)
    bs = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    ys = torch.func.vmap(lambda x, w, b: cpu_kernels.short_conv_cpu(x, w, b, "silu"))(xs, ws, bs)
    gw, gb = torch.autograd.grad(ys.square().sum(), (ws, bs))
    for k in range(3):
        wk, bk = ws[k].detach().requires_grad_(), bs[k].detach().requires_grad_()
        ref = silu_reference(xs[k], wk, bk)
        assert (ys[k] - ref).abs().max() <= 1e-12
        want_w, want_b = torch.autograd.grad(ref.square().sum(), (wk, bk))
        assert (gw[k] - want_w).abs().max() <= 1e-10 and (gb[k] - want_b).abs().max() <= 1e-10


@needs_compiler
def test_compiled_silu_in_float32_at_width_256():
    # Mamba's convolution at width 256 (512 channels), batch 4, length 37, 4 taps, with its bias
    # and SiLU, in float32 against the float64 reference: to 1e-6 of each tensor's largest entry
    # (float32 rounding is 6e-8; a tap sum of 4 terms and the SiLU add a few steps; the kernel's
    # sigmoid is its own vector exp, within a few steps of float64's)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 37, 512, generator=g, dtype=torch.float64)
    weight = torch.randn(512, 1, 4, generator=g, dtype=torch.float64) / 2
    bias = torch.randn(512, generator=g, dtype=torch.float64) / 2
    w = torch.randn(4, 37, 512, generator=g, dtype=torch.float64)
    leaves64 = [t.clone().requires_grad_() for t in (x, weight, bias)]
    ref = silu_reference(*leaves64)
    ref_grads = torch.autograd.grad((ref * w).sum(), leaves64)
    leaves32 = [t.float().requires_grad_() for t in (x, weight, bias)]
    y = cpu_kernels.short_conv_cpu(*leaves32, activation="silu")
    assert y.dtype == torch.float32
    assert (y.double() - ref).abs().max() <= 1e-6 * ref.abs().max()
    for got, want in zip(torch.autograd.grad((y * w.float()).sum(), leaves32), ref_grads):
        assert (got.double() - want).abs().max() <= 1e-6 * want.abs().max()


@needs_compiler
def test_the_compiled_convolution_reads_a_sliced_input_in_its_logical_order():
    # x a column slice of a wider tensor (as a mixer's projection split in parts): the kernel
    # function itself, called without short_conv_cpu's copy, gives the reference's values and
    # gradients; a weight of another channel count is refused before the kernel runs
    g = torch.Generator().manual_seed(21)
    wide = torch.randn(2, 7, 10, generator=g, dtype=torch.float64)
    weight = torch.randn(6, 1, 3, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    x = wide[..., 2:8].requires_grad_()
    assert not x.is_contiguous()
    y = cpu_kernels.CpuShortConv.apply(x, weight, bias, True)
    want = F.silu(short_conv_reference(x, weight, bias))
    assert (y - want).abs().max() <= 1e-12 * want.abs().max()
    w = torch.randn(want.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((y * w).sum(), (x, weight, bias))
    expected = torch.autograd.grad((want * w).sum(), (x, weight, bias))
    assert all((a - b).abs().max() <= 1e-10 * b.abs().max() for a, b in zip(got, expected))
    with pytest.raises(ValueError, match="short_conv_forward: weight must be"):
        cpu_kernels.CpuShortConv.apply(x.detach(), weight.detach()[:5], None, False)

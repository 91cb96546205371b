"""ops.short_conv: the hand-written backward against the reference and ShortConv itself."""
import pytest
import torch

from hf_mecheval.models.convolutions import ShortConv
from hf_mecheval.models.ops_short_conv import ShortConvFunction, short_conv, short_conv_reference


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

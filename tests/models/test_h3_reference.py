"""H3 in the paper's reference form (``ssm_form`` "reference", the default), each piece checked against
the reference's equations written out here by hand from the module's own parameters — shift
registers and complex recurrences stepped one position at a time in float64, never through the
module's code —; its initialisation against the values and distributions the reference draws; and
the "mecheval-v1" form, which the committed H3 checkpoints were made with and still load."""
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import hf_mecheval  # noqa: F401  (registers the Auto classes)
from hf_mecheval.models import build_model
from hf_mecheval.models.configuration_mecheval import FORM_FIELDS
from hf_mecheval.models.mixer_h3 import MechEvalH3Config
from hf_mecheval.models.errors import ConfigError
from hf_mecheval.models.mixer_h3 import H3MechEvalV1, H3Reference

f64 = torch.float64
ROOT = Path(__file__).resolve().parents[2]
V1_RUN = ROOT / "results/reference/ref_ar/runs/h3_lr1e-03_s0"


def reference_mixer(D=4, N=6, P=2, seed=0, perturb=True):
    """A float64 reference-form mixer; with ``perturb``, every SSM parameter moved away from its
    initial value (B off e_0 and off 1, A's real parts off -1/2, ...), so that each one matters."""
    torch.manual_seed(seed)
    m = H3Reference(MechEvalH3Config(hidden_size=D, d_state=N, head_dim=P), layer_idx=0).double()
    if perturb:
        g = torch.Generator().manual_seed(seed + 100)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=f64))
            kernel = m.kernel
            kernel.log_dt.copy_(math.log(1e-2) + torch.rand(kernel.log_dt.shape, generator=g, dtype=f64))
            kernel.A_imag.copy_(3 * torch.rand(kernel.A_imag.shape, generator=g, dtype=f64))
    return m


def inputs(B, L, D, seed=1):
    return torch.randn(B, L, D, dtype=f64, generator=torch.Generator().manual_seed(seed))


def discretised_by_hand(m, h, n):
    """The bilinear discretisation of head h's mode n, in Python complex numbers."""
    kernel = m.kernel
    dt = math.exp(kernel.log_dt[h].item())
    A = complex(-math.exp(kernel.inv_A_real[h, n].item()), kernel.A_imag[h, n].item())
    B = complex(kernel.B[h, n, 0].item(), kernel.B[h, n, 1].item())
    C = complex(kernel.C[h, n, 0].item(), kernel.C[h, n, 1].item())
    dA = (1 + dt * A / 2) / (1 - dt * A / 2)
    dB = dt * B / (1 - dt * A / 2)
    return dA, dB, C


def shift_by_hand(m, k):
    """The shift SSM and its skip, by a register per channel: x_t = S x_{t-1} + B k_t,
    out_t = C · x_t + ssm_k_D k_t."""
    Bs, Ls, D = k.shape
    N = m.d_state
    Bm, Cm, skip = m.ssm_k_kernel.B.detach(), m.ssm_k_kernel.C.detach(), m.ssm_k_D.detach()
    out = torch.zeros_like(k)
    for b in range(Bs):
        for c in range(D):
            register = [0.0] * N
            for t in range(Ls):
                u = k[b, t, c].item()
                register = [0.0] + register[:-1]                           # shift by one
                register = [register[n] + Bm[c, n].item() * u for n in range(N)]
                out[b, t, c] = sum(Cm[c, n].item() * register[n] for n in range(N)) + skip[c].item() * u
    return out


def h3_by_hand(m, x):
    """The reference's H3.forward written out: q, k, v; k through the shift SSM and its skip;
    kv[i, j, h] = k[hP+i] v[hP+j]; per head h the complex recurrence h_t = dA h_{t-1} + dB kv_t,
    y = 2 Re(C · h_t) + D_h kv_t; o[j, h] = sum_i q[hP+i] y[i, j, h]; output_linear over o in
    the order (j, h)."""
    Bs, Ls, D = x.shape
    P, H = m.head_dim, m.num_heads
    modes = m.d_state // 2
    with torch.no_grad():
        q, k, v = (x @ lin.weight.T + lin.bias for lin in (m.q_proj, m.k_proj, m.v_proj))
    k = shift_by_hand(m, k)
    o = torch.zeros(Bs, Ls, P, H, dtype=f64)                                  # [j, h]
    for h in range(H):
        disc = [discretised_by_hand(m, h, n) for n in range(modes)]
        for b in range(Bs):
            for i in range(P):
                for j in range(P):
                    state = [0j] * modes
                    for t in range(Ls):
                        u = k[b, t, h * P + i].item() * v[b, t, h * P + j].item()
                        state = [dA * s + dB * u for (dA, dB, _), s in zip(disc, state)]
                        y = 2 * sum(C * s for (_, _, C), s in zip(disc, state)).real + m.D[h].item() * u
                        o[b, t, j, h] += q[b, t, h * P + i].item() * y
    with torch.no_grad():
        return o.flatten(-2) @ m.out_proj.weight.T + m.out_proj.bias


# ------------------------------------------------------------------ (a) the diagonal SSM's kernel
@pytest.mark.parametrize("L", [1, 5, 40])
def test_the_diagonal_ssm_kernel_is_the_complex_recurrence_stepped_by_hand(L):
    m = reference_mixer(D=6, N=10, P=2)                                       # 3 heads, 5 modes
    want = torch.zeros(m.num_heads, L, dtype=f64)
    for h in range(m.num_heads):
        for n in range(m.d_state // 2):
            dA, dB, C = discretised_by_hand(m, h, n)
            state = dB                                                        # the impulse at lag 0
            for l in range(L):
                want[h, l] += 2 * (C * state).real
                state = dA * state
    got = m.kernel.kernel(L)
    assert got.dtype == f64 and got.shape == (m.num_heads, L)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    # each outer-product channel (i, j, h) uses its head's kernel, and the head's skip D
    P, H = m.head_dim, m.num_heads
    per_channel = m.ssm_kernel(L).view(P, P, H, L)
    for i in range(P):
        for j in range(P):
            torch.testing.assert_close(per_channel[i, j], want, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(m._skip().view(P, P, H)[i, j], m.D, rtol=0, atol=0)


def test_the_real_arithmetic_discretisation_is_the_complex_one_with_its_gradients():
    """``discretize`` (real products) against ``discretize_complex`` (complex division), values
    and the gradients of every SSM parameter, in float64 and in float32 to its rounding."""
    for dtype, tol in ((f64, dict(rtol=1e-12, atol=1e-12)), (torch.float32, dict(rtol=1e-5, atol=1e-6))):
        kernel = reference_mixer(D=6, N=10, P=2).kernel.to(dtype)
        with torch.no_grad():                        # large and small dt, far-off A_imag
            kernel.log_dt.copy_(torch.tensor([math.log(1e-3), math.log(0.5), math.log(3.0)]))
            kernel.A_imag[0, -1] = 900.0
        params = [kernel.log_dt, kernel.inv_A_real, kernel.A_imag, kernel.B, kernel.C]
        weights = [torch.randn(3, 5, 2, dtype=dtype, generator=torch.Generator().manual_seed(i)) for i in range(3)]

        def loss(parts):
            return sum((torch.view_as_real(p) * w).sum() for p, w in zip(parts, weights))

        got, want = kernel.discretize(), kernel.discretize_complex()
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            torch.testing.assert_close(g, w, **tol)
        for g, w in zip(torch.autograd.grad(loss(got), params), torch.autograd.grad(loss(want), params)):
            torch.testing.assert_close(g, w, **tol)


def test_the_whole_reference_mixer_is_the_reference_forward_by_hand():
    m = reference_mixer(D=4, N=6, P=2)                                        # 2 heads, 3 modes
    x = inputs(2, 9, 4)
    want = h3_by_hand(m, x)
    torch.testing.assert_close(m(x), want, rtol=1e-9, atol=1e-10)
    m.state.materialize = True                                                # through the state trajectory
    torch.testing.assert_close(m(x), want, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("D, P", [(3, 1), (6, 3)])
def test_head_dims_1_and_3_are_the_reference_forward_by_hand(D, P):
    m = reference_mixer(D=D, N=4, P=P)
    x = inputs(1, 7, D)
    torch.testing.assert_close(m(x), h3_by_hand(m, x), rtol=1e-9, atol=1e-10)


# ------------------------------------------------------------------ (b) the shift SSM and its skip
@pytest.mark.parametrize("L", [5, 13])                                         # shorter and longer than N = 8
def test_the_shift_ssm_and_its_skip_are_a_shift_register_plus_d_k(L):
    m = reference_mixer(D=3, N=8, P=1)
    k = inputs(2, L, 3, seed=3)
    torch.testing.assert_close(m._shift(k), shift_by_hand(m, k), rtol=1e-10, atol=1e-12)
    # the recurrent form keeps the register itself
    state, steps = None, []
    for t in range(L):
        y, state = m._shift_step(k[:, t], state)
        steps.append(y)
    torch.testing.assert_close(torch.stack(steps, 1), shift_by_hand(m, k), rtol=1e-10, atol=1e-12)


def _shift_kernel_paths():
    """The shift SSM's kernel by FFT ("torch"), and compiled lag by lag ("auto") where the kernels build."""
    from hf_mecheval.models import cpu_kernels
    return ["torch", pytest.param("auto", marks=pytest.mark.skipif(not cpu_kernels.available(),
                                                                   reason="no C++ compiler: the kernels are not built"))]


@pytest.mark.parametrize("kernels", _shift_kernel_paths())
def test_the_shift_kernel_is_the_cross_correlation_of_b_and_c(kernels):
    m = reference_mixer(D=3, N=8, P=1)
    m.ssm_k_kernel.kernels = kernels
    Bm, Cm = m.ssm_k_kernel.B.detach(), m.ssm_k_kernel.C.detach()
    for L in (3, 8, 12):
        want = torch.zeros(3, L, dtype=f64)
        for c in range(3):
            for l in range(min(L, 8)):
                want[c, l] = sum(Bm[c, n] * Cm[c, n + l] for n in range(8 - l))
        torch.testing.assert_close(m.ssm_k_kernel.kernel(L), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kernels", _shift_kernel_paths())
@pytest.mark.parametrize("L", [1, 3, 7, 8, 12])
def test_the_shift_kernel_by_the_smaller_fft_has_the_gradients_of_the_size_2n_one(L, kernels):
    """The kernel's FFTs are of the smallest 5-smooth size >= N + min(N, L) - 1, or (compiled)
    its lags one by one; values and gradients are those of the reference's size 2N."""
    m = reference_mixer(D=3, N=8, P=1)
    shift = m.ssm_k_kernel
    shift.kernels = kernels
    G = torch.randn(3, L, dtype=f64, generator=torch.Generator().manual_seed(5))

    def size_2n(B, C):
        n = 16
        corr = torch.fft.irfft(torch.fft.rfft(B, n=n).conj() * torch.fft.rfft(C, n=n), n=n)
        return torch.nn.functional.pad(corr[:, :min(8, L)], (0, max(0, L - 8)))

    got = torch.autograd.grad((shift.kernel(L) * G).sum(), [shift.B, shift.C])
    want = torch.autograd.grad((size_2n(shift.B, shift.C) * G).sum(), [shift.B, shift.C])
    torch.testing.assert_close(shift.kernel(L), size_2n(shift.B, shift.C), rtol=1e-10, atol=1e-12)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_the_compiled_shift_kernel_equals_the_ffts_at_h3s_width_256_and_under_vmap(monkeypatch):
    """At H3's width-256 sizes (256 channels, N 1 024, 37 lags) in float32: the compiled lags
    (``shift_taps_cpu``; sums in another order) and the FFTs, values and both gradients within
    1e-5 of their largest entry; at 70 lags (over SHIFT_LAGS_DIRECT_MAX) the FFTs run; and the
    compiled kernel under vmap (stacked copies) equals it copy by copy."""
    from hf_mecheval.models import cpu_kernels
    from hf_mecheval.models.mixer_h3 import SHIFT_LAGS_DIRECT_MAX, ShiftSSM

    if not cpu_kernels.available():
        pytest.skip("no C++ compiler: the kernels are not built")
    torch.manual_seed(0)
    shift = ShiftSSM(256, 1024)
    with torch.no_grad():
        shift.B.normal_()                                   # trained B is dense, not e_0
    G = torch.randn(256, 37)
    paths = {}
    for kernels in ("torch", "auto"):
        shift.kernels = kernels
        K = shift.kernel(37)
        paths[kernels] = (K, *torch.autograd.grad((K * G).sum(), (shift.B, shift.C)))
    for got, want in zip(paths["auto"], paths["torch"]):
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    calls = []
    real = cpu_kernels.shift_taps_cpu
    monkeypatch.setattr(cpu_kernels, "shift_taps_cpu", lambda *a: calls.append(a[2]) or real(*a))
    shift.kernel(37), shift.kernel(SHIFT_LAGS_DIRECT_MAX + 6)
    assert calls == [37]
    B, C = torch.randn(2, 3, 9, dtype=f64), torch.randn(2, 3, 9, dtype=f64)
    stacked = torch.func.vmap(lambda b, c: real(b, c, 5))(B, C)
    for i in range(2):
        torch.testing.assert_close(stacked[i], real(B[i], C[i], 5))


def test_smooth_fft_sizes():
    from hf_mecheval.models.mixer_h3 import _smooth_size
    assert [_smooth_size(m) for m in (1, 7, 11, 1060, 2047)] == [1, 8, 12, 1080, 2048]


# ------------------------------------------------------------------ the state site
def test_a_reference_state_patch_propagates_through_the_complex_recurrence():
    """The site shows (Re h, Im h) per mode: adding delta there at position p changes the SSM output
    at t >= p by 2 Re(C dA^(t-p) (delta_re + i delta_im)), and the mixer output by out_proj of q
    contracted with that (order (i, j, h) in, (j, h) out)."""
    m = reference_mixer(D=4, N=6, P=2)
    x, p, Ls = inputs(2, 11, 4), 4, 11
    P, H, modes = m.head_dim, m.num_heads, m.d_state // 2
    y = m(x)
    delta = torch.randn(2, m.channels, modes, 2, dtype=f64, generator=torch.Generator().manual_seed(7))

    def patch(mod, inp, out):
        assert out.shape == (2, Ls, m.channels, modes, 2) and out.dtype == f64
        out = out.clone()
        out[:, p] += delta
        return out

    handle = m.state.register_forward_hook(patch)
    y_patched = m(x)
    handle.remove()
    torch.testing.assert_close(y_patched[:, :p], y[:, :p], rtol=0, atol=1e-12)

    with torch.no_grad():
        q = x @ m.q_proj.weight.T + m.q_proj.bias
    ds = torch.zeros(2, Ls, P, P, H, dtype=f64)                               # [i, j, h]
    for b in range(2):
        for i in range(P):
            for j in range(P):
                for h in range(H):
                    c = (i * P + j) * H + h
                    for n in range(modes):
                        dA, _, C = discretised_by_hand(m, h, n)
                        e = complex(delta[b, c, n, 0].item(), delta[b, c, n, 1].item())
                        for t in range(p, Ls):
                            ds[b, t, i, j, h] += 2 * (C * dA ** (t - p) * e).real
    do = torch.zeros(2, Ls, P, H, dtype=f64)                                  # [j, h]
    for i in range(P):
        for j in range(P):
            for h in range(H):
                do[:, :, j, h] += q[:, :, h * P + i] * ds[:, :, i, j, h]
    expected = do.flatten(-2) @ m.out_proj.weight.detach().T
    torch.testing.assert_close(y_patched - y, expected, rtol=1e-8, atol=1e-10)


# ------------------------------------------------------------------ (c) the reference's initialisation
def test_the_initial_values_are_the_reference_init():
    D, N, P, layers = 256, 64, 2, 2
    torch.manual_seed(0)
    model = build_model("h3", vocab_size=11, hidden_size=D, d_state=N, head_dim=P, num_hidden_layers=layers)
    assert model.config.ssm_form == "reference"
    H, modes = D // P, N // 2
    mixers = [layer.mixer for layer in model.model.layers]
    assert all(isinstance(m, H3Reference) for m in mixers)
    shapes = {name: tuple(p.shape) for name, p in mixers[0].named_parameters()}
    assert shapes == {
        "q_proj.weight": (D, D), "q_proj.bias": (D,), "k_proj.weight": (D, D), "k_proj.bias": (D,),
        "v_proj.weight": (D, D), "v_proj.bias": (D,), "out_proj.weight": (D, D), "out_proj.bias": (D,),
        "ssm_k_kernel.B": (D, N), "ssm_k_kernel.C": (D, N), "ssm_k_D": (D,),
        "kernel.log_dt": (H,), "kernel.inv_A_real": (H, modes), "kernel.A_imag": (H, modes),
        "kernel.B": (H, modes, 2), "kernel.C": (H, modes, 2), "D": (H,)}
    # every parameter is trained (the reference's AdamW(model.parameters()))
    assert all(p.requires_grad for p in model.parameters())

    def cat(get):
        return torch.cat([get(m).detach().double().flatten() for m in mixers])

    # A = -1/2 + iπn exactly, B = 1 + 0i
    for m in mixers:
        kernel = m.kernel
        torch.testing.assert_close(-torch.exp(kernel.inv_A_real.double()), torch.full((H, modes), -0.5, dtype=f64))
        torch.testing.assert_close(kernel.A_imag.double(), (math.pi * torch.arange(modes, dtype=f64)).expand(H, -1))
        assert torch.equal(kernel.B[..., 0], torch.ones(H, modes)) and torch.equal(kernel.B[..., 1], torch.zeros(H, modes))
        # the shift SSM's B = e_0, so its kernel starts as C
        assert torch.equal(m.ssm_k_kernel.B[:, 0], torch.ones(D)) and not m.ssm_k_kernel.B[:, 1:].any()
        torch.testing.assert_close(m.ssm_k_kernel.kernel(N), m.ssm_k_kernel.C.detach(), rtol=0, atol=1e-6)

    def within(samples, mean, std, what):
        n = samples.numel()
        assert abs(samples.mean().item() - mean) < 5 * std / math.sqrt(n), what
        assert abs(samples.std().item() / std - 1) < 5 / math.sqrt(2 * n), what

    # dt log-uniform in [1e-3, 1e-1]
    log_dt, lo, hi = cat(lambda m: m.kernel.log_dt), math.log(1e-3), math.log(1e-1)
    assert log_dt.min() >= lo and log_dt.max() <= hi
    within(log_dt, (lo + hi) / 2, (hi - lo) / math.sqrt(12), "log_dt")
    # C complex normal: each part N(0, 1/2), E|C|^2 = 1
    C = cat(lambda m: m.kernel.C)
    within(C, 0.0, math.sqrt(0.5), "C")
    # the skips: D per head and ssm_k_D per channel, N(0, 1)
    within(cat(lambda m: m.D), 0.0, 1.0, "D")
    within(cat(lambda m: m.ssm_k_D), 0.0, 1.0, "ssm_k_D")
    # the shift SSM's C: U(+-1/sqrt(N))
    shift_C, bound = cat(lambda m: m.ssm_k_kernel.C), 1 / math.sqrt(N)
    assert shift_C.abs().max() <= bound
    within(shift_C, 0.0, bound / math.sqrt(3), "shift C")


def test_a_checkpoint_missing_ssm_parameters_draws_them_as_the_reference(tmp_path):
    model = build_model("h3", vocab_size=11, hidden_size=8, d_state=8, head_dim=2)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    dropped = sorted(k for k in weights if k.endswith(("kernel.A_imag", "ssm_k_kernel.B", "mixer.D")))
    assert len(dropped) == 6
    save_file({k: v for k, v in weights.items() if k not in dropped}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    partial, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert sorted(info["missing_keys"]) == dropped
    for layer in partial.model.layers:
        m = layer.mixer
        torch.testing.assert_close(m.kernel.A_imag, (math.pi * torch.arange(4.0)).expand(4, -1))
        assert torch.equal(m.ssm_k_kernel.B, torch.eye(8)[0].expand(8, -1))
        assert torch.isfinite(m.D).all() and m.D.abs().max() < 10


# ------------------------------------------------------------------ (d) the committed v1 checkpoint
def test_the_committed_h3_checkpoint_loads_as_v1_with_every_key():
    model, info = AutoModelForCausalLM.from_pretrained(V1_RUN, output_loading_info=True)
    assert not any(info.values()), info
    assert model.config.ssm_form == "mecheval-v1"
    assert "ssm_form" not in json.loads((V1_RUN / "config.json").read_text())     # read as its legacy value
    assert all(isinstance(layer.mixer, H3MechEvalV1) for layer in model.model.layers)
    saved = {k: tuple(v.shape) for k, v in load_file(V1_RUN / "model.safetensors").items()}
    state = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if "lm_head.weight" not in saved:                                       # tied to the embedding
        state.pop("lm_head.weight", None)
    assert state == saved
    assert "model.layers.0.mixer.shift.weight" in saved and "model.layers.0.mixer.A_log" in saved


# ------------------------------------------------------------------ (e) the field
@pytest.mark.parametrize("bad", ["mecheval-v2", "Reference", None, 1])
def test_bad_ssm_forms_name_the_field(bad):
    with pytest.raises(ConfigError) as info:
        MechEvalH3Config(ssm_form=bad)
    assert info.value.field == "ssm_form"
    assert "'reference', 'mecheval-v1'" in str(info.value)


def test_the_reference_form_needs_two_states():
    with pytest.raises(ConfigError) as info:
        MechEvalH3Config(d_state=1)
    assert info.value.field == "d_state"
    assert MechEvalH3Config(d_state=1, ssm_form="mecheval-v1").d_state == 1


def test_a_new_model_saves_and_reloads_the_reference_form(tmp_path):
    model = build_model("h3", vocab_size=11, hidden_size=8, d_state=8).eval()
    assert model.config.ssm_form == "reference"
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["ssm_form"] == "reference"
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info
    assert loaded.config.ssm_form == "reference"
    assert all(isinstance(layer.mixer, H3Reference) for layer in loaded.model.layers)
    ids = torch.randint(3, 11, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_mixer_forms_sets_the_ssm_form():
    from hf_mecheval.training.arguments import ModelArguments

    assert "ssm_form" in FORM_FIELDS
    assert ModelArguments(architecture="h3", mixer_forms="mecheval-v1").config_fields()["ssm_form"] == "mecheval-v1"
    assert "ssm_form" not in ModelArguments(architecture="h3").config_fields()


# ------------------------------------------------------------------ the kernel's taps
def _modes(C, N, seed, dtype=torch.complex128):
    """w (C, N) complex normal; a (C, N) inside the unit disc, radii 0.2-0.95, angles 0-3."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(C, N, generator=g, dtype=dtype)
    real = torch.float64 if dtype == torch.complex128 else torch.float32
    radius = 0.2 + 0.75 * torch.rand(C, N, generator=g, dtype=real)
    angle = 3 * torch.rand(C, N, generator=g, dtype=real)
    return w.requires_grad_(), torch.polar(radius, angle).requires_grad_()


def test_conjugate_pair_taps_against_the_closed_form_and_gradcheck():
    from hf_mecheval.models.ops_ssm_taps import ConjugatePairTaps

    for L in (1, 2, 9):
        w, a = _modes(3, 4, seed=L)
        assert torch.autograd.gradcheck(lambda w, a: ConjugatePairTaps.apply(w, a, L), (w, a))
        closed = 2 * (w[..., None] * a[..., None] ** torch.arange(L, dtype=f64)).sum(1).real
        torch.testing.assert_close(ConjugatePairTaps.apply(w, a, L), closed, rtol=0, atol=1e-12)


def _diagonal_ssm(H, N, seed, dtype=f64):
    """A DiagonalSSM with every parameter moved off its initial value (dt in [1e-2, 2.7e-2])."""
    from hf_mecheval.models.mixer_h3 import DiagonalSSM

    torch.manual_seed(seed)
    ssm = DiagonalSSM(H, N).to(dtype)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in ssm.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=dtype))
        ssm.log_dt.copy_(math.log(1e-2) + torch.rand(H, generator=g, dtype=dtype))
    return ssm


def _bilinear_taps_by_pytorch(ssm, L):
    from hf_mecheval.models.ops_ssm_taps import ConjugatePairTaps

    dA, dB, C = ssm.discretize()
    return ConjugatePairTaps.apply(C * dB, dA, L)


def test_the_compiled_bilinear_taps_pass_gradcheck_and_equal_discretisation_then_taps():
    """``bilinear_taps_cpu`` (the discretisation and the taps in one compiled pass, and the chain rule
    back through both) in float64: gradcheck in all five parameters, and values and gradients
    against autograd through ``DiagonalSSM.discretize`` and ``ConjugatePairTaps`` to 1e-13 of
    their largest entry, at 1, 2 and 9 taps, 21 modes (a whole block of 16 lanes and a part)."""
    from hf_mecheval.models import cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("no C++ compiler: the kernels are not built")
    ssm = _diagonal_ssm(3, 10, seed=0)
    params = list(ssm.parameters())
    assert [n for n, _ in ssm.named_parameters()] == ["log_dt", "inv_A_real", "A_imag", "B", "C"]
    assert torch.autograd.gradcheck(lambda *p: cpu_kernels.bilinear_taps_cpu(*p, 5), tuple(params))
    ssm = _diagonal_ssm(4, 42, seed=1)
    params = list(ssm.parameters())
    for L in (1, 2, 9):
        want, got = _bilinear_taps_by_pytorch(ssm, L), cpu_kernels.bilinear_taps_cpu(*params, L)
        G = torch.randn(want.shape, generator=torch.Generator().manual_seed(L), dtype=f64)
        assert (got - want).abs().max() <= 1e-13 * want.abs().max()
        for g_got, g_want in zip(torch.autograd.grad((got * G).sum(), params), torch.autograd.grad((want * G).sum(), params)):
            assert (g_got - g_want).abs().max() <= 1e-13 * g_want.abs().max()


def test_compiled_bilinear_taps_equal_pytorchs_in_float32_at_h3s_width_256_and_under_vmap(monkeypatch):
    """At H3's width-256 sizes (128 heads, 512 modes, 37 taps) in float32: ``DiagonalSSM.kernel``
    under kernels "auto" (a spy checks the compiled kernel ran) against the PyTorch path, taps and
    every parameter's gradient within 1e-5 of their largest entry (sums over 512 modes in another
    order); and the kernel under vmap (stacked copies) equal to it copy by copy."""
    from hf_mecheval.models import cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("no C++ compiler: the kernels are not built")
    calls = []
    real = cpu_kernels.bilinear_taps_cpu
    monkeypatch.setattr(cpu_kernels, "bilinear_taps_cpu", lambda *a: calls.append(a[-1]) or real(*a))
    ssm = _diagonal_ssm(128, 1024, seed=2, dtype=torch.float32)
    G = torch.randn(128, 37, generator=torch.Generator().manual_seed(3))
    paths = {}
    for kernels in ("torch", "auto"):
        ssm.kernels = kernels
        K = ssm.kernel(37)
        paths[kernels] = (K, *torch.autograd.grad((K * G).sum(), list(ssm.parameters())))
    assert calls == [37]
    for got, want in zip(paths["auto"], paths["torch"]):
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    copies = [_diagonal_ssm(3, 20, seed=s) for s in (4, 5)]
    stacked_params = [torch.stack(p) for p in zip(*(c.parameters() for c in copies))]
    stacked = torch.func.vmap(lambda *p: real(*p, 6))(*stacked_params)
    for c, copy in enumerate(copies):
        torch.testing.assert_close(stacked[c], _bilinear_taps_by_pytorch(copy, 6), rtol=0, atol=1e-13)


@pytest.mark.parametrize("L", [1, 7, 37, 100])
def test_the_kernel_by_repeated_products_equals_the_vandermonde_form(L):
    kernel = reference_mixer(D=8, N=16, P=2).kernel
    fast, slow = kernel.kernel(L), kernel.kernel_vandermonde(L)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-11)
    weights = torch.randn_like(fast)
    params = [kernel.log_dt, kernel.inv_A_real, kernel.A_imag, kernel.B, kernel.C]
    for g_fast, g_slow in zip(*(torch.autograd.grad((k * weights).sum(), params) for k in (fast, slow))):
        torch.testing.assert_close(g_fast, g_slow, rtol=1e-9, atol=1e-10)


# ------------------------------------------------------------------ the heads at the kept positions, compiled
def _kept_heads_pair(D, N, P, dtype=f64, seed=0):
    """The same perturbed reference-form mixer twice: on the PyTorch path and under kernels "auto"."""
    torch_path = reference_mixer(D=D, N=N, P=P, seed=seed).to(dtype)
    compiled = reference_mixer(D=D, N=N, P=P, seed=seed).to(dtype)
    torch_path.kernels = torch_path.kernel.kernels = torch_path.ssm_k_kernel.kernels = "torch"
    compiled.kernels = compiled.kernel.kernels = compiled.ssm_k_kernel.kernels = "auto"
    return torch_path, compiled


@pytest.mark.parametrize("P", [1, 2, 3])
@pytest.mark.parametrize("S", [1, 2, 5])
def test_the_compiled_heads_at_kept_positions_are_the_pytorch_paths(P, S, monkeypatch):
    """The reference form's answer-only path under kernels "auto" (outer products, the diagonal SSM's
    convolution and skip, the q contraction at the kept positions, in one compiled pass) against
    PyTorch's (the gathered window for S <= 2, whole rows convolved then read for 5), float64: output
    and the gradients of x and of every parameter to 1e-12 of their largest entry. 19 heads (a whole
    block of 16 lanes and a part); kept positions at 0, at L - 1, and twice the same one in a row.
    A spy checks that the compiled kernel ran."""
    from hf_mecheval.models import cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("no C++ compiler: the kernels are not built")
    calls = []
    real = cpu_kernels.h3_kept_heads_cpu
    monkeypatch.setattr(cpu_kernels, "h3_kept_heads_cpu", lambda *a: calls.append(a[4].shape) or real(*a))
    B, L = 4, 11
    torch_path, compiled = _kept_heads_pair(D=19 * P, N=8, P=P)
    g = torch.Generator().manual_seed(3)
    keep = torch.randint(0, L, (B, S), generator=g)
    keep[0, 0], keep[1, -1], keep[2, :] = 0, L - 1, 4
    x, go = inputs(B, L, 19 * P), torch.randn(B, S, 19 * P, generator=g, dtype=f64)
    results = []
    for m in (torch_path, compiled):
        x_m = x.clone().requires_grad_()
        y = m(x_m, keep=keep)
        results.append([y, *torch.autograd.grad((y * go).sum(), [x_m, *m.parameters()])])
    assert calls == [(B, S)]
    for want, got in zip(*results):
        assert (got - want).abs().max() <= 1e-12 * want.abs().max()


def test_the_compiled_kept_heads_pass_gradcheck_with_taps_shared_and_per_row():
    """``CpuH3KeptHeads`` by gradcheck in float64 (q, k, v, taps), with the taps shared by the rows
    (L, H) and one set per row (B, L, H), 17 heads of 2 (a whole block of 16 lanes and a part)."""
    from hf_mecheval.models import cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("no C++ compiler: the kernels are not built")
    g = torch.Generator().manual_seed(0)
    B, L, P, H = 2, 5, 2, 17
    q, k, v = (torch.randn(B, L, P * H, generator=g, dtype=f64, requires_grad=True) for _ in range(3))
    keep = torch.tensor([[4, 0], [2, 2]])
    for taps_shape in ((L, H), (B, L, H)):
        taps = torch.randn(*taps_shape, generator=g, dtype=f64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda q, k, v, t: cpu_kernels.h3_kept_heads_cpu(q, k, v, t, keep, P),
                                        (q, k, v, taps))


def test_the_compiled_kept_heads_by_hand_under_vmap_and_refusing_positions_outside_the_rows():
    """One output of ``h3_kept_heads_cpu`` summed by hand from the definition; the kernel under vmap
    (stacked copies, taps per copy) equal to it copy by copy, with its gradients; a kept position
    outside [0, L) refused before the kernel reads there; no kept position, an empty output."""
    from hf_mecheval.models import cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("no C++ compiler: the kernels are not built")
    g = torch.Generator().manual_seed(1)
    B, L, P, H = 3, 6, 2, 3
    q, k, v = (torch.randn(B, L, P * H, generator=g, dtype=f64) for _ in range(3))
    taps = torch.randn(L, H, generator=g, dtype=f64)
    keep = torch.tensor([[5], [3], [0]])
    o = cpu_kernels.h3_kept_heads_cpu(q, k, v, taps, keep, P)                  # (B, 1, P H)
    b, p, j, h = 1, 3, 1, 2
    by_hand = sum(q[b, p, h * P + i] * taps[l, h] * k[b, p - l, h * P + i] * v[b, p - l, h * P + j]
                  for i in range(P) for l in range(p + 1))
    torch.testing.assert_close(o[b, 0, j * H + h], by_hand, rtol=1e-13, atol=0)

    copies = [t.expand(2, *t.shape).clone().requires_grad_() for t in (q, k, v)]
    per_copy_taps = torch.randn(2, L, H, generator=g, dtype=f64, requires_grad=True)
    stacked = torch.func.vmap(lambda q, k, v, t: cpu_kernels.h3_kept_heads_cpu(q, k, v, t, keep, P))(
        *copies, per_copy_taps)
    weights = torch.randn(stacked.shape, generator=g, dtype=f64)
    stacked_grads = torch.autograd.grad((stacked * weights).sum(), [*copies, per_copy_taps])
    for c in range(2):
        alone = [t[c].detach().requires_grad_() for t in (*copies, per_copy_taps)]
        out = cpu_kernels.h3_kept_heads_cpu(*alone[:3], alone[3], keep, P)
        torch.testing.assert_close(stacked[c], out)
        for got, want in zip(stacked_grads, torch.autograd.grad((out * weights[c]).sum(), alone)):
            torch.testing.assert_close(got[c], want)

    for bad in (torch.tensor([[6], [0], [0]]), torch.tensor([[-1], [0], [0]])):
        with pytest.raises(ValueError, match=r"kept positions must lie in \[0, 6\)"):
            cpu_kernels.h3_kept_heads_cpu(q, k, v, taps, bad, P)

    leaves = [t.clone().requires_grad_() for t in (q, k, v, taps)]       # no kept position: nothing read
    none_kept = cpu_kernels.h3_kept_heads_cpu(*leaves, torch.zeros(B, 0, dtype=torch.long), P)
    assert none_kept.shape == (B, 0, P * H)
    none_kept.sum().backward()
    assert all(torch.equal(t.grad, torch.zeros_like(t)) for t in leaves)


def test_the_compiled_heads_take_whole_rows_up_to_their_longest_and_leave_longer_ones_to_pytorch(monkeypatch):
    """Without kept positions (the full forward): rows up to COMPILED_WHOLE_ROWS_MAX tokens run the
    compiled heads at every position, equal to PyTorch's whole-row convolution (float64, output and
    gradients of x and every parameter to 1e-12 of their largest entry); longer rows, and a forward
    that reads the state site, take PyTorch's path (a spy counts the compiled calls)."""
    from hf_mecheval.models import cpu_kernels
    from hf_mecheval.models.mixer_h3 import COMPILED_WHOLE_ROWS_MAX

    if not cpu_kernels.available():
        pytest.skip("no C++ compiler: the kernels are not built")
    calls = []
    real = cpu_kernels.h3_kept_heads_cpu
    monkeypatch.setattr(cpu_kernels, "h3_kept_heads_cpu", lambda *a: calls.append(a[4].shape) or real(*a))
    torch_path, compiled = _kept_heads_pair(D=6, N=8, P=2)
    x = inputs(3, 11, 6)
    results = []
    for m in (torch_path, compiled):
        x_m = x.clone().requires_grad_()
        y = m(x_m)
        results.append([y, *torch.autograd.grad((y * x).sum(), [x_m, *m.parameters()])])
    assert calls == [(3, 11)]
    for want, got in zip(*results):
        assert (got - want).abs().max() <= 1e-12 * want.abs().max()
    compiled(inputs(1, COMPILED_WHOLE_ROWS_MAX + 1, 6))
    hook = compiled.state.register_forward_hook(lambda module, args, out: out)
    compiled(x)
    hook.remove()
    assert calls == [(3, 11)]

"""The fused selective scan, its answer-position form, the compiled CPU scan and the state-path
scan against the readable reference."""
import pytest
import torch
from torch.nn import functional as F

from hf_mecheval.models import build_model, cpu_kernels
from hf_mecheval.models.kernels import cpu_scan
from hf_mecheval.models.ops_selective_scan import (LinearScan, ScanWorkspace, selective_scan, selective_scan_at,
                                                   selective_scan_reference)

from recurrent_mixers import assert_training_step_equal_across_kernels


def inputs(seed=0, B=3, L=9, E=5, N=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, E, generator=g, dtype=torch.float64)
    dt = torch.rand(B, L, E, generator=g, dtype=torch.float64) * 0.5
    A = -torch.rand(E, N, generator=g, dtype=torch.float64) * 3
    Bm = torch.randn(B, L, N, generator=g, dtype=torch.float64)
    C = torch.randn(B, L, N, generator=g, dtype=torch.float64)
    return [t.requires_grad_() for t in (x, dt, A, Bm, C)]


def assert_same_values_and_gradients(fast, reference, seed):
    """fast(*inputs) and reference(*inputs) agree, and so do the gradients of every input."""
    a, b = inputs(seed), inputs(seed)
    y_ref, y = reference(*a), fast(*b)
    assert torch.allclose(y, y_ref, atol=1e-12)
    w = torch.randn_like(y)
    (y_ref * w).sum().backward()
    (y * w).sum().backward()
    for p, q in zip(a, b):
        assert torch.allclose(p.grad, q.grad, atol=1e-10)


def test_fused_scan_matches_reference_values_and_gradients():
    assert torch.autograd.gradcheck(selective_scan, inputs())
    assert_same_values_and_gradients(selective_scan, lambda *t: selective_scan_reference(*t)[0], seed=1)


def test_fused_scan_with_one_A_per_row_and_under_vmap():
    # per-row A (stacked copies folded into rows) equals running each row with its own A
    x, dt, A, Bm, C = inputs(3)
    A_rows = (A[None] * torch.tensor([1.0, 0.5, 2.0], dtype=A.dtype)[:, None, None]).detach().requires_grad_()
    assert torch.autograd.gradcheck(selective_scan, (x, dt, A_rows, Bm, C))
    y = selective_scan(x, dt, A_rows, Bm, C)
    for r in range(3):
        y_r, _ = selective_scan_reference(x[r:r + 1], dt[r:r + 1], A_rows[r], Bm[r:r + 1], C[r:r + 1])
        assert torch.allclose(y[r:r + 1], y_r, atol=1e-12)
    # vmap over K = 2 copies (A batched, inputs batched or shared) equals a loop over the copies
    K_A = torch.stack([A.detach(), 0.3 * A.detach()]).requires_grad_()
    K_x = torch.stack([x.detach(), x.detach().flip(0)]).requires_grad_()
    ys = torch.func.vmap(selective_scan, in_dims=(0, None, 0, None, None))(K_x, dt, K_A, Bm, C)
    w = torch.randn_like(ys)
    (ys * w).sum().backward()
    for k in range(2):
        a = K_A.detach()[k].clone().requires_grad_()
        xk = K_x.detach()[k].clone().requires_grad_()
        y_k, _ = selective_scan_reference(xk, dt, a, Bm, C)
        (y_k * w[k]).sum().backward()
        assert torch.allclose(ys[k], y_k, atol=1e-12)
        assert torch.allclose(K_A.grad[k], a.grad, atol=1e-10) and torch.allclose(K_x.grad[k], xk.grad, atol=1e-10)


def _at(y, keep):
    return y.gather(1, keep[..., None].expand(-1, -1, y.shape[-1]))


def test_scan_at_kept_positions_matches_reference_values_and_gradients():
    # per-row positions, two per row (one of them the first position), in any order
    keep = torch.tensor([[8, 3], [0, 5], [6, 6]])
    assert torch.autograd.gradcheck(lambda *t: selective_scan_at(*t, keep), inputs(4))
    assert_same_values_and_gradients(lambda *t: selective_scan_at(*t, keep, ScanWorkspace()),
                                     lambda *t: _at(selective_scan_reference(*t)[0], keep), seed=5)


def test_scan_at_kept_positions_under_vmap():
    x, dt, A, Bm, C = (t.detach() for t in inputs(6))
    keep = torch.tensor([[8], [2], [5]])
    K_A = torch.stack([A, 0.3 * A]).requires_grad_()
    K_B = torch.stack([Bm, -Bm]).requires_grad_()
    ys = torch.func.vmap(selective_scan_at, in_dims=(None, None, 0, 0, None, None))(x, dt, K_A, K_B, C, keep)
    w = torch.randn_like(ys)
    (ys * w).sum().backward()
    for k in range(2):
        a, bk = K_A.detach()[k].clone().requires_grad_(), K_B.detach()[k].clone().requires_grad_()
        y_k = _at(selective_scan_reference(x, dt, a, bk, C)[0], keep)
        (y_k * w[k]).sum().backward()
        assert torch.allclose(ys[k], y_k, atol=1e-12)
        assert torch.allclose(K_A.grad[k], a.grad, atol=1e-10) and torch.allclose(K_B.grad[k], bk.grad, atol=1e-10)


def test_linear_scan_gradcheck():
    x, dt, A, Bm, _ = inputs(2)
    dA = torch.exp(dt[..., None] * A).detach().requires_grad_()
    dBx = ((dt * x)[..., None] * Bm[:, :, None, :]).detach().requires_grad_()
    assert torch.autograd.gradcheck(LinearScan.apply, (dA, dBx))


def test_state_path_equals_fused_path():
    torch.manual_seed(0)
    model = build_model("mamba", vocab_size=11, hidden_size=8, d_state=4).double().eval()
    ids = torch.randint(3, 11, (2, 10))
    fast = model(ids).logits
    model.materialize_sites(True)
    slow = model(ids).logits
    assert torch.allclose(fast, slow, atol=1e-10)


def test_state_patch_propagates_forward_only():
    torch.manual_seed(0)
    model = build_model("mamba", vocab_size=11, hidden_size=8, d_state=4, num_hidden_layers=1).double().eval()
    ids = torch.randint(3, 11, (2, 10))
    clean = model(ids).logits
    p = 4

    def patch(module, args, out):
        out = out.clone()
        out[:, p] += 1.0
        return out

    handle = model.get_site("layers.0.mixer.state").register_forward_hook(patch)
    patched = model(ids).logits
    handle.remove()
    assert torch.allclose(patched[:, :p], clean[:, :p], atol=1e-12)
    assert ((patched - clean)[:, p:].abs().amax(-1) > 1e-9).all()    # every later position moves


def tiny_mamba_batch(kernels="torch"):
    """A 2-layer Mamba and a batch with one answer label per row (the training path)."""
    torch.manual_seed(0)
    model = build_model("mamba", vocab_size=11, hidden_size=8, d_state=4, num_hidden_layers=2, kernels=kernels)
    ids = torch.randint(3, 11, (2, 10))
    labels = torch.full_like(ids, -100)
    labels[:, -1] = ids[:, -1]
    return model, ids, labels


def test_buffers_needed_by_a_pending_backward_are_never_reused():
    # a second forward (with or without grad) before the first one's backward must not write into
    # the buffers that backward reads; the gradients equal those of a lone forward and backward
    model, ids, labels = tiny_mamba_batch()
    model(ids, labels=labels).loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    for second in ("grad", "no_grad"):
        model.zero_grad()
        loss = model(ids, labels=labels).loss
        with torch.set_grad_enabled(second == "grad"):
            model(ids.flip(1), labels=labels)
        loss.backward()
        for n, p in model.named_parameters():
            assert torch.allclose(p.grad, want[n], atol=1e-6), (second, n)


@pytest.mark.parametrize("kernels", ["torch", "auto"])
def test_mamba_trains_under_bfloat16_autocast(kernels):
    # the scans (PyTorch's, or the compiled one where it builds) run in float32 inside; the loss
    # stays close to the float32 one and every parameter gets a finite gradient
    model, ids, labels = tiny_mamba_batch(kernels)
    full = model(ids, labels=labels).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(ids, labels=labels).loss
        logits = model(ids).logits
    loss.backward()
    assert abs(loss.item() - full.item()) < 0.02 and logits.dtype == torch.bfloat16
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


needs_compiler = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler: the compiled scan is not built")


@needs_compiler
def test_compiled_scan_matches_reference_values_and_gradients():
    assert torch.autograd.gradcheck(cpu_kernels.selective_scan_cpu, inputs(7))
    assert_same_values_and_gradients(cpu_kernels.selective_scan_cpu,
                                     lambda *t: selective_scan_reference(*t)[0], seed=8)
    # float32 (training's dtype) against the float64 reference, at Mamba's layout sizes
    x, dt, A, Bm, C = (t.detach() for t in inputs(9, B=4, L=37, E=16, N=16))
    y32 = cpu_kernels.selective_scan_cpu(*(t.float() for t in (x, dt, A, Bm, C)))
    assert y32.dtype == torch.float32
    assert torch.allclose(y32.double(), selective_scan_reference(x, dt, A, Bm, C)[0], atol=1e-5)


@needs_compiler
@pytest.mark.parametrize("E", [512, 40])
def test_compiled_scan_in_float32_at_width_256(E):
    # Mamba's sizes at width 256 (E = 512 channels, 32 blocks of 16) and a width whose channels
    # end in a partial block (40 = 2 x 16 + 8): float32 values and gradients against the float64
    # reference, to float32 rounding (relative to each tensor's scale)
    x, dt, A, Bm, C = (t.detach() for t in inputs(12, B=2, L=37, E=E, N=16))
    w = torch.randn(2, 37, E, generator=torch.Generator().manual_seed(13), dtype=torch.float64)
    wanted = [t.clone().requires_grad_() for t in (x, dt, A, Bm, C)]
    (selective_scan_reference(*wanted)[0] * w).sum().backward()
    got = [t.float().requires_grad_() for t in (x, dt, A, Bm, C)]
    y32 = cpu_kernels.selective_scan_cpu(*got)
    (y32 * w.float()).sum().backward()
    y64 = selective_scan_reference(x, dt, A, Bm, C)[0]
    assert (y32.double() - y64).abs().max() <= 1e-5 * y64.abs().max()
    for a, b in zip(got, wanted):
        assert (a.grad.double() - b.grad).abs().max() <= 1e-5 * b.grad.abs().max()


def test_the_compiled_scans_flop_count():
    # what a FLOP count adds by hand for the kernel (benchmarks/bench_models.py): per state element
    # 7 operations forward and 20 backward, over rows x length x state x channels
    assert cpu_kernels.scan_flops(2, 3, 4, 5, backward=False) == 7 * 120
    assert cpu_kernels.scan_flops(32, 37, 16, 512) == 27 * 32 * 37 * 16 * 512


def test_kernel_calls_take_a_thread_per_share_of_work():
    # torch's threads, but no more than one per WORK_PER_THREAD operations, and at least one
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        unit = cpu_kernels.WORK_PER_THREAD
        assert [cpu_kernels._threads_for(w) for w in (0, unit - 1, 2 * unit, 3 * unit + 5, 100 * unit)] == \
            [1, 1, 2, 3, 4]
    finally:
        torch.set_num_threads(threads)


@needs_compiler
def test_compiled_scan_with_very_large_steps():
    # dt up to 1e4 (a model trained at a high rate): decays far below exp(-80), which the kernel
    # clamps there (its fast path); y still matches the float64 reference in float32
    x, dt, A, Bm, C = (t.detach() for t in inputs(11, B=4, L=37, E=16, N=16))
    dt = dt * torch.logspace(-2, 4, 37, dtype=dt.dtype)[None, :, None]
    y32 = cpu_kernels.selective_scan_cpu(*(t.float() for t in (x, dt, A, Bm, C)))
    y64 = selective_scan_reference(x, dt, A, Bm, C)[0]
    assert torch.isfinite(y32).all()
    assert torch.allclose(y32.double(), y64, rtol=1e-4, atol=1e-3 * y64.abs().max().item())


@needs_compiler
def test_compiled_scan_with_one_A_per_row_under_vmap_and_split_between_threads(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "WORK_PER_THREAD", 1)    # split even these small calls
    x, dt, A, Bm, C = inputs(10, B=5)
    A_rows = (A[None] * torch.linspace(0.5, 2.0, 5, dtype=A.dtype)[:, None, None]).detach().requires_grad_()
    assert torch.autograd.gradcheck(cpu_kernels.selective_scan_cpu, (x, dt, A_rows, Bm, C))
    # rows split between 3 threads (1, 2 and 2 rows) give the 1-thread result exactly, values and
    # gradients (each row is computed by one thread alone)
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 3):
            torch.set_num_threads(n)
            y = cpu_kernels.selective_scan_cpu(x, dt, A_rows, Bm, C)
            results.append((y, *torch.autograd.grad(y.sum(), (x, dt, A_rows, Bm, C))))
        assert all(torch.equal(a, b) for a, b in zip(*results))
    finally:
        torch.set_num_threads(threads)
    K_A = torch.stack([A.detach(), 0.3 * A.detach()]).requires_grad_()
    K_C = torch.stack([C.detach(), -C.detach()]).requires_grad_()
    ys = torch.func.vmap(cpu_kernels.selective_scan_cpu, in_dims=(None, None, 0, None, 0))(x, dt, K_A, Bm, K_C)
    w = torch.randn_like(ys)
    (ys * w).sum().backward()
    for k in range(2):
        a, c = K_A.detach()[k].clone().requires_grad_(), K_C.detach()[k].clone().requires_grad_()
        y_k = selective_scan_reference(x.detach(), dt.detach(), a, Bm.detach(), c)[0]
        (y_k * w[k]).sum().backward()
        assert torch.allclose(ys[k], y_k, atol=1e-12)
        assert torch.allclose(K_A.grad[k], a.grad, atol=1e-10) and torch.allclose(K_C.grad[k], c.grad, atol=1e-10)


@needs_compiler
def test_mamba_on_the_compiled_scan_equals_the_pytorch_path():
    # the whole model, on the training path (answer-only last layer) and on full logits:
    # kernels="auto" takes the compiled scan on a CPU, "torch" the PyTorch one
    assert cpu_scan("mamba", "auto", torch.device("cpu")) is cpu_kernels.selective_scan_cpu
    assert cpu_scan("mamba", "torch", torch.device("cpu")) is None
    losses, grads = {}, {}
    for kernels in ("torch", "auto"):
        model, ids, labels = tiny_mamba_batch(kernels)
        model.double()
        loss = model(ids, labels=labels).loss
        loss.backward()
        losses[kernels] = (loss.item(), model(ids).logits.detach())
        grads[kernels] = {n: p.grad for n, p in model.named_parameters()}
    assert abs(losses["torch"][0] - losses["auto"][0]) < 1e-12
    assert torch.allclose(losses["torch"][1], losses["auto"][1], atol=1e-12)
    for n, g in grads["torch"].items():
        assert torch.allclose(grads["auto"][n], g, atol=1e-10), n


def test_a_compiler_that_fails_leaves_the_pytorch_path(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("HF_MECHEVAL_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setenv("CXX", "false")                    # a "compiler" that always fails
    assert cpu_kernels.kernel_library.__wrapped__() is None
    assert not list((tmp_path / "kernels").glob("*.so"))  # nothing half-built is left to load
    # a cache "folder" that is a file (cannot be created): None, not an error
    monkeypatch.delenv("CXX")
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("HF_MECHEVAL_KERNEL_CACHE", str(tmp_path / "a-file" / "kernels"))
    assert cpu_kernels.kernel_library.__wrapped__() is None
    # no source (a checkpoint's copy of the code) or no compiler at all: None as well
    monkeypatch.setattr(cpu_kernels, "SOURCES", (tmp_path / "missing.cpp", *cpu_kernels.SOURCES[1:]))
    assert cpu_kernels.kernel_library.__wrapped__() is None


@needs_compiler
def test_the_compiled_library_is_cached_per_source_and_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_MECHEVAL_KERNEL_CACHE", str(tmp_path))
    first = cpu_kernels.kernel_library.__wrapped__()
    built = list(tmp_path.glob("cpu_kernels-*.so"))
    assert first is not None and len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    assert cpu_kernels.kernel_library.__wrapped__() is not None      # loads the cached build
    assert built[0].stat().st_mtime_ns == stamp and list(tmp_path.glob("*.so")) == built
    # another source is another build
    changed = tmp_path / "changed.cpp"
    changed.write_text(cpu_kernels.SOURCES[0].read_text() + "\n// changed\n")
    for header in (p for p in cpu_kernels.SOURCES if p.suffix == ".h"):          # included beside it
        (tmp_path / header.name).write_text(header.read_text())
    monkeypatch.setattr(cpu_kernels, "SOURCES", (changed, *cpu_kernels.SOURCES[1:]))
    assert cpu_kernels.kernel_library.__wrapped__() is not None
    assert len(list(tmp_path.glob("*.so"))) == 2


# --------------------------------------------------------------------------- the fused options
def fused_reference(x, dt_raw, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """What the compiled kernel computes with its options, written out in PyTorch as the mixer's
    PyTorch path does: dt = softplus(dt_raw + bias), y = scan + D x, out = y silu(z)."""
    dt = dt_raw if delta_bias is None else dt_raw + delta_bias
    dt = F.softplus(dt) if delta_softplus else dt
    y = selective_scan_reference(x, dt, A, B, C)[0]
    y = y if D is None else y + D * x
    return y if z is None else y * F.silu(z)


def fused_inputs(seed, B=3, L=9, E=5, N=4, dtype=torch.float64):
    """x, dt_raw (around -2: softplus of it ~0.1, Mamba's range, with a tail past the threshold
    20 and below -20), A, B, C, D, z, delta_bias."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, E, generator=g, dtype=dtype)
    dt_raw = torch.randn(B, L, E, generator=g, dtype=dtype) - 2
    dt_raw.view(-1)[::17] = 21.0                      # past softplus's threshold: dt = dt_raw
    dt_raw.view(-1)[5::19] = -30.0
    A = -torch.rand(E, N, generator=g, dtype=dtype) * 3
    Bm = torch.randn(B, L, N, generator=g, dtype=dtype)
    C = torch.randn(B, L, N, generator=g, dtype=dtype)
    D = torch.randn(E, generator=g, dtype=dtype)
    z = torch.randn(B, L, E, generator=g, dtype=dtype) * 2
    bias = torch.randn(E, generator=g, dtype=dtype) * 0.5
    return x, dt_raw, A, Bm, C, D, z, bias


OPTIONS = [dict(D=True, z=True, delta_bias=True, delta_softplus=True),   # the mixer's full path
           dict(D=True, z=False, delta_bias=True, delta_softplus=True),  # its answer-only last layer
           dict(D=False, z=True, delta_bias=False, delta_softplus=False),
           dict(D=False, z=False, delta_bias=True, delta_softplus=False),
           dict(D=False, z=False, delta_bias=False, delta_softplus=True)]


def _with_options(tensors, options):
    x, dt_raw, A, Bm, C, D, z, bias = tensors
    if not options["delta_softplus"]:                 # dt itself: positive, Mamba's size
        dt_raw, bias = dt_raw.sigmoid() * 0.2, bias.abs() * 0.1
    return [x, dt_raw, A, Bm, C, D if options["D"] else None, z if options["z"] else None,
            bias if options["delta_bias"] else None]


def _values_and_gradients(fn, tensors, softplus, w):
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in tensors]
    y = fn(*leaves, delta_softplus=softplus)
    (y * w.to(y.dtype)).sum().backward()
    return y, [None if t is None else t.grad for t in leaves]


@needs_compiler
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "+".join(k for k, v in o.items() if v))
def test_compiled_scan_options_match_the_pytorch_form(options):
    # softplus(dt_raw + bias), + D x and * silu(z) taken into the kernel (as mamba-ssm's
    # selective_scan_fn takes them) against the same steps in PyTorch around the reference scan:
    # values and the gradients of every input, float64, to 1e-12 / 1e-10 of each tensor's largest
    # entry (the two sum the same terms in another order); gradcheck on a smaller case
    tensors = _with_options(fused_inputs(20), options)
    softplus = options["delta_softplus"]
    small = [None if t is None else t[:2, :5].detach().clone().requires_grad_() if t.dim() == 3
             else t.detach().clone().requires_grad_() for t in tensors]
    assert torch.autograd.gradcheck(lambda *t: cpu_kernels.selective_scan_cpu(*t, delta_softplus=softplus), small)
    w = torch.randn(3, 9, 5, generator=torch.Generator().manual_seed(21), dtype=torch.float64)
    y, grads = _values_and_gradients(cpu_kernels.selective_scan_cpu, tensors, softplus, w)
    y_ref, grads_ref = _values_and_gradients(fused_reference, tensors, softplus, w)
    assert (y - y_ref).abs().max() <= 1e-12 * y_ref.abs().max()
    for got, want in zip(grads, grads_ref):
        assert (got is None) == (want is None)
        if got is not None:
            assert (got - want).abs().max() <= 1e-10 * want.abs().max()


@needs_compiler
@pytest.mark.parametrize("E", [512, 40])
def test_compiled_scan_options_in_float32_at_width_256(E):
    # the mixer's two calls at width 256 (E = 512 channels; 40 ends in a partial block): float32
    # values and gradients against the float64 PyTorch form. Tolerance 1e-5 of each tensor's
    # largest entry: float32's rounding step is 6e-8, and sums over the 37 positions and 16 states
    # of terms as large as the result gather up to a few hundred of them (the plain compiled scan
    # is held to the same bound above)
    tensors = fused_inputs(22, B=2, L=37, E=E, N=16)
    w = torch.randn(2, 37, E, generator=torch.Generator().manual_seed(23), dtype=torch.float64)
    for options in OPTIONS[:2]:
        chosen = _with_options(tensors, options)
        y32, grads32 = _values_and_gradients(cpu_kernels.selective_scan_cpu,
                                             [None if t is None else t.float() for t in chosen], True, w)
        y64, grads64 = _values_and_gradients(fused_reference, chosen, True, w)
        assert y32.dtype == torch.float32
        assert (y32.double() - y64).abs().max() <= 1e-5 * y64.abs().max()
        for got, want in zip(grads32, grads64):
            if want is not None:
                assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()


@needs_compiler
def test_compiled_softplus_equals_torchs_to_float32_rounding():
    # the kernel's own softplus and its slope (vector exp and log in float32): with A = 0 and
    # x = B = C = 1 at one position, out = dt = softplus(dt_raw) and d out / d dt_raw = sigmoid
    # (1 past the threshold 20). Within 5 float32 rounding steps (3e-7, relative) of the float64
    # values wherever dt_raw >= -80 (torch's own float32 softplus is up to 2.1e-7 off them); below
    # that the kernel's exp stops at exp(-80), and both are below 2e-35
    v = torch.cat([torch.linspace(-100, 100, 20001), torch.tensor([-80.0, 19.99, 20.0, 20.01, 1e-8, 0.0])])
    E = v.numel()
    raw = v.view(1, 1, E).clone().requires_grad_()
    ones = torch.ones(1, 1, 1)
    out = cpu_kernels.selective_scan_cpu(torch.ones(1, 1, E), raw, torch.zeros(E, 1), ones, ones,
                                         delta_softplus=True)
    out.sum().backward()
    want = F.softplus(v.double())
    slope = torch.where(v > 20, 1.0, torch.sigmoid(v.double()))
    inside = v >= -80
    for got, ref in ((out.view(-1), want), (raw.grad.view(-1), slope)):
        assert ((got.double() - ref).abs() / ref)[inside].max() <= 3e-7
        assert (got.double() - ref).abs()[~inside].max() <= 2e-35


@needs_compiler
def test_compiled_scan_options_under_vmap():
    # stacked copies, each with its own D and bias (and A), the inputs shared: per-copy values and
    # gradients equal a loop over the copies
    x, dt_raw, A, Bm, C, D, z, bias = fused_inputs(24)
    K_D = torch.stack([D, -0.5 * D]).requires_grad_()
    K_bias = torch.stack([bias, bias + 1]).requires_grad_()
    K_A = torch.stack([A, 0.3 * A]).requires_grad_()
    fn = lambda a, d, b: cpu_kernels.selective_scan_cpu(x, dt_raw, a, Bm, C, d, z, b, True)
    ys = torch.func.vmap(fn)(K_A, K_D, K_bias)
    w = torch.randn_like(ys)
    (ys * w).sum().backward()
    for k in range(2):
        a, d, b = (t.detach()[k].clone().requires_grad_() for t in (K_A, K_D, K_bias))
        y_k = fused_reference(x, dt_raw, a, Bm, C, d, z, b, True)
        (y_k * w[k]).sum().backward()
        assert (ys[k] - y_k).abs().max() <= 1e-12
        for got, want in ((K_A.grad[k], a.grad), (K_D.grad[k], d.grad), (K_bias.grad[k], b.grad)):
            assert (got - want).abs().max() <= 1e-10


@needs_compiler
def test_a_float32_training_step_on_the_fused_kernel_equals_the_pytorch_path():
    # the training step as a run takes it (float32; width 64: 128 channels, 8 blocks of the
    # kernel; layer 0 on the full path with D and the gate in the kernel, layer 1 on the
    # answer-only path): loss and every parameter's gradient, compiled against PyTorch, to 1e-5 of
    # each gradient's largest entry (float32 rounding, 6e-8, through two layers' sums)
    assert_training_step_equal_across_kernels("mamba", torch.float32, 1e-6, 1e-5, hidden_size=64, d_state=16)


@needs_compiler
def test_the_kernels_float32_exp_is_within_two_rounding_steps():
    # the decays exp(dt A) the float32 scan computes on its vectors: with x = (1, 0), B = C = 1
    # and dt = 1 over two positions, y_1 = exp(A) exactly; within 1e-7 (1.7 float32 rounding
    # steps, relative) of the float64 exp over [-80, 80]; below -80 the kernel stops at exp(-80)
    a = torch.linspace(-80, 80, 160001)
    E = a.numel()
    x = torch.zeros(1, 2, E)
    x[:, 0] = 1
    ones = torch.ones(1, 2, 1)
    y = cpu_kernels.selective_scan_cpu(x, torch.ones(1, 2, E), a[:, None], ones, ones)
    want = a.double().exp()
    assert ((y[0, 1].double() - want).abs() / want).max() <= 1e-7

"""H3 (Fu et al. 2023, "Hungry Hungry Hippos: Towards Language Modeling with State Space Models").

    q, k, v = Wq x, Wk x, Wv x                       each (B, L, D), split into H = D / P heads of size P
    k       = shift_ssm(k)                            learned causal kernel of length d_state per channel
    S_h     = diag_ssm(k_h v_h^T)                     per head: P*P outer-product channels (i, j)
    y_h[j]  = sum_i q_h[i] * S_h[i, j]                q contracts with k's index, as in attention
    out     = Wo concat_h(y_h)

Two forms, chosen by the config's ``ssm_form`` (the mixers "h3", :class:`H3Reference`, and
"h3_v1", :class:`H3MechEvalV1`, subclasses of :class:`H3`); both share the projections (``q_proj``, ``k_proj``, ``v_proj``,
``out_proj``: Linear with bias, drawn N(0, 0.02) with zero bias by the model's ``_init_weights``,
as the reference's ``_init_weights`` draws them — its output projection is named
``output_linear`` there, so it is not rescaled), the sites, the recurrent form and the
answer-position path.

"reference" (the default): as the paper's reference code, its zoology fork's
``zoology/mixers/h3/h3.py`` instantiated as ``H3(d_model, l_max=1024, d_state=1024, head_dim=2)``
with empty ``kernel_args`` (tinylang's ``model/zoology.py``), whose kernels are
``ss_kernel.py``'s ``SSKernel`` in mode 'shift' (``ss_kernel_shift.py``) and with its defaults
(``ss_kernel_diag.py``, initialised by ``dplr.py``). N = d_state, D = hidden_size, P = head_dim.

* Shift SSM on k (:class:`ShiftSSM`; the reference's ``ssm_k_kernel``), one per model channel c:

      x_t = S x_{t-1} + B u_t,   y_t = C · x_t        x_t in R^N, S the shift (x_t[n] = x_{t-1}[n-1])
      K_shift[c, l] = sum_m B[c, m] C[c, m + l]        l < min(N, L), 0 beyond;  (D, L)

  B (D, N) and C (D, N; the reference's has a leading ``channels`` axis of 1) are both trained;
  B starts as e_0 (so K_shift = C at first), C as
  ``kaiming_uniform_(a=sqrt(5))`` of a (D, 1, N) tensor, i.e. U(+-1/sqrt(N)) (nn.Conv1d's init).
  The reference computes K_shift as a cross-correlation by FFTs of size 2N, as here. Then, with a
  separate skip ``ssm_k_D`` (D,) ~ N(0, 1):

      k <- K_shift * k + ssm_k_D k                    (* = causal convolution along the sequence)

* Diagonal SSM on kv (:class:`DiagonalSSM`; the reference's ``kernel``): S4D-Lin, complex and
  diagonal, ONE SSM per head h (SSKernel's H = D / P copies, ``channels`` 1), shared by the head's
  P*P outer-product channels (i, j). SSKernel's defaults: mode "diag", measure "diag-lin",
  dt_min 1e-3, dt_max 0.1, discretisation "bilinear", real_type "exp". Per head h and complex mode
  n < N/2 (the N/2 modes stand for N/2 conjugate pairs of an N-state real SSM):

      dt_h = exp(log_dt_h),       log_dt ~ U(log 1e-3, log 1e-1)                        (H,)
      A    = -exp(inv_A_real) + i A_imag,  inv_A_real = log(1/2), A_imag = π n at init   (H, N/2)
      B    = 1 + 0i at init (trained)                                                   (H, N/2)
      C    ~ complex normal, E|C|^2 = 1 (real and imaginary parts N(0, 1/2))            (H, N/2)
      bilinear:  dA = (1 + dt A / 2) / (1 - dt A / 2),   dB = dt B / (1 - dt A / 2)
      h_t = dA h_{t-1} + dB u_t  (complex),   y_t = 2 Re(C · h_t) + D_h u_t
      K[h, l] = 2 Re sum_n C dB dA^l                                                    (H, L)

  The reference computes K with ``log_vandermonde``: sum_n C dB exp(l log dA), real part times 2;
  this module takes the same sum with the powers by repeated multiplication
  (:class:`ConjugatePairTaps`: no (H, N/2, L) complex tensor; tested against the Vandermonde
  form). Its skip ``D`` is per head, (H,) ~ N(0, 1). (The reference keeps B and C as real views
  (..., 2) of complex tensors, C with a leading ``channels`` axis of 1 that is dropped here, and
  stores C conjugated, which changes nothing in distribution.)

  Trained: log_dt, inv_A_real, A_imag, B, C, D, and the shift SSM's B, C and ssm_k_D. The
  reference registers log_dt, A and B (and the shift's B) with ``_optim = {"weight_decay": 0}``
  and no learning rate of its own (``lr`` is None), but the paper's training loop builds
  ``torch.optim.AdamW(model.parameters(), lr, weight_decay)``, which ignores ``_optim``: every
  parameter trains at the global rate and weight decay, as here.

* Heads (the reference's forward): kv[i, j, h] = k[h P + i] v[h P + j] (channel order (i, j, h),
  as its ``b d1 d2 h l``); s = K_h * kv + D_h kv; o[j, h] = sum_i q[h P + i] s[i, j, h]; the
  output projection reads o in the order (j, h) (its ``b (d h) l``), i.e. input column j H + h.

  Differences kept: the reference truncates both kernels to l_max = 1024 taps, which changes
  nothing up to 1024 tokens (hf-mecheval has no l_max: the kernels are defined at any length); it
  runs the long convolutions in float32 by FFT, this module as ``causal_conv`` does (direct or FFT,
  in the activations' dtype).

The ``state`` site of the reference form is the diagonal SSM's state trajectory as the state of
the equivalent REAL system: h (B, L, C, N/2) complex shown as (B, L, C, N/2, 2) = (Re h, Im h).
Each complex mode is a real 2-vector that evolves by the 2x2 rotation-scaling block
[[Re dA, -Im dA], [Im dA, Re dA]] and is read out as 2 (Re C Re h - Im C Im h). That is a real
tensor the size of v1's (B, L, C, N) for the same d_state, the system stays linear in it, so a patch
(of any real coordinate, independently) propagates to later positions by the same rule as v1's
(``through_state_site``, with the 2x2 block as the transition); a complex tensor would need every
tool that reads or writes sites (caches, in-place patches, comparisons) to handle complex dtypes.

"mecheval-v1": hf-mecheval's first H3, kept so that its checkpoints load and compute as before
(:class:`H3MechEvalV1`, parameters and values unchanged for the same seed):

The shift SSM has A = shift matrix, B = e_0, so its kernel is its C: K_shift[c, l] = C[c, l]
for l < d_state (tap 0 = the current input, so it also plays the part of a skip term); its
recurrent form is a shift register of the last d_state inputs. We keep that kernel in a
:class:`ShortConv` (width d_state), which gives the register for ``step`` for free.

The diagonal SSM has one set of parameters per model channel (h, j) — hidden_size of them, as in
H3, where the SSM is defined over the model's channels and broadcast over the key index of the
outer product. It is S4D-real: per channel c and state n, A[c, n] = -exp(A_log[c, n])
(initialised to -(n+1)), step size dt_c = exp(log_dt_c), zero-order-hold discretisation

    a = exp(dt A),   b = (exp(dt A) - 1) / A * B            (C, N)
    h_t = a * h_{t-1} + b * u_t,   s_t = sum_n C h_t + D u_t

ZOH on B keeps each state's gain b / (1 - a) = B / -A bounded whatever dt is (a bare B would
amplify slow channels by 1/(1 - a), up to ~1000x at dt = 1e-3). Unrolled, the SSM is the causal
convolution with kernel K[c, l] = sum_n C b a^l, which is what ``forward`` uses unless someone
wants the state trajectory (see ``self.state``).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .convolutions import ShortConv
from .kernels import cpu_bilinear_taps, cpu_h3_kept_heads, cpu_shift_taps
from .ops_long_conv import causal_conv
from .ops_state_patch import lti_state_patch_effect, lti_states_at
from .ops_ssm_taps import ConjugatePairTaps, PowerSumTaps
from .recurrent_cache import RecurrentStateLayer, WindowAndRecurrentState
from .sites import Site, through_state_site
from .mixers import at_positions, zero_padding
from .errors import ConfigError
from .configuration_mecheval import MechEvalConfig, FILTER_FORMS, check_choice, check_divides_hidden, check_int
from .registry import ArchitectureSpec, register_architecture


class MechEvalH3Config(MechEvalConfig):
    """H3: shift SSM on K, diagonal SSM on K·V (per head, head_dim x head_dim), Q gating."""

    model_type = "mecheval-h3"
    d_state: int = 1024
    """State size N of the diagonal SSM (in the "reference" form N/2 complex modes, as the
    reference's S4D kernel) and length of the shift SSM's register."""
    head_dim: int = 2
    ssm_form: str = "reference"
    """Form of the two SSMs. "reference" = the paper's reference code's (its zoology fork's ``H3``
    with empty ``kernel_args``): a shift SSM with trainable B and C plus its own skip ``ssm_k_D``
    on K; an S4D-Lin diagonal SSM (complex, A = -1/2 + iπn, N/2 modes, bilinear discretisation)
    and a skip D per head, shared by the head's head_dim x head_dim outer-product channels.
    "mecheval-v1" = hf-mecheval's first: the shift SSM as a short convolution of width d_state
    (no separate skip), a real S4D diagonal SSM (A = -(n+1), zero-order hold) and a skip per model
    channel (the checkpoints made before this field existed). See the module's docstring."""

    LEGACY_FIELDS = {**MechEvalConfig.LEGACY_FIELDS, "ssm_form": "mecheval-v1"}

    def validate_fields(self) -> None:
        super().validate_fields()
        check_int(self, "d_state", minimum=1)
        check_divides_hidden(self, "head_dim")
        check_choice(self, "ssm_form", FILTER_FORMS)
        if self.ssm_form == "reference" and self.d_state < 2:
            raise ConfigError("d_state", f"must be >= 2 in the reference form (d_state / 2 complex modes), "
                                         f"got {self.d_state}")

    def layer_mixers(self) -> list[str]:
        return ["h3" if self.ssm_form == "reference" else "h3_v1"] * self.num_hidden_layers


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The real dtype the reference form's SSMs are computed in: the parameters' own, at least
    float32 (the reference computes its kernels in float32; complex32 is barely supported)."""
    return torch.promote_types(t.dtype, torch.float32)


def _powers(dA: torch.Tensor, lags: torch.Tensor) -> torch.Tensor:
    """dA^lag for complex dA (..., N/2) and integer lags (T,) -> (..., N/2, T), in polar form
    |dA|^lag e^(i lag arg dA) (torch's complex ``**`` took 1.8 s for H3's at width 64 on a CPU,
    complex exp 0.8 s)."""
    lags = lags.to(dA.real.dtype)
    return torch.polar(dA.abs()[..., None] ** lags, dA.angle()[..., None] * lags)


def _smooth_size(m: int) -> int:
    """The smallest n >= m whose prime factors are 2, 3 and 5 only (a fast FFT size)."""
    n = m
    while True:
        rest = n
        for p in (2, 3, 5):
            while rest % p == 0:
                rest //= p
        if rest == 1:
            return n
        n += 1


# --- the reference form's two SSMs -----------------------------------------------------------

# The most lags of the shift SSM's kernel taken directly (compiled) rather than by FFT: at 64 the
# two took the same time (64 channels, N 64), at 128 the FFTs were as fast or faster.
SHIFT_LAGS_DIRECT_MAX = 64


class ShiftSSM(nn.Module):
    """The reference's shift SSM (``SSKernelShift``), one per channel: state x in R^N,

        x_t = S x_{t-1} + B u_t   (S shifts by one: x_t[n] = x_{t-1}[n-1]),   y_t = C · x_t

    B, C (channels, N), both trained. Its convolution kernel is the cross-correlation of B and C,
    K[c, l] = sum_m B[c, m] C[c, m + l] (0 for l >= N)."""

    def __init__(self, channels: int, N: int, kernels: str = "torch"):
        super().__init__()
        self.channels, self.N = channels, N
        self.kernels = kernels                 # on a CPU under "auto": the kernel lag by lag, compiled (``kernel``)
        self.B = nn.Parameter(torch.empty(channels, N))
        self.C = nn.Parameter(torch.empty(channels, N))
        self.init_mecheval_parameters()

    @torch.no_grad()
    def init_mecheval_parameters(self) -> None:
        """B = e_0; C ~ U(+-1/sqrt(N)) (the reference's kaiming_uniform_(a=sqrt(5)) of a (channels,
        1, N) tensor: fan_in N, gain sqrt(1/3), bound sqrt(1/3) * sqrt(3/N))."""
        self.B.zero_()
        self.B[:, 0] = 1.0
        bound = 1 / math.sqrt(self.N)
        self.C.uniform_(-bound, bound)

    def kernel(self, L: int) -> torch.Tensor:
        """K (channels, L): column l = weight on the input l steps back. By FFTs, as the reference,
        but of the smallest size n >= N + T - 1 with no prime factor above 5, T = min(N, L) the
        lags wanted: no wrap-around, since m + l <= N + T - 2 < n (the reference's size 2N is
        that bound at L >= N). Measured on one CPU thread at 256 channels, N 1 024, L 37: forward
        + backward 16.7 ms at size 2 048, 3.4 ms at size 1 080.

        On a CPU under ``kernels`` "auto", up to SHIFT_LAGS_DIRECT_MAX lags, the compiled kernel
        takes the T lags directly instead (``cpu_kernels.shift_taps_cpu``, T N multiply-adds each
        way): at 256 channels, N 1 024, T 37, ~2.5 ms forward and backward against ~5-14 ms by the
        FFTs, one thread beside two trainings; at T 128 the FFTs were as fast or faster."""
        N, T = self.N, min(self.N, L)
        B, C = self.B.to(_compute_dtype(self.B)), self.C.to(_compute_dtype(self.C))
        compiled = cpu_shift_taps(self.kernels, B.device) if T <= SHIFT_LAGS_DIRECT_MAX else None
        if compiled is not None:
            K = compiled(B, C, T)                                              # (channels, T)
        else:
            n = _smooth_size(N + T - 1)
            corr = torch.fft.irfft(torch.fft.rfft(B, n=n).conj() * torch.fft.rfft(C, n=n), n=n)   # (channels, n)
            K = corr[:, :T]
        return F.pad(K, (0, max(0, L - N))).to(self.C.dtype)

    def step(self, u_t: torch.Tensor, x: torch.Tensor | None):
        """u_t: (B, channels); x: (B, channels, N) state (None = zeros). Returns (y_t, x)."""
        if x is None:
            x = u_t.new_zeros(*u_t.shape, self.N)
        x = F.pad(x[..., :-1], (1, 0)) + self.B * u_t[..., None]       # shift by one, then B u_t
        return (x * self.C).sum(-1), x


class DiagonalSSM(nn.Module):
    """The reference's S4D-Lin kernel (``SSKernelDiag`` as ``SSKernel``'s defaults build it): H
    independent complex diagonal SSMs of N/2 modes, bilinear discretisation (module docstring).

    Parameters (real tensors; complex ones as (..., 2) = (real, imaginary), as the reference
    keeps them): log_dt (H,), inv_A_real (H, N/2), A_imag (H, N/2), B (H, N/2, 2), C (H, N/2, 2).
    ``kernels``: the mixer's mode, under which the taps run compiled on a CPU (``kernel``)."""

    def __init__(self, H: int, N: int, dt_min: float = 1e-3, dt_max: float = 1e-1, kernels: str = "torch"):
        super().__init__()
        self.H, self.modes = H, N // 2
        self.kernels = kernels
        self.dt_min, self.dt_max = dt_min, dt_max
        self.log_dt = nn.Parameter(torch.empty(H))
        self.inv_A_real = nn.Parameter(torch.empty(H, self.modes))
        self.A_imag = nn.Parameter(torch.empty(H, self.modes))
        self.B = nn.Parameter(torch.empty(H, self.modes, 2))
        self.C = nn.Parameter(torch.empty(H, self.modes, 2))
        self.init_mecheval_parameters()

    @torch.no_grad()
    def init_mecheval_parameters(self) -> None:
        """S4D-Lin (``dplr.py``, scaling "lin"): A = -1/2 + iπn; B = 1; C complex normal with
        E|C|^2 = 1 (torch.randn of a complex dtype: each part N(0, 1/2)); dt log-uniform in
        [dt_min, dt_max]."""
        lo, hi = math.log(self.dt_min), math.log(self.dt_max)
        self.log_dt.uniform_(0, 1).mul_(hi - lo).add_(lo)
        self.inv_A_real.fill_(math.log(0.5))
        self.A_imag.copy_(math.pi * torch.arange(self.modes, dtype=self.A_imag.dtype,
                                                 device=self.A_imag.device).expand(self.H, -1))
        self.B.zero_()
        self.B[..., 0] = 1.0
        self.C.normal_(0.0, math.sqrt(0.5))

    def discretize_complex(self):
        """Bilinear: dA = (1 + dt A / 2) / (1 - dt A / 2), dB = dt B / (1 - dt A / 2); returns dA,
        dB and C, each (H, N/2) complex. Readable, in complex arithmetic (for tests);
        ``discretize`` computes the same in real arithmetic."""
        real = _compute_dtype(self.log_dt)
        dt = torch.exp(self.log_dt.to(real))[:, None]                               # (H, 1)
        A = torch.complex(-torch.exp(self.inv_A_real.to(real)), self.A_imag.to(real))   # (H, N/2)
        B = torch.complex(self.B[..., 0].to(real), self.B[..., 1].to(real))
        C = torch.complex(self.C[..., 0].to(real), self.C[..., 1].to(real))
        half = dt * A / 2
        return (1 + half) / (1 - half), dt * B / (1 - half), C

    def discretize(self):
        """The bilinear discretisation, dA, dB and C each (H, N/2) complex: ``discretize_complex``'s
        values (to rounding) in real arithmetic: with dt A / 2 = x + i y and
        den = (1 - x)^2 + y^2, 1 / (1 - dt A / 2) = ((1 - x) + i y) / den, so

            dA = (1 - x^2 - y^2 + 2 i y) / den,   dB = dt (B_re + i B_im) ((1 - x) + i y) / den.

        Complex division and its backward were ~8 ms of each H3 layer's training step (width 256,
        d_state 1 024, one CPU thread), these real products ~3 ms. Tested against ``discretize_complex``."""
        real = _compute_dtype(self.log_dt)
        dt = torch.exp(self.log_dt.to(real))[:, None]                               # (H, 1)
        x = -0.5 * dt * torch.exp(self.inv_A_real.to(real))                        # Re(dt A / 2), (H, N/2)
        y = 0.5 * dt * self.A_imag.to(real)                                         # Im(dt A / 2)
        one_minus_x = 1 - x
        y2 = y * y
        scale = 1 / (one_minus_x * one_minus_x + y2)                                # 1 / den
        dA = torch.complex((1 - x * x - y2) * scale, 2 * y * scale)
        B_re, B_im = self.B[..., 0].to(real), self.B[..., 1].to(real)
        gain = dt * scale
        dB = torch.complex((B_re * one_minus_x - B_im * y) * gain, (B_re * y + B_im * one_minus_x) * gain)
        C = torch.complex(self.C[..., 0].to(real), self.C[..., 1].to(real))
        return dA, dB, C

    def kernel(self, L: int) -> torch.Tensor:
        """K[h, l] = 2 Re sum_n C dB dA^l, (H, L) in the parameters' dtype: ``discretize``, then the
        powers by repeated multiplication (``ConjugatePairTaps``). Measured on one CPU thread at
        H 32, N/2 512: forward + backward ~8 ms at L 37 and ~90 ms at L 1024, peak ~2.4 MiB; the
        Vandermonde matrix of complex exponentials (``kernel_vandermonde``) took ~70 ms at L 37 and
        peaked at ~510 MiB at L 1024. On a CPU under ``kernels`` "auto", both steps and their
        backward in one compiled pass per head (``cpu_kernels.bilinear_taps_cpu``): at H 128, N/2
        512, L 37, one thread, nothing else running, ~1.4 ms forward and backward, where the
        discretisation's elementwise passes alone took ~2.8 ms and the taps after them, compiled
        on their own, ~1 more."""
        compiled = cpu_bilinear_taps(self.kernels, self.log_dt.device) if L >= 1 else None
        if compiled is not None:
            real = _compute_dtype(self.log_dt)
            params = (self.log_dt, self.inv_A_real, self.A_imag, self.B, self.C)
            return compiled(*(p.to(real) for p in params), L).to(self.log_dt.dtype)
        dA, dB, C = self.discretize()
        return ConjugatePairTaps.apply(C * dB, dA, L).to(self.log_dt.dtype)

    def kernel_vandermonde(self, L: int) -> torch.Tensor:
        """The same kernel as the reference writes it (its ``log_vandermonde``): the powers as the
        Vandermonde matrix exp(l log dA), (H, N/2, L) complex (readable; for tests)."""
        dA, dB, C = self.discretize()
        lags = torch.arange(L, device=dA.device, dtype=dA.real.dtype)
        powers = torch.exp(torch.log(dA)[..., None] * lags)                        # (H, N/2, L)
        K = 2 * torch.einsum("hn,hnl->hl", C * dB, powers).real                    # (H, L)
        return K.to(self.log_dt.dtype)


# --- the mixer --------------------------------------------------------------------------------


# PyTorch's kept-positions path (the reference form's compiled one, ``H3Reference._compiled_heads_at``,
# takes any number of kept positions) gathers a (B, k, L, C) window of u: cheaper than the whole
# convolution for one or two answers per row (AR, ATR), dearer at four and more (MQAR's 4-64
# queries per document; three, not measured apart, takes the whole convolution too).
# Forward and backward of one layer, one CPU thread, batch 32, ms, kept path vs whole convolution
# then the kept positions: width 64 at L 128 (d_state 256), k = 1: 31 vs 71, 2: 29 vs 65, 4: 57 vs
# 45, 16: 239 vs 91; at L 37 (d_state 1 024), k = 16: 62 vs 14; width 128 at L 128, k = 16: 469
# vs 144. Both give the same values to float rounding.
KEPT_POSITIONS_PATH_MAX = 2

# The longest rows whose every position the compiled heads (``H3Reference._compiled_heads_at``)
# compute when no positions are kept, position by position (length^2 / 2 lags per channel), where
# PyTorch's path convolves whole rows. Forward and backward of one layer, one CPU thread, nothing
# else running, batch 32, median ms compiled vs PyTorch: width 256 at length 37 (d_state 1 024),
# 32 vs 38; width 64 (d_state 256) at 128, 31 vs 41; at 192, 57 vs 61; at 256, 88 vs 87 (the FFTs
# catching up).
COMPILED_WHOLE_ROWS_MAX = 128


class H3(WindowAndRecurrentState, nn.Module):
    """What both forms of the H3 mixer share (:class:`H3Reference`, registered as the mixer "h3",
    and :class:`H3MechEvalV1`, "h3_v1"; ``MechEvalH3Config.layer_mixers`` names the one its ``ssm_form``
    asks for): the projections, and the parallel, answer-position and recurrent forms, which
    call the form's own pieces:

        _shift(k) / _shift_step(k_t, state)     the shift SSM on k (its output is ``conv_output``)
        _outer(k, v), _contract(q, s)           the heads' outer products and the q contraction
        ssm_kernel(L) (C, L), _skip() (C,)      the diagonal SSM per outer-product channel, as a
                                                convolution kernel and skip
        _ssm_via_states(u), _ssm_step(u_t, h)   the diagonal SSM through its state (``state``)
        _compiled_heads_at(q, k, v, keep)       the heads' output (at ``keep``, or everywhere) in one
                                                compiled pass, or None (then the pieces above run)
    """

    def __init__(self, config, layer_idx: int):
        super().__init__()
        D, N, P = config.hidden_size, config.d_state, config.head_dim
        self.layer_idx = layer_idx
        self.ssm_form = config.ssm_form
        self.kernels = config.kernels                  # the direct long convolutions' path (ops_long_conv)
        self.hidden_size, self.d_state, self.head_dim = D, N, P
        self.num_heads = D // P
        # the outer product k v^T has H * P * P = D * P channels
        self.channels = self.num_heads * P * P

        self.q_proj = nn.Linear(D, D)
        self.k_proj = nn.Linear(D, D)
        self.v_proj = nn.Linear(D, D)
        self.out_proj = nn.Linear(D, D)

    accepts_keep = True

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, L, D) -> (B, L, D); with keep (B, k) positions (the answer-only training path,
        nothing observing the layer), the output at those positions only, (B, k, D). Padded keys
        are zeroed before the shift SSM (k_proj has a bias), so their outer products are zero."""
        L = x.shape[1]
        q, k, v = self.q_proj(x), zero_padding(self.k_proj(x), mask), self.v_proj(x)   # (B, L, D)
        k = self.conv_output(self._shift(k))                                   # (B, L, D)
        # whole states read or replaced at given positions (the intervention engine's,
        # ``Site.reading_entries`` / ``patching_entries``): in closed form below, without the
        # (B, L, C, N) trajectory, unless a hook wants the trajectory anyway
        read, patch = self.state.entry_read, self.state.entry_patch
        plain = read is None and patch is None and not self.state.wanted()
        if plain:
            compiled = self._compiled_heads_at(q, k, v, keep)                  # what the paths below compute
            if compiled is not None:
                return self.out_proj(compiled)
        u = self._outer(k, v)                                                  # (B, L, C)
        if self.state.wanted():
            s = self._ssm_via_states(u)
        elif plain and keep is not None and keep.shape[1] <= KEPT_POSITIONS_PATH_MAX:
            # the long convolution evaluated at the kept positions only
            # s_p = sum_l K[:, l] u_{p-l}: gather u at p - l (B, k, L, C), rather than the kernel at
            # p - t, whose backward (an index_put with accumulation) was slow on a CPU
            source = keep[:, :, None] - torch.arange(L, device=x.device)       # (B, k, L): p - l for lag l
            u_back = at_positions(u, source.clamp(min=0).flatten(1)).unflatten(1, source.shape[1:])
            u_back = u_back * (source >= 0)[..., None]                         # (B, k, L, C), 0 before t = 0
            s = (u_back * self.ssm_kernel(L).T).sum(2) + self._skip() * at_positions(u, keep)
            q = at_positions(q, keep)                                          # (B, k, D)
        else:  # fast path: the SSM unrolled into one long convolution
            s = causal_conv(u, self.ssm_kernel(L), kernels=self.kernels) + self._skip() * u   # (B, L, C)
            if read is not None or patch is not None:
                response, readout = self._state_kernels(L)                     # (L, C, *state) each
            if read is not None:
                rows, positions, found = read
                found.append(lti_states_at(u, rows, positions, response).to(u.dtype))
            if patch is not None:
                rows, positions, values = patch
                s = s + lti_state_patch_effect(u, rows, positions, values, response, readout)
            if keep is not None:                                               # many answers per row (MQAR)
                s, q = at_positions(s, keep), at_positions(q, keep)            # (B, k, C), (B, k, D)
        return self.out_proj(self._contract(q, s))

    def _compiled_heads_at(self, q, k, v, keep) -> torch.Tensor | None:
        """The heads' output at the kept positions, (B, k, D), or at every position (keep None),
        by a compiled kernel where the form has one and it runs (see H3Reference), else None."""
        return None

    def step(self, x_t: torch.Tensor, state=None, mask: torch.Tensor | None = None):
        """x_t: (B, D). state = (shift SSM state, diagonal SSM state) or None (each form's own:
        ``_shift_step`` and ``_ssm_step``)."""
        shift_state, h = (None, None) if state is None else state
        q, k, v = self.q_proj(x_t), zero_padding(self.k_proj(x_t), mask), self.v_proj(x_t)   # (B, D)
        k, shift_state = self._shift_step(k, shift_state)
        u = self._outer(k, v)                                                  # (B, C)
        s, h = self._ssm_step(u, h)
        return self.out_proj(self._contract(q, s)), (shift_state, h)


class H3Reference(H3):
    """The reference form (module docstring): shift SSM + skip ``ssm_k_D`` on k, S4D-Lin per head
    with skip ``D`` per head; outer-product channels in the order (i, j, h)."""

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        D, N, H = self.hidden_size, self.d_state, self.num_heads
        self.ssm_k_kernel = ShiftSSM(D, N, kernels=config.kernels)   # shift SSM on k, per model channel
        self.ssm_k_D = nn.Parameter(torch.empty(D))            # its skip
        self.kernel = DiagonalSSM(H, N, kernels=config.kernels)   # S4D-Lin, one per head
        self.D = nn.Parameter(torch.empty(H))                  # its skip, per head
        self.init_mecheval_parameters()

        self.conv_output = Site("shift-SSM output on K plus its skip ssm_k_D * K, (batch, length, hidden)")
        self.state = Site("diagonal SSM state trajectory as the equivalent real system: (Re h, Im h), "
                          "(batch, length, channels (i, j, head), d_state // 2, 2)", propagates_in_layer=True,
                          entry_access=True)

    @torch.no_grad()
    def init_mecheval_parameters(self) -> None:
        """The skips ssm_k_D and D ~ N(0, 1), as the reference draws them."""
        self.ssm_k_D.normal_()
        self.D.normal_()

    # --- heads: channel (i, j, h) of the outer product, output channel (j, h) -------------------

    def _per_channel(self, t: torch.Tensor) -> torch.Tensor:
        """(H, ...) per head -> (P*P*H, ...) per outer-product channel (i, j, h)."""
        P = self.head_dim
        return t.expand(P * P, *t.shape).flatten(0, 1)

    def _by_index_and_head(self, t: torch.Tensor) -> torch.Tensor:
        """(..., D) with channel h*P + i -> (..., P, H) indexed [i, h], contiguous: the products
        below then run over unit-stride rows of H (on strided views, forward + backward of
        ``_outer`` and ``_contract`` took ~26 ms at batch 32, length 37, width 256 on one CPU
        thread; ~6-10 ms with these copies of (..., D))."""
        return t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(-1, -2).contiguous()

    def _outer(self, k, v):
        """k, v: (..., D) -> kv (..., C), kv[i, j, h] = k[h P + i] v[h P + j] (the reference's
        ``b d1 d2 h``)."""
        k, v = self._by_index_and_head(k), self._by_index_and_head(v)          # (..., P, H)
        return (k[..., :, None, :] * v[..., None, :, :]).flatten(-3)           # (..., P, P, H) -> (..., C)

    def _contract(self, q, s):
        """q: (..., D), s: (..., C) -> o (..., D), o[j, h] = sum_i q[h P + i] s[i, j, h], in the
        reference's output order (j, h): channel j H + h. The sum over i as P products added in
        turn (a broadcast product of (..., P, P, H) and ``sum`` were ~2x slower on a CPU)."""
        P, H = self.head_dim, self.num_heads
        q, s = self._by_index_and_head(q), s.unflatten(-1, (P, P, H))          # (..., P, H), (..., P, P, H)
        o = q[..., 0, None, :] * s[..., 0, :, :]                               # (..., P, H) indexed [j, h]
        for i in range(1, P):
            o = o + q[..., i, None, :] * s[..., i, :, :]
        return o.flatten(-2)

    def _compiled_heads_at(self, q, k, v, keep) -> torch.Tensor | None:
        """On a CPU under ``kernels`` "auto": what ``forward`` computes from q, k, v at the kept
        positions (outer products, the diagonal SSM's convolution with its skip, the q contraction)
        in one compiled pass over each row (``cpu_kernels.h3_kept_heads_cpu``), q, k, v (B, L, D) ->
        (B, k, D), or without ``keep`` every position of rows up to COMPILED_WHOLE_ROWS_MAX tokens,
        (B, L, D); else None. For any number of kept positions: one layer's forward and backward,
        one CPU thread beside two trainings, batch 32, median ms in PyTorch -> compiled: width 256,
        length 37, one answer per row (AR), 51 -> 29 (the compiled steps themselves ~2 ms); width 64,
        length 128, 16 answers (MQAR, where PyTorch convolves whole rows), 51 -> 28; width 64,
        length 512, 64 answers, 261 -> 152."""
        B, L = q.shape[:2]
        compiled = cpu_h3_kept_heads(self.kernels, q.device)
        if compiled is None or (keep is None and L > COMPILED_WHOLE_ROWS_MAX):
            return None
        if keep is None:
            keep = torch.arange(L, device=q.device).expand(B, L)
        taps = self.kernel.kernel(L) + F.pad(self.D[:, None], (0, L - 1))      # (H, L): the skip D_h at lag 0
        return compiled(q, k, v, taps.T, keep, self.head_dim)                  # output channel j H + h

    def forward_with_state(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """forward(x, mask) and the state ``step`` continues from: (the shift SSM's state (B, D, N),
        the diagonal SSM's state in real coordinates (B, C, N/2, 2)), each summed in closed form."""
        L = x.shape[1]
        q, k_in, v = self.q_proj(x), zero_padding(self.k_proj(x), mask), self.v_proj(x)   # (B, L, D)
        k = self.conv_output(self._shift(k_in))
        u = self._outer(k, v)                                                  # (B, L, C)
        s = causal_conv(u, self.ssm_kernel(L), kernels=self.kernels) + self._skip() * u
        return self.out_proj(self._contract(q, s)), (self._shift_state_after(k_in), self._ssm_state_after(u))

    def _shift_state_after(self, k: torch.Tensor) -> torch.Tensor:
        """The shift SSM's state after reading k (B, L, D): x[n] = sum_{j <= n} B[n - j] k_{L-1-j}
        (the input j steps back, shifted n - j places since it entered through B), a causal
        convolution of the last N inputs, newest first, with B. -> (B, D, N)."""
        N, L = self.d_state, k.shape[1]
        newest_first = F.pad(k[:, max(0, L - N):].flip(1), (0, 0, 0, max(0, N - L)))   # (B, N, D)
        return causal_conv(newest_first, self.ssm_k_kernel.B.to(k.dtype), kernels=self.kernels).transpose(1, 2)

    def _ssm_state_after(self, u: torch.Tensor, chunk: int = 64) -> torch.Tensor:
        """The diagonal SSM's state after reading u (B, L, C): h = sum_s dA^(L-1-s) dB u_s, chunk by
        chunk: each chunk's sum by the powers of dA, (C, N/2, chunk), computed once (``_powers``),
        carried across chunks by dA^chunk. -> real coordinates (B, C, N/2, 2)."""
        dA, dB, _ = self._expanded()                                           # (C, N/2) complex
        T = min(chunk, u.shape[1])
        powers = _powers(dA, torch.arange(T, -1, -1, device=u.device))         # (C, N/2, T+1): dA^T ... dA^0
        h = torch.zeros(u.shape[0], *dA.shape, dtype=dA.dtype, device=u.device)
        for start in range(0, u.shape[1], T):
            part = u[:, start:start + T].to(dA.dtype)                          # (B, t, C)
            t = part.shape[1]
            # h <- dA^t h + sum_i dA^(t-1-i) dB u_i
            h = powers[..., T - t] * h + dB * torch.einsum("btc,cnt->bcn", part, powers[..., T + 1 - t:])
        return torch.view_as_real(h)

    # --- the shift SSM ----------------------------------------------------------------------------

    def _shift(self, k):
        """k (B, L, D) -> K_shift * k + ssm_k_D k."""
        return causal_conv(k, self.ssm_k_kernel.kernel(k.shape[1]), kernels=self.kernels) + self.ssm_k_D * k

    def _shift_step(self, k_t, x):
        """k_t (B, D); x: the shift SSM's state (B, D, N) or None."""
        y, x = self.ssm_k_kernel.step(k_t, x)
        return y + self.ssm_k_D * k_t, x

    # --- the diagonal SSM -------------------------------------------------------------------------

    def ssm_kernel(self, L: int) -> torch.Tensor:
        """(C, L): the head's kernel K[h] for each outer-product channel (i, j, h)."""
        return self._per_channel(self.kernel.kernel(L))

    def _skip(self) -> torch.Tensor:
        return self._per_channel(self.D)                                       # (C,)

    def _expanded(self):
        """dA, dB, C per outer-product channel, each (C, N/2) complex."""
        return [self._per_channel(t) for t in self.kernel.discretize()]

    def _state_kernels(self, L: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The diagonal SSM in the state site's real coordinates (Re h, Im h), each (L, C, N/2, 2):
        the state j steps after a unit input, (Re, Im) of dA^j dB, and the output j steps after a
        unit state coordinate, 2 (Re C dA^j, -Im C dA^j) (``_readout``)."""
        dA, dB, C = self.kernel.discretize()                                   # per head, (H, N/2) complex
        powers = _powers(dA, torch.arange(L, device=dA.device))                # (H, N/2, L): dA^j
        response = torch.view_as_real(dB[..., None] * powers)                 # (H, N/2, L, 2)
        gain = 2 * C[..., None] * powers
        readout = torch.stack([gain.real, -gain.imag], dim=-1)                 # (H, N/2, L, 2)
        as_lag_channel_state = lambda t: self._per_channel(t).permute(2, 0, 1, 3)   # (L, C, N/2, 2)
        return as_lag_channel_state(response), as_lag_channel_state(readout)

    @staticmethod
    def _rotate(dA: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """dA e for e (..., N/2, 2) in real coordinates (Re, Im): each mode's 2x2 block
        [[Re dA, -Im dA], [Im dA, Re dA]] (the equivalent real system's transition)."""
        re, im = e[..., 0], e[..., 1]
        return torch.stack([dA.real * re - dA.imag * im, dA.imag * re + dA.real * im], dim=-1)

    @staticmethod
    def _readout(C: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """2 Re(C · h) for h (..., N/2, 2) in real coordinates -> (...)."""
        return 2 * (C.real * h[..., 0] - C.imag * h[..., 1]).sum(-1)

    def _ssm_via_states(self, u):
        """The diagonal SSM through its explicit state trajectory, so it can be read and patched."""
        dA, dB, C = self._expanded()                                           # (C, N/2) complex
        h = torch.zeros(u.shape[0], *dA.shape, dtype=dA.dtype, device=u.device)   # (B, C, N/2)
        states = []
        for t in range(u.shape[1]):
            h = dA * h + dB * u[:, t, :, None]
            states.append(h)
        states = torch.view_as_real(torch.stack(states, dim=1))                # (B, L, C, N/2, 2) real
        # a patched element propagates to later positions of this layer along the recurrence
        states = through_state_site(self.state, states, lambda t, e: self._rotate(dA, e))
        return self._readout(C, states).to(u.dtype) + self._skip() * u         # (B, L, C)

    def _ssm_step(self, u_t, h):
        """u_t (B, C); h: the state in real coordinates (B, C, N/2, 2) or None."""
        dA, dB, C = self._expanded()
        if h is None:
            h = u_t.new_zeros(u_t.shape[0], *dA.shape, 2, dtype=dA.real.dtype)
        h = self._rotate(dA, h) + torch.view_as_real(dB * u_t[..., None])     # dA h + dB u_t
        return self._readout(C, h).to(u_t.dtype) + self._skip() * u_t, h

    # --- the step state in the generation cache (recurrent_cache.py) ------------------------------

    def state_to_cache(self, state, layer: RecurrentStateLayer) -> None:
        """The shift SSM's register x (B, D, N), x[..., n] what entered n steps ago through B, as
        transformers' conv state: oldest first (time last), as a (B, N, D) window; the diagonal
        SSM's state as the recurrent state."""
        register, h = state
        layer.store(window=register.flip(-1).transpose(1, 2), recurrent=h)

    def state_from_cache(self, layer: RecurrentStateLayer):
        return layer.window.transpose(1, 2).flip(-1), layer.recurrent


class H3MechEvalV1(H3):
    """hf-mecheval's first form (module docstring): a ShortConv shift register, a real S4D
    diagonal SSM per model channel (ZOH) and a skip per model channel; outer-product channels in
    the order (h, i, j)."""

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        D, N = self.hidden_size, self.d_state
        # the SSM parameters exist per model channel (h, j) and are shared across the key index i
        C = D

        # shift SSM on k: weight (D, 1, N), tap j looks back N-1-j steps (ShortConv's layout)
        self.shift = ShortConv(D, N, bias=False)

        # diagonal SSM (S4D-real), all (C, N) or (C,)
        log_dt = math.log(1e-3) + torch.rand(C) * (math.log(1e-1) - math.log(1e-3))  # log-uniform dt
        self.log_dt = nn.Parameter(log_dt)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32)).repeat(C, 1))
        self.B = nn.Parameter(torch.ones(C, N))
        self.C = nn.Parameter(torch.randn(C, N))
        self.D = nn.Parameter(torch.randn(C))

        self.conv_output = Site("shift-SSM output on K, (batch, length, hidden)")
        self.state = Site("diagonal SSM state trajectory, (batch, length, channels, d_state)",
                          propagates_in_layer=True, entry_access=True)

    # --- pieces shared by forward and step ---------------------------------------------------

    def _per_channel(self, t: torch.Tensor) -> torch.Tensor:
        """(D, ...) per model channel (h, j) -> (D * P, ...) per outer-product channel (h, i, j)."""
        H, P = self.num_heads, self.head_dim
        return t.unflatten(0, (H, 1, P)).expand(H, P, P, *t.shape[1:]).flatten(0, 2)

    def _discretize(self):
        """ZOH: returns dt A (log of the decay a = exp(dt A)) and b = (exp(dt A) - 1) / A * B, both (D, N)."""
        A = -torch.exp(self.A_log)                       # (D, N), negative
        dtA = torch.exp(self.log_dt)[:, None] * A        # (D, N)
        return dtA, torch.expm1(dtA) / A * self.B

    def _channel_index(self, device):
        """For each outer-product channel (h, i, j): the model channels of its key index, h*P + i,
        and of its value index, h*P + j; each (D*P,)."""
        P = self.head_dim
        c = torch.arange(self.channels, device=device)
        head = c // (P * P)
        return head * P + (c // P) % P, head * P + c % P

    def _outer(self, k, v):
        """k, v: (..., D) -> per-head k_h v_h^T flattened to (..., C), channel = (head, i, j).
        Gathered to (..., C) and multiplied elementwise: a broadcast product over (P, 1) x (1, P)
        blocks with P = 2 cost ~2x more on a CPU."""
        key, value = self._channel_index(k.device)
        return k.index_select(-1, key) * v.index_select(-1, value)

    def _contract(self, q, s):
        """q: (..., D), s: (..., C) -> y (..., D), y_h[j] = sum_i q_h[i] s_h[i, j]."""
        H, P = self.num_heads, self.head_dim
        key, _ = self._channel_index(q.device)
        return (q.index_select(-1, key) * s).unflatten(-1, (H, P, P)).sum(-2).flatten(-2)

    # --- parallel form ------------------------------------------------------------------------

    def shift_kernel(self, L: int) -> torch.Tensor:
        """(D, max(L, N)); column l = weight on the input l steps back."""
        k = self.shift.weight[:, 0].flip(-1)              # ShortConv stores the oldest tap first
        return F.pad(k, (0, max(0, L - self.d_state)))

    def _shift(self, k):
        return causal_conv(k, self.shift_kernel(k.shape[1]), kernels=self.kernels)

    def _expanded(self):
        """Decay a, input gain b, readout C (each (D*P, N)) and skip D (D*P,) per outer-product channel."""
        dtA, b = self._discretize()
        return (self._per_channel(torch.exp(dtA)), self._per_channel(b), self._per_channel(self.C),
                self._per_channel(self.D))

    def _skip(self) -> torch.Tensor:
        return self._per_channel(self.D)

    def _state_kernels(self, L: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The state j steps after a unit input, b a^j, and the output j steps after a unit state
        coordinate, C a^j; each (L, C, N)."""
        dtA, b = self._discretize()                                            # (D, N)
        powers = torch.exp(dtA[None] * torch.arange(L, device=dtA.device, dtype=dtA.dtype)[:, None, None])
        per_channel = lambda t: self._per_channel(t.transpose(0, 1)).transpose(0, 1)   # (L, D, N) -> (L, D*P, N)
        return per_channel(b * powers), per_channel(self.C * powers)

    def ssm_kernel(self, L: int) -> torch.Tensor:
        """K[c, l] = sum_n C b a^l, (D*P, L). The powers come from repeated multiplication (L small
        (D, N) products, ``PowerSumTaps``), measured ~3x faster on a CPU than exp(l dt A) over a
        (D, N, L) tensor (``ssm_kernel_reference``; a blocked form, (C b a^i) @ (a^s)^j with
        s ~ sqrt(L), measured no faster). Tested against the reference."""
        dtA, b = self._discretize()                                                # (D, N)
        return self._per_channel(PowerSumTaps.apply(self.C * b, torch.exp(dtA), L))      # (D*P, L)

    def ssm_kernel_reference(self, L: int) -> torch.Tensor:
        """The same kernel with every power in closed form, exp(l dt A) (readable; for tests)."""
        dtA, b = self._discretize()
        powers = torch.exp(dtA[..., None] * torch.arange(L, dtype=dtA.dtype, device=dtA.device))   # (D, N, L)
        return self._per_channel(((self.C * b)[..., None] * powers).sum(1))

    def _scan(self, u, a, b):
        """States h_t = a h_{t-1} + b u_t, (B, L, C, N)."""
        h = u.new_zeros(u.shape[0], *a.shape)             # (B, C, N)
        states = []
        for t in range(u.shape[1]):
            h = a * h + b * u[:, t, :, None]
            states.append(h)
        return torch.stack(states, dim=1)

    def _ssm_via_states(self, u):
        """The diagonal SSM through its explicit state trajectory, so it can be read and patched."""
        a, b, C, D = self._expanded()
        h = self._scan(u, a, b)                           # (B, L, C, N)
        # a patched element propagates to later positions of this layer along the recurrence
        h = through_state_site(self.state, h, lambda t, e: a * e)
        return (h * C).sum(-1) + D * u                    # (B, L, D*P)

    # --- recurrent form -----------------------------------------------------------------------

    def _shift_step(self, k, window):
        """The shift register (B, N-1, D) of ShortConv."""
        return self.shift.step(k, window)

    def _ssm_step(self, u, h):
        """SSM state (B, C, N) or None."""
        a, b, C, D = self._expanded()
        if h is None:
            h = u.new_zeros(u.shape[0], *b.shape)
        h = a * h + b * u[..., None]                                           # (B, D*P, N)
        s = (h * C).sum(-1) + D * u
        return s, h


register_architecture(ArchitectureSpec(
    name="h3", config_class=MechEvalH3Config, mixers={"h3": H3Reference, "h3_v1": H3MechEvalV1}, class_stem="H3",
    tiny_config={"d_state": 8, "head_dim": 2}, test_variants=({"ssm_form": "mecheval-v1"},)))

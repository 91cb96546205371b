"""H3 (Fu et al. 2023, "Hungry Hungry Hippos: Towards Language Modeling with State Space Models").

    q, k, v = Wq x, Wk x, Wv x                       each (B, L, D), split into H heads of size P
    k       = shift_ssm(k)                            learned causal kernel of length d_state per channel
    S_h     = diag_ssm(k_h v_h^T)                     per head: P*P channels; entry (i, j) runs the
                                                      SSM of channel (h, j), shared across i
    y_h[j]  = sum_i q_h[i] * S_h[i, j]                q contracts with k's index, as in attention
    out     = Wo concat_h(y_h)

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

from .convolutions import ShortConv, causal_conv
from .sites import Site, through_state_site
from .mixers import at_positions, fold_copies, zero_padding
from .configuration_mecheval import H3Config
from .registry import ArchitectureSpec, register_architecture


class PowerSumTaps(torch.autograd.Function):
    """taps[c, l] = sum_n w[c, n] * a[c, n]^l for l < L: w, a (C, N) -> (C, L).

    Forward by repeated multiplication; backward by Horner's rule on the polynomial
    P(a) = sum_l G[:, l] a^l (G = dLoss/dtaps): dL/dw = P(a), dL/da = w P'(a), both accumulated in
    place in L steps — instead of an autograd graph of L products and sums, which made this small
    kernel a fifth of an H3 training step on a CPU. Tested against exp(l log a) (gradcheck)."""

    @staticmethod
    def forward(w: torch.Tensor, a: torch.Tensor, L: int) -> torch.Tensor:
        taps = w.new_empty(w.shape[0], L)
        p = w.clone()
        for l in range(L):
            torch.sum(p, dim=-1, out=taps[:, l])
            if l + 1 < L:
                p.mul_(a)
        return taps

    @staticmethod
    def setup_context(ctx, inputs, output):
        w, a, L = inputs
        ctx.save_for_backward(w, a)

    @staticmethod
    def backward(ctx, G: torch.Tensor):
        w, a = ctx.saved_tensors
        L = G.shape[1]
        P = G[:, L - 1, None].expand_as(a).clone()                 # Horner from the highest power
        dP = torch.zeros_like(a)
        for l in range(L - 2, -1, -1):
            dP.mul_(a).add_(P)
            P.mul_(a).add_(G[:, l, None])
        return P, w * dP, None

    @staticmethod
    def vmap(info, in_dims, w, a, L):
        # stacked copies: every channel is independent, so fold the copies into the channels
        K = info.batch_size
        taps = PowerSumTaps.apply(*fold_copies(K, (w, a), in_dims[:2]), L)
        return taps.view(K, -1, L), 0


class H3(nn.Module):

    def __init__(self, config, layer_idx: int):
        super().__init__()
        D, N, P = config.hidden_size, config.d_state, config.head_dim
        self.layer_idx = layer_idx
        self.hidden_size, self.d_state, self.head_dim = D, N, P
        self.num_heads = D // P
        # the outer product k v^T has H * P * P = D * P channels; the SSM parameters exist per
        # model channel (h, j) and are shared across the key index i
        self.channels = self.num_heads * P * P
        C = D

        self.q_proj = nn.Linear(D, D)
        self.k_proj = nn.Linear(D, D)
        self.v_proj = nn.Linear(D, D)
        self.out_proj = nn.Linear(D, D)

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
                          propagates_in_layer=True)

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

    def _expanded(self):
        """Decay a, input gain b, readout C (each (D*P, N)) and skip D (D*P,) per outer-product channel."""
        dtA, b = self._discretize()
        return (self._per_channel(torch.exp(dtA)), self._per_channel(b), self._per_channel(self.C),
                self._per_channel(self.D))

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

    accepts_keep = True

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, L, D) -> (B, L, D); with keep (B, k) positions (the answer-only training path,
        nothing observing the layer), the output at those positions only, (B, k, D). Padded keys
        are zeroed before the shift SSM (k_proj has a bias), so their outer products are zero."""
        L = x.shape[1]
        q, k, v = self.q_proj(x), zero_padding(self.k_proj(x), mask), self.v_proj(x)   # (B, L, D)
        k = self.conv_output(causal_conv(k, self.shift_kernel(L)))             # (B, L, D)
        u = self._outer(k, v)                                                  # (B, L, C)
        if self.state.wanted():
            s = self._ssm_via_states(u)
        elif keep is not None:  # the long convolution evaluated at the kept positions only
            # s_p = sum_l K[:, l] u_{p-l}: gather u at p - l (B, k, L, C), rather than the kernel at
            # p - t, whose backward (an index_put with accumulation) was slow on a CPU
            source = keep[:, :, None] - torch.arange(L, device=x.device)       # (B, k, L): p - l for lag l
            u_back = at_positions(u, source.clamp(min=0).flatten(1)).unflatten(1, source.shape[1:])
            u_back = u_back * (source >= 0)[..., None]                         # (B, k, L, C), 0 before t = 0
            s = (u_back * self.ssm_kernel(L).T).sum(2) + self._per_channel(self.D) * at_positions(u, keep)
            q = at_positions(q, keep)                                          # (B, k, D)
        else:  # fast path: the SSM unrolled into one long convolution
            s = causal_conv(u, self.ssm_kernel(L)) + self._per_channel(self.D) * u   # (B, L, D*P)
        return self.out_proj(self._contract(q, s))

    # --- recurrent form -----------------------------------------------------------------------

    def step(self, x_t: torch.Tensor, state=None, mask: torch.Tensor | None = None):
        """x_t: (B, D). state = (shift register (B, N-1, D), SSM state (B, C, N)) or None."""
        window, h = (None, None) if state is None else state
        q, k, v = self.q_proj(x_t), zero_padding(self.k_proj(x_t), mask), self.v_proj(x_t)   # (B, D)
        k, window = self.shift.step(k, window)
        u = self._outer(k, v)                                                  # (B, C)
        a, b, C, D = self._expanded()
        if h is None:
            h = u.new_zeros(u.shape[0], *b.shape)
        h = a * h + b * u[..., None]                                           # (B, D*P, N)
        s = (h * C).sum(-1) + D * u
        return self.out_proj(self._contract(q, s)), (window, h)


register_architecture(ArchitectureSpec(
    name="h3", config_class=H3Config, mixers={"h3": H3}, class_stem="H3",
    tiny_config={"d_state": 8, "head_dim": 2}))

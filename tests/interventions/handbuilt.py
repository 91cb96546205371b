"""Two-layer attention models whose weights are set by hand to implement a known mechanism.

Residual stream layout (d = 3V + 2P): TOK (V) | POS (P) | PREV (V) | MATCH (P) | OUT (V).
Attention is softmax attention with hand-set Q, K, V and a large inverse temperature, so it is
near-hard; the LM head reads the OUT subspace.

* ``induction_model``: layer 0 is a previous-token head (PREV_t = TOK_{t-1}, nothing at position 0,
  which has no previous token: an MQAR document starts with its first key); layer 1 at every
  position attends to the position whose PREV equals its own token and copies that position's
  token into OUT. At the query it finds the value position (PREV = key) and reads the value:
  the key's identity lives at the value position from layer 1's input on.
* ``direct_model``: layer 0 at every position attends to the earlier position holding the same
  token (not itself) and writes that position + 1 into MATCH; layer 1 attends to the position
  named by MATCH and copies its token. At the query: MATCH = value position, computed at the
  query itself; nothing about the key is written at the value position.
"""
from types import SimpleNamespace

import torch
from torch import nn

from hf_mecheval.models.sites import Site

BETA = 60.0    # inverse temperature: near-hard attention
GAMMA = 30.0   # LM head scale


class HandAttention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        for m in (self.q, self.k, self.v):
            nn.init.zeros_(m.weight)
        self.silent_at_start = False       # write nothing at position 0 (a head that needs an earlier token)

    def forward(self, x):
        L = x.shape[1]
        scores = self.q(x) @ self.k(x).transpose(1, 2)
        mask = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
        out = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ self.v(x)
        if self.silent_at_start:
            out = torch.cat([torch.zeros_like(out[:, :1]), out[:, 1:]], dim=1)
        return out


class HandBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.input, self.mixer_input = Site("input"), Site("mixer_input")
        self.mixer = HandAttention(d)
        self.mixer_output, self.output = Site("mixer_output"), Site("output")

    def forward(self, r):
        r = self.input(r)
        return self.output(r + self.mixer_output(self.mixer(self.mixer_input(r))))


class HandBackbone(nn.Module):
    def __init__(self, V, P):
        super().__init__()
        self.V, self.P = V, P
        self.d = 3 * V + 2 * P
        self.layers = nn.ModuleList([HandBlock(self.d), HandBlock(self.d)])
        self.norm_f = nn.Identity()

    # subspace offsets
    def tok(self):
        return slice(0, self.V)

    def pos(self):
        return slice(self.V, self.V + self.P)

    def prev(self):
        return slice(self.V + self.P, 2 * self.V + self.P)

    def match(self):
        return slice(2 * self.V + self.P, 2 * self.V + 2 * self.P)

    def out(self):
        return slice(2 * self.V + 2 * self.P, self.d)

    def embed(self, ids):
        B, L = ids.shape
        x = torch.zeros(B, L, self.d)
        x[..., self.tok()] = nn.functional.one_hot(ids, self.V).float()
        x[..., self.pos()] = torch.eye(self.P)[:L]
        return x


class HandModel(nn.Module):
    def __init__(self, V, P):
        super().__init__()
        self.model = HandBackbone(V, P)
        self.lm_head = nn.Linear(self.model.d, V, bias=False)
        nn.init.zeros_(self.lm_head.weight)
        with torch.no_grad():
            self.lm_head.weight[:, self.model.out()] = GAMMA * torch.eye(V)

    def site_names(self):
        return [n.removeprefix("model.") for n, m in self.named_modules() if isinstance(m, Site)]

    def get_site(self, name):
        return dict(self.model.named_modules())[name]

    def forward(self, input_ids):
        r = self.model.embed(input_ids)
        for block in self.model.layers:
            r = block(r)
        return SimpleNamespace(logits=self.lm_head(r))


def _set(linear, rows, cols, value):
    with torch.no_grad():
        linear.weight[rows, cols] = value


def induction_model(V, P):
    m = HandModel(V, P)
    b = m.model
    a0, a1 = b.layers[0].mixer, b.layers[1].mixer
    # layer 0: query at t looks for position t-1 (shift within POS), values write TOK into PREV
    shift = torch.zeros(P, P)                                    # Linear weights are (out, in):
    shift[torch.arange(P - 1), torch.arange(1, P)] = 1.0          # e_t -> e_{t-1}
    _set(a0.q, b.pos(), b.pos(), BETA * shift)
    _set(a0.k, b.pos(), b.pos(), torch.eye(P))
    _set(a0.v, b.prev(), b.tok(), torch.eye(V))
    a0.silent_at_start = True
    # layer 1: query = own token, key = PREV, value = TOK -> OUT
    _set(a1.q, b.tok(), b.tok(), BETA * torch.eye(V))
    _set(a1.k, b.tok(), b.prev(), torch.eye(V))
    _set(a1.v, b.out(), b.tok(), torch.eye(V))
    return m


def direct_model(V, P):
    m = HandModel(V, P)
    b = m.model
    a0, a1 = b.layers[0].mixer, b.layers[1].mixer
    # layer 0: same token elsewhere (+beta), not itself (-2 beta); write (matched position + 1) into MATCH
    _set(a0.q, b.tok(), b.tok(), BETA * torch.eye(V))
    _set(a0.k, b.tok(), b.tok(), torch.eye(V))
    _set(a0.q, b.pos(), b.pos(), BETA * torch.eye(P))
    _set(a0.k, b.pos(), b.pos(), -2.0 * torch.eye(P))
    nxt = torch.zeros(P, P)
    nxt[torch.arange(1, P), torch.arange(P - 1)] = 1.0            # e_s -> e_{s+1}
    _set(a0.v, b.match(), b.pos(), nxt)
    # layer 1: query = MATCH, key = POS, value = TOK -> OUT
    _set(a1.q, b.match(), b.match(), BETA * torch.eye(P))
    _set(a1.k, b.match(), b.pos(), torch.eye(P))
    _set(a1.v, b.out(), b.tok(), torch.eye(V))
    return m

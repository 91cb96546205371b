"""A plug-in architecture from outside hf-mecheval, for the tests: a package written into a folder
with the packaging metadata an installed distribution has (``*.dist-info/METADATA`` and
``entry_points.txt``), so that putting the folder on ``sys.path`` (or PYTHONPATH) installs it as
far as ``importlib.metadata`` can tell.

The mixer is a causal running mean: v_t = W_in x_t, S_t = sum_{s<=t} v_s (the ``state`` site),
y_t = W_out (S_t / n_t) with n_t the number of real tokens up to t.
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

PACKAGE = "mecheval_cummean"
ARCHITECTURE = "cummean"
MODEL_TYPE = "mecheval-cummean"

SOURCE = textwrap.dedent('''
    """Plug-in: a causal running-mean mixer as an hf-mecheval architecture."""
    import torch
    from torch import nn

    from hf_mecheval import ArchitectureSpec
    from hf_mecheval.models import MechEvalConfig
    from hf_mecheval.models.mixers import zero_padding
    from hf_mecheval.models.sites import Site, through_state_site


    class CumMeanConfig(MechEvalConfig):
        model_type = "mecheval-cummean"

        def layer_mixers(self):
            return ["cumulative_mean"] * self.num_hidden_layers


    class CumulativeMean(nn.Module):
        def __init__(self, config, layer_idx):
            super().__init__()
            self.in_proj = nn.Linear(config.hidden_size, config.hidden_size)
            self.out_proj = nn.Linear(config.hidden_size, config.hidden_size)
            self.state = Site("running sum S_t, (batch, length, hidden)", propagates_in_layer=True)

        def forward(self, x, mask=None):
            # x (B, L, D); padded positions add nothing and are not counted
            v = zero_padding(self.in_proj(x), mask)
            real = torch.ones_like(x[..., :1]) if mask is None else mask[..., None].to(x.dtype)
            sums = through_state_site(self.state, v.cumsum(1), lambda t, e: e)   # S_t = S_(t-1) + v_t
            return self.out_proj(sums / real.cumsum(1).clamp(min=1))

        def step(self, x_t, state, mask=None):
            v = zero_padding(self.in_proj(x_t), mask)
            real = torch.ones_like(x_t[..., :1]) if mask is None else mask[..., None].to(x_t.dtype)
            sums, count = (v, real) if state is None else (state[0] + v, state[1] + real)
            return self.out_proj(sums / count.clamp(min=1)), (sums, count)


    SPEC = ArchitectureSpec(name="cummean", config_class=CumMeanConfig, mixers={"cumulative_mean": CumulativeMean},
                            class_stem="CumMean", package="mecheval-cummean")
''')


def write_plugin(folder: Path) -> Path:
    """Write the package and its distribution metadata into ``folder``; returns ``folder``."""
    folder = Path(folder)
    (folder / PACKAGE).mkdir(parents=True, exist_ok=True)
    (folder / PACKAGE / "__init__.py").write_text(SOURCE)
    info = folder / f"{PACKAGE}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mecheval-cummean\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[hf_mecheval.architectures]\n{ARCHITECTURE} = {PACKAGE}:SPEC\n")
    return folder


def install_plugin(folder: Path):
    """Write the plug-in into ``folder``, put it on sys.path and let hf-mecheval find it (through its
    entry point, as an installed one); returns its spec."""
    write_plugin(folder)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    from hf_mecheval.models import get_architecture, load_plugins

    load_plugins(reload=True)
    return get_architecture(ARCHITECTURE)

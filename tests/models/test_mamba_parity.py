"""Our Mamba mixer against transformers' own ``MambaMixer`` (an implementation written apart from
ours): with the same weights, the same outputs and the same gradients, on the fused training
path, the state-site path and the answer-only path."""
import pytest
import torch
from transformers import MambaConfig as HFMambaConfig
from transformers.models.mamba.modeling_mamba import MambaMixer as HFMambaMixer

from hf_mecheval.models.mixer_mamba import MechEvalMambaConfig
from hf_mecheval.models.mixer_mamba import MambaMixer


def pair(seed: int = 0):
    """(ours, theirs) with the same weights: hidden 16, expand 2, state 4, conv width 4. float32:
    transformers computes A in float32 whatever the module's dtype."""
    torch.manual_seed(seed)            # only to initialise both modules; every value is copied across
    ours = MambaMixer(MechEvalMambaConfig(hidden_size=16, d_state=4, conv_kernel=4), layer_idx=0)
    theirs = HFMambaMixer(HFMambaConfig(hidden_size=16, state_size=4, expand=2, conv_kernel=4,
                                        time_step_rank=ours.R, use_bias=False, use_conv_bias=True), 0)
    with torch.no_grad():
        for name in ("in_proj.weight", "x_proj.weight", "out_proj.weight", "A_log", "D"):
            theirs.get_parameter(name).copy_(ours.get_parameter(name))
        theirs.conv1d.weight.copy_(ours.conv.weight)
        theirs.conv1d.bias.copy_(ours.conv.bias)
        theirs.dt_proj.weight.copy_(ours.dt_proj.weight)
        theirs.dt_proj.bias.copy_(ours.dt_bias)          # ours keeps dt's bias apart from its projection
        ours.A_log.add_(torch.randn_like(ours.A_log) * 0.3)      # away from the init's shared rows
        theirs.A_log.copy_(ours.A_log)
    return ours, theirs


@pytest.mark.parametrize("path", ["fused", "state_site"])
def test_mamba_mixer_matches_transformers_mamba_mixer(path):
    ours, theirs = pair()
    u = torch.randn(3, 11, 16, generator=torch.Generator().manual_seed(1))
    u_ours, u_theirs = u.clone().requires_grad_(), u.clone().requires_grad_()
    if path == "state_site":
        # a listener on the state: the trajectory goes through the Site (LinearScan), not the fused scan
        ours.state.register_forward_hook(lambda module, args, output: None)
    y_ours = ours(u_ours)
    y_theirs = theirs(u_theirs)          # no kernel packages here: their plain-PyTorch path
    assert torch.allclose(y_ours, y_theirs, atol=1e-5)
    w = torch.randn_like(y_ours)
    (y_ours * w).sum().backward()
    (y_theirs * w).sum().backward()
    # each gradient within 1e-5 of its own largest entry: the two float32 computations differ by at
    # most 8.5e-7 of it (seeds 0-4, one and two threads), where A_log's and dt's gradients are
    # small beside the others' (an absolute tolerance fit for the largest would hide an error in them)
    grads = {"input": (u_ours.grad, u_theirs.grad),
             "conv.weight": (ours.conv.weight.grad, theirs.conv1d.weight.grad),
             "conv.bias": (ours.conv.bias.grad, theirs.conv1d.bias.grad),
             "dt_proj.weight": (ours.dt_proj.weight.grad, theirs.dt_proj.weight.grad),
             "dt_bias": (ours.dt_bias.grad, theirs.dt_proj.bias.grad)}
    for name in ("in_proj.weight", "x_proj.weight", "out_proj.weight", "A_log", "D"):
        grads[name] = (ours.get_parameter(name).grad, theirs.get_parameter(name).grad)
    for name, (mine, reference) in grads.items():
        torch.testing.assert_close(mine, reference, rtol=0, atol=1e-5 * float(reference.abs().max()), msg=name)


def test_answer_only_path_matches_transformers_at_the_kept_positions():
    ours, theirs = pair(2)
    u = torch.randn(3, 11, 16, generator=torch.Generator().manual_seed(3))
    keep = torch.tensor([[10], [4], [7]])
    y_ours = ours(u, keep=keep)                                          # (3, 1, 16)
    y_theirs = theirs(u).gather(1, keep[..., None].expand(-1, -1, 16))
    assert torch.allclose(y_ours, y_theirs, atol=1e-5)

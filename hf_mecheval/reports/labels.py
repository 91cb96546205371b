"""How reports name a model: its label in tables and legends, and the order and default
configuration of the architectures that figures colour by."""
from __future__ import annotations

import re

# the order in which the reports list the architectures, and in which a figure that colours by
# architecture gives each its colour (C0, C1, ...): the paper's seven, then the two beyond it
ARCHITECTURE_ORDER = ("transformer", "based", "mamba", "deltanet", "hyena", "h3", "baseconv", "mamba2",
                      "gated_deltanet")


def model_label(model: dict) -> str:
    """A configuration's name in tables: the architecture, with the short-convolution width where
    it is an ablation knob (Mamba always, Based when not its default 3), "no positions" for a
    Transformer without position embeddings and "positions" for another of our architectures given
    learned ones (the max_position_embeddings of transformers' own models is their context length,
    not named). ``model``: a run record's model fields, or a sweep run's ``architecture`` with its
    ``model_config``."""
    arch = model.get("architecture", model.get("model_type", "?"))
    extra = []
    if arch == "mamba":
        extra.append(f"conv {model.get('conv_kernel', 4)}")
    if arch == "based" and model.get("short_conv_kernel", 3) != 3:
        extra.append(f"conv {model.get('short_conv_kernel')}")
    if arch == "transformer" and model.get("max_position_embeddings") == 0:
        extra.append("no positions")
    if arch != "transformer" and not arch.startswith("hf:") and (model.get("max_position_embeddings") or 0) > 0:
        extra.append("positions")
    return f"{arch} ({', '.join(extra)})" if extra else arch


def run_label(record: dict) -> str:
    """``model_label`` of a run's ``run.json`` record."""
    return model_label(record["model"])


def architecture_rank(label: str) -> int:
    """The place in ``ARCHITECTURE_ORDER`` of a label's architecture ("mamba (conv 4)": mamba's);
    labels outside the nine after them."""
    name = re.match(r"\w*", label).group()           # "transformer, 3 layers": transformer
    return ARCHITECTURE_ORDER.index(name) if name in ARCHITECTURE_ORDER else len(ARCHITECTURE_ORDER)


# each architecture's default configuration as ``model_label`` names it ("based", "mamba (conv 4)")
DEFAULT_CONFIGURATION_LABELS = tuple(model_label({"architecture": arch}) for arch in ARCHITECTURE_ORDER)


def is_default_configuration(label: str) -> bool:
    """Whether a figure's label names its architecture's default configuration ("based",
    "mamba (conv 4)", "transformer, 3 layers"; not "based (positions)" or "mamba (conv 0)")."""
    return re.sub(r", \d+ layers?$", "", label) in DEFAULT_CONFIGURATION_LABELS

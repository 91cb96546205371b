"""Let pyvene address our sites by name: ``register_pyvene()`` maps every hf-mecheval causal LM
type to its site components (imported lazily; pyvene is in the ``interp`` extra).

    import pyvene as pv
    from hf_mecheval.interventions.pyvene_support import register_pyvene
    register_pyvene()
    config = pv.IntervenableConfig(representations=[
        pv.RepresentationConfig(layer=1, component="input", unit="pos", max_number_of_units=1)],
        intervention_types=pv.VanillaIntervention)
    intervenable = pv.IntervenableModel(config, model)

Components: input, mixer_input, mixer_output, mlp_input, mlp_output, output (residual width) and
mixer.conv_output, mixer.state (mixer-specific shapes).
"""
from __future__ import annotations

COMPONENTS = ("input", "mixer_input", "mixer_output", "mlp_input", "mlp_output", "output",
              "mixer.conv_output", "mixer.state")


def register_pyvene() -> None:
    import pyvene as pv
    from pyvene.models.constants import CONST_OUTPUT_HOOK

    from ..models import MODEL_CLASSES

    modules = {c: (f"model.layers[%s].{c}", CONST_OUTPUT_HOOK) for c in COMPONENTS}
    dimensions = {c: ("hidden_size",) for c in COMPONENTS}
    for _, _, lm_cls in MODEL_CLASSES.values():
        pv.type_to_module_mapping[lm_cls] = modules
        pv.type_to_dimension_mapping[lm_cls] = dimensions

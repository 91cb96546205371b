"""Which mechanism a trained model uses, from its restoration signature.

Evidence: key corrupted, residual stream patched at the input of the last layer, at the key,
value and query positions (for 2-layer models: ``layers.1.input``).

* induction (Transformer, Based): @value high, @query and @key low — layer 0 copied the key's
  identity into the value token, the last layer looks it up there;
* direct retrieval at the query (H3, Hyena where they work): @query high, @value low;
* direct retrieval, key -> query (Mamba): @value low, @key + @query high with a real share at the
  key — the last layer takes what it needs from the key's position onward, not from the value
  token; the query's own share may be anything from most of it to nothing (a Mamba at width 64
  on ar_32 restored 0.95 at the key and 0.02 at the query);
* mixed: none of these clearly;
* failed: the model does not solve the task (clean accuracy too low) or corrupting the key does
  not change its prediction (the restoration denominator is below threshold).

In a model of more than two layers the lookup need not happen in the last one: a 3-layer
Transformer can copy the key's identity into the value token in layer 0 and look it up in layer
1, after which the answer sits at the query, and the last layer's input reads @query 1.00 like a
direct retrieval. Induction is the one mechanism that leaves the key's identity at the value
position, so ``classify_by_layer`` labels a model ``induction`` where any layer's input after the
first shows induction's signature, and reads every other label at the last layer's input (for one
and two layers the same as ``classify`` there: the first layer's input holds the tokens only).

Confidence: "high" when the bootstrap intervals lie entirely on the decisive side of the
thresholds, "medium" when only the point estimates do (or there are no intervals: zero
resamples, or a bootstrap that gave up on small denominators), "low" for mixed.
"""
from __future__ import annotations

import dataclasses

HIGH, LOW = 0.6, 0.3          # "restores" / "does not restore"
MIN_ACCURACY = 0.5


@dataclasses.dataclass
class Mechanism:
    label: str                 # induction | direct_query | direct_key_query | mixed | failed
    confidence: str            # high | medium | low
    reason: str
    evidence: dict

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def classify(cells: dict[str, dict], clean_accuracy: float, min_accuracy: float = MIN_ACCURACY) -> Mechanism:
    """cells: position name ("key", "value", "query") -> summary dict from ``summarize_restoration``."""
    evidence = {"clean_accuracy": clean_accuracy,
                **{f"@{p}": {"restoration": c.get("restoration"), "ci": c.get("restoration_ci")}
                   for p, c in cells.items()}}
    if clean_accuracy < min_accuracy:
        return Mechanism("failed", "high", f"clean accuracy {clean_accuracy:.2f} < {min_accuracy}", evidence)
    if any(cells.get(p, {}).get("restoration") is None for p in ("key", "value", "query")):
        return Mechanism("failed", "high", "corrupting the key does not change the prediction "
                                           "(restoration denominator below threshold)", evidence)

    def point(p):
        return cells[p]["restoration"]

    def lo(p):
        ci = cells[p].get("restoration_ci")
        return ci[0] if ci else point(p)

    def hi(p):
        ci = cells[p].get("restoration_ci")
        return ci[1] if ci else point(p)

    intervals = all(cells[p].get("restoration_ci") for p in ("key", "value", "query"))
    rules = [
        ("induction", lambda f, g: f("value") >= HIGH and g("query") <= LOW and g("key") <= LOW,
         "the value position restores, the query and key positions do not"),
        ("direct_query", lambda f, g: f("query") >= HIGH and g("value") <= LOW and g("key") <= LOW,
         "the query position restores, the value position does not"),
        ("direct_key_query", lambda f, g: g("value") <= LOW and f("key") + f("query") >= HIGH and f("key") >= 0.15,
         "key and query positions together restore, the value position does not"),
    ]
    for label, rule, reason in rules:
        if intervals and rule(lo, hi):
            return Mechanism(label, "high", reason + " (bootstrap intervals agree)", evidence)
        if rule(point, point):
            why = "intervals overlap the thresholds" if intervals else "no bootstrap intervals"
            return Mechanism(label, "medium", f"{reason} (point estimates; {why})", evidence)
    return Mechanism("mixed", "low", f"@key {point('key'):.2f}, @value {point('value'):.2f}, "
                                     f"@query {point('query'):.2f}: no single mechanism dominates", evidence)


def classify_by_layer(cells_by_layer: dict[int, dict[str, dict]], clean_accuracy: float,
                      min_accuracy: float = MIN_ACCURACY) -> Mechanism:
    """cells_by_layer: layer -> the cells at that layer's input (as ``classify`` takes them), the
    last layer's at least. The label at the last layer's input, or ``induction`` where a layer
    between the first and the last shows it (the latest such layer; its evidence says which)."""
    last = max(cells_by_layer)
    mechanism = classify(cells_by_layer[last], clean_accuracy, min_accuracy)
    if mechanism.label in ("induction", "failed"):
        return mechanism
    for layer in sorted((l for l in cells_by_layer if 0 < l < last), reverse=True):
        earlier = classify(cells_by_layer[layer], clean_accuracy, min_accuracy)
        if earlier.label == "induction":
            return Mechanism("induction", earlier.confidence,
                             f"at layer {layer}'s input {earlier.reason}; at the last layer's input the answer has "
                             f"moved on ({mechanism.label})", {**earlier.evidence, "layer": layer})
    return mechanism


def relabel(row: dict) -> dict:
    """A report row (``@key``/``@value``/``@query`` at the last layer's input with their ``_ci``
    intervals, ``mechanism``, ``confidence``) with its label by the current rule, so that rows
    written before a change of the rule read like new ones. A row labelled ``failed`` (or not
    labelled) is returned as it is: that label may rest on the grid's clean accuracy, which a row
    does not keep. Any other label means the accuracy passed, which is all ``classify`` needs of it.
    Induction read at a layer before the last adds ``mechanism_layer``, that layer."""
    if row.get("mechanism") in (None, "failed"):
        return row
    cells = {p: {"restoration": row.get(f"@{p}"), "restoration_ci": row.get(f"@{p}_ci")}
             for p in ("key", "value", "query")}
    # the layers before the last from ``layer_scores`` (point estimates: a row keeps no intervals there)
    layers: dict[int, dict[str, dict]] = {}
    for name, value in (row.get("layer_scores") or {}).items():
        site, _, position = name.partition("@")
        layers.setdefault(int(site.split(".")[1]), {})[position] = {"restoration": value}
    last = max(layers, default=0)
    layers[last] = cells
    mechanism = classify_by_layer(layers, clean_accuracy=MIN_ACCURACY)
    where = {"mechanism_layer": mechanism.evidence["layer"]} if "layer" in mechanism.evidence else {}
    if where and row["mechanism"] == "induction":
        return {**row, **where}        # read there with its intervals when the row was written
    return {**row, "mechanism": mechanism.label, "confidence": mechanism.confidence, **where}

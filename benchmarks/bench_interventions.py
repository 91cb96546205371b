"""The full intervention grid (key and value corrupted, every site, every layer, positions key /
value / divider / query / answer) for a 2-layer hidden-128 model over 320 documents, done three
ways in the same run:

* ours: ``run_grid`` (clean and corrupted runs cached once, all positions of a site in one batch,
  the forward resumed at the patched layer);
* the reference way: pyvene, one IntervenableModel per (layer, site), three forwards per cell
  (source, base, intervened);
* nnsight: one trace of the clean and one of the patched run per cell.

It also times one full forward of the 320 documents and prints the "minimal" cost of the grid,
(2 + cells) full forwards per corruption. Targets: >= 10x faster than the pyvene way; wall time
<= 1.5x the minimal forward count.

    python benchmarks/bench_interventions.py [--arch mamba transformer] [--n 320] [--skip-peers | --peers pyvene]

``--vs-native gpt2`` instead times the same grid on transformers' own model (``hf:gpt2``, or
another ``hf:`` family) through ``FullForwardEngine`` (every patched row a whole
forward of the corrupted tokens) against ``InterventionEngine`` on our Transformer of the same size
(hidden, layers, heads, 64 positions): the sites both have (``layers.L.input``, ``mixer_output``,
``output``), both corruptions, the five positions, the same documents; one bootstrap resample per
cell, so the time is the engines'. The two are timed in alternation, ``--repeats`` times each, so
load on the machine hits both alike; prints the median of each, their ratio, and the median time
of one forward to the last hidden state of each model (how much of the ratio is the model rather
than the engine). On a loaded machine pass ``--threads 1``: two threads that wait for each other
made both sides 5-8x slower there.

    python benchmarks/bench_interventions.py --vs-native gpt2 [--hidden 64] [--n 320] [--repeats 5]
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
import warnings

import numpy as np
import torch

from hf_mecheval.interventions import POSITIONS, run_grid
from hf_mecheval.models import build_model
from hf_mecheval.tasks import build_task, corrupt

CORRUPTIONS = ("key", "value")


def setup(arch, n):
    task = build_task("ar_32")
    torch.manual_seed(0)
    extra = {"max_position_embeddings": 64} if arch == "transformer" else {}
    model = build_model(arch, vocab_size=task.vocab_size, hidden_size=128, kernels="torch", **extra).eval()
    data = task.generate(n, "test", seed=0)
    return task, model, data


def tensors(task, data, which):
    ids = torch.from_numpy(data.padded()).long()
    bad = torch.from_numpy(corrupt(data.padded(), data.columns[f"{which}_pos"], task.token_classes, 0).input_ids).long()
    col = {c: torch.from_numpy(data.columns[c]).long() for c in data.columns}
    return ids, bad, col


def p_answer(logits, col):
    rows = torch.arange(len(logits))
    return torch.softmax(logits[rows, col["query_pos"]].float(), -1)[rows, col["answer"]]


def time_forward(model, ids, repeats=5):
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(ids)
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def pyvene_way(task, model, data):
    import pyvene as pv

    from hf_mecheval.interventions.pyvene_support import register_pyvene

    register_pyvene()
    # pyvene's unit scatter handles (batch, length, hidden) activations; the recurrent state
    # (batch, length, channels, d_state) and the short-conv output are left out and the time per
    # cell is extrapolated to the whole grid (printed as such)
    sites = [s for s in model.site_names() if not s.endswith(("mixer.state", "mixer.conv_output"))]
    t0 = time.perf_counter()
    for which in CORRUPTIONS:
        ids, bad, col = tensors(task, data, which)
        for site in sites:
            layer, component = int(site.split(".")[1]), site.split(".", 2)[2]
            config = pv.IntervenableConfig(representations=[pv.RepresentationConfig(
                layer=layer, component=component, unit="pos", max_number_of_units=1)],
                intervention_types=pv.VanillaIntervention)
            intervenable = pv.IntervenableModel(config, model)
            for position in POSITIONS:
                pos = col[f"{position}_pos"][None, :, None].tolist()
                with torch.no_grad():
                    p_answer(model(ids).logits, col)                 # clean
                    p_answer(model(bad).logits, col)                 # corrupted
                    _, out = intervenable({"input_ids": bad}, [{"input_ids": ids}], {"sources->base": (pos, pos)})
                    p_answer(out.logits, col)                        # patched
    return time.perf_counter() - t0, len(sites)


def nnsight_way(task, model, data):
    from nnsight import NNsight

    model.materialize_sites(True)      # nnsight does not use torch hooks: make mixers run their state sites
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nm = NNsight(model)
    sites = model.site_names()
    t0 = time.perf_counter()
    for which in CORRUPTIONS:
        ids, bad, col = tensors(task, data, which)
        rows = torch.arange(len(ids))
        for site in sites:
            for position in POSITIONS:
                pos = col[f"{position}_pos"]
                path = site.split(".", 2)[2].split(".")
                with torch.no_grad():
                    with nm.trace(ids):
                        target = _walk(nm.model.layers[int(site.split(".")[1])], path)
                        clean = target.output.save()
                    with nm.trace(bad):
                        target = _walk(nm.model.layers[int(site.split(".")[1])], path)
                        target.output[rows, pos] = clean[rows, pos]
                        logits = nm.output.logits.save()
                p_answer(logits, col)
    return time.perf_counter() - t0


def _walk(envoy, path):
    """Follow a site path below a block; nnsight serves submodules named input/output as E_input/E_output."""
    for part in path:
        envoy = getattr(envoy, {"input": "E_input", "output": "E_output"}.get(part, part))
    return envoy


def native_comparison(model_type: str, hidden: int, layers: int, n: int, repeats: int) -> None:
    """FullForwardEngine on ``hf:<model_type>`` vs InterventionEngine on our Transformer (see the
    module's docstring)."""
    from hf_mecheval.adapters import build_native_model, native_config
    from hf_mecheval.interventions.engine import engine_for

    task = build_task("ar_32")
    data = task.generate(n, "test", seed=0)
    torch.manual_seed(0)
    config = native_config(f"hf:{model_type}", vocab_size=task.vocab_size, hidden_size=hidden,
                           num_hidden_layers=layers, max_position_embeddings=64)
    native = build_native_model(config).eval()
    heads = getattr(config, "num_attention_heads", 1)     # GPT-2: n_head through its attribute_map
    torch.manual_seed(0)
    mine = build_model("transformer", vocab_size=task.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, max_position_embeddings=64, kernels="torch").eval()
    sites = [f"layers.{layer}.{kind}" for layer in range(layers) for kind in ("input", "mixer_output", "output")]
    engines = {"ours": engine_for(mine), f"hf:{model_type}": engine_for(native)}
    for name, engine in engines.items():     # both must offer every site compared
        missing = set(sites) - set(engine.site_names())
        assert not missing, f"{name} lacks {sorted(missing)}"
    models = {"ours": mine, f"hf:{model_type}": native}
    ids, _, _ = tensors(task, data, "key")                                 # (n, L) clean documents
    # what the engines run per forward: tokens -> final residual (n, 37, hidden), no LM head (the
    # grid reads logits at the query only)
    forwards = {name: time_forward(engine.full_forward, ids) for name, engine in engines.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(repeats):               # alternate, so that a burst of load hits both
        for name, model in models.items():
            t0 = time.perf_counter()
            run_grid(model, task, data, sites=sites, n_resamples=1, progress=False, batch_size=64,
                     keep_per_example=False)
            times[name].append(time.perf_counter() - t0)
    cells = len(CORRUPTIONS) * len(sites) * len(POSITIONS)
    params = {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()}
    print(f"\nintervention grid, AR ({n} documents of {int(data.lengths.max())} tokens), hidden {hidden}, {layers} layers, {heads} head(s), "
          f"{len(sites)} sites x {len(POSITIONS)} positions x {len(CORRUPTIONS)} corruptions = {cells} cells, "
          f"{torch.get_num_threads()} threads, {repeats} repeats each, alternated")
    for name, engine in engines.items():
        spread = ", ".join(f"{t:.2f}" for t in times[name])
        print(f"  {name:>12} ({type(engine).__name__}, {params[name]:,} parameters): median {statistics.median(times[name]):.2f} s "
              f"({spread}); one forward of {n} documents to the last hidden state {1000 * forwards[name]:.1f} ms")
    ours, theirs = statistics.median(times["ours"]), statistics.median(times[f"hf:{model_type}"])
    forward_ratio = forwards[f"hf:{model_type}"] / forwards["ours"]
    print(f"  hf:{model_type} / ours: {theirs / ours:.2f}x the grid time; {forward_ratio:.2f}x the time of one "
          f"forward, so the engine (whole forwards instead of resuming at the patched layer) accounts for "
          f"{theirs / ours / forward_ratio:.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", default=["mamba", "transformer"])
    parser.add_argument("--n", type=int, default=320)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--peers", nargs="+", default=["pyvene", "nnsight"], choices=["pyvene", "nnsight"])
    parser.add_argument("--vs-native", metavar="MODEL_TYPE",
                        help="compare FullForwardEngine on hf:MODEL_TYPE (e.g. gpt2) with ours on our Transformer")
    parser.add_argument("--hidden", type=int, default=64, help="width for --vs-native")
    parser.add_argument("--layers", type=int, default=2, help="layers for --vs-native")
    parser.add_argument("--repeats", type=int, default=5, help="grid timings per model for --vs-native")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.vs_native:
        native_comparison(args.vs_native, args.hidden, args.layers, args.n, args.repeats)
        return
    for arch in args.arch:
        task, model, data = setup(arch, args.n)
        cells = len(model.site_names()) * len(POSITIONS)
        ids, _, _ = tensors(task, data, "key")
        forward = time_forward(model, ids)
        minimal = len(CORRUPTIONS) * (2 + cells) * forward
        t0 = time.perf_counter()
        run_grid(model, task, data, n_resamples=1000, progress=False, batch_size=64)
        ours = time.perf_counter() - t0
        print(f"\n{arch}, hidden 128, {args.n} documents, {len(model.site_names())} sites x {len(POSITIONS)} positions "
              f"x {len(CORRUPTIONS)} corruptions = {len(CORRUPTIONS) * cells} cells")
        print(f"  one full forward of {args.n} documents: {1000 * forward:.1f} ms; minimal grid "
              f"({len(CORRUPTIONS) * (2 + cells)} forwards): {minimal:.2f} s")
        print(f"  ours (with 1000 bootstrap resamples per cell): {ours:.2f} s = {ours / minimal:.2f}x the minimal "
              f"count (target <= 1.5x) {'ok' if ours <= 1.5 * minimal else 'MISSED'}")
        if args.skip_peers:
            continue
        if "pyvene" in args.peers and importlib.util.find_spec("pyvene"):
            measured, n_sites = pyvene_way(task, model, data)
            ref = measured * len(model.site_names()) / n_sites
            note = "" if n_sites == len(model.site_names()) else \
                f" (measured {measured:.2f} s on the {n_sites} residual-width sites, scaled to all {len(model.site_names())})"
            print(f"  pyvene, the reference way: {ref:.2f} s{note} -> ours is {ref / ours:.1f}x faster "
                  f"(target >= 10x) {'ok' if ref >= 10 * ours else 'MISSED'}")
        if "nnsight" in args.peers and importlib.util.find_spec("nnsight"):
            nn = nnsight_way(task, model, data)
            print(f"  nnsight, one trace per cell: {nn:.2f} s -> ours is {nn / ours:.1f}x faster")


if __name__ == "__main__":
    main()

"""Stacked runs: equivalence with runs trained alone, per-copy data and divergence, resume, the
stack file entry point, and stacking in sweeps."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from hf_mecheval.errors import ConfigError, MechEvalError
from hf_mecheval.tasks.presets import build_task
from hf_mecheval.training.data import PaddedTaskDataset, StackedBatchSampler, batch_collator, epoch_order
from hf_mecheval.training.command_line import parse
from hf_mecheval.training.spec import RunSpec
from hf_mecheval.training.run import main, train
from hf_mecheval.training.trainer import MechEvalTrainer
from hf_mecheval.training.stacked import Member, StackedAdamW, copy_history, train_stacked
from hf_mecheval.training.jobs import Stack
from hf_mecheval.training.sweep import Sweep, launch, plan_jobs

from test_training import StopAt

BASE = ["--task", "ar_32", "--task_config", '{"num_kv": 16, "num_pairs": 2}', "--train_size", "96",
        "--eval_size", "32", "--hidden_size", "16", "--per_device_train_batch_size", "8", "--max_steps", "50",
        "--logging_steps", "10", "--save_strategy", "no", "--disable_tqdm", "true", "--weight_decay", "0.01"]
# five runs: learning rates and seeds (so initialisation and data order) all differ
COPIES = [(1e-3, 0), (2e-3, 1), (3e-3, 2), (5e-4, 3), (1.5e-3, 4)]


def flags(arch, out, lr, seed, *extra):
    pos = ["--max_position_embeddings", "16"] if arch == "transformer" else []
    return BASE + pos + ["--architecture", arch, "--learning_rate", str(lr), "--seed", str(seed),
                         "--output_dir", str(out), *extra]


def members(arch, root, copies=COPIES, *extra):
    return [Member(f"lr{lr}_s{seed}", RunSpec.from_flags(flags(arch, root / f"lr{lr}_s{seed}", lr, seed, *extra)))
            for lr, seed in copies]


def max_weight_difference(a: Path, b: Path) -> float:
    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert x.keys() == y.keys()
    return max((x[k] - y[k]).abs().max().item() for k in x)


# What stacking adds around the model (the per-copy optimizer, clipping, batches, schedule and the
# unstacking into run directories) is the same for every architecture, and every mixer's forward
# and backward under vmap is checked against its copies by the mixer contract test
# (tests/models/test_mixer_contract.py): two architectures, attention and a recurrent scan, suffice here.
WHOLE_RUN_ARCHITECTURES = ["transformer", "mamba"]


@pytest.mark.parametrize("arch", WHOLE_RUN_ARCHITECTURES)
def test_five_stacked_runs_equal_five_runs_trained_alone(arch, tmp_path):
    # 50 steps, 4 epochs (12 steps each: the epoch orders change), weight decay, evaluation every
    # epoch; the Transformer with per-copy clipping at 1 (norms > 1 early on), Mamba with none (the
    # reference recipe's default)
    extra = ("--eval_strategy", "epoch", *(("--max_grad_norm", "1") if arch == "transformer" else ()))
    stacked = members(arch, tmp_path / "stacked", COPIES, *extra)
    finals = train_stacked(stacked, tmp_path / "stack")
    for (lr, seed), member, final in zip(COPIES, stacked, finals):
        alone = tmp_path / "alone" / member.name
        reference = train(RunSpec.from_flags(flags(arch, alone, lr, seed, *extra)))
        assert json.loads((Path(member.training.output_dir) / "run.json").read_text())["training"][
            "max_grad_norm"] == (1.0 if arch == "transformer" else 0.0)
        run = Path(member.training.output_dir)
        assert max_weight_difference(alone, run) <= 1e-4, member.name
        assert final["validation_loss"] == pytest.approx(reference["validation_loss"], abs=1e-4)
        assert final["stack_size"] == 5 and "diverged_at_step" not in final
        history = {e["step"]: e for e in json.loads((run / "metrics.json").read_text())["history"] if "loss" in e}
        expected = {e["step"]: e for e in json.loads((alone / "metrics.json").read_text())["history"] if "loss" in e}
        assert history.keys() == expected.keys() == {10, 20, 30, 40, 50}
        for step in history:
            assert history[step]["loss"] == pytest.approx(expected[step]["loss"], abs=1e-4)
            assert history[step]["learning_rate"] == pytest.approx(expected[step]["learning_rate"], rel=1e-5)
        evals = [e["eval_accuracy"] for e in json.loads((run / "metrics.json").read_text())["history"]
                 if "eval_accuracy" in e]
        assert len(evals) >= 5     # every epoch, then the final validation
        record = json.loads((run / "run.json").read_text())
        assert record["stack"]["size"] == 5 and record["training"]["learning_rate"] == lr
        assert (run / "config.json").exists() and (run / "README.md").exists()
    assert not list((tmp_path / "stack").glob("checkpoint-*"))     # copies live in their run dirs now


class PoisonCopy(TrainerCallback):
    """Sets one copy's embedding to NaN after a step: that copy diverges, by construction."""

    def __init__(self, copy, step):
        self.copy, self.step = copy, step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                model.stacked["model__embed_tokens__weight"][self.copy].fill_(float("nan"))


def test_a_diverging_copy_is_reported_and_leaves_its_siblings_alone(tmp_path, capsys):
    copies = COPIES[:3]
    clean = train_stacked(members("mamba", tmp_path / "clean", copies), tmp_path / "stack_clean")
    poisoned = train_stacked(members("mamba", tmp_path / "poisoned", copies), tmp_path / "stack_poisoned",
                             callbacks=[PoisonCopy(1, 7)])
    assert poisoned[1]["diverged_at_step"] == 8 and "diverged_at_step" not in poisoned[0]
    # marked failed like a lone run that diverges (the training process exits 1), siblings not
    assert poisoned[1]["failed"] == "it diverged: non-finite gradients from step 8"
    assert "failed" not in poisoned[0] and "failed" not in poisoned[2]
    assert "copy 1 (lr0.002_s1) diverged" in capsys.readouterr().err
    for k in (0, 2):
        name = members("mamba", tmp_path, copies)[k].name
        assert max_weight_difference(tmp_path / "clean" / name, tmp_path / "poisoned" / name) == 0.0
        assert poisoned[k]["test_loss"] == clean[k]["test_loss"]
    finished = json.loads((tmp_path / "stack_poisoned" / "finished.json").read_text())
    assert finished["diverged_at_step"] == [-1, 8, -1]


def test_killed_stacked_run_resumes_to_the_same_weights(tmp_path):
    copies = COPIES[:2]
    extra = ("--save_strategy", "steps", "--save_steps", "20")
    train_stacked(members("h3", tmp_path / "whole", copies, *extra), tmp_path / "stack_whole")
    with pytest.raises(KeyboardInterrupt):
        train_stacked(members("h3", tmp_path / "killed", copies, *extra), tmp_path / "stack_killed",
                      callbacks=[StopAt(20)])
    assert (tmp_path / "stack_killed" / "checkpoint-20").exists()
    with pytest.raises(MechEvalError, match="--resume"):
        train_stacked(members("h3", tmp_path / "killed", copies, *extra), tmp_path / "stack_killed")
    train_stacked(members("h3", tmp_path / "killed", copies, *extra), tmp_path / "stack_killed", resume=True)
    for m in members("h3", tmp_path, copies):
        assert max_weight_difference(tmp_path / "whole" / m.name, tmp_path / "killed" / m.name) <= 1e-6


def test_a_stack_job_file_entry_point_and_its_errors(tmp_path, capsys):
    runs = [{"name": f"r{i}", "output_dir": str(tmp_path / f"r{i}"),
             "args": {"task": "ar_32", "task_config": {"num_kv": 16, "num_pairs": 2}, "train_size": 32, "eval_size": 16,
                      "hidden_size": 16, "max_steps": 3, "learning_rate": lr, "architecture": "based",
                      "save_strategy": "no", "eval_strategy": "no"}}
            for i, lr in enumerate((1e-3, 1e-2))]
    spec = tmp_path / "stack.json"
    spec.write_text(json.dumps({"stack_dir": str(tmp_path / "stack"), "runs": runs}))
    assert main(["--job", str(spec)]) == 0
    assert json.loads((tmp_path / "r1" / "metrics.json").read_text())["final"]["global_step"] == 3
    capsys.readouterr()
    assert main(["--job", str(spec)]) == 2                                     # would overwrite
    assert "already holds a finished run" in capsys.readouterr().err
    runs[1]["args"]["hidden_size"] = 32
    spec.write_text(json.dumps({"stack_dir": str(tmp_path / "stack2"), "runs": runs}))
    assert main(["--job", str(spec), "--overwrite"]) == 2
    assert "hidden_size" in capsys.readouterr().err
    spec.write_text(json.dumps({"runs": runs}))
    assert main(["--job", str(spec)]) == 2
    assert "needs a stack_dir" in capsys.readouterr().err
    assert main(["--job", str(tmp_path / "missing.json")]) == 2
    assert "cannot read the job file" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="restoration"):
        train_stacked(members("based", tmp_path / "x", COPIES[:2], "--restoration_every_n_steps", "5"), tmp_path / "s")


def test_a_stack_of_transformers_own_models_is_refused_before_anything_starts(tmp_path, capsys):
    # StackedCausalLM runs our backbone's functional path under vmap; a GPT2LMHeadModel has none
    runs = [{"name": f"g{i}", "output_dir": str(tmp_path / f"g{i}"),
             "args": {"task": "ar_32", "task_config": {"num_kv": 16, "num_pairs": 2}, "train_size": 32,
                      "eval_size": 16, "hidden_size": 16, "max_steps": 3, "learning_rate": lr,
                      "architecture": "hf:gpt2", "save_strategy": "no", "eval_strategy": "no"}}
            for i, lr in enumerate((1e-3, 1e-2))]
    spec = tmp_path / "stack.json"
    spec.write_text(json.dumps({"stack_dir": str(tmp_path / "stack"), "runs": runs}))
    assert main(["--job", str(spec)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        "architecture: hf:gpt2 (run g0) is transformers' own model, which cannot be trained in a stack (--stack); "
        "train those runs one by one (mecheval train, or a sweep, which trains hf: runs alone)"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stack.json"]        # no stack or run directory
    # one hf: member among ours is refused the same way, naming it
    mixed = members("based", tmp_path / "m", COPIES[:1]) + [
        Member("llama", RunSpec.from_flags(flags("hf:llama", tmp_path / "m" / "llama", 1e-3, 1)))]
    with pytest.raises(ConfigError, match=r"^architecture: hf:llama \(run llama\)") as info:
        train_stacked(mixed, tmp_path / "m" / "stack")
    assert info.value.field == "architecture" and not (tmp_path / "m").exists()


def test_batches_follow_each_runs_own_epoch_order(tmp_path):
    data = build_task("ar_32", num_kv=16, num_pairs=2).generate(20, "train", 0)
    sampler = StackedBatchSampler(20, [3, 3, 8], batch_size=6)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        batches = [torch.tensor(b).view(3, -1) for b in sampler]
        assert [len(b[0]) for b in batches] == [6, 6, 6, 2]
        for k, seed in enumerate((3, 3, 8)):
            assert torch.equal(torch.cat([b[k] for b in batches]), epoch_order(20, seed, epoch))
    # a run trained alone visits its documents in epoch_order of its data seed
    dataset = PaddedTaskDataset(data)
    dataset.input_ids[:, 0] = torch.arange(20)
    args = parse(flags("transformer", tmp_path / "o", 1e-3, 5, "--per_device_train_batch_size", "4",
                       "--eval_strategy", "no", "--num_train_epochs", "1"))[3]
    loader = MechEvalTrainer(model=torch.nn.Linear(1, 1), args=args, train_dataset=dataset,
                             data_collator=batch_collator).get_train_dataloader()
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        assert torch.equal(torch.cat([b["input_ids"][:, 0] for b in loader]), epoch_order(20, 5, epoch))
    # --data_seed, where given, orders the documents instead of --seed (which then seeds the weights only)
    args = parse(flags("transformer", tmp_path / "o", 1e-3, 5, "--per_device_train_batch_size", "4",
                       "--eval_strategy", "no", "--num_train_epochs", "1", "--data_seed", "9"))[3]
    loader = MechEvalTrainer(model=torch.nn.Linear(1, 1), args=args, train_dataset=dataset,
                             data_collator=batch_collator).get_train_dataloader()
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        assert torch.equal(torch.cat([b["input_ids"][:, 0] for b in loader]), epoch_order(20, 9, epoch))
    assert not torch.equal(epoch_order(20, 9, 0), epoch_order(20, 5, 0))


def test_copy_history_picks_each_copys_values():
    history = [{"loss": [1.0, 2.0], "epoch": 1.0, "step": 5}, {"train_runtime": 3.0, "note": [1, 2, 3]}]
    assert copy_history(history, 1, 2) == [{"loss": 2.0, "epoch": 1.0, "step": 5},
                                           {"train_runtime": 3.0, "note": [1, 2, 3]}]


# ---------------------------------------------------------------------------------- sweeps
def sweep(**grid):
    return Sweep.from_dict({"name": "st", "task": "ar_32",
                            "defaults": {"task_config": {"num_kv": 16, "num_pairs": 2}, "train_size": 48,
                                         "eval_size": 16, "max_steps": 6, "hidden_size": 16,
                                         "max_position_embeddings": 16, "eval_strategy": "no",
                                         "save_strategy": "no"},
                            "grids": [grid]})


def test_plan_groups_runs_that_differ_in_learning_rate_and_seed_only(tmp_path):
    s = Sweep.from_dict({"name": "p", "task": "ar_32",
                         "grids": [{"architecture": ["mamba", "h3"], "learning_rate": [1e-3, 3e-3, 1e-2]}],
                         "seeds": [0, 1]})
    jobs = plan_jobs(s.runs, tmp_path, stack=4)
    stacks = [j for j in jobs if isinstance(j, Stack)]
    assert sorted(len(j.runs) for j in stacks) == [2, 2, 4, 4]                 # 6 runs per architecture
    assert all(len({r.args["architecture"] for r in j.runs}) == 1 for j in stacks)
    assert sorted(r.name for j in stacks for r in j.runs) == sorted(r.name for r in s.runs)
    assert plan_jobs(s.runs, tmp_path, stack=4) == jobs                         # deterministic names
    # without stacking, the sweep file's order (not grouped by architecture)
    assert plan_jobs(s.runs, tmp_path, stack=1) == s.runs
    # a run a killed worker left with a checkpoint comes first and resumes alone
    (tmp_path / s.runs[3].name / "checkpoint-3").mkdir(parents=True)
    assert plan_jobs(s.runs, tmp_path, stack=4)[0] == s.runs[3]
    assert plan_jobs(s.runs, tmp_path, stack=1) == [s.runs[3]] + s.runs[:3] + s.runs[4:]


def test_a_sweep_trains_transformers_own_models_one_by_one(tmp_path):
    s = sweep(architecture=["hf:gpt2", "based"], learning_rate=[1e-3, 3e-3])
    native = [r for r in s.runs if r.args["architecture"] == "hf:gpt2"]
    jobs = plan_jobs(s.runs, tmp_path / "st" / "runs", stack=4)
    stacks = [j for j in jobs if isinstance(j, Stack)]
    assert [[r.args["architecture"] for r in j.runs] for j in stacks] == [["based", "based"]]
    assert [j for j in jobs if not isinstance(j, Stack)] == native             # each alone, in the file's order
    # trained: each hf: run is a run of its own (no stack record), and the sweep finishes
    s = sweep(architecture=["hf:gpt2"], learning_rate=[1e-3, 3e-3])
    outcome = launch(s, tmp_path, progress=False, stack=2)
    assert sorted(outcome["finished"]) == sorted(r.name for r in s.runs) and not outcome["failed"]
    for r in s.runs:
        record = json.loads((tmp_path / "st" / "runs" / r.name / "run.json").read_text())
        assert record["model"]["architecture"] == "hf:gpt2" and "stack" not in record
    assert not (tmp_path / "st" / "stacks").exists() or not any((tmp_path / "st" / "stacks").iterdir())


def test_stacked_sweep_trains_resumes_and_skips(tmp_path):
    s = sweep(architecture=["based"], learning_rate=[1e-3, 3e-3, 1e-2])
    runs_dir = tmp_path / "st" / "runs"
    # a stacked job killed after its checkpoint, as a dead worker leaves it
    plan = plan_jobs(s.runs, runs_dir, stack=2)
    stack = next(j for j in plan if isinstance(j, Stack))
    killed = [Member(r.name, RunSpec.from_values({**r.args, "output_dir": str(runs_dir / r.name),
                                                  "save_strategy": "steps", "save_steps": 3}))
              for r in stack.runs]
    with pytest.raises(KeyboardInterrupt):
        train_stacked(killed, tmp_path / "st" / "stacks" / stack.name, callbacks=[StopAt(3)])
    outcome = launch(s, tmp_path, progress=False, stack=2)
    assert sorted(outcome["finished"]) == sorted(r.name for r in s.runs) and not outcome["failed"]
    log = (tmp_path / "st" / "stacks" / f"{stack.name}.log").read_text()
    assert f"resuming from {tmp_path / 'st' / 'stacks' / stack.name / 'checkpoint-3'}\n" in log
    for r in stack.runs:
        record = json.loads((runs_dir / r.name / "run.json").read_text())
        assert record["stack"]["size"] == 2
    again = launch(s, tmp_path, progress=False, stack=2)
    assert again["finished"] == [] and len(again["skipped"]) == 3
    with pytest.raises(ConfigError, match="stack"):
        launch(s, tmp_path, progress=False, stack=0)


def test_stacked_adamw_is_torch_fused_adamw_on_each_copy():
    """Every copy steps exactly as torch.optim.AdamW(fused=True) with its own learning rate, weight
    decay on the decayed parameters only; the state survives a state_dict round trip."""
    K, lrs = 3, [1e-3, 3e-3, 1e-2]
    g = torch.Generator().manual_seed(0)
    shapes = {"w": (K, 4, 5), "b": (K, 5)}
    stacked = {n: torch.nn.Parameter(torch.randn(*s, generator=g)) for n, s in shapes.items()}
    lone = [[torch.nn.Parameter(stacked[n].detach()[k].clone()) for n in shapes] for k in range(K)]
    opt = StackedAdamW(list(stacked.items()), lrs, weight_decay=0.1, decay={"w"})
    lone_opts = [torch.optim.AdamW([{"params": [w], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}],
                                   lr=lr, fused=True) for (w, b), lr in zip(lone, lrs)]
    for step in range(4):
        if step == 2:                          # resume mid-way, as from a checkpoint
            state = opt.state_dict()
            opt = StackedAdamW(list(stacked.items()), lrs, weight_decay=0.1, decay={"w"})
            opt.load_state_dict(state)
        grads = {n: torch.randn(*s, generator=g) for n, s in shapes.items()}
        for n, p in stacked.items():
            p.grad = grads[n].clone()
        opt.step()
        for k in range(K):
            for p, n in zip(lone[k], shapes):
                p.grad = grads[n][k].clone()
            lone_opts[k].step()
            for p, n in zip(lone[k], shapes):
                assert torch.equal(stacked[n].detach()[k], p.detach()), (step, k, n)


@pytest.mark.parametrize("spec, message", [
    ({"stack_dir": 3, "runs": []}, "stack_dir: s.json: the stack's folder must be a folder name, got 3"),
    ({"stack_dir": "st", "runs": []}, "runs: s.json lists no runs"),
    ({"stack_dir": "st", "runs": [{"name": ["a"], "output_dir": "x", "args": {}}]},
     "name: entry 0 of s.json: name must be a non-empty string, got ['a']"),
    ({"stack_dir": "st", "runs": [{"name": "a", "output_dir": None, "args": {}}]},
     "output_dir: entry 0 of s.json: output_dir must be a non-empty string, got None"),
])
def test_bad_job_files_are_one_line(tmp_path, capsys, monkeypatch, spec, message):
    monkeypatch.chdir(tmp_path)
    Path("s.json").write_text(json.dumps(spec))
    assert main(["--job", "s.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_auto_stacking_fits_half_the_free_gpu_memory_by_the_runs_own_estimate(monkeypatch):
    from hf_mecheval.training.arguments import run_memory
    from hf_mecheval.training.sweep import stack_size_that_fits

    spec = RunSpec.from_values({"task": "ar_32", "architecture": "mamba", "hidden_size": 64})
    if not torch.cuda.is_available():
        # a CPU: stacks of 8 at widths 16 and 32 (mostly overhead there), none from 64 on
        assert stack_size_that_fits(spec) == 1
        for width in (16, 32):
            small = RunSpec.from_values({"task": "ar_32", "architecture": "mamba", "hidden_size": width})
            assert stack_size_that_fits(small) == 8
    # on a GPU (simulated here): the copy costs what the run's own memory check estimates on the device
    per_copy = sum(run_memory(spec.config, spec.task, spec.train_size, spec.eval_size, spec.run,
                              spec.training)["device"].values())
    assert per_copy > 16 * 64 * 64                     # parameters, state and activations of one copy
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for free, size in ((10.9 * per_copy, 5), (1.5 * per_copy, 1), (1e6 * per_copy, 32)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda free=free: (int(free), int(free)))
        assert stack_size_that_fits(spec) == size

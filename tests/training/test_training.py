"""Training runs through the Trainer: learning, determinism, resume, run directories, errors,
two processes through `accelerate launch`."""
import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, TrainerCallback

import hf_mecheval  # noqa: F401
from hf_mecheval.errors import MechEvalError
from hf_mecheval.models.cpu_kernels import cpu_identity
from hf_mecheval.runs.code_version import code_version
from hf_mecheval.training.command_line import parse
from hf_mecheval.training.spec import RunSpec
from hf_mecheval.training.run import main, train
from hostile_inputs import BOMB

REPO = Path(__file__).resolve().parents[2]
TINY_AR = ["--task", "ar_32", "--task_config", '{"num_kv": 16, "num_pairs": 2}', "--architecture", "transformer",
           "--hidden_size", "64", "--max_position_embeddings", "16", "--disable_tqdm", "true"]


def run_args(tmp, *extra):
    return TINY_AR + ["--output_dir", str(tmp), *extra]


def test_tiny_ar_is_learned_by_the_transformer(tmp_path, capfd):
    # 16 000 documents x 10 epochs = 5 000 steps: about 20 s on two cores
    argv = run_args(tmp_path / "run", "--train_size", "16000", "--eval_size", "500", "--num_train_epochs", "10",
                    "--learning_rate", "3e-4", "--eval_strategy", "no", "--save_strategy", "no", "--logging_steps", "1000")
    assert main(argv) == 0
    # the run prints a test document as text, with the model's answer
    example = next(line for line in capfd.readouterr().err.splitlines() if "test document 0:" in line)
    assert example.startswith("run, test document 0: <bos> k") and example.endswith(": right)")
    # text in, text out: the pipeline over the run directory answers as the paper's documents read
    from transformers import pipeline

    from hf_mecheval.tasks import build_task

    doc = build_task("ar_32", num_kv=16, num_pairs=2).generate(20, "test", seed=7)
    generate = pipeline("text-generation", model=str(tmp_path / "run"))
    names = generate.tokenizer.convert_ids_to_tokens
    right = 0
    for i in range(len(doc)):
        d = doc.document(i)
        prompt = " ".join(names(d["input_ids"][:d["answer_pos"]]))
        out = generate(prompt)[0]["generated_text"]
        right += out == f"{prompt} {names(d['answer'])}"
    assert right >= 19
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["final"]["test_accuracy"] >= 0.95
    assert "test_by_length" not in metrics["final"]          # AR's documents are all as long
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "run")
    assert model.config.model_type == "mecheval-transformer"
    for name in ("command.txt", "run.json", "config.json", "model.safetensors", "trainer_state.json",
                 "tokenizer.json", "generation_config.json", "modeling_mecheval.py"):
        assert (tmp_path / "run" / name).exists()
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["training"]["lr_scheduler_type"] == "cosine" and record["training"]["warmup_steps"] == 0.1


def test_atr_records_test_accuracy_by_document_length(tmp_path):
    """ATR's documents run from a few tokens to many: metrics.json splits the test accuracy by
    length, [0, 16), [16, 32), ...; checked against the run's model scoring each test document."""
    import numpy as np

    from hf_mecheval.tasks import build_task

    run = tmp_path / "run"
    assert main(["--task", "atr_easy", "--architecture", "mamba", "--hidden_size", "16", "--train_size", "256",
                 "--eval_size", "200", "--max_steps", "60", "--learning_rate", "3e-3", "--eval_strategy", "no",
                 "--save_strategy", "no", "--disable_tqdm", "true", "--output_dir", str(run)]) == 0
    final = json.loads((run / "metrics.json").read_text())["final"]
    test = build_task("atr_easy").generate(200, "test", seed=0)
    model = AutoModelForCausalLM.from_pretrained(run).eval()
    right = []
    with torch.no_grad():
        for i in range(len(test)):
            doc = test.document(i)
            logits = model(input_ids=torch.tensor([doc["input_ids"]])).logits[0]
            right.append(int(logits[doc["answer_pos"] - 1].argmax()) == doc["answer"])
    right, lengths = np.array(right), test.lengths
    assert final["test_accuracy"] == pytest.approx(right.mean(), abs=1e-6)
    expected = []
    for lo, hi in ((0, 16), (16, 32), (32, 64), (64, 128), (128, 256)):
        rows = (lengths >= lo) & (lengths < hi)
        if rows.any():
            expected.append({"length_from": lo, "length_to": hi, "documents": int(rows.sum()),
                             "accuracy": pytest.approx(float(right[rows].mean()), abs=1e-6)})
    assert len(expected) >= 3 and final["test_by_length"] == expected


SHORT = ["--train_size", "640", "--eval_size", "64", "--max_steps", "40", "--logging_steps", "5",
         "--save_steps", "20", "--save_strategy", "steps", "--eval_strategy", "no", "--hidden_size", "16"]


def losses(run_dir):
    state = json.loads((Path(run_dir) / "trainer_state.json").read_text())
    return [(e["step"], e["loss"]) for e in state["log_history"] if "loss" in e]


def test_same_seed_same_losses(tmp_path):
    assert main(run_args(tmp_path / "a", *SHORT)) == 0
    assert main(run_args(tmp_path / "b", *SHORT)) == 0
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert len(a) == 8 and a == b
    assert main(run_args(tmp_path / "c", *SHORT, "--seed", "1")) == 0
    assert losses(tmp_path / "c") != a
    # trainer_state's total_flos: 6 x tokens x non-embedding parameters per step, as transformers
    # counts it (the parameter count is taken once per run, not at every step)
    state = json.loads((tmp_path / "a" / "trainer_state.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    tokens = 32 * 9      # a batch: 32 documents of 9 tokens (2 pairs)
    assert state["total_flos"] == 40 * 6 * tokens * model.num_parameters(exclude_embeddings=True)


def test_the_reference_recipe_does_not_clip_gradients(tmp_path, monkeypatch):
    """The reference trains with no gradient clipping (transformers' default would clip at 1.0):
    the Trainer's clipping is never called, yet clipping at 1 is one flag away and does change
    the run (its gradient norms pass 1 here)."""
    from hf_mecheval.training.trainer import MechEvalTrainer

    calls = []
    clip = MechEvalTrainer._clip_grad_norm
    monkeypatch.setattr(MechEvalTrainer, "_clip_grad_norm", lambda self, model: calls.append(1) or clip(self, model))
    fast = ("--learning_rate", "3e-2")
    assert main(run_args(tmp_path / "reference", *SHORT, *fast)) == 0
    record = json.loads((tmp_path / "reference" / "run.json").read_text())
    assert calls == [] and record["training"]["max_grad_norm"] == 0.0
    assert record["model"]["init_scheme"] == "reference"
    assert main(run_args(tmp_path / "clipped", *SHORT, *fast, "--max_grad_norm", "1")) == 0
    assert len(calls) == 40
    norms = [e["grad_norm"] for e in json.loads((tmp_path / "reference" / "metrics.json").read_text())["history"]
             if "grad_norm" in e]
    assert max(norms) > 1
    assert losses(tmp_path / "clipped") != losses(tmp_path / "reference")


class StopAt(TrainerCallback):
    """Simulates a run killed right after its checkpoint at `step`."""

    def __init__(self, step):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            raise KeyboardInterrupt


@pytest.mark.parametrize("stop", [20, 30])        # 640 documents in batches of 32: an epoch is 20 steps
def test_killed_run_resumes_to_the_same_weights(tmp_path, stop):
    """Killed at an epoch's end (20) or in the middle of the second epoch (30, where the resumed
    run must skip the ten batches of that epoch's own shuffle it already took): the same losses
    after the kill and the same final weights as a run never stopped."""
    every_ten = [*SHORT, "--save_steps", "10"]
    assert main(run_args(tmp_path / "whole", *every_ten)) == 0
    args = RunSpec.from_flags(run_args(tmp_path / "broken", *every_ten))
    with pytest.raises(KeyboardInterrupt):
        train(args, callbacks=[StopAt(stop)])
    assert not (tmp_path / "broken" / "metrics.json").exists()
    assert main(run_args(tmp_path / "broken", *every_ten, "--resume")) == 0
    whole = {step: loss for step, loss in losses(tmp_path / "whole") if step > stop}
    resumed = {step: loss for step, loss in losses(tmp_path / "broken") if step > stop}
    assert whole and resumed.keys() == whole.keys() and resumed == pytest.approx(whole, rel=1e-5)
    a = load_file(tmp_path / "whole" / "model.safetensors")
    b = load_file(tmp_path / "broken" / "model.safetensors")
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    # the weights are readable as the other outputs are (safetensors writes 0600 by itself)
    umask = os.umask(0o022)                               # (reads the process's umask; set back below)
    os.umask(umask)
    for weights in [tmp_path / "broken" / "model.safetensors", *(tmp_path / "broken").glob("checkpoint-*/*.safetensors")]:
        assert stat.S_IMODE(weights.stat().st_mode) == 0o666 & ~umask, weights


def test_ctrl_c_is_one_line_and_says_how_to_continue(tmp_path, capsys, monkeypatch):
    import hf_mecheval.training.run as run_module

    args = run_args(tmp_path / "run", *SHORT)
    # Ctrl-C inside the Trainer's loop, right after the checkpoint at step 20
    original = run_module.train
    monkeypatch.setattr(run_module, "train", lambda *a, **k: original(*a, **k, callbacks=[StopAt(20)]))
    assert main(args) == 130
    monkeypatch.setattr(run_module, "train", original)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("mecheval train: interrupted") and "--resume" in err[-1]
    assert "Traceback" not in "\n".join(err)
    assert main([*args, "--resume"]) == 0                  # and it continues


@pytest.mark.parametrize("extra, message", [
    (["--architecture", "rwkv"], "architecture: unknown architecture 'rwkv'"),
    (["--task", "ar_64"], "task: unknown preset 'ar_64'"),
    (["--learning_rate", "-0.1"], "learning_rate: must be > 0"),
    (["--max_steps", "0"], "max_steps: must be >= 1, or -1"),
    (["--gradient_accumulation_steps", "-1"], "gradient_accumulation_steps: must be >= 1"),
    (["--gradient_accumulation_steps", "0"], "gradient_accumulation_steps: must be >= 1"),
    (["--label_smoothing_factor", "-1"], "label_smoothing_factor: must be in [0, 1)"),
    (["--adam_beta1", "-1"], "adam_beta1: must be in [0, 1)"),
    (["--adam_epsilon", "0"], "adam_epsilon: must be > 0"),
    (["--dataloader_num_workers", "-1"], "dataloader_num_workers: must be >= 0"),
    (["--dataloader_num_workers", "100000"], "dataloader_num_workers: must be <="),
    (["--model_config", "{conv"], "model_config: must be a JSON object"),
    (["--task_config", '{"num_kv": 7}'], "num_kv: must be even"),
    (["--recipe", "slow"], "recipe: must be 'reference' or 'quick'"),
    (["--model_config", '{"conv_kernl": 0}'], "model_config: unknown field 'conv_kernl' for transformer"),
    (["--model_config", '{"vocab_size": 10}'], "model_config: vocab_size comes from the task"),
    (["--hidden_size", "abc"], "invalid int value: 'abc'"),
    (["--hidden_size", "-5"], "hidden_size: must be >= 1"),
    (["--per_device_train_batch_size", "0"], "per_device_train_batch_size: must be >= 1"),
    (["--seed", "-1"], "seed: must be >= 0"),
    (["--seed", str(2**32)], "seed: must be <= 4294967295"),
    (["--dataset_seed", "-1"], "dataset_seed: must be >= 0"),
    (["--restoration_every_n_steps", "5", "--restoration_examples", "0"], "restoration_examples: must be >= 1"),
    # NaN and infinity wherever a number is read
    (["--learning_rate", "nan"], "learning_rate: must be a finite number, got nan"),
    (["--learning_rate", "inf"], "learning_rate: must be a finite number, got inf"),
    (["--num_train_epochs", "inf"], "num_train_epochs: must be a finite number, got inf"),
    (["--warmup_steps", "nan"], "warmup_steps: must be a finite number"),
    (["--max_grad_norm", "nan"], "max_grad_norm: must be a finite number"),
    (["--mixer_forms", "v2"], "mixer_forms: must be one of reference, mecheval-v1, got 'v2'"),
    (["--init_scheme", "xavier"], "init_scheme: must be one of 'reference', 'normal', got 'xavier'"),
    (["--architecture", "hyena", "--mixer_forms", "reference", "--model_config", '{"filter_form": "mecheval-v1"}'],
     "mixer_forms: --mixer_forms reference and --model_config's filter_form 'mecheval-v1' disagree"),
    (["--task_config", '{"num_kv": 16, "num_pairs": 2, "heldout_fraction": NaN}'], "NaN is not a finite number"),
    (["--model_config", '{"layer_norm_eps": Infinity}'], "Infinity is not a finite number"),
    (["--model_config", '{"initializer_range": 1e999}'], "1e999 is not a finite number"),
    # sizes that cannot fit in memory, refused with the estimate
    (["--hidden_size", "1000000000"], "the model cannot be built"),
    (["--hidden_size", "1000000"], "parameters, 640 training documents) would need about"),
    (["--num_hidden_layers", "100000000"], "would need about"),
    (["--task_config", '{"num_kv": 2000000000, "num_pairs": 2}'], "would need about"),
    (["--train_size", str(10**12)], "would need about"),
    (["--per_device_eval_batch_size", str(10**12)], "would need about"),
    (["--restoration_every_n_steps", "5", "--restoration_examples", str(10**12)], "would need about"),
    (["--task", "atr_easy", "--task_config", '{"num_terminals": 1000000000}'], "this ATR grammar would need about"),
    (["--task", "atr_easy", "--task_config", '{"num_nonterminals": 10000000}'], "num_nonterminals: must be <= 100000"),
    (["--data_seed", str(10**30)], "data_seed: must be <= 4294967295"),
    # TrainingArguments values that transformers only trips on once training starts (or ends)
    (["--optim", "adamw_bnb_8bit"], "optim: adamw_bnb_8bit: You need to install `bitsandbytes`"),
    (["--report_to", "wandb"], "report_to: WandbCallback requires wandb"),
    (["--save_strategy", "best"], "metric_for_best_model: is needed by --save_strategy best"),
    (["--metric_for_best_model", "bleu"], "metric_for_best_model: must be one of accuracy, answer_prob, loss"),
    (["--logging_steps", "inf"], "logging_steps: must be a finite number, got inf"),
    (["--eval_steps=nan"], "eval_steps: must be a finite number, got nan"),
    (["--label_names", "x"], "label_names: must be 'labels'"),
    (["--hidden_size", str(10**20)], "hidden_size: must be <= 9,007,199,254,740,992"),
    (["--per_device_train_batch_size", str(10**20)], "per_device_train_batch_size: must be <= 9,007,199,254,740,992"),
    # TrainingArguments' own choices, whose refusal names the value but not the flag
    (["--lr_scheduler_type", "foo"], "lr_scheduler_type: foo is not a valid SchedulerType"),
    (["--save_strategy=sometimes"], "save_strategy: sometimes is not a valid SaveStrategy"),
    # fused kernels asked for where they cannot run: refused before the run's folder is written
    pytest.param(["--architecture", "mamba", "--kernels", "cuda"], "kernels: 'cuda' requested for mamba but CUDA",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="the kernels may be there")),
])
def test_bad_arguments_one_line_nonzero(tmp_path, capsys, extra, message):
    code = main(run_args(tmp_path / "run", *SHORT, *extra))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0]
    assert not (tmp_path / "run").exists()


def test_bad_config_files_one_line_nonzero(tmp_path, capsys):
    for name, content in (("bin.yaml", bytes(range(256)) * 4), ("nan.yaml", b"learning_rate: .nan\n"),
                          ("inf.json", b'{"learning_rate": Infinity}'), ("deep.yaml", b"model_config: {dt_min: .inf}\n")):
        (tmp_path / name).write_bytes(content)
        assert main([str(tmp_path / name), *run_args(tmp_path / "run", *SHORT)]) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(tmp_path / name) in err[0], err
        assert not (tmp_path / "run").exists()


def test_existing_run_is_never_overwritten(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("precious")
    assert main(run_args(run, *SHORT)) == 2
    assert "already holds files" in capsys.readouterr().err
    assert (run / "notes.txt").read_text() == "precious"
    assert main(run_args(tmp_path / "empty", *SHORT, "--resume")) == 2
    assert "holds no run" in capsys.readouterr().err


def test_overwrite_checks_the_new_run_before_removing_the_old(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(run_args(run, *SHORT, "--max_steps", "2")) == 0
    before = sorted(p.name for p in run.iterdir())
    for bad in (["--hidden_size", "-5"], ["--task_config", '{"num_kvv": 64}'], ["--per_device_train_batch_size", "0"]):
        assert main(run_args(run, *SHORT, "--overwrite", *bad)) == 2
        assert sorted(p.name for p in run.iterdir()) == before, bad
    capsys.readouterr()
    assert main(run_args(run, *SHORT, "--max_steps", "3", "--overwrite")) == 0
    assert json.loads((run / "metrics.json").read_text())["final"]["global_step"] == 3


def test_corrupt_checkpoint_gives_a_clear_error(tmp_path, capsys):
    args = RunSpec.from_flags(run_args(tmp_path / "run", *SHORT))
    with pytest.raises(KeyboardInterrupt):
        train(args, callbacks=[StopAt(20)])
    ckpt = tmp_path / "run" / "checkpoint-20"
    (ckpt / "model.safetensors").write_bytes(b"not a safetensors file")
    capsys.readouterr()
    assert main(run_args(tmp_path / "run", *SHORT, "--resume")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot resume from" in err[0] and "checkpoint-20" in err[0]


def test_yaml_config_with_overrides(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("task: ar_32\ntask_config: {num_kv: 16, num_pairs: 2}\narchitecture: mamba\nhidden_size: 16\n"
                      f"output_dir: {tmp_path / 'run'}\ntrain_size: 64\neval_size: 16\nmax_steps: 3\n"
                      "learning_rate: 0.01\nmodel_config: {conv_kernel: 2}\n")
    model, data, run, training = parse([str(config), "--learning_rate", "0.002"])
    assert (model.architecture, training.learning_rate, data.train_size) == ("mamba", 0.002, 64)
    assert json.loads(model.model_config) == {"conv_kernel": 2}
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: ar_32\nlearning_rat: 0.1\n")
    with pytest.raises(MechEvalError, match="learning_rat"):
        parse([str(bad)])


def test_two_processes_through_accelerate_launch(tmp_path):
    """Two processes of 16 rows each train what one process of 32 rows trains: each step's global
    batch is the same documents (each process takes every other batch of one seeded order) and
    the gradients' all-reduce averages the two halves' mean losses (one answer per AR row)."""
    run = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # accelerate's torchrun-style launcher; --use_cpu makes the Trainer use gloo on the CPU
    with socket.socket() as sock:                 # a free port: never collide with another run
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
           str(REPO / "training" / "train.py"), *run_args(run, *SHORT), "--use_cpu", "true",
           "--per_device_train_batch_size", "16"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["final"]["world_size"] == 2
    one = tmp_path / "one"
    assert main(run_args(one, *SHORT, "--per_device_train_batch_size", "32")) == 0
    # measured: 1.2e-7 apart at most (weights up to ~1), the all-reduce's order of summation
    two_weights, one_weights = load_file(run / "model.safetensors"), load_file(one / "model.safetensors")
    assert max((two_weights[k] - one_weights[k]).abs().max().item() for k in one_weights) < 1e-5
    assert [s for s, _ in losses(run)] == [s for s, _ in losses(one)] == list(range(5, 41, 5))
    assert [l for _, l in losses(run)] == pytest.approx([l for _, l in losses(one)], abs=1e-5)
    # command.txt: the launch to type again
    assert (run / "command.txt").read_text().startswith(
        f"accelerate launch --multi_gpu --num_processes 2 {REPO / 'training' / 'train.py'} --task ar_32 ")
    model = AutoModelForCausalLM.from_pretrained(run)
    assert isinstance(model, torch.nn.Module)


def test_corrupt_optimizer_state_gives_a_clear_error(tmp_path, capsys):
    args = RunSpec.from_flags(run_args(tmp_path / "run", *SHORT))
    with pytest.raises(KeyboardInterrupt):
        train(args, callbacks=[StopAt(20)])
    (tmp_path / "run" / "checkpoint-20" / "optimizer.pt").write_bytes(b"garbage")
    capsys.readouterr()
    assert main(run_args(tmp_path / "run", *SHORT, "--resume")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot resume from" in err[0]


def test_a_trainer_state_transformers_cannot_read_gives_a_clear_error(tmp_path, capsys):
    args = RunSpec.from_flags(run_args(tmp_path / "run", *SHORT))
    with pytest.raises(KeyboardInterrupt):
        train(args, callbacks=[StopAt(20)])
    state_file = tmp_path / "run" / "checkpoint-20" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    # a key another transformers wrote (the Trainer would stop in TrainerState(**state)), and a list
    for damaged, why in (({**state, "a_future_field": 1}, "keys this transformers' TrainerState does not know: "
                                                           "a_future_field"), ([state], "is not a JSON object")):
        state_file.write_text(json.dumps(damaged))
        capsys.readouterr()
        assert main(run_args(tmp_path / "run", *SHORT, "--resume")) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cannot resume from" in err[0] and why in err[0], err


def test_resume_falls_back_past_a_checkpoint_whose_optimizer_state_is_damaged(tmp_path, capsys):
    args = RunSpec.from_flags(run_args(tmp_path / "run", *SHORT, "--save_strategy", "steps", "--save_steps", "10"))
    with pytest.raises(KeyboardInterrupt):
        train(args, callbacks=[StopAt(20)])
    optimizer = tmp_path / "run" / "checkpoint-20" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[: optimizer.stat().st_size // 2])      # a save cut short
    capsys.readouterr()
    assert main(run_args(tmp_path / "run", *SHORT, "--save_strategy", "steps", "--save_steps", "10", "--resume")) == 0
    err = capsys.readouterr().err
    assert "resume: removed" in err and "checkpoint-20: optimizer.pt is damaged" in err
    history = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["log_history"]
    assert history[-1]["step"] == 40


def test_linear_decay_is_the_default_where_the_reference_used_it():
    def schedule(*argv):
        return parse(["--output_dir", "x", *argv])[3].lr_scheduler_type.value

    assert schedule("--task", "atr_gen") == schedule("--task", "atr_sibling") == "linear"
    assert schedule("--task", "atr_easy") == schedule("--task", "ar_32") == "cosine"
    assert schedule("--task", "atr_gen", "--lr_scheduler_type", "cosine") == "cosine"     # chosen explicitly


def test_gradient_accumulation_logs_the_same_loss(tmp_path):
    # the loss is a mean over answers: 2 accumulated half batches give the mean of the whole batch
    logged = []
    for name, flags in (("whole", ["--per_device_train_batch_size", "32"]),
                        ("halves", ["--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "2"])):
        assert main(run_args(tmp_path / name, *SHORT, "--max_steps", "2", "--logging_steps", "1", *flags)) == 0
        logged.append([loss for _, loss in losses(tmp_path / name)])
    assert logged[0] == pytest.approx(logged[1], rel=1e-5)


class CountMixerCalls(TrainerCallback):
    """The first layer's token mixer calls in each training step (a pre-hook: a recomputation in
    backward stops once it has its saved tensors back, which can be inside the mixer)."""

    def __init__(self):
        self.per_step, self.calls = [], 0

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model.model.layers[0].mixer.register_forward_pre_hook(lambda *a: setattr(self, "calls", self.calls + 1))

    def on_step_end(self, args, state, control, **kwargs):
        self.per_step.append(self.calls)
        self.calls = 0


def test_gradient_checkpointing_flag_recomputes_and_trains_the_same(tmp_path):
    logged, calls = [], []
    for name, flags in (("plain", []), ("checkpointed", ["--gradient_checkpointing", "true"])):
        counter = CountMixerCalls()
        train(RunSpec.from_flags(run_args(tmp_path / name, *SHORT, "--max_steps", "3", "--logging_steps", "1",
                                          *flags)), callbacks=[counter])
        logged.append([loss for _, loss in losses(tmp_path / name)])
        calls.append(counter.per_step)
    # the flag reaches the model: each step's forward runs the mixer once, and again in backward
    assert calls == [[1, 1, 1], [2, 2, 2]]
    assert logged[0] == pytest.approx(logged[1], rel=1e-5)


def test_restoration_history_survives_a_resume(tmp_path):
    extra = ["--restoration_every_n_steps", "10", "--restoration_examples", "16"]
    args = RunSpec.from_flags(run_args(tmp_path / "run", *SHORT, *extra))
    with pytest.raises(KeyboardInterrupt):
        train(args, callbacks=[StopAt(20)])
    logged = json.loads((tmp_path / "run" / "checkpoint-20" / "trainer_state.json").read_text())["log_history"]
    before = [{k: e.get(k) for k in ("step", "restoration_accuracy", "restoration@key", "restoration@value",
                                      "restoration@query")} for e in logged if "restoration_accuracy" in e]
    assert [e["step"] for e in before] == [10, 20]
    assert main(run_args(tmp_path / "run", *SHORT, *extra, "--resume")) == 0
    history = json.loads((tmp_path / "run" / "restoration_history.json").read_text())
    assert [e["step"] for e in history] == [10, 20, 30, 40]
    # what was measured before the interruption comes back as it was (a score of None is not logged)
    assert [{**e, **{k: v for k, v in b.items() if v is not None}} for e, b in zip(history, before)] == history[:2]
    # the last entry is of the final model, on the first validation documents (40 steps teach it
    # too little for restoration scores: those are checked on hand-built models, test_engine.py)
    from hf_mecheval.interventions.grid import run_grid
    from hf_mecheval.reports.evaluate_run import load_run

    model, task, record = load_run(tmp_path / "run")
    grid = run_grid(model.eval(), task, task.generate(16, "validation", record["task"].get("dataset_seed", 0)),
                    n_resamples=0, progress=False)
    assert history[-1]["restoration_accuracy"] == pytest.approx(grid["corruptions"]["key"]["clean_accuracy"])


def test_wall_time_adds_up_over_a_resume(tmp_path):
    args = RunSpec.from_flags(run_args(tmp_path / "run", *SHORT))
    with pytest.raises(KeyboardInterrupt):
        train(args, callbacks=[StopAt(20)])
    saved = json.loads((tmp_path / "run" / "checkpoint-20" / "wall_time.json").read_text())
    assert saved["segments"] == 1 and saved["seconds"] > 0 and saved["cpu_seconds"] > 0
    assert main(run_args(tmp_path / "run", *SHORT, "--resume")) == 0
    final = json.loads((tmp_path / "run" / "metrics.json").read_text())["final"]
    assert final["train_segments"] == 2 and final["threads"] == torch.get_num_threads()
    assert saved["code"] == [code_version()] and final["train_code"] == [code_version()] * 2   # one per segment
    # the second segment trained as many steps as the first: the total is more than the first alone
    assert final["train_wall_seconds"] > saved["seconds"] and final["train_cpu_seconds"] > saved["cpu_seconds"]
    # each segment's own time: the first as its checkpoint saved it, the second the rest of the total
    first, second = final["train_segment_times"]
    assert saved["segment_times"] == [first]
    assert first["steps"] == 20 and second["steps"] == final["global_step"] - 20 == 20
    assert first["threads"] == second["threads"] == torch.get_num_threads()
    assert first["cpu_signature"] == second["cpu_signature"] == cpu_identity()["cpu_signature"]   # both here
    assert first["wall_seconds"] + second["wall_seconds"] == pytest.approx(final["train_wall_seconds"], abs=0.11)
    assert first["cpu_seconds"] + second["cpu_seconds"] == pytest.approx(final["train_cpu_seconds"], abs=0.11)


def test_a_finished_run_resumed_from_its_last_checkpoint_writes_the_same_metrics_again(tmp_path):
    """metrics.json moved away, the run resumed: no step trained, the same weights and figures, a
    segment of 0 steps recorded, and no zero-step Trainer summary (train_loss 0.0) in the history."""
    run = tmp_path / "run"
    args = ["--task", "atr_easy", "--architecture", "mamba", "--hidden_size", "16", "--train_size", "256",
            "--eval_size", "200", "--max_steps", "40", "--save_steps", "20", "--save_strategy", "steps",
            "--learning_rate", "3e-3", "--eval_strategy", "no", "--logging_steps", "10", "--disable_tqdm", "true",
            "--output_dir", str(run)]
    assert main(args) == 0
    weights = (run / "model.safetensors").read_bytes()
    before = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").rename(tmp_path / "old_metrics.json")
    assert main([*args, "--resume"]) == 0
    after = json.loads((run / "metrics.json").read_text())
    assert (run / "model.safetensors").read_bytes() == weights
    for key in ("validation_accuracy", "validation_loss", "test_accuracy", "test_loss",
                "train_head_accuracy", "test_by_length", "global_step", "epochs"):
        assert after["final"][key] == before["final"][key], key
    assert after["final"]["train_segments"] == 2
    assert [s["steps"] for s in after["final"]["train_segment_times"]] == [40, 0]
    # the training log is the first segment's; its Trainer summary (the only one with a
    # train_runtime) was in the old file and the empty segment's is not in the new one
    assert [e for e in after["history"] if "loss" in e] == [e for e in before["history"] if "loss" in e]
    assert [e["train_loss"] for e in before["history"] if "train_runtime" in e][0] > 0
    assert not [e for e in after["history"] if "train_runtime" in e]


def test_cpu_identity_names_the_model_and_signs_other_flags_differently(monkeypatch):
    from hf_mecheval.models import cpu_kernels

    info = "flags\t\t: fpu sse avx2 fma\nmodel name\t: AMD EPYC 9654"
    monkeypatch.setattr(cpu_kernels, "_cpu_signature", lambda: info)
    cpu_kernels.cpu_identity.cache_clear()
    try:
        here = cpu_kernels.cpu_identity()
        assert here["cpu_model"] == "AMD EPYC 9654" and len(here["cpu_signature"]) == 12
        # the same model name with AVX-512: other instruction paths, another signature
        monkeypatch.setattr(cpu_kernels, "_cpu_signature", lambda: info.replace("fma", "fma avx512f"))
        cpu_kernels.cpu_identity.cache_clear()
        other = cpu_kernels.cpu_identity()
        assert other["cpu_model"] == here["cpu_model"] and other["cpu_signature"] != here["cpu_signature"]
    finally:
        cpu_kernels.cpu_identity.cache_clear()


def test_cpu_time_is_unknown_after_a_checkpoint_without_it_and_leaves_out_a_pause(tmp_path):
    from hf_mecheval.training.callbacks import TrainingClock

    old = tmp_path / "checkpoint-old"                     # written before CPU time was kept
    old.mkdir()
    (old / TrainingClock.FILE).write_text(json.dumps({"seconds": 50.0, "segments": 1}))
    clock = TrainingClock(str(old))
    assert clock.summary()["train_cpu_seconds"] is None and clock.summary()["train_segments"] == 2
    assert clock.summary()["train_code"] == [None, code_version()]  # the first segment's code is unknown
    assert clock.summary()["train_wall_seconds"] >= 50.0
    # its one segment: the checkpoint's totals, at its step, at a thread count it did not record
    (old / "trainer_state.json").write_text(json.dumps({"global_step": 300}))
    assert TrainingClock(str(old)).summary()["train_segment_times"][0] == {
        "steps": 300, "wall_seconds": 50.0, "cpu_seconds": None, "threads": None, "cpu_model": None,
        "cpu_signature": None}
    # two segments in one such checkpoint: neither one's share is known
    (old / TrainingClock.FILE).write_text(json.dumps({"seconds": 50.0, "cpu_seconds": 40.0, "segments": 2}))
    assert TrainingClock(str(old)).summary()["train_segment_times"][:2] == [
        {"steps": None, "wall_seconds": None, "cpu_seconds": None, "threads": None, "cpu_model": None,
         "cpu_signature": None}] * 2
    clock = TrainingClock()
    time.sleep(0.3)                                       # idle, as a paused process: wall time only
    summary = clock.summary()
    assert summary["train_wall_seconds"] >= 0.3 and summary["train_cpu_seconds"] < 0.2


def test_test_accuracy_on_the_first_documents(tmp_path):
    from hf_mecheval.tasks import build_task
    from hf_mecheval.training.data import PaddedTaskDataset

    assert main(run_args(tmp_path / "run", *SHORT, "--eval_size", "100", "--test_head_size", "30")) == 0
    final = json.loads((tmp_path / "run" / "metrics.json").read_text())["final"]
    assert final["test_head_size"] == 30
    # independently: argmax at the answer-predicting position of the first 30 test documents
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "run")
    test = build_task("ar_32", num_kv=16, num_pairs=2).generate(100, "test", 0).head(30)
    batch = PaddedTaskDataset(test).__getitems__(list(range(30)))
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits          # (30, L, V)
    rows = torch.arange(30)
    answer_pos = torch.from_numpy(test.columns["answer_pos"]).long()
    predicted = logits[rows, answer_pos - 1].argmax(-1)
    expected = (predicted == batch["input_ids"][rows, answer_pos]).float().mean().item()
    assert final["test_head_accuracy"] == pytest.approx(expected)
    # and on the documents it trained on: the first 100 (the validation split's size) of the
    # 640 training documents, computed the same independent way
    assert final["train_head_size"] == 100
    seen = build_task("ar_32", num_kv=16, num_pairs=2).generate(640, "train", 0).head(100)
    batch = PaddedTaskDataset(seen).__getitems__(list(range(100)))
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits
    rows, answer_pos = torch.arange(100), torch.from_numpy(seen.columns["answer_pos"]).long()
    expected = (logits[rows, answer_pos - 1].argmax(-1) == batch["input_ids"][rows, answer_pos]).float().mean().item()
    assert final["train_head_accuracy"] == pytest.approx(expected)
    # no head when it would be the whole split, or when switched off
    assert main(run_args(tmp_path / "off", *SHORT, "--eval_size", "30", "--test_head_size", "30")) == 0
    assert "test_head_accuracy" not in json.loads((tmp_path / "off" / "metrics.json").read_text())["final"]


def test_a_run_that_diverges_is_marked_failed(tmp_path, capsys):
    """A learning rate of 1e30 turns the weights to NaN: the run folder is complete, but the
    process exits 1, metrics.json says why (strict JSON: the NaN losses are null), and no
    intervention grid is run on it."""
    from hf_mecheval.cli import main as mecheval
    from hf_mecheval.inputs import loads_finite

    run = tmp_path / "run"
    assert main(run_args(run, *SHORT, "--learning_rate", "1e30")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("mecheval train: error: 1 of 1 run(s) failed: it diverged"), err[-1]
    final = loads_finite((run / "metrics.json").read_text(), "metrics.json")["final"]
    assert final["failed"].startswith("it diverged") and final["test_loss"] is None
    assert mecheval(["evaluate", str(run)]) == 2
    assert "is a failed run (it diverged" in capsys.readouterr().err
    assert not (run / "interventions").exists()


def test_a_run_stops_at_the_first_logging_step_where_its_weights_turned_nan(tmp_path):
    """1e30 makes the weights NaN within the first steps: checked every 2 steps (the logging
    steps), the run stops at the first check that finds them, not at step 40, and is failed as
    diverged there."""
    run = tmp_path / "run"
    assert main(run_args(run, "--max_steps", "40", "--train_size", "64", "--eval_size", "16", "--logging_steps", "2",
                         "--learning_rate", "1e30")) == 1
    final = json.loads((run / "metrics.json").read_text())["final"]
    stopped = final["stopped_diverged_at_step"]
    assert final["global_step"] == stopped and stopped % 2 == 0 and stopped <= 6
    assert final["failed"] == f"it diverged: its weights held NaN or infinity at step {stopped}, where it stopped"
    # a run that stays finite trains to its end, with no such field
    assert main(run_args(tmp_path / "fine", "--max_steps", "6", "--train_size", "64", "--eval_size", "16",
                         "--logging_steps", "2")) == 0
    final = json.loads((tmp_path / "fine" / "metrics.json").read_text())["final"]
    assert final["global_step"] == 6 and "stopped_diverged_at_step" not in final


def test_run_failure_names_zero_steps_and_non_finite_weights():
    from hf_mecheval.training.trainer import run_failure

    model = torch.nn.Linear(2, 2)
    fine = {"global_step": 5, "validation_loss": 0.5, "test_loss": 0.7}
    assert run_failure(model, fine) is None
    assert run_failure(model, {**fine, "global_step": 0}) == "it trained zero steps"
    assert run_failure(model, {**fine, "test_loss": float("inf")}) == "it diverged: its final loss is NaN or infinite"
    assert run_failure(model, {**fine, "diverged_at_step": 3}) == "it diverged: non-finite gradients from step 3"
    assert run_failure(model, {**fine, "stopped_diverged_at_step": 50}) == \
        "it diverged: its weights held NaN or infinity at step 50, where it stopped"
    with torch.no_grad():
        model.bias[1] = float("nan")
    assert run_failure(model, fine) == "it diverged: its weights hold NaN or infinity"


@pytest.mark.parametrize("name, content, message", [
    ("bomb.yaml", BOMB, "more than 100,000 values once its aliases are expanded"),
    ("loop.yaml", "model_config: &m {inner: *m}\n", "a recursive alias"),
    ("deep.yaml", "model_config: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 64 levels deep"),
    ("deep.json", '{"model_config": ' + "[" * 5000 + "]" * 5000 + "}", "nested more than 64 levels deep"),
    # a key given twice: the parsers keep the last without a word
    ("twice.yaml", "learning_rate: 0.1\nhidden_size: 16\nlearning_rate: 0.001\n",
     "line 3: the key 'learning_rate' is given twice in one mapping"),
    ("inner.yaml", "model_config: {d_state: 4, d_state: 8}\n", "line 1: the key 'd_state' is given twice"),
    ("twice.json", '{"model_config": {"d_state": 4}, "learning_rate": 0.1, "model_config": {}}',
     "the key 'model_config' is given twice in one object"),
])
def test_hostile_config_files_are_refused_at_once(tmp_path, capsys, name, content, message):
    (tmp_path / name).write_text(content)
    started = time.monotonic()
    assert main([str(tmp_path / name), *run_args(tmp_path / "run", *SHORT)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and str(tmp_path / name) in err[0], err
    assert time.monotonic() - started < 30          # a bomb walked value by value takes hours
    assert not (tmp_path / "run").exists()


def test_deep_json_in_a_flag_is_one_line(tmp_path, capsys):
    deep = '{"num_kv": ' + "[" * 5000 + "]" * 5000 + "}"
    assert main(run_args(tmp_path / "run", *SHORT, "--task_config", deep)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--task_config: nested more than 64 levels deep" in err[0], err


def test_yaml_aliases_within_bounds_still_read():
    from hf_mecheval.inputs import load_yaml

    assert load_yaml("a: &x {lr: 1, seeds: [1, 2]}\nb: *x\n", "f") == {"a": {"lr": 1, "seeds": [1, 2]},
                                                                      "b": {"lr": 1, "seeds": [1, 2]}}
    # one key in two mappings, one mapping aliased twice, and a merge key: none is a key given twice
    assert load_yaml("a: &x {lr: 1}\nb: {lr: 2, <<: *x}\nc: *x\n", "f") == {"a": {"lr": 1}, "b": {"lr": 2}, "c": {"lr": 1}}


def test_json_input_keeps_its_nulls():
    from hf_mecheval.inputs import loads_finite

    assert loads_finite('{"a": null, "b": [null, 1, {"c": null}]}', "f") == {"a": None, "b": [None, 1, {"c": None}]}


def test_overwrite_removes_only_what_the_run_wrote(tmp_path, capsys):
    """The run's manifest lists every file it wrote (its own, the Trainer's checkpoints, the
    grid's); --overwrite refuses while anything else is below the run folder, at any depth, and
    removes exactly the listed files once it is gone."""
    from hf_mecheval.cli import main as mecheval
    from hf_mecheval.runs.manifest import files_under, written

    run = tmp_path / "run"
    args = run_args(run, *SHORT, "--max_steps", "20", "--save_steps", "10", "--save_total_limit", "5")
    with pytest.raises(KeyboardInterrupt):
        train(RunSpec.from_flags(args), callbacks=[StopAt(20)])        # checkpoints 10 and 20 stay
    assert main([*args, "--resume"]) == 0
    assert mecheval(["evaluate", str(run), "-n", "8", "--resamples", "10"]) == 0
    listed = written(run)
    assert listed == set(files_under(run))                 # every file there is the run's, and listed
    assert {"run.json", "metrics.json", "README.md", "checkpoint-10/optimizer.pt", "interventions/interventions.json",
            "interventions/residual_key.png"} <= listed
    for mine in ("interventions/notes.md", "checkpoint-10/mine/x"):
        (run / mine).parent.mkdir(parents=True, exist_ok=True)
        (run / mine).write_text("precious")
        capsys.readouterr()
        assert main([*args, "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert mine in err and "which no run writes" in err, err
        (run / mine).unlink()
    # a run from before the manifest: judged by the names a run writes, at every depth too
    (run / ".mecheval-written.json").unlink()
    (run / "interventions" / "notes.md").write_text("precious")
    assert main([*args, "--overwrite"]) == 2
    assert "interventions/notes.md" in capsys.readouterr().err
    (run / "interventions" / "notes.md").unlink()
    assert main([*args, "--overwrite"]) == 0
    assert not (run / "interventions").exists() and (run / "metrics.json").exists()

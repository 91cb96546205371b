"""Stacked runs: K runs that differ only in learning rate and seed, trained as one computation.

    python -m hf_mecheval.training.run --job JOB.json [--resume | --overwrite]

with a job file (``jobs.py``) that lists the runs and names the stack's own directory (its
checkpoints), ``stack_dir``.

Every run's arguments must agree except ``learning_rate``, ``seed`` and ``data_seed``, and the
architecture must be one of ours (or a plug-in's): transformers' own models (``hf:<model_type>``)
are refused before anything starts, since a stack runs our backbone's functional path under
``vmap`` (``models/stacked.py``); a sweep trains such runs one by one. Each copy
is initialised exactly as its run would be alone (``set_seed(seed)`` then the model), sees the
batches its run would see alone (``data.StackedBatchSampler``), and is updated by AdamW with its
own learning rate under the shared schedule shape, with its own gradient clipping
(``StackedAdamW``). A stacked run is one Trainer in one process (so ``accelerate launch`` works
as for any run); checkpoints hold all copies and live in the stack directory, beside
``records.json`` (each copy's run.json record: ``--resume`` continues only the stack it was
started as). The stack directory and every copy's run directory are locked while it trains, and
replaced only if they are runs (``runs/run_dir.py``). At the end every copy is unstacked into its own
run directory — model, trainer state, per-copy history, metrics, model card — by the same code
that finishes a run trained alone.

A copy whose loss turns NaN or infinite is recorded (``diverged_at_step`` in its metrics) and
left to itself: no operation mixes copies, so its siblings are unaffected.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Sequence

import torch
from torch.optim.adamw import adamw as adamw_step
from torch.utils.data import DataLoader

from ..adapters.native_config import is_native
from ..errors import ConfigError, MechEvalError
from ..inputs import read_json
from ..locks import locked_folder
from ..models.stacked import StackedCausalLM
from ..runs import RunDir
from ..runs.manifest import write_run_file
from ..runs.run_dir import check_replaceable, checkpoints, clear_run_dir, remove_run_subfolder, differences, holds_files, resume_checkpoint
from ..tasks.data import IGNORE_INDEX
from ..tasks.tokenizer import build_tokenizer
from .callbacks import TrainingClock
from .data import StackedBatchSampler, StackedTaskDataset, batch_collator
from .evaluation import compute_answer_metrics, logits_summary_for
from .command_line import this_command
from .progress import ProgressFile
from .spec import RunSpec
from .trainer import (MechEvalTrainer, build_run_model, data_seed, finish_run, load_task_splits, padded_splits,
                      run_trainer)

PER_COPY_FIELDS = {"learning_rate", "seed", "data_seed", "output_dir", "resume", "overwrite"}


class StackedAdamW(torch.optim.Optimizer):
    """AdamW (as ``torch.optim.AdamW``) on stacked parameters (K, ...), with a learning rate per copy.

    The parameter group's ``lr`` is the schedule *factor* (the Trainer's scheduler moves it from
    1.0 along the schedule shape); copy k's learning rate is ``learning_rates[k] * factor``.
    Gradients are clipped per copy (copy k's global norm over all its parameters), as each run's
    Trainer would clip alone. ``decay`` names the parameters that get weight decay (the Trainer's
    rule: not biases, not norm weights)."""

    def __init__(self, named_params: list[tuple[str, torch.nn.Parameter]], learning_rates: Sequence[float],
                 betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0, max_grad_norm: float = 0.0,
                 decay: set[str] | None = None):
        params = [p for _, p in named_params]
        # fused: as torch's AdamW(fused=True), so that load_state_dict keeps "step" on the parameters' device
        super().__init__(params, {"lr": 1.0, "betas": betas, "eps": eps, "weight_decay": weight_decay, "fused": True})
        self.names = {id(p): n for n, p in named_params}
        self.decay = decay if decay is not None else {n for n, _ in named_params}
        device = params[0].device
        self.learning_rates = [float(lr) for lr in learning_rates]    # Python floats, as each lone run's
        self.max_grad_norm = max_grad_norm
        self.last_grad_norms = torch.zeros(len(self.learning_rates), device=device)                  # (K,)
        self.diverged_at = torch.full((len(self.learning_rates),), -1, dtype=torch.long, device=device)   # -1 = never
        self.steps = 0

    @staticmethod
    def _per_copy(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return x.view(-1, *([1] * (like.dim() - 1)))             # (K,) -> (K, 1, ..., 1)

    @torch.no_grad()
    def step(self, closure=None):
        group = self.param_groups[0]
        params = [p for p in group["params"] if p.grad is not None]
        self.steps += 1
        norms = torch.stack([p.grad.pow(2).flatten(1).sum(1) for p in params]).sum(0).sqrt()    # (K,)
        self.last_grad_norms = norms
        newly = ~torch.isfinite(norms) & (self.diverged_at < 0)
        self.diverged_at[newly] = self.steps
        if self.max_grad_norm > 0:   # torch.nn.utils.clip_grad_norm_'s coefficient, per copy
            scale = (self.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
            for p in params:
                p.grad.mul_(self._per_copy(scale, p))
        beta1, beta2 = group["betas"]
        for p in params:
            state = self.state[p]
            if not state:
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            if not torch.is_tensor(state.get("step")):   # fresh, or a checkpoint that counted with an int
                state["step"] = torch.full((p.shape[0],), float(state.get("step", 0)), device=p.device)
            state["step"] = state["step"].to(p.device, torch.float32)
            if not p.grad.is_contiguous():               # the fused kernel assumes dense slices
                p.grad = p.grad.contiguous()
        # torch's own fused AdamW, once per copy (and per weight-decay group) on the copy's slices:
        # the same arithmetic as a lone run's optimizer (the Trainer's adamw_torch_fused), in place,
        # ~4x faster here than the per-copy-broadcast form with its temporaries
        decays = [bool(group["weight_decay"]) and self.names[id(p)] in self.decay for p in params]
        groups = (([p for p, d in zip(params, decays) if d], group["weight_decay"]),
                  ([p for p, d in zip(params, decays) if not d], 0.0))
        for k, lr_k in enumerate(lr * group["lr"] for lr in self.learning_rates):
            for members, weight_decay in groups:
                if not members:
                    continue
                adamw_step(
                    [p[k] for p in members], [p.grad[k] for p in members],
                    [self.state[p]["exp_avg"][k] for p in members], [self.state[p]["exp_avg_sq"][k] for p in members],
                    [], [self.state[p]["step"][k] for p in members], fused=True, amsgrad=False, beta1=beta1,
                    beta2=beta2, lr=lr_k, weight_decay=weight_decay, eps=group["eps"], maximize=False)

    def state_dict(self):
        state = super().state_dict()
        state["stacked"] = {"learning_rates": self.learning_rates, "diverged_at": self.diverged_at.tolist(),
                            "steps": self.steps}
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        extra = state_dict.pop("stacked")
        super().load_state_dict(state_dict)
        self.diverged_at = torch.tensor(extra["diverged_at"], device=self.diverged_at.device)
        self.steps = extra["steps"]


class StackedTrainer(MechEvalTrainer):
    """The Trainer for a ``StackedCausalLM``: per-copy optimizer, batches, losses and evaluation.

    Every per-copy quantity it logs is a list of K values (``loss``, ``learning_rate``,
    ``grad_norm``, ``eval_accuracy`` ...); ``copy_history`` picks copy k's entries back out."""

    def __init__(self, *args, learning_rates: Sequence[float], data_seeds: Sequence[int], max_grad_norm: float,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.learning_rates, self.data_seeds = list(learning_rates), list(data_seeds)
        self.copy_max_grad_norm = max_grad_norm
        self._loss_sum = None            # (K,) since the last log
        self._loss_steps = 0
        self._total_loss, self._total_steps = None, 0

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            model = self.model
            decay = set(self.get_decay_parameter_names(model.template))     # the rule a lone run uses
            self.optimizer = StackedAdamW(model.named_stacked_parameters(), self.learning_rates,
                                          betas=(self.args.adam_beta1, self.args.adam_beta2), eps=self.args.adam_epsilon,
                                          weight_decay=self.args.weight_decay, max_grad_norm=self.copy_max_grad_norm,
                                          decay=decay)
        return self.optimizer

    def _stacked_optimizer(self) -> StackedAdamW:
        return getattr(self.optimizer, "optimizer", self.optimizer)     # accelerate wraps it

    def _get_grad_norm(self, model, grad_norm=None):
        # The Trainer measures the global norm by "clipping" to infinity, which multiplies every
        # gradient by max_norm / norm: one NaN copy would turn all copies' gradients NaN. The
        # per-copy norms come from StackedAdamW instead (logged as grad_norm).
        return None

    def get_train_dataloader(self) -> DataLoader:
        sampler = StackedBatchSampler(len(self.train_dataset), self.data_seeds, self._train_batch_size,
                                      self.args.dataloader_drop_last)
        return self.accelerator.prepare(DataLoader(self.train_dataset, batch_sampler=sampler,
                                                   collate_fn=batch_collator, num_workers=0))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = model(**inputs)
        losses = out.losses.detach()
        self._step_losses = losses
        self._loss_sum = losses if self._loss_sum is None else self._loss_sum + losses
        self._total_loss = losses if self._total_loss is None else self._total_loss + losses
        self._loss_steps += 1
        self._total_steps += 1
        return (out.loss, out) if return_outputs else out.loss

    def step_losses(self, loss: torch.Tensor) -> torch.Tensor:
        return self._step_losses        # (K,): each copy's, where ``loss`` is their sum

    def log(self, logs: dict, start_time=None) -> None:
        logs = dict(logs)
        if "loss" in logs and self._loss_sum is not None:
            logs["loss"] = [round(v, 6) for v in (self._loss_sum / self._loss_steps).tolist()]
            # the Trainer logs the group's lr, which is the schedule factor here (base lr 1.0)
            factor = logs.get("learning_rate", self.optimizer.param_groups[0]["lr"])
            logs["learning_rate"] = [lr * factor for lr in self.learning_rates]
            logs["grad_norm"] = self._stacked_optimizer().last_grad_norms.tolist()
            self._loss_sum, self._loss_steps = None, 0
        if "train_loss" in logs and self._total_loss is not None:
            logs["train_loss"] = (self._total_loss / self._total_steps).tolist()
        super().log(logs, start_time)

    @torch.no_grad()
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        """Per-copy loss, accuracy and p(answer) on a dataset (lists of K values), logged."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        model = self.model
        was_training = model.training
        model.eval()
        K, n = model.num_copies, len(dataset)
        loss = torch.zeros(K)
        correct = torch.zeros(K)
        prob = torch.zeros(K)
        device = next(model.parameters()).device
        for start in range(0, n, self.args.per_device_eval_batch_size):
            batch = dataset.__getitems__(list(range(start, min(n, start + self.args.per_device_eval_batch_size))))
            out = model(**{k: v.to(device) for k, v in batch.items()})
            probs = torch.softmax(out.logits.float(), dim=-1)                       # (K, B, [k,] V)
            targets = out.targets.expand(K, *out.targets.shape[-out.logits.dim() + 2:])   # (K, B[, k])
            b = targets.shape[1]
            loss += out.losses.cpu() * b
            if targets.dim() == 3:      # one answer per query: each document's share (evaluation.per_document)
                valid = targets != IGNORE_INDEX
                count = valid.sum(-1).clamp(min=1)
                p = probs.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
                correct += (((probs.argmax(-1) == targets) & valid).sum(-1) / count).sum(-1).cpu()
                prob += ((p * valid).sum(-1) / count).sum(-1).cpu()
                continue
            correct += (probs.argmax(-1) == targets).sum(-1).cpu()
            prob += probs.gather(-1, targets[..., None])[..., 0].sum(-1).cpu()
        model.train(was_training)
        metrics = {f"{metric_key_prefix}_loss": (loss / n).tolist(), f"{metric_key_prefix}_accuracy": (correct / n).tolist(),
                   f"{metric_key_prefix}_answer_prob": (prob / n).tolist()}
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


def copy_history(history: list[dict], k: int, num_copies: int) -> list[dict]:
    """Copy k's view of a stacked run's log history: every K-long list becomes its k-th value."""
    def pick(value):
        return value[k] if isinstance(value, list) and len(value) == num_copies else value
    return [{key: pick(value) for key, value in entry.items()} for entry in history]


# ---------------------------------------------------------------------------------- a stacked run
@dataclasses.dataclass
class Member:
    name: str
    spec: RunSpec

    @property
    def training(self):
        return self.spec.training


def check_compatible(members: list[Member]) -> None:
    """Runs can share a stack when all their arguments agree but learning rate and seeds."""
    first = members[0]
    for other in members[1:]:
        for a, b in zip(first.spec.groups, other.spec.groups):
            for field in dataclasses.fields(a):
                if field.name in PER_COPY_FIELDS or field.name.startswith("_"):
                    continue
                if getattr(a, field.name) != getattr(b, field.name):
                    raise ConfigError(field.name, f"runs {first.name} and {other.name} differ in it "
                                                  f"({getattr(a, field.name)!r} vs {getattr(b, field.name)!r}); a stack "
                                                  f"may differ only in {', '.join(sorted(PER_COPY_FIELDS))}")
    if first.spec.run.restoration_every_n_steps > 0:
        raise ConfigError("restoration_every_n_steps", "the restoration callback is not available in stacked runs; "
                                                      "train such runs alone")
    # each copy is unstacked into its own directory: two copies sharing one would lose one run
    dirs = {}
    for m in members:
        out = Path(m.training.output_dir).resolve()
        for other, other_dir in dirs.items():
            if out == other_dir or out in other_dir.parents or other_dir in out.parents:
                raise ConfigError("output_dir", f"runs {other} and {m.name} would write into the same directory "
                                                f"({m.training.output_dir}); give each run its own")
        dirs[m.name] = out


def refuse_native(members: list[Member]) -> None:
    """transformers' own models cannot be stacked: StackedCausalLM stacks our backbone's weights and
    runs its functional path (``use_functional_path``, ``keep_positions``) under vmap, which a
    GPT2LMHeadModel or MambaForCausalLM does not have. Refused before any file is touched."""
    for m in members:
        architecture = m.spec.model.architecture
        if is_native(architecture):
            raise ConfigError("architecture", f"{architecture} (run {m.name}) is transformers' own model, which "
                                              "cannot be trained in a stack (--stack); train those runs one by "
                                              "one (mecheval train, or a sweep, which trains hf: runs alone)")


RECORDS = "records.json"     # in the stack directory: each member's run.json record, for --resume


def _prepare_stack_dir(stack_dir: Path, members: list[Member], records: dict, resume: bool,
                       overwrite: bool) -> str | None:
    """Check the stack directory and the members' run directories against --resume / --overwrite
    (every folder that will be replaced must be a run: ``runs.run_dir.check_replaceable``); returns the
    checkpoint to resume from. Nothing is deleted here (but checkpoints cut short)."""
    for m in members:
        out = Path(m.training.output_dir)
        if RunDir(out).finished and not overwrite:
            raise MechEvalError(f"{out} already holds a finished run ({m.name}); leave it out of the stack "
                                "or pass --overwrite to replace it")
        if holds_files(out) and not (overwrite or resume):
            raise MechEvalError(f"{out} already holds files; pass --overwrite to replace them")
        check_replaceable(out)           # each copy's directory is replaced when the stack is unstacked
    exists = holds_files(stack_dir)
    if resume:
        if not exists:
            raise MechEvalError(f"--resume: {stack_dir} holds no stacked run to continue")
        _check_records(stack_dir, records)
        checkpoint = resume_checkpoint(stack_dir)
        print(f"stacked run: resuming from {checkpoint}", file=sys.stderr)
        return str(checkpoint)
    if exists and not overwrite:
        raise MechEvalError(f"{stack_dir} already holds a stacked run; pass --resume to continue it or "
                            "--overwrite to replace it")
    check_replaceable(stack_dir)
    return None


def _check_records(stack_dir: Path, records: dict) -> None:
    """A resumed stack must be the stack asked for: each member's fingerprint as recorded when the
    stack started (a stack directory without records.json, from before they were kept, is not checked)."""
    path = stack_dir / RECORDS
    if not path.exists():
        return
    recorded = read_json(path, dict)
    for name, record in records.items():
        if name not in recorded:
            raise MechEvalError(f"cannot resume {stack_dir}: run {name} is not part of that stack "
                                f"({', '.join(recorded)})")
        diff = differences(recorded[name], record)
        if diff:
            raise MechEvalError(f"cannot resume {stack_dir}: run {name} was started with other arguments — "
                                f"{'; '.join(diff[:3])}; use another stack directory, or remove that one")


def train_stacked(members: list[Member], stack_dir: str | Path, resume: bool = False, overwrite: bool = False,
                  command: str | None = None, callbacks: Sequence = (), progress: Path | None = None) -> list[dict]:
    """Train the members as one stack; returns each member's final metrics (also in its run directory).
    ``progress``: a progress file to keep (``progress.py``), or None."""
    if not members:
        raise ConfigError("runs", "a stack needs at least one run")
    refuse_native(members)
    check_compatible(members)          # every member was checked as it was read (RunSpec); they share the task
    if members[0].training.world_size > 1:
        raise ConfigError("stack", "a stacked run is one process; spread stacks over several GPUs or machines with "
                                   "the sweep launchers (mecheval sweep --launcher local --workers N, or --launcher ray)")
    stack_dir = Path(stack_dir)
    records = {m.name: m.spec.record for m in members}
    # the stack directory and every copy's run directory stay locked until the stack is written
    with contextlib.ExitStack() as locks:
        for folder in [stack_dir, *(Path(m.training.output_dir) for m in members)]:
            locks.enter_context(locked_folder(folder))
        checkpoint = _prepare_stack_dir(stack_dir, members, records, resume, overwrite)
        return _train_stack(members, stack_dir, records, checkpoint, command, callbacks, progress)


def _train_stack(members, stack_dir, records, checkpoint, command, callbacks, progress) -> list[dict]:
    first = members[0].spec
    task, first_training = first.task, first.training
    data = load_task_splits(first, main_process=True)
    longest = max(int(d.lengths.max()) for d in data.values())
    copies = [build_run_model(first, m.training.seed, longest) for m in members]
    stacked = StackedCausalLM(copies)
    K = len(members)
    splits = padded_splits(data, first.run)

    if checkpoint is None:
        clear_run_dir(stack_dir)
        write_run_file(stack_dir, "command.txt", (command or this_command()) + "\n")
        write_run_file(stack_dir, RECORDS, json.dumps(records, indent=2) + "\n")
    args = dataclasses.replace(first_training, output_dir=str(stack_dir), learning_rate=1.0, max_grad_norm=0.0)
    trainer = StackedTrainer(
        model=stacked, args=args, train_dataset=StackedTaskDataset(data["train"], K),
        eval_dataset=splits["validation"], data_collator=batch_collator, callbacks=list(callbacks),
        learning_rates=[m.training.learning_rate for m in members],
        data_seeds=[data_seed(m.training) for m in members], max_grad_norm=first_training.max_grad_norm)
    clock = TrainingClock(checkpoint)
    trainer.add_callback(clock)
    if progress is not None:
        trainer.add_callback(ProgressFile(progress, [m.name for m in members], trainer.loss_meter))
    run_trainer(trainer, checkpoint)

    diverged = trainer._stacked_optimizer().diverged_at.tolist()
    finals = []
    for k, (member, model) in enumerate(zip(members, stacked.unstack())):
        t_args = member.training
        run_dir = Path(t_args.output_dir)
        record = {**records[member.name], "stack": {"dir": str(stack_dir), "copy": k, "size": K}}
        RunDir(run_dir).start(f"{command or this_command()}\n# copy {k} of {K} in the stacked run {stack_dir}",
                              record)
        lone = MechEvalTrainer(model=model, args=t_args, eval_dataset=splits["validation"],
                               processing_class=build_tokenizer(task), data_collator=batch_collator,
                               compute_metrics=compute_answer_metrics,
                               answer_summary=logits_summary_for(task))
        lone.state = dataclasses.replace(trainer.state, log_history=copy_history(trainer.state.log_history, k, K))
        extra = {"stack_size": K, **clock.summary()}      # the stack's wall time
        if diverged[k] >= 0:
            extra["diverged_at_step"] = diverged[k]
            print(f"stacked run: copy {k} ({member.name}) diverged (non-finite gradients) at step {diverged[k]}",
                  file=sys.stderr)
        finals.append(finish_run(lone, splits, run_dir, extra))
    for ckpt in checkpoints(stack_dir):                # every copy now lives in its own run directory
        try:
            remove_run_subfolder(stack_dir, ckpt)
        except MechEvalError as exc:                   # a person's file in it: the checkpoint stays
            print(f"stacked run: {exc}; {ckpt} was left as it is", file=sys.stderr)
    write_run_file(stack_dir, "finished.json", json.dumps(
        {"runs": [m.name for m in members], "diverged_at_step": diverged}, indent=2) + "\n")
    return finals

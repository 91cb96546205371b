"""Progress a person can watch (``training/progress.py``): the progress file a job's training
process keeps, and the board a launcher shows from those files — on a terminal (redrawn in
place) and in a log file (printed lines) — with a fake clock, so every figure is the one computed
here by hand. The tiny quickstart (tests/reports/test_quickstart_and_report.py) runs it for real."""
import io
import json
import types

import pytest
import torch

from hf_mecheval.training.progress import (ProgressBoard, ProgressFile, RunningLoss, clock_time, progress_line,
                                           progress_path, write_progress)


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def _state(step, max_steps=100, epoch=None, epochs=4):
    return types.SimpleNamespace(global_step=step, max_steps=max_steps, epoch=epoch if epoch is not None else
                                 step * epochs / max_steps, num_train_epochs=epochs, is_world_process_zero=True)


def test_running_loss_is_the_mean_per_step_since_it_was_last_taken():
    meter = RunningLoss()
    assert meter.take() is None
    for value in (1.0, 2.0, 6.0):
        meter.add(torch.tensor(value))
    assert meter.take() == [3.0]
    assert meter.take() is None                     # taken: it starts again
    for values in ([1.0, 4.0], [3.0, 0.0]):          # a stack of two copies: one mean each
        meter.add(torch.tensor(values))
    assert meter.take() == [2.0, 2.0]


def test_the_progress_file_follows_steps_epochs_loss_and_time_left(tmp_path, capsys):
    path = progress_path(tmp_path / "mamba_conv4.job.json")
    assert path == tmp_path / "mamba_conv4.progress.json"
    clock, meter = Clock(), RunningLoss()
    callback = ProgressFile(path, ["mamba_conv4"], meter, every=1.0, log_every=30.0, clock=clock)
    args, control = None, None
    callback.on_train_begin(args, _state(0), control)
    record = json.loads(path.read_text())
    assert (record["phase"], record["step"], record["max_steps"], record["loss"], record["seconds_left"]) == \
        ("training", 0, 100, None, None)

    # step 1 is always written (the first sign of life); its loss, and the time left at its pace
    meter.add(torch.tensor(4.0))
    clock.now += 0.5
    callback.on_step_end(args, _state(1), control)
    record = json.loads(path.read_text())
    assert record["step"] == 1 and record["loss"] == [4.0] and record["seconds"] == 0.5
    assert record["seconds_left"] == 99 * 0.5                  # 99 steps left at 0.5 s a step
    # within a second of the last write: nothing written
    meter.add(torch.tensor(2.0))
    clock.now += 0.5
    callback.on_step_end(args, _state(2), control)
    assert json.loads(path.read_text())["step"] == 1
    # a second later: steps 2 and 3's mean loss, 2 s for 3 steps -> 97 steps left take 64.7 s
    meter.add(torch.tensor(1.0))
    clock.now += 1.0
    callback.on_step_end(args, _state(3), control)
    record = json.loads(path.read_text())
    assert record["step"] == 3 and record["loss"] == [1.5] and record["epoch"] == 0.12
    assert record["seconds_left"] == round(97 * 2.0 / 3, 1)
    assert capsys.readouterr().out == ""                        # no log line yet: every 30 s
    clock.now += 30.0
    callback.on_step_end(args, _state(50), control)
    line = capsys.readouterr().out.strip()
    assert line == progress_line(json.loads(path.read_text()))
    assert line.startswith("step 50/100, epoch 2.0/4, loss 1.5,") and "0:32 in, ~0:32 left" in line
    # the last step is written whatever the time; then the final evaluation
    clock.now += 0.1
    callback.on_step_end(args, _state(100), control)
    assert json.loads(path.read_text())["seconds_left"] == 0
    callback.on_train_end(args, _state(100), control)
    record = json.loads(path.read_text())
    assert record["phase"] == "evaluating" and "final evaluation" in capsys.readouterr().out


def test_a_resumed_run_counts_its_pace_from_where_it_resumed(tmp_path):
    clock, meter = Clock(), RunningLoss()
    path = tmp_path / "r.progress.json"
    callback = ProgressFile(path, ["r"], meter, clock=clock)
    callback.on_train_begin(None, _state(60), None)
    clock.now += 2.0
    callback.on_step_end(None, _state(61), None)
    assert json.loads(path.read_text())["seconds_left"] == 39 * 2.0   # not 39 * 2 / 61


def test_lines_and_clock_times():
    assert [clock_time(s) for s in (0, 59.4, 65, 3599, 3723, None)] == ["0:00", "0:59", "1:05", "59:59", "1:02:03", "?"]
    stack = {"phase": "training", "step": 10, "max_steps": 40, "epoch": 0.5, "epochs": 2, "loss": [0.5, 0.25],
             "seconds": 12, "seconds_left": 36}
    assert progress_line(stack) == "step 10/40, epoch 0.5/2, loss 0.5 0.25, 0:12 in, ~0:36 left"
    small = {**stack, "loss": [2.0833, 0.021349, 4.1e-05]}
    assert "loss 2.08 0.0213 4.1e-05," in progress_line(small)
    assert progress_line({"phase": "interventions", "run": "h3"}) == "intervention grid of h3"


def _board(tmp_path, stream, clock, every=None):
    jobs = [(name, tmp_path / f"{name}.job.json") for name in ("transformer", "mamba_conv4", "h3")]
    return ProgressBoard(jobs, stream=stream, every=every, clock=clock)


def _progress(tmp_path, name, time, **fields):
    record = {"runs": [name], "phase": "training", "step": 0, "max_steps": 100, "epoch": 0.0, "epochs": 4,
              "loss": None, "seconds": 0, "seconds_left": None, **fields, "time": time}
    (tmp_path / f"{name}.progress.json").write_text(json.dumps(record))


def test_the_board_in_a_log_file_prints_plain_lines_every_30_seconds(tmp_path):
    clock, stream = Clock(), io.StringIO()
    _progress(tmp_path, "h3", time=clock.now - 500, step=99)     # an earlier sweep's file: not this one's
    board = _board(tmp_path, stream, clock)
    _progress(tmp_path, "h3", time=clock.now + 1, loss=["not a number"])   # one the board cannot read
    assert board.in_flight() == [("h3", "in flight (its progress file is not one this version reads)")]
    _progress(tmp_path, "h3", time=clock.now - 500, step=99)
    assert board.every == 30.0
    board.started("transformer")
    _progress(tmp_path, "mamba_conv4", time=clock.now + 1, step=40, epoch=1.6, loss=[0.75], seconds=20,
              seconds_left=30)                                    # started on another machine (Ray)
    clock.now += 10
    board.tick()
    assert stream.getvalue() == ""                              # not yet 30 s
    clock.now += 20
    board.tick()
    assert stream.getvalue().splitlines() == [
        "jobs: 0/3 ended, 2 in flight, 0:30 so far",
        "  transformer  starting (0:30)",
        "  mamba_conv4  step 40/100, epoch 1.6/4, loss 0.75, 0:20 in, ~0:30 left"]
    board.ended({"name": "transformer", "runs": ["transformer"], "returncode": 0, "log": "t.log", "seconds": 65.0})
    board.ended({"name": "mamba_conv4", "runs": ["mamba_conv4"], "returncode": 1, "log": "m.log", "seconds": 3.0})
    board.ended({"name": "h3", "runs": ["h3"], "returncode": 2, "in_use": True, "log": "left alone"})
    board.close({"transformer": 61.2, "mamba_conv4": None})
    assert stream.getvalue().splitlines()[3:] == [
        "[1/3] transformer: done in 1:05",
        "[2/3] mamba_conv4: failed (exit 1, log m.log) in 0:03",
        "[3/3] h3: in use by another process",
        "wall time of each job (its process: training, then the intervention grid where asked):",
        "  transformer      1:05  (training 1:01)",
        "  mamba_conv4      0:03"]
    assert "\x1b" not in stream.getvalue()


class Terminal(io.StringIO):
    """A stream that says it is a terminal, and the screen its writes leave (the two escape
    sequences the board uses: cursor up N lines to the start of the line, erase below)."""

    def isatty(self):
        return True

    def screen(self) -> list[str]:
        lines, row, text = [""], 0, self.getvalue()
        i = 0
        while i < len(text):
            if text.startswith("\x1b[", i):
                end = i + 2
                while text[end].isdigit():
                    end += 1
                count, code = int(text[i + 2:end] or 1), text[end]
                if code == "F":
                    row = max(0, row - count)
                    lines[row] = ""
                elif code == "J":
                    del lines[row + 1:]
                    lines[row] = ""
                i = end + 1
            elif text[i] == "\n":
                row += 1
                if row == len(lines):
                    lines.append("")
                i += 1
            else:
                lines[row] += text[i]
                i += 1
        return lines[:-1] if lines[-1] == "" else lines


def test_the_board_on_a_terminal_is_redrawn_in_place_and_leaves_only_what_ended(tmp_path):
    clock, stream = Clock(), Terminal()
    board = _board(tmp_path, stream, clock)
    assert board.every == 1.0
    board.started("transformer")
    board.started("mamba_conv4")
    for step in (10, 20, 30):
        clock.now += 1
        _progress(tmp_path, "transformer", time=clock.now, step=step, seconds=step, seconds_left=100 - step)
        board.tick()
    assert stream.screen() == ["jobs: 0/3 ended, 2 in flight, 0:03 so far",
                               "  transformer  step 30/100, epoch 0.0/4, 0:30 in, ~1:10 left",
                               "  mamba_conv4  starting (0:03)"]
    board.ended({"name": "transformer", "runs": ["transformer"], "returncode": 0, "log": "t.log", "seconds": 40})
    assert stream.screen() == ["[1/3] transformer: done in 0:40",
                               "jobs: 1/3 ended, 1 in flight, 0:03 so far",
                               "  mamba_conv4  starting (0:03)"]
    board.close({"transformer": 30.0})
    assert stream.screen() == ["[1/3] transformer: done in 0:40",
                               "wall time of each job (its process: training, then the intervention grid where asked):",
                               "  transformer      0:40  (training 0:30)"]


def test_a_board_without_a_stream_says_nothing_and_a_write_that_fails_is_skipped(tmp_path):
    board = ProgressBoard([("a", tmp_path / "a.job.json")], stream=None)
    board.started("a")
    board.tick()
    board.ended({"name": "a", "runs": ["a"], "returncode": 0, "log": "", "seconds": 1.0})
    board.close({})
    (tmp_path / "a file").write_text("")
    write_progress(tmp_path / "a file" / "a.progress.json", {"step": 1})     # cannot be written: no error
    assert (tmp_path / "a file").read_text() == ""


def untimed(metrics: dict) -> dict:
    """A run's metrics less what the clock read (its totals, each segment's seconds): two runs of
    one spec agree on the rest, their segments' steps and threads and the CPU they ran on included."""
    clock = ("wall_seconds", "cpu_seconds")
    kept = {k: v for k, v in metrics.items() if k not in ("train_wall_seconds", "train_cpu_seconds")}
    kept["train_segment_times"] = [{k: v for k, v in segment.items() if k not in clock}
                                   for segment in metrics["train_segment_times"]]
    return kept


def test_a_run_computes_the_same_with_its_progress_file_and_a_stack_shows_each_copys_loss(tmp_path, monkeypatch):
    """Weights and metrics of a run are those of the same run without a progress file, to the bit
    (CPU); a stack's file holds each copy's mean loss, as its copy trained alone has it."""
    from safetensors.torch import load_file
    from test_stacked import flags

    import hf_mecheval.training.progress as progress
    from hf_mecheval.training.run import train
    from hf_mecheval.training.spec import RunSpec
    from hf_mecheval.training.stacked import Member, train_stacked

    monkeypatch.setattr(progress, "WRITE_EVERY", float("inf"))   # written at the first and last step only
    copies = [(1e-3, 0), (3e-3, 1)]

    def spec(folder, lr, seed):
        return RunSpec.from_flags(flags("transformer", tmp_path / folder, lr, seed))

    watched = train(spec("watched", *copies[0]), progress=tmp_path / "watched.progress.json")
    plain = train(spec("plain", *copies[0]))
    assert untimed(watched) == untimed(plain)
    a, b = load_file(str(tmp_path / "watched" / "model.safetensors")), load_file(str(tmp_path / "plain" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)

    second = tmp_path / "second.progress.json"
    train(spec("second", *copies[1]), progress=second)
    members = [Member(f"copy{k}", spec(f"stacked/copy{k}", lr, seed)) for k, (lr, seed) in enumerate(copies)]
    train_stacked(members, tmp_path / "stack", progress=tmp_path / "stack.progress.json")
    stacked = json.loads((tmp_path / "stack.progress.json").read_text())
    alone = [json.loads(p.read_text())["loss"][0] for p in (tmp_path / "watched.progress.json", second)]
    assert stacked["runs"] == ["copy0", "copy1"] and stacked["phase"] == "evaluating" and stacked["step"] == 50
    assert stacked["loss"] == pytest.approx(alone, rel=1e-4)
    assert alone[0] != pytest.approx(alone[1], rel=1e-2)          # two different runs, told apart

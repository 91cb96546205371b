"""The `mecheval` command line: outputs, and one clear line with a non-zero exit on bad input."""
import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from hf_mecheval.cli import main
from hf_mecheval.tasks import build_task


def test_data_generate_writes_the_columns(tmp_path, capsys):
    out = tmp_path / "train.parquet"
    assert main(["data", "generate", "atr_easy", "--split", "validation", "-n", "64", "--seed", "3",
                 "--grammar-seed", "2", "--out", str(out)]) == 0
    table = pq.read_table(out)
    want = build_task("atr_easy", grammar_seed=2).generate(64, "validation", 3).to_arrow()
    assert table.equals(want)
    for column in ("input_ids", "labels", "answer", "key_pos", "value_pos", "divider_pos", "query_pos", "answer_pos"):
        assert column in table.column_names


@pytest.mark.parametrize(
    "argv, message",
    [
        (["data", "generate", "ar_32", "-n", "5", "--grammar-seed", "1", "--out", "{tmp}/x.parquet"], "ATR presets only"),
        (["data", "generate", "ar_32", "-n", "5", "--out", "/proc/forbidden/x.parquet"], "cannot write"),
        (["data", "generate", "ar_32", "-n", "5", "--out", "{tmp}/exists.parquet"], "already exists"),
        # a trailing slash says a folder, which Path() drops: it must not become a file of that name
        (["data", "generate", "ar_32", "-n", "5", "--out", "{tmp}/newdir/"], "newdir/ is a folder; give a file name"),
    ],
)
def test_errors_are_one_line(tmp_path, capsys, argv, message):
    (tmp_path / "exists.parquet").write_bytes(b"precious")
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1
    assert (tmp_path / "exists.parquet").read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists.parquet"]


def test_a_mistyped_flag_without_a_command_is_named(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--verison"])
    assert info.value.code == 2 and "error: unrecognized arguments: --verison" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([])
    assert "error: the following arguments are required: COMMAND" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["data", "generate", "atr_hard", "-n", "1", "--out", "x.parquet"],
                                  ["data", "generate", "ar_32", "-n", "-3", "--out", "x.parquet"],
                                  ["data", "generate", "ar_32", "-n", "0", "--out", "x.parquet"],    # no documents
                                  ["data", "publish", "ar_32", "--train-size", "0", "--out", "x"],
                                  ["data", "stats", "ar_32", "--grammar-seeds", "5-2"],
                                  ["quickstart", "--tiny", "--seed", "4294967296"],
                                  ["quickstart", "--tiny", "--seed", "-1"],
                                  ["sweep", "reference/ar", "--no-such-flag"],
                                  ["no-such-command"]])
def test_argument_errors_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()   # argparse's own would print the usage first
    assert len(err) == 1 and err[0].startswith("mecheval") and "error:" in err[0] and "--help" in err[0], err


def test_a_quickstart_whose_run_fails_exits_1_as_training_does(tmp_path, capsys, monkeypatch):
    import hf_mecheval.training.sweep as sweep

    # what the launcher reports when a run diverged (training it for real takes minutes)
    monkeypatch.setattr(sweep, "train_runs", lambda runs, *a, **k: {"failed": ["h3: it diverged"], "in_use": []})
    assert main(["quickstart", "--tiny", "--out", str(tmp_path / "qs")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mecheval: error: quickstart: 1 run(s) failed: h3: it diverged"]


def test_sizes_and_hub_problems_are_refused_before_any_output(tmp_path, capsys):
    out = tmp_path / "x.parquet"
    assert main(["data", "generate", "ar_32", "-n", str(10**12), "--out", str(out)]) == 2
    assert "1,000,000,000,000 documents of ar would need about" in capsys.readouterr().err
    for argv, message in ((["--train-size", str(10**12)], "would need about"),
                          (["--push-to-hub", "bad name!!"], "bad repository name"),
                          (["--push-to-hub", "me/data"], "offline mode")):           # HF_HUB_OFFLINE in tests
        assert main(["data", "publish", "ar_32", "--out", str(tmp_path / "pub"), "--eval-size", "4", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit) as info:
        main(["data", "stats", "atr_easy", "-n", "4", "--grammar-seeds", "0-100000000"])
    assert info.value.code == 2 and "at most 10,000 seeds" in capsys.readouterr().err


def test_stats_json_and_grammar_average(capsys):
    assert main(["data", "stats", "atr_easy", "-n", "200", "--grammar-seeds", "0-2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    per = [build_task("atr_easy", grammar_seed=g).generate(200, "test") for g in range(3)]
    assert report["atr_easy"]["length_mean"] == pytest.approx(sum(d.lengths.mean() for d in per) / 3)
    assert main(["data", "stats", "ar_32", "-n", "100"]) == 0
    assert "adjacent_fraction" in capsys.readouterr().out


def test_publish_and_console_script(tmp_path):
    out = tmp_path / "atr"
    proc = subprocess.run([sys.executable, "-m", "hf_mecheval.cli", "data", "publish", "atr_easy", "atr_sibling",
                           "--out", str(out), "--train-size", "30", "--eval-size", "10"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (out / "atr_sibling" / "test-00000-of-00001.parquet").exists()
    again = subprocess.run([sys.executable, "-m", "hf_mecheval.cli", "data", "publish", "atr_easy",
                            "--out", str(out)], capture_output=True, text=True)
    assert again.returncode == 2 and "already exists" in again.stderr


@pytest.mark.parametrize("command", [["data", "generate"], ["data", "stats"], ["data", "publish"], ["train"],
                                     ["sweep"], ["evaluate"], ["report"], ["quickstart"], ["reproduce"],
                                     ["push"]])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main(command + ["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "usage:" in text and len(text) > 200
    # the usage line names the command typed, not `mecheval` alone (whose flags these are not)
    assert text.startswith(f"usage: mecheval {' '.join(command)} "), text[:80]


def test_help_does_not_load_the_plotting_library():
    """`mecheval --help` (every command's parser is built) imports no matplotlib: only drawing needs it."""
    code = ("import sys\nfrom hf_mecheval.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"


def test_train_help_gives_defaults_only_where_a_flag_has_one(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())      # argparse wraps lines at the terminal's width
    assert "(default: 64)" in text and "(default: ar_32)" in text
    # None means "not given" (the reference recipe's, the architecture's): the flag's help says
    # which, and no "(default: None)" contradicts it
    assert "default: None" not in text
    assert "reference (the paper's code; the default)" in text


def test_reproduce_refuses_a_persons_report_folder_before_training(tmp_path, capsys):
    report = tmp_path / "cpu_ar" / "report"
    report.mkdir(parents=True)
    (report / "report.md").write_text("my write-up\n")
    assert main(["reproduce", "--preset", "cpu-ar", "--out", str(tmp_path)]) == 2
    assert "hf-mecheval did not write there (report.md)" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "cpu_ar").iterdir()) == ["report"]      # no run started
    assert (report / "report.md").read_text() == "my write-up\n"


def test_reproduce_dry_run_lists_the_reference_sweep(capsys):
    assert main(["reproduce", "--preset", "ablation-mamba", "--dry-run"]) == 0
    assert "225 runs" in capsys.readouterr().out
    # a part of it, by run name: ref_ar's Mamba runs at its four learning rates, and two more
    # seeds at the best
    assert main(["reproduce", "--preset", "ref-ar", "--dry-run", "--only", "mamba_*"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "6 runs" and len(lines) == 7 and all(line.startswith("mamba_lr") for line in lines[:-1])
    # the reference ablations: Based's four other short kernels, then Mamba's conv 0-3, at each
    # model's best ref_ar rate
    assert main(["reproduce", "--preset", "ref-ablations", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "8 runs"
    assert main(["sweep", "reference/ar_ablations", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:-1] if line.startswith(("based_", "mamba_"))] == [
        *(f"based_lr1e-03_short_conv_kernel{k}_s0" for k in (1, 2, 4, "long")),
        *(f"mamba_lr3e-03_conv_kernel{k}_s0" for k in (2, 3, 0, 1))]


def test_sweeps_by_name_or_path(capsys, tmp_path):
    assert main(["sweep", "ar_position_embeddings", "--dry-run"]) == 0
    assert "112 runs" in capsys.readouterr().out      # 7 architectures x 2 position settings x 2 widths x 4 rates
    assert main(["sweep", "reference/ar", "--dry-run"]) == 0
    by_name = capsys.readouterr().out
    from hf_mecheval.training.sweep import SWEEPS_DIR

    copy = tmp_path / "mine.yaml"
    copy.write_text((SWEEPS_DIR / "reference" / "ar.yaml").read_text())
    assert main(["sweep", str(copy), "--dry-run"]) == 0
    assert capsys.readouterr().out == by_name
    assert main(["sweep", "no_such_sweep", "--dry-run"]) == 2
    assert "packaged: " in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["report", "runs/definitely-missing"],
    ["evaluate", "runs/definitely-missing"],
    ["quickstart", "--tiny", "--out", "/proc/forbidden/qs"],
    ["train", "--task", "ar_32", "--output_dir", "/proc/forbidden/run", "--max_steps", "1", "--train_size", "8",
     "--eval_size", "4"],
    ["data", "publish", "atr_easy", "--out", "/proc/forbidden/data", "--train-size", "4", "--eval-size", "2"],
])
def test_error_paths_print_one_line(argv, capsys):
    assert main(argv) == 2
    err = [l for l in capsys.readouterr().err.strip().splitlines() if "error" in l]
    assert len(err) == 1 and err[0].startswith("mecheval")


def test_train_records_a_command_that_can_be_typed_again(tmp_path):
    run = tmp_path / "run"
    argv = ["train", "--task", "ar_32", "--architecture", "mamba", "--hidden_size", "16", "--max_steps", "2",
            "--train_size", "64", "--eval_size", "8", "--eval_strategy", "no", "--save_strategy", "no",
            "--disable_tqdm", "true", "--output_dir", str(run)]
    assert main(argv) == 0
    assert (run / "command.txt").read_text().startswith("mecheval train --task ar_32 --architecture mamba ")


def test_version(capsys):
    import hf_mecheval

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"hf-mecheval {hf_mecheval.__version__}"

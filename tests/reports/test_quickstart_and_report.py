"""`mecheval quickstart --tiny` end to end, and `mecheval report`."""
import csv
import json

from hf_mecheval.cli import main as mecheval

PNG = b"\x89PNG\r\n\x1a\n"


def test_tiny_quickstart_writes_every_artefact(tmp_path, capsys):
    out = tmp_path / "qs"
    assert mecheval(["quickstart", "--tiny", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["label"]: r for r in summary["rows"]}
    assert set(rows) == {"transformer", "based", "mamba (conv 4)", "mamba (conv 0)", "hyena", "h3", "baseconv",
                         "deltanet"}
    for name in ("accuracy.png", "scatter_value_query.png", "scatter_query_key.png", "layers.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name
    report = (out / "report.md").read_text()
    # the numbers in the report are those of the JSON
    for r in summary["rows"]:
        line = next(l for l in report.splitlines() if l.startswith(f"| {r['label']} (d="))
        assert f"{100 * r['test_accuracy']:.1f} %" in line
        for p in ("key", "value", "query"):
            value = r[f"@{p}"]
            assert ("n/a" if value is None else f"{value:.2f}") in line
        assert r["mechanism"] in line
    assert len(summary["checks"]) == 7 and all(("reproduced" in report) for _ in summary["checks"])
    assert "mamba (conv 0)" in printed and "report:" in printed
    runs = list(csv.DictReader((out / "runs.csv").open()))
    assert len(runs) == 8
    # a second invocation reuses the finished runs
    assert mecheval(["quickstart", "--tiny", "--out", str(out)]) == 0
    assert "[quickstart] training" not in capsys.readouterr().out


def test_report_command_and_errors(tmp_path, capsys):
    assert mecheval(["report", str(tmp_path / "nothing"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a finished run" in err[0]

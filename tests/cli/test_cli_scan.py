"""The ``adopter`` command line, run as a user would (a subprocess), plus in-process checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adopter.cli import app
from adopter.rules import load_rule_set

GOOD = """
from torch import nn
import torch.nn.functional as F

class Attention(nn.Module):
    def forward(self, scores):
        return F.softmax(scores, dim=-1)
"""

# If this file were imported or run, it would write a marker file and then raise.
BOOBY_TRAPPED = """
import pathlib
pathlib.Path({marker!r}).write_text("executed")
raise SystemExit("this module must never be executed")

from torch import nn
import torch.nn.functional as F

class Attention(nn.Module):
    def forward(self, scores):
        return F.softmax(scores, dim=-1)
"""

try:  # keep stderr (progress, summaries) out of the parsed stdout on every click version
    runner = CliRunner(mix_stderr=False)
except TypeError:  # click >= 8.2 always keeps them apart
    runner = CliRunner()


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "adopter", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_scan_json(tmp_path):
    (tmp_path / "model.py").write_text(GOOD)
    result = runner.invoke(app, ["scan", str(tmp_path), "--format", "json"])
    assert result.exit_code == 0, result.output
    (record,) = json.loads(result.stdout)
    assert record["rule"] == "paper.4"
    assert record["line"] == 7 and record["class"] == "Attention" and record["method"] == "forward"
    assert set(record) == {
        *("rule", "name", "path", "line", "col", "class", "method", "message", "kernel")
    }


def test_scan_sarif(tmp_path):
    (tmp_path / "model.py").write_text(GOOD)
    result = runner.invoke(app, ["scan", str(tmp_path / "model.py"), "--format", "sarif"])
    assert result.exit_code == 0
    log = json.loads(result.stdout)
    assert log["version"] == "2.1.0"
    run = log["runs"][0]
    # every rule of the default set is described, whether or not it fired
    assert len(run["tool"]["driver"]["rules"]) == len(load_rule_set())
    (finding,) = run["results"]
    assert finding["ruleId"] == "paper.4"
    assert finding["locations"][0]["physicalLocation"]["region"] == {
        "startLine": 7,
        "startColumn": 16,
    }


def test_columns_count_characters_not_bytes(tmp_path):
    # ``ast`` counts UTF-8 bytes: "ü" and "→" before the site would push it right by 1 and 2
    wide = GOOD.replace(
        "return F.softmax(scores, dim=-1)", 'label = "ü→"; return F.softmax(scores, dim=-1)'
    )
    (tmp_path / "model.py").write_text(wide, encoding="utf-8")
    expected = len('        label = "ü→"; return ') + 1
    result = runner.invoke(app, ["scan", str(tmp_path / "model.py"), "--format", "sarif"])
    run = json.loads(result.stdout)["runs"][0]
    assert run["columnKind"] == "unicodeCodePoints"
    region = run["results"][0]["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": 7, "startColumn": expected}
    result = runner.invoke(app, ["scan", str(tmp_path / "model.py"), "--format", "json"])
    assert json.loads(result.stdout)[0]["col"] == expected


def test_scan_table_and_select(tmp_path):
    (tmp_path / "model.py").write_text(GOOD)
    result = runner.invoke(app, ["scan", str(tmp_path), "--select", "paper.5"])
    assert result.exit_code == 0
    assert "0 site(s) in 1 file(s), 1 rule(s)" in result.stdout
    result = runner.invoke(app, ["scan", str(tmp_path), "--select", "paper.4"])
    assert "paper.4" in result.stdout and "1 site(s)" in result.stdout


def _deep_model(tmp_path: Path) -> Path:
    """A model file whose path is far longer than any terminal width tried below."""
    folder = tmp_path / ("d" * 100) / ("e" * 60)
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(GOOD)
    return folder / "model.py"


@pytest.mark.parametrize("columns", ["40", "60", "80", "300"])
def test_scan_table_prints_each_location_whole_on_one_line(tmp_path, monkeypatch, columns):
    # A table folds a long path over several lines (or cuts it with an ellipsis) to fit the
    # terminal: then it can be neither copied nor clicked, and a test that looks for the path
    # depends on how long the temporary folder's name is.
    model = _deep_model(tmp_path)
    monkeypatch.setenv("COLUMNS", columns)
    result = runner.invoke(app, ["scan", str(model)])
    assert result.exit_code == 0, result.output
    location = f"{model}:7:16"
    (line,) = [line for line in result.stdout.splitlines() if "paper.4" in line]
    assert line.startswith(location + "  "), result.stdout
    assert "Attention.forward" in line and "softmax" in line


def test_scan_table_piped_keeps_locations_whole(tmp_path):
    model = _deep_model(tmp_path)
    env = {**os.environ, "COLUMNS": "60"}
    result = subprocess.run(
        [sys.executable, "-m", "adopter", "scan", str(model)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert f"{model}:7:16  paper.4" in result.stdout.splitlines()[0]


@pytest.mark.parametrize("columns", ["40", "300"])
def test_verify_table_prints_each_file_whole_on_one_line(tmp_path, monkeypatch, capsys, columns):
    from adopter import cli

    model = _deep_model(tmp_path)
    monkeypatch.setenv("COLUMNS", columns)
    rows = [
        {
            "path": str(model),
            "class": "Attention",
            "status": "verified",
            "reason": "",
            "max_abs_diff": 1.5e-7,
            "where": "eval",
        }
    ]
    cli._print_verdicts(rows, "table")
    (line, summary) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{model}  Attention  verified"), line
    assert summary == "1 verified file(s)"


def test_scan_with_user_rule_file(tmp_path):
    (tmp_path / "model.py").write_text(GOOD)
    rules = tmp_path / "mine.adopt"
    rules.write_text(
        'rule mine.1 { name: "any softmax" forward { torch.nn.functional.softmax($x, ...) -> $y } => _ }'
    )
    result = runner.invoke(
        app, ["scan", str(tmp_path / "model.py"), "--rules", str(rules), "-f", "json"]
    )
    assert result.exit_code == 0, result.output
    assert [r["rule"] for r in json.loads(result.stdout)] == ["mine.1"]


def test_scan_never_imports_the_target(tmp_path):
    marker = tmp_path / "executed.txt"
    (tmp_path / "trap.py").write_text(BOOBY_TRAPPED.format(marker=str(marker)))
    result = run_cli("scan", str(tmp_path), "--format", "json")
    assert result.returncode == 0, result.stderr
    assert [r["line"] for r in json.loads(result.stdout)] == [11]
    assert not marker.exists()
    assert "trap" not in sys.modules


def test_scan_and_apply_never_import_torch(tmp_path):
    """Scanning and rewriting are static: the kernels (and torch) are named, never imported;
    a rewrite check that read the kernel registry through ``adopter.kernels`` once cost every
    command torch's import (seconds)."""
    (tmp_path / "model.py").write_text(GOOD)
    code = (
        "import sys\n"
        "from adopter.cli import app\n"
        "for command in (['scan', sys.argv[1]], ['apply', '--write', sys.argv[1]]):\n"
        "    try:\n"
        "        app(command)\n"
        "    except SystemExit as done:\n"
        "        assert not done.code, done.code\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('adopter.kernels')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "from adopter.kernels import softmax" in (tmp_path / "model.py").read_text()
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("broken.py", b"class A(:\n    pass\n", r"broken.py:1:9: invalid Python"),
        ("latin.py", b"x = 1\ny = '\xe9'\n", r"latin.py:2:6: cannot decode byte 0xe9 as utf-8"),
    ],
)
def test_bad_files_are_reported_and_the_rest_scanned(tmp_path, name, content, expected):
    (tmp_path / name).write_bytes(content)
    (tmp_path / "good.py").write_text(GOOD)
    result = run_cli("scan", str(tmp_path), "--format", "json")
    assert result.returncode == 2
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert [r["rule"] for r in json.loads(result.stdout)] == ["paper.4"]


def test_missing_path_and_bad_rule_file(tmp_path):
    result = run_cli("scan", str(tmp_path / "nope.py"))
    assert result.returncode == 2
    assert f"{tmp_path / 'nope.py'}:1:1: no such file or directory" in result.stderr
    bad_rule = tmp_path / "bad.adopt"
    bad_rule.write_text("rule x {\n  forward { f($x) -> }\n}\n")
    (tmp_path / "m.py").write_text(GOOD)
    result = run_cli("scan", str(tmp_path / "m.py"), "--rules", str(bad_rule))
    assert result.returncode == 2
    assert f"{bad_rule}:2:22: unexpected '}}'" in result.stderr
    assert result.stdout == ""


def test_unknown_select_is_an_error(tmp_path):
    (tmp_path / "m.py").write_text(GOOD)
    result = runner.invoke(app, ["scan", str(tmp_path), "--select", "paper.42"])
    assert result.exit_code == 2


def test_structure_command(tmp_path):
    (tmp_path / "m.py").write_text(GOOD)
    result = runner.invoke(app, ["structure", str(tmp_path / "m.py")])
    assert result.exit_code == 0
    assert "class Attention(torch.nn.Module)" in result.stdout
    assert "torch.nn.functional.softmax($scores, dim=-1) -> $t" in result.stdout


def test_rules_command_lists_all_nine():
    result = runner.invoke(app, ["rules"])
    assert result.exit_code == 0
    assert all(f"paper.{n}" in result.stdout for n in range(1, 10))


def test_parallel_scan_matches_serial(tmp_path):
    for index in range(12):
        (tmp_path / f"m{index}.py").write_text(GOOD)
    serial = runner.invoke(app, ["scan", str(tmp_path), "-f", "json", "--jobs", "1"])
    parallel = runner.invoke(app, ["scan", str(tmp_path), "-f", "json", "--jobs", "2"])
    assert json.loads(serial.stdout) == json.loads(parallel.stdout)
    assert len(json.loads(serial.stdout)) == 12


def test_help_and_usage_errors_through_the_console_entry_point():
    help_text = run_cli("--help")
    assert help_text.returncode == 0 and "scan" in help_text.stdout
    scan_help = run_cli("scan", "--help")
    assert scan_help.returncode == 0 and "--format" in scan_help.stdout
    usage = run_cli("scan", "--no-such-option", "x.py")
    assert usage.returncode == 2
    assert "No such option: --no-such-option" in usage.stderr


def test_launcher_decides_help_from_the_arguments():
    from adopter.launcher import wants_help

    assert wants_help([])
    assert wants_help(["scan", "--help"])
    assert not wants_help(["scan", "model.py", "--format", "json"])


@pytest.mark.parametrize("columns", ["40", "80", "300"])
def test_a_long_path_is_printed_whole_on_one_line_at_any_terminal_width(tmp_path, columns):
    # A table folds a path longer than its column over several lines, so the location can be
    # neither copied nor clicked, and a test that looks for it depends on the tmp folder's length.
    folder = tmp_path / ("deep_" * 30) / ("nested_" * 10)
    folder.mkdir(parents=True)
    model = folder / "attention_module.py"
    model.write_text(GOOD)
    environment = {**os.environ, "COLUMNS": columns, "TERM": "xterm-256color"}
    done = subprocess.run(
        [sys.executable, "-m", "adopter", "scan", str(model)],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    location = f"{model.relative_to(tmp_path)}:7:16"
    lines = [line for line in done.stdout.splitlines() if line.startswith(location)]
    assert lines and "paper.4" in lines[0], done.stdout

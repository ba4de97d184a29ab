"""``apply --write`` never loses an edit and never changes what a file is: content changed since
it was read, concurrent runs, symlinks, hard links, owner and mode, read-only files, temporary
files left by a killed run, failed writes, and the diff's headers."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from adopter.cli import app
from adopter.match.matcher import Matcher
from tests.rewrite.samples import BERT_LIKE, PATCHED_FRAGMENTS

try:
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

SOFTMAX = PATCHED_FRAGMENTS["paper.4"]
FUSED_NORM = PATCHED_FRAGMENTS["paper.5"]


def _model(folder: Path, name: str = "model.py") -> Path:
    path = folder / name
    path.write_text(BERT_LIKE, encoding="utf-8")
    return path


def _patched(path: Path) -> bool:
    return SOFTMAX in path.read_text(encoding="utf-8")


def test_a_file_edited_during_the_run_is_not_overwritten(tmp_path, monkeypatch):
    target = _model(tmp_path)
    match_file = Matcher.match_file

    def edit_while_analysing(self, structure):
        found = match_file(self, structure)
        if "USER_EDIT" not in target.read_text(encoding="utf-8"):
            with open(target, "a", encoding="utf-8") as stream:  # someone saves meanwhile
                stream.write("\nUSER_EDIT = 1\n")
        return found

    monkeypatch.setattr(Matcher, "match_file", edit_while_analysing)
    result = runner.invoke(app, ["apply", str(target), "--write"])
    assert result.exit_code != 0
    assert target.read_text(encoding="utf-8") == BERT_LIKE + "\nUSER_EDIT = 1\n"
    assert f"{target}" in result.stderr and "changed since it was read" in result.stderr
    assert "0 site(s) patched" in result.stderr


def _run(*arguments: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "adopter", "apply", *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _skipped_paths(stderr: str) -> set[str]:
    return set(re.findall(r"^(\S+\.py): not written: changed since it was read", stderr, re.M))


def test_concurrent_runs_never_lose_an_edit(tmp_path):
    files = [_model(tmp_path, f"model_{index:02d}.py") for index in range(40)]
    runs = {
        "paper.4": _run(str(tmp_path), "--write", "--select", "paper.4"),
        "paper.5": _run(str(tmp_path), "--write", "--select", "paper.5"),
    }
    fragments = {"paper.4": SOFTMAX, "paper.5": FUSED_NORM}
    for rule_id, process in runs.items():
        _, stderr = process.communicate(timeout=300)
        skipped = _skipped_paths(stderr)
        assert process.returncode == (2 if skipped else 0), stderr
        for path in files:
            if str(path) not in skipped:  # every file the run did not name has its edit
                assert fragments[rule_id] in path.read_text(encoding="utf-8"), (rule_id, path)
    for rule_id in runs:  # a rerun completes what was skipped
        again = runner.invoke(app, ["apply", str(tmp_path), "--write", "--select", rule_id])
        assert again.exit_code == 0, again.stderr
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert SOFTMAX in text and FUSED_NORM in text
        compile(text, str(path), "exec")
    assert not list(tmp_path.glob(".*.adopter"))


def test_a_symlink_stays_a_link_and_its_target_is_patched(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    target = _model(real)
    link = tmp_path / "link.py"
    link.symlink_to(target)
    result = runner.invoke(app, ["apply", str(link), "--write"])
    assert result.exit_code == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert _patched(target)
    assert not list(real.glob(".*.adopter")) and not list(tmp_path.glob(".*.adopter"))


def test_hard_linked_files_are_refused_unless_written_in_place(tmp_path):
    target = _model(tmp_path)
    other = tmp_path / "other_name.txt"
    os.link(target, other)
    refused = runner.invoke(app, ["apply", str(target), "--write"])
    assert refused.exit_code != 0
    assert "hard link" in refused.stderr and str(target) in refused.stderr
    assert not _patched(target) and target.stat().st_nlink == 2
    written = runner.invoke(app, ["apply", str(target), "--write", "--in-place-hard-links"])
    assert written.exit_code == 0, written.stderr
    assert _patched(target) and _patched(other)
    assert os.path.samefile(target, other)


def test_owner_group_and_mode_are_kept(tmp_path):
    target = _model(tmp_path)
    target.chmod(0o640)
    if os.geteuid() == 0:
        os.chown(target, 4321, 8765)
    before = target.stat()
    result = runner.invoke(app, ["apply", str(target), "--write"])
    assert result.exit_code == 0, result.stderr
    after = target.stat()
    assert _patched(target)
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
    assert after.st_mode == before.st_mode


def test_read_only_files_are_refused_unless_forced(tmp_path):
    target = _model(tmp_path)
    target.chmod(0o444)
    refused = runner.invoke(app, ["apply", str(target), "--write"])
    assert refused.exit_code != 0
    assert "read-only" in refused.stderr and str(target) in refused.stderr
    assert not _patched(target)
    forced = runner.invoke(app, ["apply", str(target), "--write", "--force-read-only"])
    assert forced.exit_code == 0, forced.stderr
    assert _patched(target) and target.stat().st_mode & 0o777 == 0o444


def test_stale_temporary_files_of_a_killed_run_are_removed(tmp_path):
    target = _model(tmp_path)
    stale = tmp_path / ".model.py.k3j_4h5g.adopter"
    stale.write_text("half of a patched file")
    hour_ago = time.time() - 3600
    os.utime(stale, (hour_ago, hour_ago))
    in_use = tmp_path / ".model.py.abcd1234.adopter"  # a live run is writing it
    in_use.write_text("being written")
    os.utime(in_use, (hour_ago, hour_ago))
    not_ours = tmp_path / ".model.py.backup"
    not_ours.write_text("someone else's")
    with open(in_use, "rb") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        result = runner.invoke(app, ["apply", str(tmp_path), "--write"])
    assert result.exit_code == 0, result.stderr
    assert not stale.exists() and in_use.exists() and not_ours.exists()
    assert str(stale) in result.stderr
    assert _patched(target)


def test_a_dry_run_removes_nothing(tmp_path):
    _model(tmp_path)
    stale = tmp_path / ".model.py.k3j_4h5g.adopter"
    stale.write_text("half of a patched file")
    os.utime(stale, (time.time() - 3600,) * 2)
    result = runner.invoke(app, ["apply", str(tmp_path)])
    assert result.exit_code == 0
    assert stale.exists()


def test_a_failed_write_is_not_counted_as_patched(tmp_path, monkeypatch):
    target = _model(tmp_path)

    def failing_replace(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    result = runner.invoke(app, ["apply", str(target), "--write"])
    assert result.exit_code == 2
    assert "No space left on device" in result.stderr
    assert "0 site(s) patched in 0 file(s)" in result.stderr
    assert target.read_text(encoding="utf-8") == BERT_LIKE
    assert [p.name for p in tmp_path.iterdir()] == ["model.py"]


def test_diff_headers_of_an_absolute_path_have_no_double_slash(tmp_path):
    target = _model(tmp_path)
    assert target.is_absolute()
    result = runner.invoke(app, ["apply", str(target)])
    assert result.exit_code == 0
    assert f"--- a{target}\n" in result.stdout and f"+++ b{target}\n" in result.stdout
    assert "a//" not in result.stdout and "b//" not in result.stdout


def test_skip_messages_point_at_the_call_site_not_the_factory(tmp_path):
    """A ``nn.Sequential`` built by a factory function: a site whose call cannot be rewritten is
    reported at its call in ``forward``, not at the factory's ``nn.Conv2d`` line."""
    source = tmp_path / "model.py"
    source.write_text(
        "from torch import nn\n"
        "\n"
        "\n"
        "def relu_conv(chs):\n"
        "    return nn.Sequential(nn.ReLU(), nn.Conv2d(chs, chs, 3, bias=False))\n"
        "\n"
        "\n"
        "class Block(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.body = relu_conv(8)\n"
        "        self.bn = nn.BatchNorm2d(8)\n"
        "\n"
        "    def forward(self, x):\n"
        "        h = self.body(x)\n"
        "        x = 3\n"
        "        return self.bn(h), x\n",
        encoding="utf-8",
    )
    result = runner.invoke(app, ["apply", str(source)])
    skips = [line for line in result.stderr.splitlines() if line.startswith("skipped")]
    assert len(skips) == 1 and f"{source}:15:13:" in skips[0], result.stderr
    # the call's column counts characters, as every reported column does (not UTF-8 bytes)
    text = source.read_text(encoding="utf-8")
    source.write_text(
        text.replace("        h = self.body(x)", '        s = "äöü"; h = self.body(x)'),
        encoding="utf-8",
    )
    result = runner.invoke(app, ["apply", str(source)])
    skips = [line for line in result.stderr.splitlines() if line.startswith("skipped")]
    column = len('        s = "äöü"; h = ') + 1
    assert len(skips) == 1 and f"{source}:15:{column}:" in skips[0], result.stderr


_KILLED_MID_WRITE = """
import os, sys, time
from adopter.cli import app
def stuck(source, destination):  # the temporary file is written and locked; never renamed
    print("temporary written", flush=True)
    time.sleep(600)
os.replace = stuck
app(["apply", sys.argv[1], "--write"])
"""


def test_a_run_killed_mid_write_leaves_the_file_whole_and_its_temporary_is_cleaned(tmp_path):
    target = _model(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MID_WRITE, str(target)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == "temporary written"
    finally:
        process.kill()  # SIGKILL: no cleanup runs
        process.communicate(timeout=60)
    assert target.read_text(encoding="utf-8") == BERT_LIKE
    (left,) = tmp_path.glob(".model.py.*.adopter")
    young = runner.invoke(app, ["apply", str(tmp_path), "--write"])
    assert young.exit_code == 0 and _patched(target)
    assert left.exists()  # too young to tell from a live run's
    os.utime(left, (time.time() - 60,) * 2)
    again = runner.invoke(app, ["apply", str(tmp_path), "--write"])
    assert again.exit_code == 0 and f"removed {left}" in again.stderr
    assert not left.exists()

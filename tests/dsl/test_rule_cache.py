"""The parse cache of rule files holds pickles, and unpickling runs code: a cache entry is read
only from this user's own private folder, never from a place another user can write."""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from pathlib import Path

import pytest

from adopter.dsl import loading
from adopter.dsl.loading import load_rule_file, rules_cache_dir

RULE = """\
# A rule for the cache tests.
rule cache.1 {
    forward { torch.nn.functional.softmax($x, dim=-1, ...) -> $p } => _
}
"""


class Payload:
    """Unpickling this writes a marker file: proof that a planted entry was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


@pytest.fixture
def cache_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


@pytest.fixture
def rule_file(tmp_path) -> Path:
    path = tmp_path / "rules" / "cache.adopt"
    path.parent.mkdir()
    path.write_text(RULE)
    return path


def _plant(folder: Path, name: str, marker: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    planted = folder / name
    planted.write_bytes(pickle.dumps(Payload(marker)))
    return planted


def _key(rule_file: Path) -> str:
    return loading._cache_key(rule_file.read_text(), str(rule_file))


def test_a_pickle_planted_in_the_old_shared_location_is_never_loaded(
    tmp_path, monkeypatch, cache_home, rule_file
):
    shared = tmp_path / "shared-tmp"
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    marker = tmp_path / "ran"
    # the name the old code computed: sha256 of text, path, grammar and protocol, under
    # $TMPDIR/adopter-rules
    digest = hashlib.sha256()
    for part in (rule_file.read_text(), str(rule_file), loading._grammar_text()):
        digest.update(part.encode("utf-8") + b"\0")
    digest.update(str(pickle.HIGHEST_PROTOCOL).encode("utf-8") + b"\0")
    planted = _plant(shared / "adopter-rules", f"{digest.hexdigest()[:32]}.pickle", marker)
    rules = load_rule_file(rule_file)
    assert [rule.id for rule in rules] == ["cache.1"]
    assert not marker.exists()
    assert list((shared / "adopter-rules").iterdir()) == [planted]  # nothing written there
    assert (cache_home / "adopter" / "rules" / _key(rule_file)).is_file()  # cached privately


def test_the_cache_is_private_and_reused(cache_home, rule_file):
    first = load_rule_file(rule_file)
    folder = rules_cache_dir()
    assert folder == cache_home / "adopter" / "rules"
    for part in (folder, folder.parent):
        assert part.stat().st_mode & 0o777 == 0o700
    entry = folder / _key(rule_file)
    assert entry.stat().st_mode & 0o077 == 0
    assert loading._load_cached(_key(rule_file)) == first
    assert load_rule_file(rule_file) == first


@pytest.mark.parametrize("which", ["rules", "adopter"])
def test_a_folder_others_can_write_is_neither_read_nor_written(
    tmp_path, cache_home, rule_file, which
):
    folder = cache_home / "adopter" / "rules"
    marker = tmp_path / "ran"
    planted = _plant(folder, _key(rule_file), marker)
    (cache_home / "adopter").chmod(0o700)
    folder.chmod(0o700)
    (folder if which == "rules" else folder.parent).chmod(0o777)
    assert [rule.id for rule in load_rule_file(rule_file)] == ["cache.1"]
    assert not marker.exists()
    assert planted.read_bytes() == pickle.dumps(Payload(marker))  # not overwritten either


def test_an_entry_others_can_write_is_not_read(tmp_path, cache_home, rule_file):
    load_rule_file(rule_file)  # creates the private folders
    marker = tmp_path / "ran"
    planted = _plant(cache_home / "adopter" / "rules", _key(rule_file), marker)
    planted.chmod(0o666)
    assert [rule.id for rule in load_rule_file(rule_file)] == ["cache.1"]
    assert not marker.exists()


def test_a_symlinked_entry_or_folder_is_not_followed(tmp_path, cache_home, rule_file):
    marker = tmp_path / "ran"
    elsewhere = _plant(tmp_path / "elsewhere", "payload.pickle", marker)
    elsewhere.chmod(0o600)
    load_rule_file(rule_file)
    entry = cache_home / "adopter" / "rules" / _key(rule_file)
    entry.unlink()
    entry.symlink_to(elsewhere)
    load_rule_file(rule_file)
    assert not marker.exists()
    # the whole folder replaced by a link to a folder holding the payload
    folder = cache_home / "adopter" / "rules"
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()
    (tmp_path / "elsewhere").chmod(0o700)
    os.rename(elsewhere, tmp_path / "elsewhere" / _key(rule_file))
    folder.symlink_to(tmp_path / "elsewhere")
    load_rule_file(rule_file)
    assert not marker.exists()


def test_a_folder_owned_by_someone_else_is_not_trusted(
    tmp_path, cache_home, rule_file, monkeypatch
):
    marker = tmp_path / "ran"
    _plant(cache_home / "adopter" / "rules", _key(rule_file), marker)
    for part in (cache_home / "adopter", cache_home / "adopter" / "rules"):
        part.chmod(0o700)
    if os.geteuid() == 0:  # really hand it to another user
        os.chown(cache_home / "adopter" / "rules", 65534, 65534)
    else:  # or pretend to be another user
        monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
    assert [rule.id for rule in load_rule_file(rule_file)] == ["cache.1"]
    assert not marker.exists()


def test_without_a_usable_cache_folder_rules_still_load(tmp_path, monkeypatch, rule_file):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert [rule.id for rule in load_rule_file(rule_file)] == ["cache.1"]
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert rules_cache_dir() == tmp_path / "home" / ".cache" / "adopter" / "rules"

"""The per-user cache: hits, invalidation, and folders or entries that are not safe to use."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys

import pytest

import adopter
from adopter.runtime import cache as cache_module
from adopter.runtime import patching
from adopter.runtime.cache import CacheRefused, RuntimeCache, clear_cache, entry_key
from adopter.runtime.rulechoice import RuleChoice

from .models import BLOCKS


def _fail_if_rewritten(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("rewrote although the cache holds this module")

    monkeypatch.setattr("adopter.rewrite.rewrite_text", refuse)


def _reimport(name: str):
    del sys.modules[name]
    return importlib.import_module(name)


def test_a_second_start_reads_the_cache_instead_of_rewriting(make_package, monkeypatch, caplog):
    make_package("rt_cached", {"blocks.py": BLOCKS})
    blocks = importlib.import_module("rt_cached.blocks")
    caplog.set_level(logging.INFO, logger="adopter")
    first = adopter.patch(blocks, rules="paper")
    # A first run says it rewrites before it does (seconds per module on a real package).
    assert "rt_cached: rewriting its imported modules" in caplog.text
    caplog.clear()
    adopter.unpatch()
    blocks = _reimport("rt_cached.blocks")  # as a new process would import it
    _fail_if_rewritten(monkeypatch)

    second = adopter.patch(blocks, rules="paper")

    assert second.patched == first.patched
    assert "patched rt_cached.blocks (cached)" in caplog.text
    assert "dropout_add_layer_norm" in vars(blocks)


def test_the_cache_misses_when_the_source_changes(make_package, monkeypatch):
    package = make_package("rt_changed", {"blocks.py": BLOCKS})
    blocks = importlib.import_module("rt_changed.blocks")
    adopter.patch(blocks, rules="paper")
    adopter.unpatch()
    source = package / "blocks.py"
    source.write_text(source.read_text().replace("F.softmax(scores", "F.softmax(2 * scores"))
    blocks = _reimport("rt_changed.blocks")
    calls = []
    real = patching.prepare

    def counting(*args, **kwargs):
        prepared = real(*args, **kwargs)
        calls.append(prepared.cached)
        return prepared

    monkeypatch.setattr(patching, "prepare", counting)
    report = adopter.patch(blocks, rules="paper")
    assert calls == [False]
    assert "paper.4 Scores.forward line 21" in report.patched["rt_changed.blocks"]
    assert blocks.Scores()(__import__("torch").zeros(1, 2)).tolist() == [[0.5, 0.5]]


def test_the_key_depends_on_source_rules_and_environment(tmp_path, monkeypatch):
    paper, extended = RuleChoice.of("paper"), RuleChoice.of("extended")
    assert entry_key(b"a", paper.fingerprint) != entry_key(b"b", paper.fingerprint)
    assert entry_key(b"a", paper.fingerprint) != entry_key(b"a", extended.fingerprint)
    assert entry_key(b"a", paper.fingerprint) != entry_key(b"a", paper.fingerprint, "verify")
    rule = tmp_path / "mine.adopt"
    rule.write_text('rule mine.1 { name: "x" forward { f($x) -> $y } => _ }')
    before = RuleChoice.of(str(rule)).fingerprint
    rule.write_text('rule mine.1 { name: "x" forward { g($x) -> $y } => _ }')
    assert RuleChoice.of(str(rule)).fingerprint != before
    key = entry_key(b"a", paper.fingerprint)
    cache_module.torch_version.cache_clear()
    monkeypatch.setitem(sys.modules, "torch", type("torch", (), {"__version__": "0.0.1"}))
    try:
        assert entry_key(b"a", paper.fingerprint) != key
    finally:
        cache_module.torch_version.cache_clear()


def test_the_folder_is_created_private(private_cache):
    RuntimeCache(private_cache)
    assert os.stat(private_cache).st_mode & 0o777 == 0o700


def test_a_folder_owned_by_someone_else_is_refused(
    private_cache, make_package, monkeypatch, caplog
):
    private_cache.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(private_cache).st_uid + 1)
    with pytest.raises(CacheRefused, match="owned by another user"):
        RuntimeCache(private_cache)
    make_package("rt_foreign", {"blocks.py": BLOCKS})
    caplog.set_level(logging.WARNING, logger="adopter")
    report = adopter.patch("rt_foreign.blocks", rules="paper")
    assert list(report.patched) == ["rt_foreign.blocks"]  # patched, without a cache
    assert "not using the cache" in caplog.text
    assert not list(private_cache.iterdir())


def test_a_folder_others_can_write_is_refused(private_cache):
    private_cache.mkdir()
    os.chmod(private_cache, 0o777)
    with pytest.raises(CacheRefused, match="writable by others"):
        RuntimeCache(private_cache)
    os.chmod(private_cache, 0o700)
    link = private_cache.parent / "link"
    link.symlink_to(private_cache)
    with pytest.raises(CacheRefused, match="not a folder"):
        RuntimeCache(link)


def test_entries_others_could_have_written_are_ignored(private_cache):
    cache = RuntimeCache(private_cache)
    cache.put("k", {"patched": "print('hello')"})
    assert cache.get("k")["patched"] == "print('hello')"
    entry = private_cache / "k.json"
    os.chmod(entry, 0o666)
    assert cache.get("k") is None
    os.chmod(entry, 0o600)
    entry.write_text(json.dumps({"format": -1}))
    assert cache.get("k") is None
    entry.write_text("not json")
    assert cache.get("k") is None


def test_clear_removes_the_entries(private_cache, make_package):
    make_package("rt_clear", {"blocks.py": BLOCKS})
    adopter.patch("rt_clear", rules="paper")
    importlib.import_module("rt_clear.blocks")  # through the hook, with its package
    assert clear_cache(private_cache) >= 2  # the package __init__ and blocks.py
    assert not list(private_cache.glob("*.json"))

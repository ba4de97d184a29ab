"""``adopter fetch``: pinned specs only; an unpacked wheel is reused from the cache."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from adopter.corpus import FetchError, fetch_wheel, pinned_requirement


@pytest.mark.parametrize(
    "spec",
    [
        "transformers",
        "transformers>=4.34",
        "==4.34.0",
        "transformers==4.*",
        "transformers==4.34.0,==4.35.0",
        "transformers===4.34.0",
        "transformers~=4.34",
    ],
)
def test_unpinned_specs_are_refused(spec, tmp_path, no_pip):
    with pytest.raises(FetchError, match="exact version"):
        fetch_wheel(spec, tmp_path)


@pytest.fixture
def no_pip(monkeypatch):
    """Fails the test if pip would be started."""

    def refuse(command, **kwargs):
        raise AssertionError(f"pip was started: {command}")

    monkeypatch.setattr("adopter.corpus.subprocess.run", refuse)


@pytest.mark.parametrize(
    "spec",
    [
        "-d/tmp/elsewhere/x==1",
        "--dest=/tmp/elsewhere",
        " -dx==1",
        "../fake==1",
        "/abs/fake==1",
        "fake/../../x==1",
        "./fake==1",
        "fake @ https://example.invalid/fake-1.whl",
        "fake==1; python_version > '3'",
        "fake[extra]==1",
        "fake==1 --index-url=https://example.invalid",
        "",
    ],
)
def test_options_paths_and_urls_are_refused(spec, tmp_path, no_pip):
    with pytest.raises(FetchError):
        fetch_wheel(spec, tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_cache_folder_and_pip_argument_come_from_the_canonical_parts(tmp_path, monkeypatch):
    assert pinned_requirement("Demo_Pkg==1.0") == ("demo-pkg", "1.0")
    assert pinned_requirement("demo.pkg == 01.02") == ("demo-pkg", "1.2")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "demo_pkg-1.0-py3-none-any.whl", "w") as archive:
        archive.writestr("demo_pkg/m.py", "x = 1\n")
    commands = []

    def fake_run(command, **kwargs):
        commands.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr("adopter.corpus.subprocess.run", fake_run)
    folder = fetch_wheel("Demo_Pkg==1.0", tmp_path)
    assert folder == tmp_path / "demo-pkg-1.0"
    (command,) = commands
    assert command[-2:] == ["--", "demo-pkg==1.0"]  # after "--": never read as an option


def test_pip_runs_isolated_from_the_working_folder(tmp_path, monkeypatch):
    """A ``pip.py`` in the current folder is not what runs: the interpreter flags keep the
    folder off the import path (checked by running pip's own --version with those flags)."""
    marker = tmp_path / "executed"
    (tmp_path / "pip.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    run = subprocess.run  # the patch below replaces it in the subprocess module itself
    commands = []

    def fake_run(command, **kwargs):
        commands.append(command)
        return subprocess.CompletedProcess(command, 1, "", "stop here")

    monkeypatch.setattr("adopter.corpus.subprocess.run", fake_run)
    with pytest.raises(FetchError):
        fetch_wheel("demo==1.0", tmp_path / "cache")
    (command,) = commands
    assert command[0] == sys.executable
    start = command[: command.index("pip") + 1]
    completed = run(
        [*start, "--version"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    assert not marker.exists()


def test_cached_wheel_is_unpacked_once(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "demo_pkg-1.0-py3-none-any.whl", "w") as archive:
        archive.writestr("demo_pkg/models/m.py", "x = 1\n")
    calls = []

    def fake_run(command, **kwargs):
        calls.append(command)

        class Done:
            returncode = 0
            stdout = stderr = ""

        return Done()

    monkeypatch.setattr("adopter.corpus.subprocess.run", fake_run)
    folder = fetch_wheel("demo-pkg==1.0", tmp_path)
    assert (folder / "demo_pkg" / "models" / "m.py").read_text() == "x = 1\n"
    assert calls and calls[0][1:5] == ["-I", "-m", "pip", "download"]
    assert fetch_wheel("demo-pkg==1.0", tmp_path) == folder
    assert len(calls) == 1  # the second call is served from the cache


def test_two_fetches_of_one_release_at_once_unpack_it_once(tmp_path, monkeypatch):
    """Parallel test workers (or two shells) fetching the same release: one downloads and
    unpacks, the other waits for it and finds it done."""
    import threading
    import time

    from adopter import corpus

    calls: list[str] = []

    def slow_download(name, version, root, target, quiet):
        calls.append(name)
        time.sleep(0.3)  # the other fetch arrives while this one works
        target.mkdir(parents=True)
        (target / ".complete").write_text("x.whl")
        return target

    monkeypatch.setattr(corpus, "_download_and_unpack", slow_download)
    results: list[object] = []
    threads = [
        threading.Thread(target=lambda: results.append(fetch_wheel("demo==1.0", tmp_path)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["demo"]
    assert results == [tmp_path / "demo-1.0"] * 2

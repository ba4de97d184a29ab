"""``adopter fetch``: pinned specs only; an unpacked wheel is reused from the cache."""

from __future__ import annotations

import zipfile

import pytest

from adopter.corpus import FetchError, fetch_wheel


@pytest.mark.parametrize("spec", ["transformers", "transformers>=4.34", "==4.34.0"])
def test_unpinned_specs_are_refused(spec, tmp_path):
    with pytest.raises(FetchError, match="exact version"):
        fetch_wheel(spec, tmp_path)


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
    assert calls and calls[0][1:4] == ["-m", "pip", "download"]
    assert fetch_wheel("demo-pkg==1.0", tmp_path) == folder
    assert len(calls) == 1  # the second call is served from the cache

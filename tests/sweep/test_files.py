"""The output lock: a second writer is refused at once, on POSIX (naming the owner) and where
the platform has no ``fcntl`` (filelock)."""

from __future__ import annotations

import pytest

from fastsim.model.schema import ConfigError
from fastsim.sweep import files


@pytest.mark.parametrize("posix", [True, False])
def test_a_second_writer_is_refused_and_the_lock_is_freed(tmp_path, monkeypatch, posix):
    if not posix:
        monkeypatch.setattr(files, "fcntl", None)
    out = tmp_path / "a.nc"
    with files.output_lock(out):
        with pytest.raises(ConfigError, match="another sweep .*is writing this output") as refused:
            with files.output_lock(out):
                pass
        assert ("(pid " in str(refused.value)) == posix
    with files.output_lock(out):  # released on exit
        pass

"""The fork server imports the libraries a fixture's module imports as it loads, so the workers
it forks find them imported; what the fixture imports later, each worker imports itself."""

from __future__ import annotations

from pathlib import Path

import fixture_runs
import pytest

pytestmark = pytest.mark.live


def _records(directory: Path) -> list[str]:
    return [path.read_text(encoding="utf-8") for path in sorted(directory.iterdir())]


@pytest.mark.parametrize(
    ("module", "expected"),
    [("preloaded_loops", "preloaded"), ("late_import_loops", "imported here")],
)
def test_a_library_the_fixtures_module_imports_is_imported_once_before_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, expected: str
) -> None:
    monkeypatch.setenv("PRELOAD_RECORDS", str(tmp_path))
    reasons, _ = fixture_runs.run(f"{module}:fixture", ["resume_1"], (1,))
    assert reasons == {"resume_1": []}
    records = _records(tmp_path)
    # The probe and resume_1's arms: the run that never saves, its repeat, the saving run, and
    # the resumed one, each a forked worker of its own.
    assert len(records) >= 5, records
    assert set(records) == {expected}, records

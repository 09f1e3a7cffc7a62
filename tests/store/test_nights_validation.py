"""Night files are validated against their names and the clock, and `history` says what is wrong
with them: nothing in the future keeps the history "current", no NaN or negative age, a damaged
night is exit 2 naming its file (an old one is named and skipped), a night never names a path,
a small gzip of a huge JSON is refused by size, a run of another matrix is not a night, and no
link on the site is anything but http(s) or relative."""
from __future__ import annotations

import gzip
import json
import tempfile
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
from helpers import BOTH, FIXTURES, HOSTILE, TESTS

from harness.cli import main
from harness.core.record import SchemaError
from harness.store import nights as nights_mod
from harness.store.nights import read_night, scan_nights
from harness.store.nights_append import append_night

RUNS = FIXTURES / "runs"
E2E = TESTS / "matrices" / "e2e.yaml"     # the fixture runs' matrix


@pytest.fixture
def history(tmp_path, capsys):
    """`python -m harness history ...` in-process: (exit code, stdout, stderr lines)."""
    def run(*args: str) -> tuple[int, str, list[str]]:
        rc = main(["--reports", str(tmp_path / "reports"), "history", *args])
        out, err = capsys.readouterr()
        return rc, out, err.strip().splitlines()
    return run


def _night_dict(name: str = "2026-11-01", **changes) -> dict:
    """A real night's content (the fixture run appended as ``name``) with ``changes``."""
    with tempfile.TemporaryDirectory() as folder:
        path, _ = append_night(RUNS / BOTH, Path(folder), name, outcome="success")
        data = json.loads(gzip.decompress(path.read_bytes()))
    return {**data, **changes}


def _write(folder: Path, name: str, data: dict | bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json.gz"
    path.write_bytes(gzip.compress(data if isinstance(data, bytes) else json.dumps(data).encode()))
    return path


def test_a_night_started_in_the_future_is_refused_not_current_for_years(tmp_path, history):
    nights = tmp_path / "nights"
    _write(nights, "2026-11-01", _night_dict(started=time.time() + 10 * 365 * 86400))
    with pytest.raises(SchemaError, match=r"2026-11-01.json.gz: key 'started': .* is in the future"):
        read_night(nights / "2026-11-01.json.gz")
    rc, out, err = history("check", "--nights", str(nights))
    assert rc == 2 and "current" not in out, out
    assert "2026-11-01.json.gz" in err[-1] and "in the future" in err[-1]


@pytest.mark.parametrize("hours", ["nan", "-1", "0", "inf"])
def test_max_age_must_be_a_positive_number_of_hours(tmp_path, history, hours):
    rc, _, err = history("check", "--nights", str(tmp_path), f"--max-age-hours={hours}")
    assert rc == 2 and "--max-age-hours" in err[-1], err


def test_append_refuses_a_night_in_the_future_and_a_link_that_is_not_http(tmp_path, history):
    nights = tmp_path / "nights"
    run = str(RUNS / BOTH)
    rc, _, err = history("append", "--run", run, "--nights", str(nights), "--night", "2099-12-31",
                         "--config", str(E2E))
    assert rc == 2 and "--night 2099-12-31: a date in the future" in err[-1], err
    rc, _, err = history("append", "--no-run", "--outcome", "failure", "--nights", str(nights), "--night", "2099-12-31")
    assert rc == 2 and "in the future" in err[-1]
    rc, _, err = history("append", "--run", run, "--nights", str(nights), "--url", "javascript:alert(1)",
                         "--config", str(E2E))
    assert rc == 2 and "--url: expected an http(s) link" in err[-1], err
    assert not nights.exists() or not list(nights.iterdir())


def test_history_append_takes_only_a_run_of_the_nightly_s_matrix(tmp_path, history):
    nights = tmp_path / "nights"
    rc, _, err = history("append", "--run", str(RUNS / BOTH), "--nights", str(nights))   # --config: matrix.yaml
    assert rc == 2 and "a run of tests/matrices/e2e.yaml, not of the nightly's matrix" in err[-1], err
    rc, out, _ = history("append", "--run", str(RUNS / BOTH), "--nights", str(nights), "--config", str(E2E),
                         "--night", "2026-11-01")
    assert rc == 0 and out.startswith("night: "), out
    assert read_night(nights / "2026-11-01.json.gz").config == "tests/matrices/e2e.yaml"


def test_a_night_s_name_is_its_file_s_and_never_a_path(tmp_path, history):
    nights, site = tmp_path / "nights", tmp_path / "site"
    _write(nights, "2026-11-01", _night_dict("2026-11-01", night="../../../escaped"))
    with pytest.raises(SchemaError, match=r"key 'night': expected a date"):
        read_night(nights / "2026-11-01.json.gz")
    _write(nights, "2026-11-02", _night_dict("2026-11-02", night="2026-11-03"))
    with pytest.raises(SchemaError, match=r"key 'night' is '2026-11-03', not the file's name '2026-11-02'"):
        read_night(nights / "2026-11-02.json.gz")
    rc, _, err = history("publish", "--nights", str(nights), "--site", str(site))
    assert rc == 2 and sum("skipping night file" in line for line in err) == 2, err
    assert not list(tmp_path.rglob("escaped*")) and not (tmp_path / "nights" / "2026-11-03.html").exists()


@pytest.mark.parametrize("change, says", [
    ({"schema": "abc"}, "key 'schema': expected a night schema number (got 'abc')"),
    ({"started": "yesterday"}, "key 'started': expected a time in seconds"),
    ({"outcome": "green"}, "key 'outcome'"),
    ({"environments": {"e": {"torch": 2}}}, "key 'environments'"),
])
def test_damaged_night_files_are_exit_2_naming_the_file(tmp_path, history, change, says):
    nights = tmp_path / "nights"
    _write(nights, "2026-11-01", _night_dict(**change))
    for action in ("check", "publish"):
        rc, _, err = history(action, "--nights", str(nights), "--site", str(tmp_path / "site"))
        assert rc == 2 and "2026-11-01.json.gz" in err[-1] and says in err[-1], err


def test_a_record_without_run_id_names_the_file_and_the_record(tmp_path, history):
    data = _night_dict()
    del data["records"][3]["run_id"]
    nights = tmp_path / "nights"
    _write(nights, "2026-11-01", data)
    rc, _, err = history("check", "--nights", str(nights))
    assert rc == 2 and "2026-11-01.json.gz: key 'records[3]'" in err[-1] and "run_id" in err[-1], err


def test_nights_that_is_a_file_is_bad_input(tmp_path, history):
    target = tmp_path / "nights"
    target.write_text("")
    for args in (["check"], ["publish"], ["append", "--run", str(RUNS / BOTH), "--config", str(E2E)]):
        rc, _, err = history(*args, "--nights", str(target))
        assert rc == 2 and err[-1] == f"error: --nights {target}: is a file; expected a folder of night files", err


def test_one_unreadable_old_night_is_named_and_skipped(tmp_path, history):
    nights, site = tmp_path / "nights", tmp_path / "site"
    (nights).mkdir()
    (nights / "2026-11-01.json.gz").write_bytes(b"not gzip at all")
    append_night(RUNS / HOSTILE, nights, "2026-11-02", outcome="success")
    append_night(RUNS / BOTH, nights, "2026-11-03", outcome="success")
    scan = scan_nights(nights)
    assert [n.night for n in scan.nights] == ["2026-11-02", "2026-11-03"] and scan.newest_damaged is None
    rc, out, err = history("check", "--nights", str(nights), "--max-age-hours", "100000")
    assert rc == 0 and out.startswith("current: newest night 2026-11-03"), out
    assert any("skipping night file" in line and "2026-11-01.json.gz" in line for line in err), err
    rc, _, err = history("publish", "--nights", str(nights), "--site", str(site))
    assert rc == 0 and (site / "nights" / "2026-11-03.html").exists() and (site / "nights" / "2026-11-02.html").exists()
    assert any("2026-11-01.json.gz" in line for line in err)


def test_a_small_gzip_holding_a_huge_json_is_refused_by_size(tmp_path, monkeypatch):
    """256 MiB of JSON in a file of a few hundred KiB: read up to the limit, never whole."""
    monkeypatch.setattr(nights_mod, "MAX_NIGHT_JSON", 2**20)
    path = tmp_path / "2026-11-01.json.gz"
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)      # a gzip stream, written in pieces
    with path.open("wb") as fh:
        fh.write(packer.compress(b'{"night": "2026-11-01", "pad": "'))
        block = b" " * 2**20
        for _ in range(256):
            fh.write(packer.compress(block))
        fh.write(packer.compress(b'"}') + packer.flush())
    assert path.stat().st_size < 2**20
    tracemalloc.start()
    with pytest.raises(SchemaError, match=r"holds more than 1 MiB of JSON"):
        read_night(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 16 * 2**20, peak


def test_a_night_file_s_link_that_is_not_http_is_never_a_link(tmp_path):
    from harness.report.history import write_history_site

    nights = tmp_path / "nights"
    _write(nights, "2026-11-01", _night_dict(outcome="failure", url="javascript:alert(document.cookie)"))
    _write(nights, "2026-11-02", _night_dict("2026-11-02", outcome="failure", url=" JaVa\tScRiPt:alert(1)"))
    _write(nights, "2026-11-03", _night_dict("2026-11-03", outcome="failure", url="https://ci.example/run/3"))
    index = write_history_site(nights, tmp_path / "site").read_text(encoding="utf-8")
    assert "javascript" not in index.lower() and "ScRiPt" not in index
    assert 'href="https://ci.example/run/3"' in index


def test_safe_href():
    from harness.report.html import safe_href

    for good in ("https://x.org/a", "HTTP://x", "nights/2026-11-01.html", "#cell", "../runs/a/matrix.html", "?q=1"):
        assert safe_href(good) == good
    for bad in ("javascript:alert(1)", "java\nscript:x", "\x01javascript:x", "data:text/html,x", "file:///etc/passwd",
                "//evil.example", "\\\\evil", "vbscript:x", "", None, 3):
        assert safe_href(bad) is None, bad


def test_the_nightly_s_matrix_is_the_same_file_or_the_same_path_in_another_checkout(tmp_path):
    from harness.core.paths import WORKSPACE
    from harness.store.nights_append import matrix_of

    other = tmp_path / "matrix.yaml"
    other.write_text("")
    assert not matrix_of(str(other), WORKSPACE / "matrix.yaml")              # another file named alike
    assert matrix_of(str(other), other) and matrix_of("matrix.yaml", WORKSPACE / "matrix.yaml")
    assert matrix_of("/home/runner/work/r/r/matrix.yaml", WORKSPACE / "matrix.yaml")   # a CI runner's checkout
    assert not matrix_of("tests/matrices/e2e.yaml", WORKSPACE / "matrix.yaml")

"""The runner's log relay: a worker's output stream routed to capped logs by marker lines."""
from __future__ import annotations

from harness.core.wire import log_marker
from harness.run.logrelay import CappedLog, LogRelay


def relay(tmp_path, max_bytes=None, closed=None):
    return LogRelay(tmp_path / "worker.log", tmp_path, max_bytes, "n0nce", {"g1", "g2"},
                    (closed if closed is not None else []).append)


def test_markers_route_output_to_group_logs_even_when_split_across_reads(tmp_path):
    closed: list[str] = []
    r = relay(tmp_path, closed=closed)
    stream = (b"import noise\n" + log_marker("n0nce", "g1") + b"export of g1\n" + log_marker("n0nce", "")
              + b"between\n" + log_marker("n0nce", "g1") + b"cell of g1\n" + log_marker("n0nce", "g2")
              + b"g2 output" + log_marker("n0nce", ""))
    for i in range(0, len(stream), 7):          # marker lines cut at every possible place
        r.feed(stream[i:i + 7])
    assert closed == ["g1"]                     # g1 is over once g2 starts
    r.close()
    assert closed == ["g1", "g2"]
    assert (tmp_path / "worker.log").read_bytes() == b"import noise\nbetween\n"
    assert (tmp_path / "g1.log").read_bytes() == b"export of g1\ncell of g1\n"
    assert (tmp_path / "g2.log").read_bytes() == b"g2 output"


def test_a_marker_with_another_nonce_or_an_unknown_group_is_output(tmp_path):
    r = relay(tmp_path)
    r.feed(log_marker("forged", "g1") + log_marker("n0nce", "../../etc/x") + b"text\n")
    r.close()
    assert (tmp_path / "worker.log").read_bytes() == log_marker("forged", "g1") + b"text\n"
    assert not (tmp_path / "g1.log").exists()


def test_capped_log_keeps_head_and_tail_and_says_how_much_was_cut(tmp_path):
    log = CappedLog(tmp_path / "x.log", 1000)
    data = b"".join(b"%06d\n" % i for i in range(10000))      # 70000 bytes
    for i in range(0, len(data), 333):
        log.write(data[i:i + 333])
    log.close()
    out = (tmp_path / "x.log").read_bytes()
    assert out.startswith(data[:500]) and out.endswith(data[-500:])
    assert b"[... 69000 bytes cut" in out


def test_capped_log_counts_an_existing_file_in_its_head(tmp_path):
    path = tmp_path / "x.log"
    path.write_bytes(b"a" * 800)                 # a first worker's output for this group
    log = CappedLog(path, 1000)
    log.write(b"b" * 2000)
    log.close()
    out = path.read_bytes()
    assert out.startswith(b"a" * 800) and out.endswith(b"b" * 500) and b"[... 1500 bytes cut" in out

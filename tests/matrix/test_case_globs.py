"""A `cases:` glob says what it took and what it left out: every top-level function it can call
without arguments is a case whatever its body (`return _kv(3)` included), one that returns no
case is a recorded failure naming it, and `plan` lists what was left out with the reason."""
from __future__ import annotations

import textwrap

import pytest

from harness.cli import main
from harness.matrix.config import load_matrix

# Ten case functions, two of which return what a helper builds: a glob used to plan 8 of them
# (only bodies with a literal tuple counted) and say nothing of the other two.
CASES = textwrap.dedent('''
    import torch


    def _kv(n):
        layer = torch.nn.Linear(n, 2)
        return layer, (torch.randn(2, n),)
''') + "".join(f"\n\ndef case_{i}():\n    return torch.nn.Linear({i + 1}, 2), (torch.randn(2, {i + 1}),)\n"
               for i in range(8)) + textwrap.dedent('''

    def cache_3():
        return _kv(3)


    def cache_8():
        return _kv(8)


    def helper(x, *, scale):
        return x


    async def fetch():
        return 1
''')

MATRIX = 'torch: ["2.13.0"]\nexporters: [dynamo]\nopsets: [18]\ncases: ["cases.py:*"]\n'


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "cases.py").write_text(CASES)
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    return tmp_path


def test_a_glob_takes_every_function_it_can_call_whatever_its_body(repo):
    labels = [c.label for c in load_matrix(repo / "matrix.yaml").cases]
    assert labels == [f"case_{i}" for i in range(8)] + ["cache_3", "cache_8"]


def test_a_glob_says_what_it_left_out_and_why(repo):
    from harness.matrix.config import expand_glob

    found = expand_glob("cases.py:*", "cases[0]", repo)
    assert len(found.took) == 10
    left = dict(found.left)
    assert set(left) == {"cases.py:_kv", "cases.py:helper", "cases.py:fetch"}
    assert "private" in left["cases.py:_kv"] and "needs arguments (x, scale)" in left["cases.py:helper"]
    assert "async" in left["cases.py:fetch"]
    assert [t.rsplit(":", 1)[1] for t in expand_glob("cases.py:_*", "cases[0]", repo).took] == []  # _kv needs n
    assert not expand_glob("cases.py:cache_*", "cases[0]", repo).left


def test_plan_lists_what_a_glob_took_and_left_out(repo, capsys):
    rc = main(["plan", "--config", str(repo / "matrix.yaml")])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0].startswith("cases[0] cases.py:*: took 10 case function(s): case_0, ") and "cache_3, cache_8" in out[0]
    assert "  left out cases.py:_kv: private, its name starts with _ (a glob starting with _ takes it)" in out
    assert "  left out cases.py:helper: needs arguments (x, scale); a case is called with none" in out
    assert out[-1] == "10 cells in 1 environments"


def test_a_glob_that_takes_nothing_says_what_it_left_out(tmp_path):
    from harness.matrix.rules import ConfigError

    (tmp_path / "cases.py").write_text("def build(size):\n    return size\n")
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    with pytest.raises(ConfigError, match=r"key 'cases\[0\]'.*matches none it can take: cases.py:build: needs arguments"):
        load_matrix(tmp_path / "matrix.yaml")


def test_a_taken_function_that_returns_no_case_is_a_failure_naming_it(tmp_path):
    """What the worker records for such a function (at the reference stage): which function
    returned what instead of a case."""
    from harness.worker.cases import build_case

    (tmp_path / "cases.py").write_text(CASES + "\n\ndef loader():\n    return torch.nn.Linear(1, 1)\n")
    with pytest.raises(TypeError, match=rf"case 'loader' must return .* got Linear \(the function {tmp_path}/cases.py:loader\)"):
        build_case("loader", f"{tmp_path}/cases.py:loader")
    assert build_case("cache_3", f"{tmp_path}/cases.py:cache_3").inputs[0].shape == (2, 3)

"""The plan-scaling benchmark measures what it says (times are reported by `nox -s bench`, never
asserted here), and a matrix of thousands of cases is checked whole: every repeated name found."""
from __future__ import annotations

import pytest

from harness.bench.suite import bench_plan_scaling
from harness.matrix.config import ConfigError, load_matrix


def test_plan_scaling_plans_every_entry():
    out = bench_plan_scaling((200, 400))
    assert out["200"]["cells"] == 200 and out["400"]["cells"] == 400
    assert out["growth"]["entries_x"] == 2.0
    assert all(out[n]["total_s"] >= out[n]["load_s"] for n in ("200", "400"))


def test_repeated_names_among_thousands_are_all_found(tmp_path):
    (tmp_path / "cases.py").write_text("def model():\n    return None\n")
    names = [f"c{i}" for i in range(5000)] + [f"c{i}" for i in range(0, 5000, 100)]   # 50 repeated
    (tmp_path / "m.yaml").write_text("torch: ['2.13.0']\nexporters: [torchscript]\nopsets: [17]\ncases:\n"
                                     + "".join(f"  - {{target: cases.py:model, name: {n}}}\n" for n in names))
    with pytest.raises(ConfigError) as err:
        load_matrix(tmp_path / "m.yaml")
    text = str(err.value)
    assert "key 'cases': case names must be unique; repeated: ['c0', 'c100', 'c1000'" in text
    assert "and 30 more" in text

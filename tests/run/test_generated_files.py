"""Generated files are safe to open and to run: a bundle's repro.py holds no text from paths, names
or errors outside string literals built by repr (and compiles whatever the bytes), ISSUE.md keeps
foreign text in code blocks no backtick run can close and the case name escaped in its title, and
matrix.html holds no raw control character."""
from __future__ import annotations

import io
import tokenize
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.core.cell import CellKey, ExportOptions
from harness.core.record import Blame, Record
from harness.core.status import Status

# A folder name that is code once a newline ends the comment it used to be written in.
EVIL_DIR = "models\nimport os; os.system('touch PWNED_DIR')\n#"
EVIL_ERROR = ("RuntimeError: boom\x00 at C:\\Users\\x\\model.py \"\"\" ''' \\\n"
              "import os; os.system('touch PWNED_ERR') ``` </pre><script>alert(1)</script>")
CASE = "import torch\n\n\ndef tiny():\n    return torch.nn.Linear(4, 2), (torch.randn(2, 4),)\n"


def _record(case: str = "tiny", error: str = EVIL_ERROR, blame: Blame | None = None) -> Record:
    key = CellKey(case, "dynamo", 18, "ort-cpu")
    return Record.for_cell("run", key, "2.13.0", "env", Status.FAIL, stage="export", error=error, blame=blame)


def _ctx(tmp_path: Path):
    from harness.worker.cases import build_case

    folder = tmp_path / EVIL_DIR
    folder.mkdir()
    (folder / "cases.py").write_text(CASE)
    ref = f"{folder}/cases.py:tiny"
    spec = build_case("tiny", ref)
    group = SimpleNamespace(exporter="dynamo", opset=18, options=ExportOptions(), case_ref=ref, cells=[], case="tiny")
    return SimpleNamespace(spec=spec, group=group, job=SimpleNamespace(base_dir=str(tmp_path), threads=1),
                           output_paths=[(0,)], shapes=[spec.example], feeds=[spec.example.feeds()])


def _code_tokens(source: str) -> list[str]:
    """Every token of the script that is not a string literal or a comment."""
    return [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type not in (tokenize.STRING, tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE)]


def test_repro_py_holds_foreign_text_only_in_repr_literals(tmp_path):
    pytest.importorskip("torch")
    from harness.worker.diagnose.repro import repro_script

    rec = _record()
    source = repro_script(_ctx(tmp_path), None, rec)
    compile(source, "repro.py", "exec")
    code = " ".join(_code_tokens(source))
    assert "PWNED" not in code and "os.system" not in code and "alert" not in code
    # The docstring is the script's own text; the run's text is in CELL/ERROR/ORIGINAL_CASE_FILE.
    docstring = source.split('"""')[1]
    assert "boom" not in docstring and "PWNED" not in docstring
    namespace: dict = {}
    exec(compile("\n".join(ln for ln in source.splitlines() if ln.startswith(("ERROR =", "ORIGINAL_CASE_FILE ="))),
                 "x", "exec"), namespace)
    assert namespace["ERROR"] == EVIL_ERROR and namespace["ORIGINAL_CASE_FILE"].endswith(f"{EVIL_DIR}/cases.py")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e-4, 3, None, "a\x00b", "C:\\Users\\x", "\udcff"])
def test_literals_compile_back_to_the_value(value):
    import math

    from harness.worker.diagnose.repro import _literal

    back = eval(compile(_literal(value), "x", "eval"), {})
    if isinstance(value, float) and math.isnan(value):
        assert math.isnan(back)
    elif value == "\udcff":
        assert back == "\\xff"       # a lone surrogate is written as its escape (safe_text)
    else:
        assert back == value


def test_issue_md_keeps_foreign_text_in_code_blocks_and_escapes_the_title():
    from harness.worker.diagnose.repro import issue_text

    blame = Blame("exporter", "reason <img src=x onerror=alert(1)>", "pytorch/pytorch",
                  source="m.py:3: x = `a` ```` b", evidence=[{"rung": "<b>r</b>", "outcome": "x|y", "detail": "<i>"}])
    rec = _record(case="tiny<script>alert(1)</script>", blame=blame)
    text = issue_text(rec, "note <b>raw</b>", [])
    title = text.splitlines()[0]
    assert title.startswith("# ") and "<script>" not in title and "&lt;script&gt;" in title
    assert "\x00" not in text and "\\x00" in text
    # No raw HTML outside code blocks; each block's fence outlasts every backtick run inside it.
    inside, fence, outside, fences = False, "", [], []
    for line in text.splitlines():
        if inside:
            if line == fence:
                inside = False
            else:
                assert fence not in line, (fence, line)
        elif line.startswith("```"):
            inside, fence = True, line[: len(line) - len(line.lstrip("`"))]
            fences.append(fence)
        else:
            outside.append(line)
    assert not inside
    assert not any("<" in line for line in outside), [line for line in outside if "<" in line]
    assert "</pre><script>alert(1)</script>" in text          # kept, verbatim, in the error's block
    assert "`````" in fences                                  # the source line holds a run of 4


def test_matrix_html_holds_no_raw_control_characters(tmp_path):
    import re

    from harness.core.run import RunMeta
    from harness.report.html import render_run_html

    records = [_record(case="nul\x00case", error="bad\x00byte \x1b[31m escape \x07 bell")]
    html = render_run_html(tmp_path, records, RunMeta(run_id="r", started=1.0, finished=True))
    assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", html)
    assert "nul\\x00case" in html

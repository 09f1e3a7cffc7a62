"""A pipeline step that fuses fewer operators after a bump is a regression the gate blocks on; its
graph drift shows the fusion counts. (The same with real fusion counts of a real run:
tests/run/test_pipelines_e2e.py.)"""
from __future__ import annotations

from harness.core.cell import CellKey, ExportOptions
from harness.core.record import Record
from harness.core.status import Status
from harness.gate.compare import Settings, Verdict, compare_sides
from harness.gate.output import render_markdown
from harness.gate.sources import Side
from harness.run.annotate import Annotator

KEY = CellKey("encoder", "torchscript", 18, "ort-cpu", ExportOptions(pipeline="fused"))
RAW = CellKey("encoder", "torchscript", 18, "ort-cpu")


def graph(attention: int) -> dict:
    fused = {"Attention": attention, "SkipLayerNormalization": 4, "Gelu": 0}
    return {"opset": 18, "nodes": 30, "ops": {"MatMul": 4}, "bytes": 1000,
            "io": {"inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["b", "s"]}],
                   "outputs": [{"name": "logits", "dtype": "float", "shape": ["b", 10]}]},
            "pipeline": {"name": "fused", "steps": [{"step": "ort-fusion", "status": "pass", "fused": fused}]}}


def side(torch: str, attention: int) -> Side:
    recs = [Record.for_cell(torch, KEY, torch, "env", Status.PASS, graph=graph(attention)),
            Record.for_cell(torch, RAW, torch, "env", Status.PASS, graph={})]
    return Side(torch, torch, recs, [torch])


def test_a_lost_fusion_blocks_and_shows_as_drift():
    base, cand = side("2.12.0", 2), side("2.13.0", 0)
    cells = {c.key: c for c in compare_sides(base, cand, Annotator([]), Settings())}
    lost = cells[KEY]
    assert lost.verdict is Verdict.FUSION_LOST and lost.verdict.blocking
    assert lost.detail == "fewer fused operators: ort-fusion: Attention 2 → 0"
    assert lost.drift.fusions == {"ort-fusion: Attention": (2, 0)}
    assert "fused ort-fusion: Attention 2→0" in lost.drift.summary()
    assert cells[RAW].verdict is Verdict.UNCHANGED
    md = render_markdown(base, cand, list(cells.values()), Settings())
    assert "Fusions lost (pipeline steps)" in md and "Attention 2 → 0" in md


def test_more_fusions_or_the_same_do_not_block():
    for after in (2, 3):
        cells = compare_sides(side("2.12.0", 2), side("2.13.0", after), Annotator([]), Settings())
        assert all(c.verdict is Verdict.UNCHANGED for c in cells), [(c.key.name, c.verdict) for c in cells]

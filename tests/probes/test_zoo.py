"""The model zoo at plan time: group expansion from the checked-in case list, the shipped zoo
matrix, config shrinking, companion pins. No torch, transformers or Optimum is needed here."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import ROOT

from harness.core.cell import CaseRef
from harness.matrix.config import ConfigError, load_matrix, shipped_matrix
from harness.matrix.plan import build_plan
from harness.probes import zoo
from harness.probes.zoo import shrink

BASE = """
torch: ["2.13.0"]
exporters: [dynamo, optimum]
opsets: [18]
runtimes: [ort-cpu]
cases: {cases}
"""


def matrix(tmp_path: Path, cases: str):
    path = tmp_path / "matrix.yaml"
    path.write_text(BASE.format(cases=cases))
    return load_matrix(path)


def entries() -> dict:
    return json.loads(zoo.TRANSFORMERS_JSON.read_text())["architectures"]


def test_transformers_group_is_one_case_per_model_type_in_the_list(tmp_path):
    m = matrix(tmp_path, "[transformers]")
    assert [c.label for c in m.cases] == [f"hf-{t}" for t in entries()]
    assert len(m.cases) >= 140
    for case in m.cases:
        ref = CaseRef.parse(case.target)
        assert ref.target == "harness.probes.zoo.hf"
        assert zoo.parse_case_function(ref.function) == (case.label.removeprefix("hf-"), None)


def test_model_types_and_task_filter(tmp_path):
    m = matrix(tmp_path, '["transformers:bert,gpt2", "transformers:task=fill-mask"]')
    labels = [c.label for c in m.cases]
    fill = [t for t, e in entries().items() if "fill-mask" in e["tasks"]]
    assert labels[:2] == ["hf-bert", "hf-gpt2"]
    # bert is built for fill-mask as a case of its own; perceiver's default task is fill-mask.
    assert "hf-bert[fill-mask]" in labels and "hf-perceiver" in labels
    assert len(labels) == 2 + len(fill)
    ref = CaseRef.parse(m.cases[labels.index("hf-bert[fill-mask]")].target)
    assert zoo.parse_case_function(ref.function) == ("bert", "fill-mask")


def test_overlapping_groups_do_not_repeat_a_case(tmp_path):
    m = matrix(tmp_path, '["transformers:bert", transformers]')
    labels = [c.label for c in m.cases]
    assert labels.count("hf-bert") == 1 and len(labels) == len(entries())


@pytest.mark.parametrize("token, expected", [
    ("transformers:bertt", "unknown model type 'bertt'; did you mean bert"),
    ("transformers:task=fill_mask", "unknown task 'fill_mask'; did you mean fill-mask"),
    ("timm:resnt", "unknown timm family 'resnt'; did you mean resnet"),
])
def test_unknown_selection_names_file_key_and_expectation(tmp_path, token, expected):
    with pytest.raises(ConfigError) as err:
        matrix(tmp_path, f'["{token}"]')
    text = str(err.value)
    assert text.startswith(f"{tmp_path / 'matrix.yaml'}: key 'cases'") and expected in text


def test_vision_groups_cover_ten_families(tmp_path):
    m = matrix(tmp_path, "[timm, torchvision]")
    labels = [c.label for c in m.cases]
    assert len(labels) == len(zoo.TIMM_FAMILIES) + len(zoo.TORCHVISION_FAMILIES)
    families = {label.split("-", 1)[1] for label in labels}
    assert len(families) >= 10
    assert {"resnet", "efficientnet", "mobilenetv3", "convnext", "regnet", "vit", "swin"} <= families
    assert {"deit", "levit", "mixer"} <= set(zoo.TIMM_FAMILIES)
    assert CaseRef.parse(m.cases[0].target).target == "harness.probes.zoo.vision"


def test_every_architecture_is_built_or_says_why_not():
    data = entries()
    built = {t: e for t, e in data.items() if not e.get("unbuildable")}
    assert len(built) >= 120
    for model_type, e in data.items():
        assert e["task"] in e["tasks"], model_type
        assert isinstance(e.get("atol"), float) and e["atol"] > 0, model_type
        if e.get("unbuildable"):
            assert len(e["unbuildable"]) > 30, model_type          # a reason, not a bare flag
        else:
            assert e["inputs"] and e["outputs"] and "batch_size" in str(e["inputs"]) or e["dynamic"] is not None
            assert e["parameters"] < 3_000_000, model_type   # tiny: the zoo must run in minutes
            assert set(e["dynamic"]) <= {a for i in e["inputs"].values() for a in i["axes"].values()}
    # Function names are unique across architectures and tasks (the case reference syntax).
    names = [zoo.case_function(t, task) for t, e in data.items() for task in [None, *e["tasks"]]]
    assert len(names) == len(set(names))


def test_plan_time_imports_no_torch_transformers_or_optimum():
    code = ("import sys; from harness.matrix.config import load_matrix; from harness.matrix.plan "
            "import build_plan; p = build_plan(load_matrix('zoo')); print(len(p.cells)); "
            "print(sorted(m for m in ('torch', 'transformers', 'optimum', 'timm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    count, imported = out.stdout.split("\n")[:2]
    assert int(count) > 1000 and imported == "[]"


def test_config_zoo_selects_the_shipped_matrix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert shipped_matrix("zoo") == ROOT / "harness" / "matrices" / "zoo.yaml"
    assert shipped_matrix("zoo.yaml") == Path("zoo.yaml")           # a file name is never replaced
    (tmp_path / "zoo").write_text(BASE.format(cases="[mha]"))
    assert shipped_matrix("zoo") == Path("zoo")                     # an existing file wins
    with pytest.raises(ConfigError, match="file not found"):
        load_matrix("nozoo")


def test_shipped_zoo_matrix_plan():
    m = load_matrix("zoo")
    assert [t.version for t in m.torch] == ["2.6.0", "2.9.1", "2.13.0"]
    assert m.exporters == ["torchscript", "dynamo", "optimum"]
    assert {r.label for r in m.runtimes} == {"ort-cpu", "openvino"}
    plan = build_plan(m, {"torch": ["2.13.0"], "exporter": ["dynamo"], "opset": ["18"], "runtime": ["ort-cpu"]})
    assert len(plan.cells) == len(m.cases) >= 140 + 10
    opsets = {(c.torch, c.key.exporter): set() for c in build_plan(m).cells}
    for c in build_plan(m).cells:
        opsets[(c.torch, c.key.exporter)].add(c.key.opset)
    assert opsets[("2.6.0", "dynamo")] == {18, 20} and opsets[("2.13.0", "dynamo")] == {18, 23}
    assert opsets[("2.13.0", "torchscript")] == {18}   # the TorchScript exporter stops at 20
    # The +cpu 2.13.0 entry carries no torchvision (it cannot import there); the PyPI ones do.
    extras = {t.version: t.extras for t in m.torch}
    assert not any("torchvision" in x or "timm" in x for x in extras["2.13.0"])
    assert any(x.startswith("torchvision==0.21.0") for x in extras["2.6.0"])


def test_zoo_matrix_extras_are_the_companion_pins():
    pytest.importorskip("torch")   # harness.probes.real builds its cases with torch
    from harness.probes.real import companion_extras

    extras = {t.version: t.extras for t in load_matrix("zoo").torch}
    assert sorted(extras["2.6.0"]) == sorted(companion_extras("2.6.0", zoo=True))
    assert sorted(extras["2.9.1"]) == sorted(companion_extras("2.9.1", zoo=True))
    assert sorted(extras["2.13.0"]) == sorted(companion_extras("2.13.0", zoo=True, vision=False))
    assert companion_extras("2.14.1") == ["torchvision==0.29.1", "transformers==4.57.6"]


# --- shrink: plain objects stand in for transformers configs (same attribute protocol) ---

class FakeConfig(SimpleNamespace):
    model_type = "fake"

    def to_dict(self):
        return dict(vars(self))


class GPT2Like(FakeConfig):
    attribute_map = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer"}


class Normalized:
    """Optimum's NormalizedConfig protocol: class attributes name the config's attributes."""

    NUM_LAYERS = "n_layer"
    HIDDEN_SIZE = "n_embd"
    NUM_ATTENTION_HEADS = "n_head"
    VOCAB_SIZE = "vocab_size"

    def __init__(self, config):
        self.config = config


def test_shrink_uses_normalized_names_then_the_table():
    cfg = GPT2Like(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_inner=3072,
                   n_positions=1024, bos_token_id=50256, eos_token_id=50256, head_dim=64,
                   use_cache=True)
    over = shrink.shrink(cfg, Normalized)
    assert over["n_layer"] == shrink.LAYERS and over["n_embd"] == shrink.HIDDEN
    assert over["n_head"] == shrink.HEADS and over["vocab_size"] == shrink.VOCAB
    assert over["n_inner"] == shrink.FFN and over["n_positions"] == shrink.MAX_POSITIONS
    assert over["head_dim"] == shrink.HIDDEN // shrink.HEADS
    # Token ids are moved inside the smaller vocabulary, each to its own id.
    assert over["bos_token_id"] < shrink.VOCAB and over["eos_token_id"] < shrink.VOCAB
    assert over["bos_token_id"] != over["eos_token_id"]
    assert "use_cache" not in over                       # booleans are never sizes
    shrink.apply(cfg, over)
    assert (cfg.n_layer, cfg.n_embd, cfg.vocab_size) == (shrink.LAYERS, shrink.HIDDEN, shrink.VOCAB)


def test_shrink_reaches_sub_configs_and_stage_lists():
    vision = FakeConfig(hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3], num_heads=[3, 6, 12, 24],
                        image_size=224, hidden_size=768)
    cfg = FakeConfig(text_config=FakeConfig(num_hidden_layers=24, hidden_size=1024, vocab_size=32000,
                                            num_key_value_heads=None),
                     vision_config=vision)
    over = shrink.shrink(cfg)
    assert over["text_config.num_hidden_layers"] == shrink.LAYERS
    assert over["text_config.num_key_value_heads"] == shrink.KV_HEADS   # None means "all": made explicit
    assert over["vision_config.depths"] == [1, 1, 1, 1]
    assert over["vision_config.hidden_sizes"] == [16, 32, 64, 64]
    assert over["vision_config.num_heads"] == [1, 1, 1, 1]
    assert over["vision_config.image_size"] == shrink.IMAGE
    shrink.apply(cfg, over)
    assert cfg.vision_config.depths == [1, 1, 1, 1] and cfg.text_config.hidden_size == shrink.HIDDEN


def test_shrink_leaves_small_values_alone():
    cfg = FakeConfig(num_hidden_layers=1, hidden_size=16, vocab_size=33)
    assert shrink.shrink(cfg) == {}

"""Structured inputs: flattening, names, dynamic dims by index / path / structure, second shapes,
output flattening, and dynamic_shapes that torch.export itself accepts (torch of this venv)."""
from __future__ import annotations

import collections
import dataclasses

import pytest

torch = pytest.importorskip("torch")

from harness.worker.cases import as_inputs, parse_result  # noqa: E402 - after the torch importorskip
from harness.worker.inputs import CaseInputs, InputsError, dims_by_name, resolve_dims  # noqa: E402 - after the torch importorskip
from harness.worker.outputs import output_leaves, output_names  # noqa: E402 - after the torch importorskip
from harness.worker.parity import second_shape_inputs  # noqa: E402 - after the torch importorskip


class LM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(20, 4)
        self.rnn = torch.nn.LSTM(4, 4)

    def forward(self, tokens, hidden):
        out, (h, c) = self.rnn(self.emb(tokens), hidden)
        return out, (h, c)


class Keywords(torch.nn.Module):
    def forward(self, input_ids, attention_mask=None, token_type_ids=None, extras=None):
        h = input_ids.float() * attention_mask
        return {"h": h, "pair": (h.sum(-1), extras["scale"][0] * 2)}


class VarArgs(torch.nn.Module):
    def forward(self, *xs):
        return sum(xs)


def lm_inputs():
    tokens = torch.randint(0, 20, (5, 2))
    return CaseInputs((tokens, (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))), {}, model=LM())


def kw_inputs():
    ids = torch.randint(0, 9, (2, 6))
    mask = torch.ones(2, 6)
    extras = {"scale": [torch.ones(2)]}
    # given out of signature order: leaves follow forward's order, as the exporters do
    return CaseInputs((), {"extras": extras, "attention_mask": mask, "input_ids": ids}, model=Keywords())


def test_leaves_names_and_paths_follow_the_structure():
    inputs = lm_inputs()
    assert inputs.input_names() == ["input_0", "input_1_0", "input_1_1"]
    assert inputs.paths() == ["tokens", "hidden.0", "hidden.1"]
    assert list(inputs.feeds()) == inputs.input_names()
    kw = kw_inputs()
    assert kw.input_names() == ["input_ids", "attention_mask", "extras_scale_0"]
    assert list(kw.kwargs) == ["input_ids", "attention_mask", "extras"]


def test_names_are_valid_and_unique():
    inputs = CaseInputs((), {"a": {"x-y": torch.zeros(1), "x_y": torch.zeros(1)}}, model=None)
    names = inputs.input_names()
    assert names == ["a_x_y", "a_x_y_2"]
    nt = collections.namedtuple("State", "h c")
    inputs = CaseInputs((nt(torch.zeros(1), torch.zeros(1)),), {}, model=None)
    assert inputs.input_names() == ["input_0_h", "input_0_c"]


@pytest.mark.parametrize("dims", [
    {0: {0: "seq", 1: "batch"}, "hidden.0": {1: "batch"}, "1.1": {1: "batch"}},        # index + paths
    {"tokens": {0: "seq", 1: "batch"}, "hidden": ({1: "batch"}, {1: "batch"})},         # path + structure
    ({0: "seq", 1: "batch"}, ({1: "batch"}, {-2: "batch"})),                            # the structure
])
def test_three_forms_of_dynamic_dims_resolve_alike(dims):
    inputs = lm_inputs()
    assert dims_by_name(resolve_dims(dims, inputs), inputs) == {
        "input_0": {0: "seq", 1: "batch"}, "input_1_0": {1: "batch"}, "input_1_1": {1: "batch"}}


def test_keyword_dims_by_name_and_nested_path():
    kw = kw_inputs()
    dims = {"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"}, "extras.scale.0": {0: "b"}}
    assert dims_by_name(resolve_dims(dims, kw), kw)["extras_scale_0"] == {0: "b"}


@pytest.mark.parametrize("dims,message", [
    ({1: {1: "batch"}}, "address its tensors by path"),
    ({"hidden.2": {1: "b"}}, "no entry '2'"),
    ({"nope": {0: "b"}}, "no input named 'nope'"),
    ({0: {2: "b"}}, "out of range"),
    ({5: {0: "b"}}, "out of range"),
    (({0: "b"},), "one per positional input"),
    ({"hidden": {0: "b"}}, "address its tensors by path"),
])
def test_dims_that_do_not_fit_say_why(dims, message):
    with pytest.raises(InputsError, match=message):
        resolve_dims(dims, lm_inputs())


def test_case_return_forms():
    m = torch.nn.Identity()
    x = torch.zeros(2)
    _, ex, dims, second = parse_result("c", (m, x))
    assert ex.args == (x,) and not ex.kwargs and dims is None and second is None
    _, ex, dims, _ = parse_result("c", (m, {"input_ids": x}, {"input_ids": {0: "b"}}))
    assert ex.args == () and list(ex.kwargs) == ["input_ids"] and dims == {"input_ids": {0: "b"}}
    _, ex, dims, second = parse_result("c", (m, (x,), {"scale": x}, {0: {0: "b"}}, (x,)))
    assert list(ex.kwargs) == ["scale"] and dims == {0: {0: "b"}} and second == (x,)
    _, ex, dims, second = parse_result("c", (m, (x,), {0: {0: "b"}}, (x,)))
    assert not ex.kwargs and dims == {0: {0: "b"}} and second == (x,)
    _, ex, dims, _ = parse_result("c", (m, (x,), {}, {0: {0: "b"}}))
    assert not ex.kwargs and dims == {0: {0: "b"}}
    with pytest.raises(TypeError, match="must return"):
        parse_result("c", (m,))


def test_second_inputs_must_have_the_example_structure():
    inputs = lm_inputs()
    ok = as_inputs((torch.zeros(7, 3, dtype=torch.int64), (torch.zeros(1, 3, 4), torch.zeros(1, 3, 4))),
                   inputs, LM())
    assert [list(v.shape) for v in ok.feeds().values()] == [[7, 3], [1, 3, 4], [1, 3, 4]]
    with pytest.raises(InputsError, match="another structure"):
        as_inputs((torch.zeros(7, 3), torch.zeros(1, 3, 4)), inputs, LM())


# -- second shapes -------------------------------------------------------------------------------
def test_second_shape_keeps_sorted_lengths_sorted_and_rows_aligned():
    x = torch.arange(3.0).reshape(3, 1, 1).expand(3, 5, 2).contiguous()
    lengths = torch.tensor([5, 4, 2])
    inputs = CaseInputs((x, lengths), {}, params=["x", "lengths"])
    dims = resolve_dims({0: {0: "batch", 1: "seq"}, 1: {0: "batch"}}, inputs)
    grown = second_shape_inputs(inputs, dims)
    gx, gl = grown.args
    assert gx.shape[:2] == (4, 6) and gl.shape == (4,)
    # a batch padded to its longest sequence stays so; lengths stay sorted
    assert gl.tolist() == [6, 6, 4, 2]
    # row i of x still belongs to lengths[i] (noise aside, rows are the original rows in order)
    assert gx[:, 0, 0].round().tolist() == [0.0, 0.0, 1.0, 2.0]


def test_second_shape_keeps_masks_padded_at_the_end_and_positions_counting():
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    positions = torch.arange(5).unsqueeze(0)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    dims = {k: {0: "b", 1: "s"} for k in range(3)}
    m, p, i = second_shape_inputs((mask, positions, ids), dims)
    assert m.tolist() == [[1, 1, 1, 1, 0, 0]] * 3
    assert p.tolist() == [[0, 1, 2, 3, 4, 5]] * 3
    assert set(i.flatten().tolist()) <= {5, 6, 7, 8, 9}


def test_second_shape_of_keyword_inputs_keeps_the_structure():
    kw = kw_inputs()
    dims = resolve_dims({"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"},
                         "extras.scale.0": {0: "b"}}, kw)
    grown = second_shape_inputs(kw, dims)
    assert {n: list(v.shape) for n, v in grown.feeds().items()} == {
        "input_ids": [3, 7], "attention_mask": [3, 7], "extras_scale_0": [3]}
    assert Keywords()(**grown.kwargs)["h"].shape == (3, 7)


# -- outputs -------------------------------------------------------------------------------------
@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    hidden: tuple


def test_output_leaves_and_names_follow_the_structure():
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    nested = {"logits": a, "aux": {"pair": (b, c), "none": None}}
    assert [p for p, _ in output_leaves(nested)] == [("logits",), ("aux", "pair", 0), ("aux", "pair", 1)]
    assert output_names([p for p, _ in output_leaves(nested)]) == [
        "output_logits", "output_aux_pair_0", "output_aux_pair_1"]
    assert output_names([p for p, _ in output_leaves(a)]) == ["output_0"]
    assert output_names([p for p, _ in output_leaves((a, (b, c)))]) == ["output_0", "output_1_0", "output_1_1"]
    leaves = output_leaves(Out(a, (b, None, c)))
    assert [p for p, _ in leaves] == [("logits",), ("hidden", 0), ("hidden", 2)]
    assert [float(v[0]) for _, v in leaves] == [0.0, 1.0, 2.0]


# -- dynamic_shapes as torch.export reads them ---------------------------------------------------
def _export(model, inputs: CaseInputs, dims):
    from harness.worker.export import DIM_DYNAMIC, dynamic_shapes

    shapes = dynamic_shapes(inputs, resolve_dims(dims, inputs), DIM_DYNAMIC, model)
    return shapes, torch.export.export(model, inputs.args, inputs.kwargs, dynamic_shapes=shapes)


def test_dynamic_shapes_for_a_tuple_argument_are_accepted_by_torch_export():
    model = LM().eval()
    # (torch.export specialises an LSTM's sequence length: only the batch is dynamic here)
    shapes, ep = _export(model, lm_inputs(), {"tokens": {1: "batch"}, "hidden.0": {1: "batch"},
                                              "hidden.1": {1: "batch"}})
    assert isinstance(shapes[1], tuple) and len(shapes[1]) == 2 and shapes[1][0] is not None
    user_inputs = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs]
    assert len(user_inputs) == 3
    assert all(not isinstance(n.meta["val"].shape[1], int) for n in user_inputs), "batch stays symbolic"


def test_dynamic_shapes_for_keyword_inputs_follow_the_signature():
    model = Keywords().eval()
    shapes, ep = _export(model, kw_inputs(), {"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"},
                                              "extras.scale.0": {0: "b"}})
    assert len(shapes) == 3 and isinstance(shapes[2], dict) and isinstance(shapes[2]["scale"], list)
    assert ep is not None


def test_dynamic_shapes_for_a_var_positional_forward_are_one_tuple():
    x = torch.zeros(2, 3)
    inputs = CaseInputs((x, x.clone()), {}, model=VarArgs())
    shapes, _ = _export(VarArgs(), inputs, {0: {0: "b"}, 1: {0: "b"}})
    assert len(shapes) == 1 and isinstance(shapes[0], tuple) and len(shapes[0]) == 2


def test_dim_marking_follows_each_release():
    from harness.worker.export import DIM_AUTO, DIM_DYNAMIC, DIM_NAMED, dim_marking

    assert dim_marking("2.6.0") == dim_marking("2.6.0+cu124") == DIM_NAMED
    assert dim_marking("2.5.1") == DIM_NAMED
    assert dim_marking("2.7.1") == DIM_AUTO
    assert dim_marking("2.8.0") == dim_marking("2.13.0") == dim_marking("2.10.0.dev20251201") == DIM_DYNAMIC

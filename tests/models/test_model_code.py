"""Loading a model never runs code from the file: models made the way a user (or an attacker) makes them, with
torch.jit.script, torch.export, torch.library and onnx.helper, whose code would write files, print or call custom
operators, are refused naming the operator before anything runs; each attack is shown real by torch itself."""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from typing import Tuple  # noqa: UP035 - TorchScript reads the annotations of __getstate__

import numpy as np
import onnx
import pytest
import torch
from conftest import assert_one_error_line, write_inputs
from model_builders import read_member, rewrite_zip
from onnx import TensorProto, helper, numpy_helper
from torch.export import Dim

from tempcal.errors import TempcalError
from tempcal.models import export, onnx_graph, torchscript
from tempcal.models.base import schema_refusal

pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")
MODEL_JSON = "models/model.json"


@pytest.fixture
def inputs(tmp_path) -> Path:
    g = torch.Generator().manual_seed(0)
    return write_inputs(tmp_path / "inputs.safetensors", torch.randn(64, 6, generator=g),
                        torch.randint(0, 4, (64,), generator=g))


def _quiet_jit_save(module: torch.nn.Module, path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(module.eval()), str(path))
    return path


def _fit(cli, model: Path, inputs: Path) -> str:
    code, out, err = cli(["fit", str(model), "--inputs", str(inputs), "--no-write"])
    assert code == 2 and not out
    return assert_one_error_line(err)


# -- TorchScript -----------------------------------------------------------------------------------------------------


class Saves(torch.nn.Module):
    """``torch.save`` inside ``forward``: writes a file of the model's choosing whenever it runs."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)
        self.marker = marker

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.save(x, self.marker)
        return self.fc(x)


class Prints(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print("logits coming")
        return self.fc(x)


class RestoresItself(torch.nn.Module):
    """A ``__setstate__`` that writes a file: torch.jit.load runs it while loading."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 6))
        self.marker = marker

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t()

    @torch.jit.export
    def __getstate__(self) -> Tuple[torch.Tensor, str, bool]:  # noqa: UP006
        return self.weight, self.marker, self.training

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, str, bool]) -> None:  # noqa: UP006
        torch.save(state[0], state[1])
        self.weight = state[0]
        self.marker = state[1]
        self.training = state[2]


def test_torch_save_in_forward_is_refused_and_never_runs(tmp_path, inputs, cli):
    marker = tmp_path / "written-by-the-model"
    path = _quiet_jit_save(Saves(str(marker)), tmp_path / "m.ts")
    with warnings.catch_warnings():  # the attack is real: torch runs it
        warnings.simplefilter("ignore")
        torch.jit.load(str(path))(torch.randn(2, 6))
    assert marker.exists()
    marker.unlink()
    line = _fit(cli, path, inputs)
    assert "aten::save" in line and "reads or writes a file" in line and "Saves.forward" in line
    assert not marker.exists()


def test_print_in_forward_and_in_a_hook_are_refused(tmp_path, inputs, cli, capsys):
    assert "prim::Print" in _fit(cli, _quiet_jit_save(Prints(), tmp_path / "p.ts"), inputs)

    def hook(module: torch.nn.Module, args: Tuple[torch.Tensor]) -> None:  # noqa: UP006
        print("hooked")

    model = torch.nn.Sequential(torch.nn.Linear(6, 4))
    model[0].register_forward_pre_hook(hook)
    line = _fit(cli, _quiet_jit_save(model, tmp_path / "h.ts"), inputs)
    assert "prim::Print" in line and ".hook" in line


def test_setstate_is_refused_before_torch_loads_the_file(tmp_path, inputs, cli):
    marker = tmp_path / "written-while-loading"
    path = _quiet_jit_save(RestoresItself(str(marker)), tmp_path / "s.ts")
    assert not marker.exists()  # saving ran __getstate__ only
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.load(str(path))
    assert marker.exists()  # the attack is real: loading ran the file's __setstate__
    marker.unlink()
    line = _fit(cli, path, inputs)
    assert "__getstate__" in line or "__setstate__" in line
    assert not marker.exists()


def test_custom_operators_are_refused_in_torchscript_and_pt2(tmp_path, inputs, cli):
    @torch.library.custom_op("tempcal_test::scale", mutates_args=())
    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    scale.register_fake(lambda x: torch.empty_like(x))

    class Custom(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(6, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.tempcal_test.scale(self.fc(x))

    scripted = _quiet_jit_save(Custom(), tmp_path / "c.ts")
    program = torch.export.export(Custom().eval(), (torch.randn(4, 6),), dynamic_shapes=({0: Dim("batch")},))
    torch.export.save(program, tmp_path / "c.pt2")
    for path in (scripted, tmp_path / "c.pt2"):
        line = _fit(cli, path, inputs)
        assert "tempcal_test::scale" in line and "not one of torch's built-in" in line


class Everyday(torch.nn.Module):
    """What real models script to: LSTM, batch norm, a transformer layer, no_grad, asserts, a dict out."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(6, 8, batch_first=True)
        self.norm = torch.nn.BatchNorm1d(8)
        self.layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        assert x.dim() == 2, "rows of features"
        with torch.no_grad():
            h, _ = self.lstm(x.unsqueeze(1))
        h = self.layer(h).squeeze(1)
        return {"logits": self.head(torch.relu(self.norm(h))), "features": h}


def test_everyday_torchscript_models_still_load_and_run(tmp_path):
    torch.manual_seed(0)
    module = Everyday().eval()
    path = _quiet_jit_save(module, tmp_path / "e.ts")
    loaded = torchscript.load(path, "cpu")
    x = torch.randn(5, 6)
    with torch.no_grad():
        assert torch.allclose(loaded.net(x)["logits"], module(x)["logits"], atol=1e-5)


def test_the_rules_follow_torch_schemas():
    """Pure computations pass whatever their overload; side effects, files and interpreter machinery do not."""
    schemas: dict[str, list] = {}
    for schema in torch._C._jit_get_all_schemas():
        schemas.setdefault(schema.name, []).append(schema)
    for name in ("aten::linear", "aten::lstm", "aten::format", "aten::warn", "aten::set_grad_enabled",
                 "prim::RaiseException", "prim::tolist", "aten::add_", "aten::einsum"):
        assert all(schema_refusal(s) is None for s in schemas[name]), name
    for name, why in (("aten::save", "file"), ("aten::from_file", "file"), ("aten::_print", "side effect"),
                      ("aten::manual_seed", "side effect"), ("prim::Print", "interpreter"),
                      ("prim::PythonOp", "interpreter"), ("prim::rpc_async", "interpreter")):
        plain = next(s for s in schemas[name] if s.overload_name == "")
        assert why in (schema_refusal(plain) or ""), name
    seeded = next(s for s in schemas["aten::manual_seed"] if s.overload_name == "generator")
    assert schema_refusal(seeded) is None  # seeding a generator object of the model's own: it writes its argument


# -- exported programs: what torch's deserializer would evaluate -----------------------------------------------------


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * 2


@pytest.fixture
def program(tmp_path) -> Path:
    torch.manual_seed(0)
    ep = torch.export.export(Small().eval(), (torch.randn(4, 6),), dynamic_shapes=({0: Dim("batch")},))
    torch.export.save(ep, tmp_path / "small.pt2")
    return tmp_path / "small.pt2"


def _edited(program: Path, target: Path, edit) -> Path:
    parsed = json.loads(read_member(program, MODEL_JSON))
    edit(parsed)
    return rewrite_zip(program, target, replace={MODEL_JSON: json.dumps(parsed).encode()})


def test_python_in_a_symbolic_size_is_refused(program, tmp_path, inputs, cli):
    """torch.export.load hands each expr_str to sympy.sympify, which evals it: a file appears."""
    marker = tmp_path / "written-by-sympify"
    payload = f"Symbol('s77', positive=True, integer=True) + 0*len(str(__import__('pathlib').Path({str(marker)!r})" \
              ".touch()))"

    def edit(parsed: dict) -> None:
        text = json.dumps(parsed)
        found = json.loads(text.replace('"expr_str": "' + _first_expr(parsed) + '"',
                                        '"expr_str": ' + json.dumps(payload), 1))
        parsed.clear()
        parsed.update(found)

    hostile = _edited(program, tmp_path / "sym.pt2", edit)
    with warnings.catch_warnings(), contextlib.suppress(Exception):
        warnings.simplefilter("ignore")
        torch.export.load(hostile)
    assert marker.exists()
    marker.unlink()
    line = _fit(cli, hostile, inputs)
    assert "symbolic size" in line and "not a size expression" in line and not marker.exists()


def _first_expr(parsed: dict) -> str:
    text = json.dumps(parsed)
    start = text.index('"expr_str": "') + len('"expr_str": "')
    return text[start:text.index('"', start)]


def test_guards_code_never_reaches_torch(program, tmp_path, inputs, cli):
    """torch execs guards_code into the module's guards when it has sample inputs; tempcal's copy has none."""
    marker = tmp_path / "written-by-a-guard"
    guard = f"__import__('pathlib').Path({str(marker)!r}).touch() is None"
    hostile = _edited(program, tmp_path / "guard.pt2", lambda parsed: parsed.update(guards_code=[guard]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.export.load(hostile).module()(torch.randn(3, 6))
    assert marker.exists()
    marker.unlink()
    loaded = export.load(hostile, "cpu")
    with torch.no_grad():
        loaded.net(torch.randn(3, 6))
    code, _, err = cli(["fit", str(hostile), "--inputs", str(inputs), "--no-write"])
    assert code == 0, err
    assert not marker.exists()


@pytest.mark.parametrize(("target", "named"), [
    ("torch.save", "torch.save"), ("torch.ops.aten.save.default", "aten::save"),
    ("torch.ops.aten.from_file.default", "aten::from_file"), ("torch.ops.aten._print.default", "aten::_print"),
    ("torch.ops.higher_order.call_torchbind", "torch.ops.higher_order.call_torchbind"),
])
def test_node_targets_outside_the_rules_are_refused(program, tmp_path, inputs, cli, target, named):
    def edit(parsed: dict) -> None:
        parsed["graph_module"]["graph"]["nodes"][-1]["target"] = target

    line = _fit(cli, _edited(program, tmp_path / "target.pt2", edit), inputs)
    assert f"calls {named} (" in line and "refused" in line


# -- ONNX ------------------------------------------------------------------------------------------------------------


def _onnx(nodes: list, path: Path, *, functions: list | None = None, domains: tuple[str, ...] = ()) -> Path:
    w = numpy_helper.from_array(np.ones((6, 4), np.float32), "W")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])], [w])
    opsets = [helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, opset_imports=opsets, functions=functions or [])
    onnx.save_model(model, path)
    return path


def test_onnx_custom_domains_are_refused_in_graphs_subgraphs_and_functions(tmp_path, inputs, cli):
    custom = helper.make_node("Mystery", ["mm"], ["logits"], domain="com.example", name="mystery")
    top = _onnx([helper.make_node("MatMul", ["x", "W"], ["mm"]), custom], tmp_path / "top.onnx",
                domains=("com.example",))
    then_graph = helper.make_graph([helper.make_node("Mystery", ["mm"], ["out"], domain="com.example")], "then", [],
                                   [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4])])
    else_graph = helper.make_graph([helper.make_node("Identity", ["mm"], ["out2"])], "else", [],
                                   [helper.make_tensor_value_info("out2", TensorProto.FLOAT, ["N", 4])])
    nested = _onnx([helper.make_node("MatMul", ["x", "W"], ["mm"]),
                    helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True), "c")),
                    helper.make_node("If", ["c"], ["logits"], then_branch=then_graph, else_branch=else_graph)],
                   tmp_path / "nested.onnx", domains=("com.example",))
    body = helper.make_function("local.fns", "Head", ["a"], ["b"],
                                [helper.make_node("Mystery", ["a"], ["b"], domain="com.example")],
                                [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    in_function = _onnx([helper.make_node("MatMul", ["x", "W"], ["mm"]),
                         helper.make_node("Head", ["mm"], ["logits"], domain="local.fns")],
                        tmp_path / "function.onnx", functions=[body], domains=("com.example", "local.fns"))
    for path, where in ((top, "the graph"), (nested, "a subgraph of node 'If'"), (in_function, "local.fns::Head")):
        line = _fit(cli, path, inputs)
        assert "'com.example'" in line and "Mystery" in line and where in line, line


def test_onnx_local_functions_of_standard_operators_run(tmp_path):
    body = helper.make_function("local.fns", "Double", ["a"], ["b"],
                                [helper.make_node("Add", ["a", "a"], ["b"])], [helper.make_opsetid("", 17)])
    path = _onnx([helper.make_node("MatMul", ["x", "W"], ["mm"]),
                  helper.make_node("Double", ["mm"], ["logits"], domain="local.fns")],
                 tmp_path / "ok.onnx", functions=[body], domains=("local.fns",))
    from tempcal.models import onnx as onnx_runtime

    loaded = onnx_runtime.load(path, "cpu")
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    np.testing.assert_allclose(loaded.net(torch.from_numpy(x)).numpy(), 2 * x @ np.ones((6, 4)), rtol=1e-5)
    assert {"", "ai.onnx", "ai.onnx.ml"} == onnx_graph.DEFAULT_DOMAINS


def test_tempcal_refusals_are_tempcal_errors(tmp_path):
    path = _quiet_jit_save(Prints(), tmp_path / "p.ts")
    with pytest.raises(TempcalError, match=r"prim::Print"):
        torchscript.load(path, "cpu")


class Derived(torch.nn.Module):
    """Sizes derived from the batch (2 * s, s % 3), torch.cond and no_grad: symbolic expressions and subgraphs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.reshape(x.shape[0] * 2, 3)
        with torch.no_grad():
            z = self.fc(y)
        z = torch.cond(z.sum() > 0, lambda a: a * 2, lambda a: a - 1, (z,))
        return z.reshape(x.shape[0], 8)[:, :4] + (x.shape[0] % 3)


def test_programs_with_derived_sizes_and_subgraphs_load(tmp_path):
    torch.manual_seed(0)
    module = Derived().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(module, (torch.randn(5, 6),), dynamic_shapes=({0: Dim("batch", max=64)},))
    torch.export.save(ep, tmp_path / "derived.pt2")
    parsed = json.loads(read_member(tmp_path / "derived.pt2", MODEL_JSON))
    assert "Mul(Integer(2)" in json.dumps(parsed) and "higher_order.cond" in json.dumps(parsed)
    loaded = export.load(tmp_path / "derived.pt2", "cpu")
    x = torch.randn(7, 6)
    with torch.no_grad():
        assert torch.allclose(loaded.net(x), module(x), atol=1e-6)

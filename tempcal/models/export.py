"""``torch.export`` programs (``.pt2``): loaded from a checked copy without unpickling anything, run as a SOURCE,
and written calibrated (``(logits.double() / T).to(logits.dtype)`` added to the graph, reloaded and checked first).
"""

from __future__ import annotations

import io
import math
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..core.parallel import resolve_device
from ..errors import TEMPERATURE_KEY, TempcalError, format_temperature, param, stored_temperature
from ..io.paths import write_bytes_atomic
from .base import TEMPERATURE_BUFFER, LoadedModel, OutputKey, error_line, is_out_of_memory, quiet, refused_line
from .pt2_archive import PROGRAM, Pt2Info, inspect_archive, open_archive, write_checked_copy
from .pt2_program import graph_refusal
from .run import selected_position

if TYPE_CHECKING:
    from torch.export import ExportedProgram


# -- loading --------------------------------------------------------------------------------------
def load(path: str | os.PathLike, device: str | torch.device = "auto") -> LoadedModel:
    """An exported program on ``device``: its original (a calibrated program without tempcal's division) and T."""
    path = Path(path)
    target = resolve_device(device)
    program, info = load_program(path, target)
    net = graph_module(program, info.temperature, str(path))
    return LoadedModel(path, "export", net, info.temperature, target)


def load_program(source: str | os.PathLike | bytes, device: torch.device | str = "cpu", *,
                 label: str | None = None) -> tuple[ExportedProgram, Pt2Info]:
    """The checked program in ``source`` (a path, or archive bytes tempcal just wrote) on ``device``, and what
    :func:`~tempcal.models.pt2_archive.inspect_archive` found. Nothing from the file is unpickled."""
    from torch.export.pt2_archive._package import load_pt2 as torch_load_pt2

    name = label or str(source)
    with open_archive(source) as archive, tempfile.TemporaryDirectory(prefix="tempcal-pt2-") as folder:
        info = inspect_archive(archive, name)
        checked = os.path.join(folder, "checked.pt2")
        write_checked_copy(archive, info, checked)
        try:  # torch builds the program from the checked copy; whatever it makes of a damaged one: one line
            with quiet():
                program = torch_load_pt2(checked).exported_programs[PROGRAM]
        except Exception as exc:
            if is_out_of_memory(exc):
                raise TempcalError(f"{name}: out of memory while loading the program") from None
            raise TempcalError(f"{name}: not a loadable exported program ({error_line(exc, last=False)})") from None
    return _finish(program, info, torch.device(device)), info


def _finish(program: ExportedProgram, info: Pt2Info, target: torch.device) -> ExportedProgram:
    """Refuse programs calling what tempcal does not run or exported in training mode, check T against the
    program's buffer, move the program to ``target``."""
    refused = graph_refusal(program)
    if refused is not None:
        raise TempcalError(refused_line(info.path, refused[0], refused[1], f"node '{refused[2]}'"))
    found = training_nodes(program)
    if found:
        raise TempcalError(f"{info.path}: the program was exported in training mode ({found[0]}), so its outputs "
                           "are not eval outputs; export model.eval() and save it again")
    stored = program_temperature(program, info.path)
    if stored != info.temperature:
        raise TempcalError(f"{info.path}: extra file '{TEMPERATURE_KEY}' says T = {info.temperature!r} but the "
                           f"program divides by {stored!r}; the file was altered, save the calibrated model again")
    if target.type != "cpu" or info.non_cpu:
        from torch.export.passes import move_to_device_pass

        try:
            with quiet():
                program = move_to_device_pass(program, target)
        except Exception as exc:
            raise TempcalError(f"{info.path}: cannot move the program to {target} "
                               f"({error_line(exc, last=False)})") from None
    return program


def graph_module(program: ExportedProgram, temperature: float | None, label: str) -> torch.nn.Module:
    """The program as a module run in batches it accepts (:class:`FittedBatches`); a calibrated one (T given) without
    its division by T, so that as a SOURCE the default ``--tau`` (the stored T) gives the calibrated outputs."""
    with quiet():
        graph = program.module()
    if temperature is not None:
        strip_division(graph, label)
    limits = batch_limits(program)
    return graph if limits is None else FittedBatches(graph, limits)


# -- programs that take only some batch sizes -------------------------------------------------------
#: (lower, upper) batch sizes a program accepts; upper None for no bound.
Limits = tuple[int, int | None]


def batch_limits(program: ExportedProgram) -> Limits | None:
    """The batch sizes (dim 0 of the first input) ``program`` accepts, None when any size is."""
    names = set(program.graph_signature.user_inputs)
    first = next((n for n in program.graph.nodes if n.op == "placeholder" and n.name in names), None)
    value = None if first is None else first.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return None
    size = value.shape[0]
    if isinstance(size, int):
        return size, size
    expr = size.node.expr
    if expr not in program.range_constraints:
        return None
    bounds = program.range_constraints[expr]
    low, high = float(bounds.lower), float(bounds.upper)  # sympy integers, or torch's int_oo (float: inf)
    lower = int(low) if low > 2 else 0  # torch lets sizes 0 and 1 through below a lower bound of 2
    upper = None if math.isinf(high) else int(high)
    return None if lower == 0 and upper is None else (lower, upper)


class FittedBatches(torch.nn.Module):
    """A program that takes only some batch sizes (a static export, a bounded ``Dim``) run on any number of rows, in
    chunks it accepts (a short chunk padded by repeating its last row, the padding's outputs dropped)."""

    def __init__(self, program: torch.fx.GraphModule, limits: Limits) -> None:
        super().__init__()
        self.program = program
        self.batch_limits = limits

    def forward(self, x: torch.Tensor) -> Any:
        lower, upper = self.batch_limits
        rows = int(x.shape[0])
        if lower <= rows and (upper is None or rows <= upper):
            return self.program(x)
        if rows == 0:
            raise ValueError(f"no rows to run (the program takes batches of {_shown(self.batch_limits)} rows)")
        step = rows if upper is None else upper
        parts = []
        for start in range(0, rows, step):
            chunk = x[start:start + step]
            kept = int(chunk.shape[0])
            if kept < lower:
                chunk = torch.cat([chunk, chunk[-1:].expand(lower - kept, *chunk.shape[1:])])
            parts.append((self.program(chunk), kept, int(chunk.shape[0])))
        return _joined(parts, self.batch_limits)


def _joined(parts: list[tuple[Any, int, int]], limits: Limits) -> Any:
    """The chunks' outputs as one: each batch-shaped output cut to the rows kept, then concatenated."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    flat = [(tree_flatten(out), kept, ran) for out, kept, ran in parts]
    joined = []
    for index in range(len(flat[0][0][0])):
        chunks = [(leaves[index], kept, ran) for (leaves, _), kept, ran in flat]
        batched = all(isinstance(leaf, torch.Tensor) and leaf.dim() >= 1 and leaf.shape[0] == ran
                      for leaf, _, ran in chunks)
        if not batched and len(chunks) > 1:  # one chunk: an output without rows is kept as it is
            raise ValueError(f"output {index} has no row per input, so batches of other sizes than the "
                             f"program's {_shown(limits)} rows cannot be joined")
        pieces = [leaf[:kept] if batched else leaf for leaf, kept, _ in chunks]
        joined.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces))
    return tree_unflatten(joined, flat[0][0][1])


def _shown(limits: Limits) -> str:
    lower, upper = limits
    if lower == upper:
        return str(lower)
    return f"{lower}..{upper}" if upper is not None else f"at least {lower}"


#: Ops whose "train" argument (by position and name) makes them behave differently in training mode.
_TRAIN_ARGUMENT = {
    **{f"aten.{op}.default": (2, "train") for op in ("dropout", "native_dropout", "feature_dropout", "alpha_dropout",
                                                     "feature_alpha_dropout")},
    **{f"aten.{op}.default": (5, "training") for op in ("batch_norm", "native_batch_norm", "_native_batch_norm_legit",
                                                        "_native_batch_norm_legit_functional")},
}
#: Ops that only exist in training-mode graphs (batch statistics, running-stat updates).
_TRAIN_ONLY = frozenset({"aten._batch_norm_with_update.default", "aten._batch_norm_with_update_functional.default",
                         "aten._native_batch_norm_legit.no_stats"})


def training_nodes(program: ExportedProgram) -> list[str]:
    """What makes ``program`` a training-mode capture: dropout or batch norm in training mode, buffer updates."""
    found = []
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        target = str(node.target)
        if target in _TRAIN_ONLY:
            found.append(f"{target} at node '{node.name}'")
        elif target in _TRAIN_ARGUMENT:
            index, name = _TRAIN_ARGUMENT[target]
            flag = node.args[index] if len(node.args) > index else node.kwargs.get(name)
            if flag is True:
                found.append(f"{target} with {name}=True at node '{node.name}'")
    mutated = list(program.graph_signature.buffers_to_mutate.values())
    if mutated:
        found.append(f"it updates buffer '{mutated[0]}' when run")
    return found


def program_temperature(program: ExportedProgram, label: str = "the program") -> float | None:
    """The T a calibrated program divides by (its ``tempcal_temperature`` buffer), None for any other program."""
    value = program.state_dict.get(TEMPERATURE_BUFFER, program.constants.get(TEMPERATURE_BUFFER))
    if value is None:
        return None
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise TempcalError(f"{label}: buffer '{TEMPERATURE_BUFFER}' is not a single number")
    return stored_temperature(repr(float(value.reshape(()).item())), f"{label}: buffer")


def strip_division(graph: torch.fx.GraphModule, label: str = "the program") -> None:
    """Remove tempcal's division by ``tempcal_temperature`` (and the cast after it) from a calibrated graph, in place
    (every node that depends on the buffer is tempcal's: the original never sees it)."""
    aten = torch.ops.aten
    getters = [n for n in graph.graph.nodes if n.op == "get_attr" and n.target == TEMPERATURE_BUFFER]
    for getter in getters:
        for division in list(getter.users):
            if division.target != aten.div.Tensor or division.args[1] is not getter:
                raise TempcalError(f"{label}: its buffer '{TEMPERATURE_BUFFER}' is used in a way tempcal does not "
                                   "write; calibrate the original program instead")
            tail = division
            if len(tail.users) == 1 and next(iter(tail.users)).target in (aten._to_copy.default, aten.to.dtype):
                tail = next(iter(tail.users))
            tail.replace_all_uses_with(division.args[0])
            for node in (tail, division) if tail is not division else (division,):
                graph.graph.erase_node(node)
        graph.graph.erase_node(getter)
    if hasattr(graph, TEMPERATURE_BUFFER):
        delattr(graph, TEMPERATURE_BUFFER)
    graph.graph.lint()
    graph.recompile()


# -- writing a calibrated program -------------------------------------------------------------------
def save_calibrated(model: LoadedModel, temperature: float, out_path: str | os.PathLike, *,
                    output_key: OutputKey = None, check_inputs: torch.Tensor | None = None) -> Path:
    """Write, atomically, an exported program whose selected output is ``model``'s (a ``.pt2`` or TorchScript model on
    the CPU) divided by ``temperature``; ``check_inputs`` drive the export and the check of the saved bytes."""
    label = model.name
    limits = getattr(model.net, "batch_limits", None)
    example = _example(check_inputs, label, limits)
    check = (torch.cat([example[0], example[0][:1]]),)  # a batch size the export did not see
    if model.format == "torchscript":
        from .torchscript import to_graph_module

        graph = to_graph_module(model.net, example, label)
    else:  # a .pt2: detect.save_format writes one from a .pt2 or TorchScript SOURCE only
        graph = model.net.program if isinstance(model.net, FittedBatches) else model.net
    reference = _run(model.net, check, label, "the original")
    index = selected_position(reference, output_key, label)  # the same choice, and wording, as running the SOURCE
    dtype = torch.utils._pytree.tree_leaves(reference)[index].dtype
    if not dtype.is_floating_point:
        raise TempcalError(f"the selected output of {label} has dtype {str(dtype).removeprefix('torch.')}; "
                           "expected floating-point logits")
    _add_division(graph, index, temperature, dtype)
    blob = _serialize(_export(graph, example, label, limits), temperature, label)
    _check_saved(blob, check, reference, index, temperature, label)
    return write_bytes_atomic(out_path, blob, what=param("save_model"))


def _example(check_inputs: torch.Tensor | None, label: str, limits: Limits | None = None) -> tuple[torch.Tensor]:
    """The example inputs as a 1-tuple with a batch of at least 2 rows (export specializes a batch of 1), of a size
    the program accepts (``limits``: rows repeated or cut)."""
    if check_inputs is None:
        raise TempcalError(f"{label}: an exported program is written from example inputs; pass check_inputs (the "
                           f"command line uses the first rows of {param('inputs')})")
    x = check_inputs.detach().cpu()
    if x.dim() < 1 or x.shape[0] < 1:
        raise TempcalError(f"{label}: example inputs of shape {list(x.shape)} hold no rows")
    lower, upper = limits or (2, None)
    rows = min(max(int(x.shape[0]), lower, 2), upper or math.inf)
    return (x.repeat(-(-int(rows) // x.shape[0]), *([1] * (x.dim() - 1)))[:int(rows)],)


def _run(model: Any, inputs: tuple[torch.Tensor, ...], label: str, what: str) -> Any:
    """``model(*inputs)`` without autograd, failures as one line."""
    try:
        with quiet(), torch.no_grad():
            return model(*inputs)
    except Exception as exc:
        if is_out_of_memory(exc):
            raise TempcalError(f"out of memory running {what} {label}") from None
        shapes = ", ".join(str(list(x.shape)) for x in inputs)
        raise TempcalError(f"{what} {label} fails on inputs of shape {shapes}: {error_line(exc)}") from None


def _add_division(graph: torch.fx.GraphModule, index: int, temperature: float, dtype: torch.dtype) -> None:
    """Divide flat output ``index`` of ``graph`` by a float64 ``[1]`` buffer holding T, casting back to ``dtype``."""
    aten = torch.ops.aten
    graph.register_buffer(TEMPERATURE_BUFFER, torch.tensor([temperature], dtype=torch.float64))
    output = next(n for n in graph.graph.nodes if n.op == "output")
    leaves = list(output.args[0])  # type: ignore[arg-type]
    with graph.graph.inserting_before(output):
        getter = graph.graph.get_attr(TEMPERATURE_BUFFER)
        scaled = graph.graph.call_function(aten.div.Tensor, (leaves[index], getter))
        if dtype != torch.float64:
            scaled = graph.graph.call_function(aten._to_copy.default, (scaled,), {"dtype": dtype})
    leaves[index] = scaled
    output.args = (type(output.args[0])(leaves),)  # type: ignore[call-arg]
    graph.graph.lint()
    graph.recompile()


def _export(graph: torch.fx.GraphModule, example: tuple[torch.Tensor, ...], label: str,
            limits: Limits | None = None) -> ExportedProgram:
    """Export ``graph`` with the batch sizes the source took: one dynamic batch dimension (dim 0 of every input),
    bounded as the source's was, or the source's static batch size."""
    from torch.export import Dim

    lower, upper = limits or (0, None)
    if upper is not None and lower == upper:
        shapes = None
    else:
        batch = Dim("batch", min=lower, max=upper) if limits else Dim("batch")
        shapes = tuple({0: batch} for _ in example)
    try:
        with quiet():
            return torch.export.export(graph, example, dynamic_shapes=shapes)
    except Exception as exc:
        fixed = re.search(r"specialized it to be a constant \((\d+)\)", str(exc))
        if fixed:
            raise TempcalError(f"{label} fixes its batch size to {fixed.group(1)}, so no program with a dynamic "
                               "batch size can be written from it; export the original nn.Module with "
                               "dynamic_shapes and calibrate that") from None
        raise TempcalError(f"cannot export the calibrated {label} ({error_line(exc, last=False)})") from None


def _serialize(program: ExportedProgram, temperature: float, label: str) -> bytes:
    """The ``.pt2`` bytes of ``program`` with T in the extra file ``tempcal.temperature``."""
    buffer = io.BytesIO()
    try:
        with quiet():
            torch.export.save(program, buffer, extra_files={TEMPERATURE_KEY: format_temperature(temperature)})
    except Exception as exc:
        raise TempcalError(f"cannot serialize the calibrated {label} ({error_line(exc, last=False)})") from None
    return buffer.getvalue()


def _check_saved(blob: bytes, check: tuple[torch.Tensor, ...], reference: Any, index: int, temperature: float,
                 label: str) -> None:
    """Reload ``blob`` safely and compare its outputs on ``check`` with the reference (logits / T)."""
    from torch.utils._pytree import tree_flatten

    program, info = load_program(blob, label=f"the calibrated {label}")
    if info.temperature != temperature:
        raise TempcalError(f"the calibrated {label} does not read back T = {temperature!r}; nothing written")
    module = graph_module(program, None, label)  # the division kept
    got, got_spec = tree_flatten(_run(module, check, label, "the calibrated"))
    want, want_spec = tree_flatten(reference)
    if got_spec != want_spec:
        raise TempcalError(f"the calibrated {label} returns {got_spec} instead of {want_spec}; nothing written")
    want[index] = (want[index].to(torch.float64) / temperature).to(want[index].dtype)
    for position, (a, b) in enumerate(zip(got, want, strict=True)):
        close = torch.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True) if a.dtype.is_floating_point else None
        same = a.shape == b.shape and a.dtype == b.dtype and (torch.equal(a, b) if close is None else close)
        if not same:
            what = "its logits divided by T" if position == index else f"its output {position}"
            raise TempcalError(f"the calibrated {label} does not reproduce {what} on a batch of "
                               f"{check[0].shape[0]} rows; nothing written")


__all__ = ["graph_module", "load", "load_program", "program_temperature", "save_calibrated", "training_nodes"]

"""Builders of model files for the tests of ``.pt2`` and ONNX models: small modules, files written by the libraries
that own the formats (``torch.export.save``; ONNX graphs built node by node with ``onnx.helper``, independent of any
exporter), and crafted hostile archives.

Imported as ``from model_builders import ...`` (``tests/`` is on ``sys.path``, see tests/conftest.py), so
that tests outside ``tests/models`` share them without a second conftest.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import numpy as np
import torch
from conftest import Evil
from torch.export import Dim

#: Archive members of a program saved by ``torch.export.save`` (named without the archive's root folder).
WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
SAMPLE_INPUTS = "data/sample_inputs/model.pt"


# -- modules ---------------------------------------------------------------------------------------------------------


class MLP(torch.nn.Module):
    """Two linear layers: a plain classifier (8 features, 5 classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class CNN(torch.nn.Module):
    """Conv, batch norm, dropout, adaptive pooling: a small ResNet-like classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.pool = torch.nn.AdaptiveAvgPool2d((1, 1))
        self.drop = torch.nn.Dropout(0.5)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(self.drop(torch.flatten(h, 1)))


class TupleOut(torch.nn.Module):
    """Returns (logits, probabilities)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.a(x)
        return z, torch.softmax(z, -1)


class DictOut(torch.nn.Module):
    """Returns {"logits": ..., "features": ...}."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.a(x), "features": x * 2}


class Branchy(torch.nn.Module):
    """Data-dependent control flow (TorchScript prim::If on a tensor value)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.a(x)
        if bool(z.sum() > 0):
            z = z * 2
        return z


# -- .pt2 ------------------------------------------------------------------------------------------------------------


def exported(module: torch.nn.Module, x: torch.Tensor) -> torch.export.ExportedProgram:
    """``module`` exported with a dynamic batch dimension."""
    return torch.export.export(module, (x,), dynamic_shapes=({0: Dim("batch")},))


def save_program(module: torch.nn.Module, x: torch.Tensor, path: Path, **extra_files: str) -> Path:
    """``module`` (in eval mode) exported with a dynamic batch and saved by ``torch.export.save``."""
    torch.export.save(exported(module.eval(), x), path, extra_files=extra_files or None)
    return path


def rewrite_zip(source: Path, target: Path, *, replace: dict[str, bytes] | None = None,
                add: dict[str, bytes] | None = None, drop: tuple[str, ...] = ()) -> Path:
    """Copy a zip, replacing, adding or dropping members named without the archive's root folder."""
    replace, add = dict(replace or {}), dict(add or {})
    with zipfile.ZipFile(source) as archive:
        names = archive.namelist()
        root = names[0].split("/", 1)[0]
        with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as out:
            for name in names:
                short = name[len(root) + 1:]
                if short in drop:
                    continue
                out.writestr(name, replace.pop(short) if short in replace else archive.read(name))
            for short, data in {**replace, **add}.items():
                out.writestr(f"{root}/{short}", data)
    return target


def read_member(path: Path, short: str) -> bytes:
    """A member of a zip, named without its root folder."""
    with zipfile.ZipFile(path) as archive:
        root = archive.namelist()[0].split("/", 1)[0]
        return archive.read(f"{root}/{short}")


def payload_pickle(marker: Path, protocol: int = 2) -> bytes:
    """A pickle that creates the file ``marker`` when unpickled."""
    return pickle.dumps(Evil(marker), protocol=protocol)


def payload_torch_save(marker: Path) -> bytes:
    """A torch.save zip archive whose data.pkl creates the file ``marker`` when unpickled."""
    buffer = io.BytesIO()
    torch.save(Evil(marker), buffer)
    return buffer.getvalue()


def with_opaque_payload(source: Path, target: Path, marker: Path) -> Path:
    """``source`` with an opaque-object constant: torch.export.load runs it through plain ``pickle.loads``."""
    import json

    config = json.loads(read_member(source, CONSTANTS_CONFIG))
    config["config"]["evil"] = {"is_param": False, "tensor_meta": None, "path_name": "opaque_obj_0",
                                "use_pickle": True}
    return rewrite_zip(source, target, replace={CONSTANTS_CONFIG: json.dumps(config).encode()},
                       add={"data/constants/opaque_obj_0": payload_pickle(marker)})


# -- ONNX ------------------------------------------------------------------------------------------------------------


def onnx_model(nodes: list, outputs: list, initializers: list, *, features: int, check: bool = True,
               input_type: int | None = None):
    """An ONNX model (opset 17) taking ``x`` [N, features] (float32 unless ``input_type``)."""
    import onnx
    from onnx import TensorProto, helper

    kind = TensorProto.FLOAT if input_type is None else input_type
    graph = helper.make_graph(nodes, "classifier", [helper.make_tensor_value_info("x", kind, ["N", features])],
                              outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if check:  # (the checker resolves external data against the working folder: skipped for those models)
        onnx.checker.check_model(model)
    return model


def onnx_mlp(module: torch.nn.Sequential | MLP, path: Path, *, probs: bool = False) -> Path:
    """A Linear-ReLU-Linear module as an ONNX file (Gemm, Relu, Gemm) with the module's weights; ``probs`` adds a
    Softmax output ``probs``, listed before ``logits``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    first, second = ((module[0], module[2]) if isinstance(module, torch.nn.Sequential) else (module.a, module.b))
    weights = [numpy_helper.from_array(t.detach().numpy().astype(np.float32), name) for name, t in
               (("W1", first.weight), ("b1", first.bias), ("W2", second.weight), ("b2", second.bias))]
    classes = second.weight.shape[0]
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "W2", "b2"], ["logits"], transB=1)]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])]
    if probs:
        nodes.append(helper.make_node("Softmax", ["logits"], ["probs"], axis=-1))
        outputs.insert(0, helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", classes]))
    onnx.save_model(onnx_model(nodes, outputs, weights, features=first.weight.shape[1]), path)
    return path


def external_onnx(folder: Path, weight: np.ndarray, bias: np.ndarray, location: str = "weights.bin", *,
                  write_data: bool = True) -> Path:
    """``x @ weight + bias`` with ``weight`` stored in a file at ``location`` (relative to the model's folder),
    16 bytes into it. Written as it is: the location is not checked by whatever writes it."""
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    if write_data:
        (folder / location).write_bytes(b"\0" * 16 + weight.astype(np.float32).tobytes())
    tensor = numpy_helper.from_array(weight.astype(np.float32), "W")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "16"), ("length", str(weight.astype(np.float32).nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    model = onnx_model([helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "b"],
                                                                                         ["logits"])],
                       [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", weight.shape[1]])],
                       [tensor, numpy_helper.from_array(bias.astype(np.float32), "b")], features=weight.shape[0],
                       check=False)
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def run_onnx_file(path: Path, x: np.ndarray, output: str | None = None) -> np.ndarray:
    """Run an ONNX file with onnxruntime directly (as a deployment would): the named (or only) output."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    (out,) = session.run([output or names[0]], {session.get_inputs()[0].name: x})
    return out


def metadata_props(path: Path) -> dict[str, str]:
    import onnx

    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}


def divided(z: torch.Tensor, temperature: float) -> torch.Tensor:
    """The exact quotient rounded once to the logits' dtype (what a calibrated ``.pt2`` computes)."""
    return (z.to(torch.float64) / temperature).to(z.dtype)


def ulps(a: np.ndarray, b: np.ndarray) -> int:
    """The largest distance between float32 arrays in units in the last place."""
    a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return int(np.max(np.abs(a32.view(np.int32).astype(np.int64) - b32.view(np.int32).astype(np.int64))))


# -- tiny language models (hidden states and an output head) ----------------------------------------------
VOCAB, WIDTH = 257, 32


def tiny_model(kind: str, folder):
    """A tiny randomly initialised causal LM of ``kind``, saved in ``folder`` (nothing downloaded)."""
    import pytest

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    common = {"vocab_size": VOCAB, "hidden_size": WIDTH, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 4, "num_key_value_heads": 2}
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    elif kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=WIDTH, n_layer=1,
                                                                     n_head=4))
    elif kind == "gemma2":
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**common, head_dim=8,
                                                                         final_logit_softcapping=2.0))
    elif kind == "cohere":
        model = transformers.CohereForCausalLM(transformers.CohereConfig(**common, logit_scale=0.5))
    else:
        model = transformers.GraniteForCausalLM(transformers.GraniteConfig(**common, logits_scaling=4.0))
    model.eval()
    model.save_pretrained(folder, max_shard_size="20KB" if kind == "llama" else "1GB")
    return model


def final_hidden_states(model, rows: int = 4, length: int = 30):
    """The output layer's input and the model's own logits for random token sequences, one row per position."""
    ids = torch.randint(0, VOCAB, (rows, length), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        out = model(input_ids=ids, output_hidden_states=True)
    return out.hidden_states[-1].reshape(-1, WIDTH), out.logits.reshape(-1, VOCAB).float()

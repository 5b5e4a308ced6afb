"""A model (``.pt2``, ``.onnx``, TorchScript) run over its inputs file as SOURCE, its logits kept in memory; it has no
file to hold T: ``--save-model`` writes it calibrated, and a calibrated model gives the original's logits and T."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..errors import Note, TempcalError, param
from ..io.safetensors_header import dtype_name, read_header
from ..models.detect import FORMAT_NAMES, looks_like_model, model_format
from .base import Keep, Kept, OpenedSource, SourceKind, SourceOptions, wrote_lines
from .described import Findings, tensor_entry

if TYPE_CHECKING:
    import numpy as np


@dataclass
class ModelSource(OpenedSource):
    """A model SOURCE run over one inputs file, labelled ``MODEL on INPUTS``."""

    model: Any = None  # the LoadedModel, reused for related inputs files
    inputs_path: Path | None = None

    def keep(self, temperature: float, ask: Keep) -> Kept:
        """A model has no file T goes into: its logits as a logits file (``ask.save_logits``, with T unless
        ``ask.store`` is False), and the model written calibrated (``ask.save_model``)."""
        from ..core.data import LogitsData
        from ..models.save import save_calibrated_model, save_logits

        if ask.save_logits:
            save_logits(cast(LogitsData, self.data), ask.save_logits, temperature=temperature if ask.store else None,
                        metadata={"tempcal.model": str(self.model.path), "tempcal.inputs": str(self.inputs_path)})
        paths = []
        if ask.save_model and ask.store:
            paths = [str(save_calibrated_model(self.model.path, temperature, ask.save_model,
                                               output_key=self.options.output_key, check_inputs=self.inputs_path,
                                               inputs_key=self.options.inputs_key))]
        saved = [f"wrote the logits to {ask.save_logits}"] if ask.save_logits else []
        return Kept(paths, wrote_lines(temperature, paths, ask) + saved)


class ModelKind(SourceKind):
    """Models (``.pt2``, ``.onnx``; TorchScript ``.pt``, ``.pth``, ``.ts``, ``.torchscript``) run over ``--inputs``."""

    name = "model"
    title = "model"
    inspect_needs_file = False  # loading it says what is wrong with its path

    def claims(self, paths: list[Path], options: SourceOptions) -> bool:
        return len(paths) == 1 and looks_like_model(paths[0], options.inputs is not None)

    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        from ..models.base import load_model

        if options.inputs is None:
            what = FORMAT_NAMES[model_format(paths[0])].split(" (")[0]
            raise TempcalError(f"{paths[0]}: {what} SOURCE needs its inputs: {param('inputs')} "
                               "DATA.safetensors (tensors 'inputs' and 'labels')")
        model = load_model(paths[0], options.device)
        return self.run(model, Path(options.inputs), options, labels_optional=labels_optional)

    def open_related(self, opened: OpenedSource, other: Any, *, labels_optional: bool = False) -> OpenedSource:
        """An inputs file run through the model ``opened`` already loaded."""
        assert isinstance(opened, ModelSource)
        return self.run(opened.model, Path(other), opened.options, labels_optional=labels_optional)

    def run(self, model: Any, inputs_path: Path, options: SourceOptions, *, labels_optional: bool) -> ModelSource:
        """The model's logits over ``inputs_path`` as a source (placeholder labels when none and optional)."""
        from ..core.data import as_logits_data
        from ..models.run import InputsFile, placeholder_labels, run_model

        inputs = InputsFile(inputs_path, options.inputs_key)
        labels = inputs.labels(options.labels_key, optional=labels_optional)
        logits = run_model(model, inputs, batch_size=options.batch_size, output_key=options.output_key,
                           progress=options.progress)
        has_labels = labels is not None
        try:
            data = as_logits_data(logits, labels if has_labels else placeholder_labels(logits),
                                  logits_name=f"{model.name} output", labels_name=options.labels_key)
        except TempcalError as exc:
            raise exc.prefixed(f"{inputs_path}: ") from None
        return ModelSource([], data, model.temperature, self, options, has_labels=has_labels,
                           label=f"{model.path} on {inputs_path}", model=model, inputs_path=inputs_path)

    def group_values(self, opened: OpenedSource, key: str, option: str) -> np.ndarray:
        """``key`` in the inputs file, checked against its labels' shape."""
        from .safetensors import safetensors_values

        assert isinstance(opened, ModelSource) and opened.inputs_path is not None
        return safetensors_values(opened.inputs_path, key, opened.options.labels_key, option)

    def describes_unopened(self, options: SourceOptions) -> bool:
        return options.inputs is None  # described from its file alone

    def describe_tensors(self, paths: list[Path], options: SourceOptions) -> list[dict[str, Any]]:
        """The tensors of its inputs file, when given."""
        if options.inputs is None:
            return []
        header = read_header(options.inputs)
        return [{**tensor_entry(options.inputs, name, info.shape, dtype_name(info.dtype), options),
                 "role": {options.inputs_key: "inputs", options.labels_key: "labels"}.get(name)}
                for name, info in header.tensors.items()]

    def describe_sidecar(self, path: Path) -> dict[str, Any] | None:
        return None  # T is in the model itself

    def describe_stored(self, path: Path, opened: OpenedSource | None, sidecar: dict[str, Any] | None,
                        findings: Findings) -> dict[str, Any]:
        """The T a calibrated model holds (loaded from its file when it was not run)."""
        temperature = opened.stored if opened is not None else findings.attempt(lambda: self.read_temperature(path)[0])
        return {"temperature": temperature, "recorded": temperature, "where": "model", "probs": False}

    def describe_details(self, paths: list[Path], options: SourceOptions) -> Any:
        """Its format (None when it cannot be told)."""
        try:
            return {"format": FORMAT_NAMES[model_format(paths[0])]}
        except TempcalError:
            return {"format": None}

    def describe_hints(self, options: SourceOptions) -> list[str]:
        if options.inputs is not None:
            return []
        return [Note(f"a model: give its inputs with {param('inputs')} DATA.safetensors to look at its outputs")]

    def read_temperature(self, path: Path) -> tuple[float | None, list[str]]:
        """A calibrated model's T (None for any other model), read by loading it as a SOURCE would."""
        from ..models.base import load_model

        return load_model(path, "cpu").temperature, []

    def write_reading(self, path: Path, temperature: float, output: str | Path | None,
                      metadata: Mapping[str, str | None]) -> Path:
        raise TempcalError(f"{path}: a model has no logits file to store T in; write it calibrated with "
                           f"{param('save_model')} PATH")


__all__ = ["ModelKind", "ModelSource"]

"""The ``.pt2`` archive checked member by member (docs/models.md, "What is checked before a model runs"): nothing
torch would unpickle or execute; only a fresh copy of the checked members, read through one handle, reaches torch.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import TEMPERATURE_KEY, TempcalError, param, stored_temperature
from ..io.sidecar import check_regular_file
from .base import error_line
from .pt2_program import check_program_json, without_guards

#: Name of the program that ``torch.export.save`` writes and ``torch.export.load`` returns.
PROGRAM = "model"
HOW_TO_SAVE = "save it with torch.export.save(torch.export.export(model.eval(), (x,)), PATH)"

# Layout of the archive as written by torch.export.save (torch/export/pt2_archive/constants.py).
_FORMAT, _VERSION, _BYTEORDER = "archive_format", "archive_version", "byteorder"
_MODELS, _WEIGHTS, _CONSTANTS = "models/", "data/weights/", "data/constants/"
_SAMPLE_INPUTS, _EXTRA, _AOTI = "data/sample_inputs/", "extra/", "data/aotinductor/"
_LEGACY_MEMBERS = ("serialized_exported_program.json", "serialized_state_dict.pt", "serialized_constants.pt",
                   "serialized_example_inputs.pt")

#: Bytes per element for the dtype codes of torch/_export/serde/schema.py (ScalarType).
_ELEMENT_SIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 2, 7: 4, 8: 8, 9: 4, 10: 8, 11: 16, 12: 1, 13: 2, 28: 2,
                 29: 1, 30: 1, 31: 1, 32: 1, 33: 1, 34: 4, 35: 8}
_STRIDED = 7  # schema Layout.Strided

#: Largest text member (format, version, byte order, tempcal's T) and JSON member (programs, payload configs) read.
_TEXT_LIMIT, _JSON_LIMIT = 1 << 12, 1 << 30
#: Largest sample-inputs member read for its check (torch.export.save writes a few batches of inputs).
_SAMPLE_LIMIT = 1 << 30


@dataclass(frozen=True)
class Pt2Info:
    """What :func:`inspect_archive` found: the archive's layout and the T a calibrated program carries."""

    path: str
    programs: tuple[str, ...]
    keep: tuple[str, ...]  # members (without the root folder) that the loaded program needs
    extra_files: tuple[str, ...]
    temperature: float | None
    non_cpu: bool = False  # some weight or constant was saved on a device other than the CPU


# -- checking the archive (nothing unpickled) -----------------------------------------------------
@contextmanager
def open_archive(source: str | os.PathLike | bytes) -> Iterator[zipfile.ZipFile]:
    """The zip archive in ``source`` (a path or bytes), with one-line errors for missing and non-zip files."""
    label = "the archive" if isinstance(source, bytes) else str(source)
    if isinstance(source, bytes):
        stream: Any = io.BytesIO(source)
    else:
        check_regular_file(source)
        try:
            stream = open(source, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise TempcalError(f"{label}: cannot read ({exc.strerror or exc})") from None
    try:
        if stream.read(2) != b"PK":
            raise TempcalError(f"{label}: not an exported program (not a zip archive; {HOW_TO_SAVE})")
        stream.seek(0)
        try:
            archive = zipfile.ZipFile(stream)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError,
                NotImplementedError) as exc:  # NotImplementedError: an unknown zip version or compression
            raise TempcalError(f"{label}: damaged or truncated zip archive ({error_line(exc, last=False)})") from None
        with archive:
            yield archive
    finally:
        stream.close()


def inspect_archive(archive: zipfile.ZipFile, label: str) -> Pt2Info:
    """Check that ``archive`` is a torch.export archive that loads without unpickling anything (one-line errors)."""
    members = _members(archive, label)
    _refuse_other_formats(members, label)
    _check_sizes(archive, members, label)
    if _FORMAT not in members:
        raise TempcalError(f"{label}: not an exported program (no '{_FORMAT}' member; {HOW_TO_SAVE})")
    fmt = _read(archive, members, _FORMAT, label, _TEXT_LIMIT).decode("utf-8", "replace").strip()
    if fmt != "pt2":
        raise TempcalError(f"{label}: member '{_FORMAT}' says {fmt[:40]!r}, not 'pt2'; not an exported program")
    version = _read(archive, members, _VERSION, label, _TEXT_LIMIT).decode("utf-8", "replace").strip() \
        if _VERSION in members else "0"
    if version != "0":
        raise TempcalError(f"{label}: archive version {version[:20]!r}; this tempcal reads version 0")
    if _BYTEORDER in members:
        order = _read(archive, members, _BYTEORDER, label, _TEXT_LIMIT).decode("utf-8", "replace").strip()
        if order != sys.byteorder:
            raise TempcalError(f"{label}: weights saved in {order[:20]!r} byte order; this machine is {sys.byteorder}")
    for name in members:
        if name.startswith(_AOTI):
            raise TempcalError(f"{label}: member '{name}': AOTInductor compiled code, which torch.export.load would "
                               "load and run as a shared library; refused")
    programs = tuple(sorted(n[len(_MODELS):-len(".json")] for n in members
                            if n.startswith(_MODELS) and n.endswith(".json") and "/" not in n[len(_MODELS):]))
    if PROGRAM not in programs:
        raise TempcalError(f"{label}: no program 'models/{PROGRAM}.json' in the archive; {HOW_TO_SAVE}")
    keep: set[str] = {f"{_MODELS}{PROGRAM}.json"}
    non_cpu = False
    for program in programs:  # torch.export.load reads every program, so every one is checked
        needed, devices = _check_program(archive, members, program, label)
        non_cpu |= devices
        if program == PROGRAM:
            keep |= needed
    extra = tuple(sorted(n[len(_EXTRA):] for n in members if n.startswith(_EXTRA)))
    temperature = (stored_temperature(_read(archive, members, _EXTRA + TEMPERATURE_KEY, label, _TEXT_LIMIT),
                                      f"{label}: extra file") if TEMPERATURE_KEY in extra else None)
    return Pt2Info(path=label, programs=programs, keep=tuple(sorted(keep)), extra_files=extra,
                   temperature=temperature, non_cpu=non_cpu)


def _members(archive: zipfile.ZipFile, label: str) -> dict[str, zipfile.ZipInfo]:
    """The archive's members by name without its root folder (one folder, no duplicates)."""
    infos = archive.infolist()
    if not infos:
        raise TempcalError(f"{label}: empty zip archive; not an exported program")
    names = [info.filename for info in infos]
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise TempcalError(f"{label}: member '{duplicate}' appears twice; refused (readers disagree on which is used)")
    first = names[0].split("/", 1)[0]
    root = first if all(n.startswith(first + "/") for n in names) else ""
    return {(i.filename[len(root) + 1:] if root else i.filename): i for i in infos}


def _check_sizes(archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], label: str) -> None:
    """Refuse encrypted or compressed members (torch.export.save stores members as they are: no zip bombs) and
    members whose declared size runs past the end of the file, before any is read."""
    stream: Any = archive.fp  # the file (or buffer) the archive reads
    position = stream.tell()
    size = int(stream.seek(0, os.SEEK_END))
    stream.seek(position)
    for name, info in members.items():
        if info.flag_bits & 0x1:
            raise TempcalError(f"{label}: member '{name}' is encrypted; not an exported program")
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise TempcalError(f"{label}: member '{name}' is compressed or damaged (torch.export.save stores members "
                               "uncompressed); save the program again")
        if info.header_offset + info.file_size > size:
            raise TempcalError(f"{label}: member '{name}' declares {info.file_size} bytes at offset "
                               f"{info.header_offset}, past the end of the file ({size} bytes); damaged or truncated")


def _refuse_other_formats(members: dict[str, zipfile.ZipInfo], label: str) -> None:
    """One-line refusals for zip files that are not new-format exported programs."""
    names = set(members)
    if names & set(_LEGACY_MEMBERS):
        raise TempcalError(f"{label}: legacy torch.export archive (torch 2.7 or older), whose loader unpickles "
                           "its members without weights_only; refused: load and save it again with a current torch")
    if "constants.pkl" in names and any(n.startswith("code/") for n in names):
        raise TempcalError(f"{label}: a TorchScript model, not an exported program (give it a TorchScript suffix "
                           f"such as .ts, or convert it with {param('save_model')} PATH.pt2)")
    if "data.pkl" in names:
        raise TempcalError(f"{label}: a torch.save archive (pickled objects), not an exported program; refused")


def _read(archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], name: str, label: str,
          limit: int | None = None) -> bytes:
    """The bytes of one member (CRC-checked by zipfile), at most ``limit`` of them, with one-line errors naming it."""
    if name not in members:
        raise TempcalError(f"{label}: member '{name}' is missing")
    if limit is not None and members[name].file_size > limit:
        raise TempcalError(f"{label}: member '{name}' declares {members[name].file_size} bytes, more than the "
                           f"{limit} tempcal reads for it; refused")
    try:
        return archive.read(members[name])
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError) as exc:
        raise TempcalError(f"{label}: member '{name}' is damaged ({error_line(exc, last=False)})") from None


def _check_program(archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], program: str,
                   label: str) -> tuple[set[str], bool]:
    """Check one program's weights, constants and sample inputs; the members it needs, and whether any is off-CPU."""
    for legacy in (f"{_WEIGHTS}{program}.pt", f"{_CONSTANTS}{program}.pt"):
        if legacy in members:
            raise TempcalError(f"{label}: member '{legacy}': legacy pickled state, which torch.export.load unpickles "
                               "(falling back to weights_only=False); refused: save the program again")
    needed: set[str] = set()
    non_cpu = False
    for directory, kind in ((_WEIGHTS, "weights"), (_CONSTANTS, "constants")):
        config_name = f"{directory}{program}_{kind}_config.json"
        config = _json_member(archive, members, config_name, label)
        entries = config.get("config") if isinstance(config, dict) else None
        if not isinstance(entries, dict):
            raise TempcalError(f"{label}: member '{config_name}' is not a payload config")
        needed.add(config_name)
        for fqn, entry in entries.items():
            member, off_cpu = _check_payload(members, directory, str(fqn), entry, config_name, label)
            needed.add(member)
            non_cpu |= off_cpu
    sample = f"{_SAMPLE_INPUTS}{program}.pt"
    _check_sample_inputs(_read(archive, members, sample, label, _SAMPLE_LIMIT), sample, label)
    member = f"{_MODELS}{program}.json"
    check_program_json(_json_member(archive, members, member, label), label, member)
    return needed, non_cpu


def _json_member(archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], name: str, label: str) -> Any:
    """A member parsed as JSON (one-line errors for a missing or malformed member)."""
    data = _read(archive, members, name, label, _JSON_LIMIT)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise TempcalError(f"{label}: member '{name}' is not valid JSON ({error_line(exc, last=False)})") from None


def _check_payload(members: dict[str, zipfile.ZipInfo], directory: str, fqn: str, entry: Any, config: str,
                   label: str) -> tuple[str, bool]:
    """Refuse a weight or constant that torch would unpickle; check a raw tensor's record covers its shape."""
    if not isinstance(entry, dict) or not isinstance(entry.get("path_name"), str):
        raise TempcalError(f"{label}: member '{config}': entry '{fqn}' is malformed")
    path_name: str = entry["path_name"]
    member = directory + path_name
    where = f"{label}: member '{member}' ({fqn!r})"
    if path_name.startswith("custom_obj_"):
        raise TempcalError(f"{where}: a TorchScript custom-class object, which torch.export.load unpickles with "
                           "torch._C._pickle_load_obj; refused")
    if path_name.startswith("opaque_obj_"):
        raise TempcalError(f"{where}: an opaque Python object, which torch.export.load unpickles with plain "
                           "pickle.loads; refused")
    if entry.get("use_pickle") is not False:
        raise TempcalError(f"{where}: a pickled tensor, which torch.export.load unpickles with weights_only=False; "
                           "refused")
    prefix = "weight_" if directory == _WEIGHTS else "tensor_"
    if not re.fullmatch(re.escape(prefix) + r"\d+", path_name):
        raise TempcalError(f"{where}: unexpected record name; refused")
    if member not in members:
        raise TempcalError(f"{where}: record is missing")
    meta = entry.get("tensor_meta")
    need, itemsize, device = _tensor_extent(meta, where)
    size = members[member].file_size
    if size % itemsize or need > size or (size == 0 and need > 0):
        raise TempcalError(f"{where}: record holds {size} bytes but the tensor needs {need} "
                           f"({itemsize}-byte elements); damaged")
    return member, device != "cpu"


def _tensor_extent(meta: Any, where: str) -> tuple[int, int, str]:
    """(bytes a raw tensor spans in its record, element size, device type) from its serialized metadata."""
    if not isinstance(meta, dict):
        raise TempcalError(f"{where}: no tensor metadata")
    itemsize = _ELEMENT_SIZE.get(meta.get("dtype"))  # type: ignore[arg-type]
    if itemsize is None:
        raise TempcalError(f"{where}: unsupported dtype code {meta.get('dtype')!r}")
    if meta.get("layout", _STRIDED) != _STRIDED:
        raise TempcalError(f"{where}: not a dense (strided) tensor")
    if not isinstance(meta.get("sizes"), list) or not isinstance(meta.get("strides"), list):
        raise TempcalError(f"{where}: malformed tensor metadata")
    sizes = [_as_int(v, where) for v in meta["sizes"]]
    strides = [_as_int(v, where) for v in meta["strides"]]
    offset = _as_int(meta.get("storage_offset", {"as_int": 0}), where)
    if len(sizes) != len(strides) or min([offset, *sizes, *strides]) < 0:
        raise TempcalError(f"{where}: malformed sizes or strides")
    device = meta.get("device")
    device_type = str(device.get("type", "cpu")) if isinstance(device, dict) else "cpu"
    span = 0 if 0 in sizes else offset + sum((n - 1) * s for n, s in zip(sizes, strides, strict=True)) + 1
    return span * itemsize, itemsize, device_type


def _as_int(value: Any, where: str) -> int:
    """A serialized SymInt that must be a plain integer (``{"as_int": n}``)."""
    if isinstance(value, dict) and set(value) == {"as_int"}:
        number = value["as_int"]
        if isinstance(number, int) and not isinstance(number, bool):
            return number
    raise TempcalError(f"{where}: symbolic or malformed tensor size; refused")


def _check_sample_inputs(blob: bytes, member: str, label: str) -> None:
    """Refuse sample inputs that ``torch.load(weights_only=True)`` would reject (torch.export.load would retry
    them with ``weights_only=False``); the pickle is disassembled by torch's own check, never run."""
    if not blob:
        return
    where = f"{label}: member '{member}'"
    _check_inner_zip(blob, where)
    import pickle

    import torch

    try:
        unsafe = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(blob)))
    except (pickle.UnpicklingError, ValueError, RuntimeError, EOFError, OSError, UnicodeDecodeError) as exc:
        raise TempcalError(f"{where}: pickle that torch's weights-only unpickler cannot read "
                           f"({error_line(exc, last=False)}), which torch.export.load would unpickle with "
                           "weights_only=False; refused") from None
    if unsafe:
        raise TempcalError(f"{where}: pickle with global '{unsafe[0]}' (not allowed by torch's weights-only "
                           "unpickler), which torch.export.load would unpickle with weights_only=False; refused")


def _check_inner_zip(blob: bytes, where: str) -> None:
    """The sample inputs must be a torch.save archive: one ``data.pkl``, every record stored within the member."""
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as inner:
            infos = inner.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError,
            RuntimeError) as exc:
        raise TempcalError(f"{where}: not a torch.save archive ({error_line(exc, last=False)}); refused") from None
    pickles = [i.filename for i in infos if i.filename.endswith(".pkl")]
    if len(pickles) != 1 or not pickles[0].endswith("data.pkl"):
        raise TempcalError(f"{where}: not a torch.save archive of tensors; refused")
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size \
                or info.header_offset + info.compress_size > len(blob):
            raise TempcalError(f"{where}: record '{info.filename}' is compressed or larger than the member "
                               "(torch.save stores records uncompressed); refused")


# -- the checked copy that torch reads ------------------------------------------------------------
def write_checked_copy(archive: zipfile.ZipFile, info: Pt2Info, destination: str) -> None:
    """Write the members of ``info.keep`` into a new archive; weights mapped to the CPU, sample inputs empty."""
    from torch.export.pt2_archive import PT2ArchiveWriter

    members = _members(archive, info.path)
    with PT2ArchiveWriter(destination) as writer:
        for name in info.keep:
            data = _read(archive, members, name, info.path)
            if name.endswith("_config.json"):
                data = _on_cpu(data)
            elif name == f"{_MODELS}{PROGRAM}.json":
                data = without_guards(data)
            writer.write_bytes(name, data)
        writer.write_bytes(f"{_SAMPLE_INPUTS}{PROGRAM}.pt", b"")  # torch reads b"" as "no example inputs"


def _on_cpu(config: bytes) -> bytes:
    """A payload config with every tensor's device set to the CPU (a GPU-saved program loads anywhere)."""
    parsed = json.loads(config)
    for entry in parsed["config"].values():
        entry["tensor_meta"]["device"] = {"type": "cpu", "index": None}
    return json.dumps(parsed).encode("utf-8")


__all__ = ["PROGRAM", "Pt2Info", "inspect_archive", "open_archive", "write_checked_copy"]

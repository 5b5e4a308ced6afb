"""A causal language model run over texts as SOURCE (``--lm MODEL --text FILE``): the model runs once, its final
hidden states are kept, and every later pass computes the logits from them as ``--head`` does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ..errors import TempcalError, param
from ..sources.base import Keep, Kept, OpenedSource, SourceKind, SourceOptions
from .command import RECORD_NAME, read_record, set_generation_temperature, write_record
from .texts import CHARS_PER_TOKEN, read_texts


@dataclass
class LmRun:
    """One text file run through the model: its texts, their tokens, the forward pass and where the rows are."""

    texts: Any  # texts.Texts
    tokenized: Any  # forward.Tokenized
    stats: Any  # forward.ForwardStats
    store: Any  # hidden.HiddenStore
    max_length: int
    batch_size: int
    batch_tokens: int | None
    tokenize_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        stats, tokenized = self.stats, self.tokenized
        padded = stats.tokens + stats.padded_tokens
        return {
            "path": str(self.texts.path), "sha256": self.texts.sha256, "text_field": self.texts.field,
            "texts": len(self.texts), "texts_cut": sum(self.texts.cut), "tokens": tokenized.tokens,
            "rows": tokenized.rows,
            "texts_at_max_length": sum(len(t) >= self.max_length for t in tokenized.ids),
            "max_length": self.max_length, "batch_size": self.batch_size, "batch_tokens": self.batch_tokens,
            "batches": stats.batches, "padding_fraction": stats.padded_tokens / padded if padded else 0.0,
            "tokenize_seconds": self.tokenize_seconds, "forward_seconds": stats.seconds,
            "tokens_per_second": stats.tokens / stats.seconds if stats.seconds > 0 else float("inf"),
            "forward_tokens": stats.tokens, "hidden_storage": "file" if self.store.spilled else "memory",
            "hidden_bytes": self.store.nbytes,
        }


@dataclass
class LmSource(OpenedSource):
    """A text file run through a causal LM: ``data`` computes the logits from the stored final hidden states."""

    lm: Any = None  # model.CausalLM, reused for --eval and OOD texts
    run: LmRun | None = None
    related: list[LmSource] = field(default_factory=list)  # --eval and OOD texts run through the same model

    @property
    def name(self) -> str:
        return self.label or f"{self.lm.folder} on {self.run.texts.path if self.run else '?'}"

    def lm_json(self) -> dict[str, Any]:
        """The model and every text file it ran over: what the JSON output says under ``lm``."""
        lm, head = self.lm, self.lm.head
        runs = [self.run, *(r.run for r in self.related)]
        return {"model": str(lm.folder), "dtype": str(lm.dtype).removeprefix("torch."),
                "device": str(lm.input_device), "device_map": lm.device_map, "load_seconds": lm.load_seconds,
                "vocab": head.vocab, "width": head.width,
                "logit_scale": head.scale, "softcap": head.softcap, "head_check_difference": lm.probe_difference,
                "texts": [run.to_json() for run in runs if run is not None]}

    def keep(self, temperature: float, ask: Keep) -> Kept:
        """T into ``MODEL/tempcal.json`` (or the record at ``ask.output``) with the texts, ``ask.settings`` and
        ``ask.results`` unless ``ask.store`` is False; into ``generation_config.json`` when ``ask.generation``; the
        hidden states at ``ask.save_hidden``."""
        lines = self.keep_hidden(ask.save_hidden)
        written = [self.record_temperature(temperature, ask.output, ask.settings, ask.results)] if ask.store else []
        if ask.generation:
            written.append(set_generation_temperature(self.lm.folder, temperature, self._generation_defaults))
        return Kept([str(path) for path in written],
                    lines + [f"wrote temperature = {temperature!r} into {path}" for path in written])

    def write_temperature(self, temperature: float, output: str | Path | None = None,
                          extra: Mapping[str, str | None] | None = None) -> list[Path]:
        """T into ``MODEL/tempcal.json`` (or the record at ``output``), with the texts (``extra`` metadata, such as
        per-group temperatures, goes into the record's results)."""
        results = {k: v for k, v in (extra or {}).items() if v is not None}
        return [self.record_temperature(temperature, output, None, results)]

    def record_temperature(self, temperature: float, output: str | Path | None, settings: Mapping[str, Any] | None,
                           results: Mapping[str, Any] | None) -> Path:
        """T, the model, the texts fitted on, ``settings`` and ``results`` into ``MODEL/tempcal.json`` or ``output``."""
        assert self.run is not None
        texts = {key: value for key, value in self.run.to_json().items()
                 if key in ("path", "sha256", "text_field", "texts", "tokens", "rows", "max_length")}
        lm = self.lm_json()
        model = {"folder": lm["model"], **{key: lm[key] for key in ("dtype", "vocab", "logit_scale", "softcap")}}
        record = {"model": model, "texts": texts, "settings": dict(settings or {})}
        if results:
            record["results"] = dict(results)
        target = Path(output) if output is not None else self.lm.folder / RECORD_NAME
        return write_record(target, temperature, record)

    def _generation_defaults(self) -> dict[str, Any]:
        """The generation configuration transformers derives from the model's (for a folder without one)."""
        from transformers import GenerationConfig

        return GenerationConfig.from_model_config(self.lm.model.config).to_diff_dict()

    def keep_hidden(self, path: str | os.PathLike | None) -> list[str]:
        """``--save-hidden``: the hidden states and labels kept at ``path`` (nothing without it); the line saying so."""
        from ..core import parallel
        from .hidden import save_hidden

        if path is None:
            return []
        if parallel.active():
            raise TempcalError(f"{param('save_hidden')} under torchrun: each process holds only its share of the rows")
        assert self.run is not None
        metadata = {"tempcal.lm_model": str(self.lm.folder), "tempcal.texts": str(self.run.texts.path),
                    "tempcal.texts_sha256": self.run.texts.sha256, "tempcal.max_length": str(self.run.max_length)}
        saved = save_hidden(path, self.data.hidden, metadata)  # type: ignore[attr-defined]
        return [f"wrote the hidden states and labels to {saved} (a SOURCE for --head {self.lm.folder})"]


class LmKind(SourceKind):
    """Text files run through ``--lm MODEL``; T goes into ``MODEL/tempcal.json``."""

    name = "lm"

    def claims(self, paths: list[Path], options: SourceOptions) -> bool:
        return getattr(options, "lm", None) is not None

    def open(self, paths: list[Path], options: SourceOptions, *, labels_optional: bool = False) -> OpenedSource:
        from .model import load_causal_lm

        self._check_options(paths, options)
        assert options.lm is not None
        lm = load_causal_lm(options.lm, options.device, device_map=options.device_map)
        opened = self.run(lm, paths[0], options)
        if options.react is not None:  # ReAct, as --head clips: at the percentile of SOURCE's hidden states
            from ..sources.head import react_threshold

            react = react_threshold(opened.data.hidden, options.react, options.device, opened.name)  # type: ignore
            opened.data.clip, opened.data.react = react.threshold, react  # type: ignore[attr-defined]
        return opened

    def _check_options(self, paths: list[Path], options: SourceOptions) -> None:
        if len(paths) != 1:
            raise TempcalError(f"{param('lm')} runs the model over one text file at a time; got {len(paths)}")
        self.refuse_probs(options, f"with {param('lm')} tempcal computes the logits")
        if options.head is not None:
            raise TempcalError(f"{param('lm')} uses the model's own output layer; drop {param('head')}")
        if options.inputs is not None:
            raise TempcalError(f"{param('lm')} runs over {param('text')} files; drop {param('inputs')}")

    def open_related(self, opened: OpenedSource, other: Any, *, labels_optional: bool = False) -> OpenedSource:
        """Another text file (``--eval``, ``--ood-text``) through the model ``opened`` already loaded."""
        assert isinstance(opened, LmSource)
        paths = [Path(other)] if isinstance(other, (str, os.PathLike)) else [Path(p) for p in other]
        if len(paths) != 1:
            raise TempcalError(f"{paths[0]}: with {param('lm')} each text file is read on its own")
        related = self.run(opened.lm, paths[0], opened.options)
        related.data.clip, related.data.react = opened.data.clip, opened.data.react  # type: ignore[attr-defined]
        opened.related.append(related)
        return related

    def run(self, lm: Any, path: Path, options: SourceOptions) -> LmSource:
        """The model over the texts in ``path``: the next-token rows as a source of logits."""
        from ..core import parallel
        from ..sources.head import HeadLogits
        from .forward import tokenize
        from .hidden import PassCounter, StoredHidden
        from .model import check_head, max_length

        began = time.perf_counter()
        length = max_length(lm, options.max_length)
        texts = read_texts(path, options.text_field, max_chars=CHARS_PER_TOKEN * (length + 1))
        tokenized = tokenize(lm, texts.texts, texts.lines, str(path), length)
        tokenize_seconds = time.perf_counter() - began
        if lm.probe_difference is None:
            check_head(lm, max(tokenized.ids, key=len).tolist())
        lo, hi = parallel.share(tokenized.rows) if parallel.active() else (0, tokenized.rows)
        store, stats = _forward(lm, tokenized, options, lo, hi, path)
        hidden = StoredHidden(store, tokenized.labels, progress=PassCounter(f"{lm.folder.name} head", options.progress))
        run = LmRun(texts, tokenized, stats, store, length, options.batch_size, options.batch_tokens, tokenize_seconds)
        data = HeadLogits(cast(Any, hidden), lm.head)  # StoredHidden reads rows as ShardedLogits does
        source = LmSource([lm.folder / RECORD_NAME], data, None, self, options, lm=lm, run=run)
        source.warnings.extend(_short_cuts(texts, tokenized, length))
        try:
            source.stored = read_record(lm.folder)
        except TempcalError as exc:  # reported if the stored T is asked for; a fit replaces the record
            source.stored_problem = exc
        return source


def _short_cuts(texts: Any, tokenized: Any, length: int) -> list[str]:
    """A warning when a text cut at the character budget gave fewer than ``length`` tokens (its whole line might
    have given more)."""
    short = [line for line, cut, ids in zip(texts.lines, texts.cut, tokenized.ids, strict=True)
             if cut and len(ids) < length]
    if not short:
        return []
    return [f"{texts.path}: {len(short)} text(s) (first: line {short[0]}) cut at {CHARS_PER_TOKEN * (length + 1)} "
            f"characters before tokenising gave fewer than {length} tokens; the rest of each line was not read"]


def _forward(lm: Any, tokenized: Any, options: SourceOptions, lo: int, hi: int, path: Path) -> tuple[Any, Any]:
    """The forward pass over the rows ``[lo, hi)`` into a new store (memory, or a temporary file), with a bar."""
    from .forward import run_forward, texts_holding
    from .hidden import DelayedBar, HiddenStore, memory_budget

    store = HiddenStore(lo, hi, lm.head.width, lm.dtype, budget=memory_budget(), folder=spill_folder(lm, options))
    total = sum(len(tokenized.ids[i]) for i in texts_holding(tokenized, lo, hi))  # the tokens the bar will see
    with DelayedBar(f"running {lm.folder.name} on {path.name}", total, "tokens", enabled=options.progress) as bar:
        stats = run_forward(lm, tokenized, store, lo=lo, hi=hi, batch_size=options.batch_size,
                            batch_tokens=options.batch_tokens, progress=bar.advance)
    return store, stats


def spill_folder(lm: Any, options: SourceOptions) -> Path | None:
    """Where hidden states too large for memory go: ``--spill-dir``, else the model's folder when it is writable
    (beside the record T goes into), else the system's temporary folder (None)."""
    if options.spill_dir is not None:
        folder = Path(options.spill_dir)
        if not folder.is_dir():
            raise TempcalError(f"{param('spill_dir')} {folder}: not a folder")
        return folder
    return lm.folder if os.access(lm.folder, os.W_OK) else None


__all__ = ["LmKind", "LmSource"]

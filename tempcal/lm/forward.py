"""One forward pass of a causal LM over texts: row ``j`` of a text is its position ``j`` labelled with token ``j + 1``;
texts run longest first in right-padded batches, their final hidden states streamed into a store.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ..core.precision import no_tf32
from ..errors import TempcalError, param
from ..models.base import error_line, is_out_of_memory, reraise_control
from .model import CausalLM, final_hidden

#: Padded tokens per batch when ``--batch-tokens`` is not given, per device type.
BATCH_TOKENS = {"cpu": 16384, "cuda": 65536}
#: Texts tokenised per call of the tokenizer.
TOKENIZE_TEXTS = 1024


@dataclass
class Tokenized:
    """Token ids per text, each text's first row, and the labels of every row (the next tokens)."""

    ids: list[torch.Tensor]
    starts: torch.Tensor  # [texts + 1]: text i's rows are starts[i] .. starts[i + 1] - 1
    labels: torch.Tensor  # [rows] int64

    @property
    def rows(self) -> int:
        return int(self.starts[-1])

    @property
    def tokens(self) -> int:
        return sum(len(t) for t in self.ids)


@dataclass
class ForwardStats:
    """What the forward pass did: the tokens it ran, the padding it added, its batches and time."""

    tokens: int
    padded_tokens: int
    batches: int
    seconds: float


def tokenize(lm: CausalLM, texts: list[str], lines: list[int], where: str, length: int) -> Tokenized:
    """Every text's token ids (at most ``length``), checked against the model's vocabulary, and the row labels."""
    ids: list[torch.Tensor] = []
    for first in range(0, len(texts), TOKENIZE_TEXTS):
        batch = texts[first : first + TOKENIZE_TEXTS]
        try:
            encoded = lm.tokenizer(batch, add_special_tokens=True, truncation=True, max_length=length + 1,
                                   return_attention_mask=False)["input_ids"]
        except BaseException as exc:  # a panic of the tokenizers library is a BaseException
            reraise_control(exc)
            raise TempcalError(f"{where}: the tokenizer of {lm.folder} fails on the texts from line "
                               f"{lines[first]}: {error_line(exc, last=False)}") from None
        ids.extend(torch.tensor(tokens[:length], dtype=torch.int64) for tokens in encoded)
    counts = torch.tensor([max(len(t) - 1, 0) for t in ids], dtype=torch.int64)
    starts = torch.zeros(len(ids) + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=starts[1:])
    _check_vocabulary(lm, ids, lines, where)
    labels = torch.cat([t[1:] for t in ids]) if ids else torch.empty(0, dtype=torch.int64)
    if labels.numel() == 0:
        raise TempcalError(f"{where}: no text has two tokens, so there is no next token to predict")
    return Tokenized(ids, starts, labels)


def _check_vocabulary(lm: CausalLM, ids: list[torch.Tensor], lines: list[int], where: str) -> None:
    """Token ids outside the model's vocabulary: a tokenizer that does not belong to the model."""
    vocab = lm.head.vocab
    for i, tokens in enumerate(ids):
        if tokens.numel() and (int(tokens.max()) >= vocab or int(tokens.min()) < 0):
            bad = int(tokens.max()) if int(tokens.max()) >= vocab else int(tokens.min())
            raise TempcalError(f"{where}: line {lines[i]}: token id {bad} is outside the vocabulary of {lm.folder} "
                               f"(V = {vocab}); the tokenizer does not match the model")


def texts_holding(tokenized: Tokenized, lo: int, hi: int) -> list[int]:
    """The texts with rows in ``[lo, hi)`` (a one-token text has none: it predicts nothing)."""
    starts = tokenized.starts
    return [i for i in range(len(tokenized.ids)) if starts[i + 1] > starts[i] and starts[i] < hi
            and starts[i + 1] > lo]


def plan_batches(tokenized: Tokenized, lo: int, hi: int, batch_size: int, batch_tokens: int) -> list[list[int]]:
    """The texts holding rows ``[lo, hi)``, longest first, in batches of at most ``batch_size`` texts and
    ``batch_tokens`` padded tokens (a longer text runs alone)."""
    wanted = texts_holding(tokenized, lo, hi)
    wanted.sort(key=lambda i: -len(tokenized.ids[i]))
    batches: list[list[int]] = []
    for i in wanted:
        current = batches[-1] if batches else None
        width = len(tokenized.ids[current[0]]) if current else 0  # the first text is the batch's longest
        if current and len(current) < batch_size and (len(current) + 1) * width <= batch_tokens:
            current.append(i)
        else:
            batches.append([i])
    return batches


def run_forward(lm: CausalLM, tokenized: Tokenized, store: Any, *, lo: int, hi: int, batch_size: int,
                batch_tokens: int | None, progress: Any = None) -> ForwardStats:
    """Run the model over the texts holding rows ``[lo, hi)``, each row's final hidden state into ``store.write``; on
    CUDA a batch's rows reach the host (:class:`HostCopies`) while the next runs; ``progress(tokens)`` per batch."""
    if batch_tokens is None:
        batch_tokens = BATCH_TOKENS.get(lm.input_device.type, BATCH_TOKENS["cuda"])
    batches = plan_batches(tokenized, lo, hi, batch_size, batch_tokens)
    most = max((sum(len(tokenized.ids[i]) for i in batch) for batch in batches), default=0)
    copies = HostCopies(lm.input_device, most, lm.head.width, lm.dtype)
    began = time.perf_counter()
    tokens = padded = 0
    pending: tuple[list[int], Any] | None = None
    with torch.inference_mode(), no_tf32():
        for number, batch in enumerate(batches):
            width = len(tokenized.ids[batch[0]])
            arrived = copies.send(_run_batch(lm, tokenized, batch, width, number))
            if pending is not None:
                _store(tokenized, store, *pending, lo, hi)
            pending = (batch, arrived)
            real = sum(len(tokenized.ids[i]) for i in batch)
            tokens, padded = tokens + real, padded + width * len(batch) - real
            if progress is not None:
                progress(real)
        if pending is not None:
            _store(tokenized, store, *pending, lo, hi)
    return ForwardStats(tokens, padded, len(batches), time.perf_counter() - began)


def _run_batch(lm: CausalLM, tokenized: Tokenized, batch: list[int], width: int, number: int) -> torch.Tensor:
    """One padded batch through the model: each text's rows (its positions but the last), text after text, on the
    model's device."""
    ids = torch.zeros(len(batch), width, dtype=torch.int64)
    mask = torch.zeros(len(batch), width, dtype=torch.int64)
    keep = []  # flat positions that have a next token
    for j, i in enumerate(batch):
        n = len(tokenized.ids[i])
        ids[j, :n] = tokenized.ids[i]
        mask[j, :n] = 1
        keep.append(torch.arange(j * width, j * width + n - 1))
    try:
        hidden = final_hidden(lm, ids.to(lm.input_device), mask.to(lm.input_device))
        flat = hidden.reshape(-1, hidden.shape[-1])
        return flat.index_select(0, torch.cat(keep).to(flat.device))
    except Exception as exc:
        where = f"batch {number} ({len(batch)} texts of up to {width} tokens)"
        if is_out_of_memory(exc):
            raise TempcalError(f"{lm.folder}: out of memory on {where}; lower {param('batch_tokens')} or "
                               f"{param('batch_size')}") from None
        raise TempcalError(f"{lm.folder} raised on {where}: {error_line(exc)}") from None


def _store(tokenized: Tokenized, store: Any, batch: list[int], arrived: Any, lo: int, hi: int) -> None:
    """A batch's rows (once on the host) into the store: each text's rows inside ``[lo, hi)``."""
    rows = arrived()
    offset = 0
    for i in batch:
        first, stop = int(tokenized.starts[i]), int(tokenized.starts[i + 1])
        a, b = max(first, lo), min(stop, hi)
        store.write(a, rows[offset + a - first : offset + b - first])
        offset += stop - first


class HostCopies:
    """Rows on the model's device copied to the host: on CUDA into two reused pinned buffers without waiting (the
    caller takes a batch's rows after sending the next); elsewhere at once. ``send`` returns the way to get them."""

    def __init__(self, device: torch.device, rows: int, width: int, dtype: torch.dtype):
        pinned = device.type == "cuda" and rows > 0
        self.buffers = [torch.empty(rows * width, dtype=dtype, pin_memory=True) for _ in range(2)] if pinned else []
        self.turn = 0

    def send(self, rows: torch.Tensor) -> Any:
        if not self.buffers or rows.device.type != "cuda":
            host = rows.to("cpu")
            return lambda: host
        buffer = self.buffers[self.turn][: rows.numel()].view(rows.shape)
        self.turn ^= 1  # the other buffer's rows were taken before this send (see run_forward)
        done = torch.cuda.Event()
        with torch.cuda.device(rows.device):  # the rows' device (the last GPU under a device_map)
            buffer.copy_(rows, non_blocking=True)
            done.record(torch.cuda.current_stream(rows.device))

        def arrived() -> torch.Tensor:
            done.synchronize()
            return buffer

        return arrived


__all__ = ["ForwardStats", "Tokenized", "plan_batches", "run_forward", "texts_holding", "tokenize"]

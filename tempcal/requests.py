"""What a command was asked to do, as typed values (what to read, compute and write), built in one place per command
from its parameters; nothing here imports torch, so ``tempcal --help`` and usage errors stay fast."""

from __future__ import annotations

from dataclasses import dataclass, field

from .sources.base import SourceOptions


@dataclass(frozen=True)
class Outputs:
    """What a command writes and how much it says: the JSON, the figures and pages, and the files it may keep."""

    json_out: str | None = None  # '-': standard output
    plot: str | None = None
    html: str | None = None
    markdown: str | None = None
    quiet: bool = False
    output: str | None = None  # fit: a copy of SOURCE holding T (with --lm: where the record of T goes)
    no_write: bool = False  # fit: T is not written back
    save_model: str | None = None
    save_logits: str | None = None
    save_hidden: str | None = None  # --lm: the hidden states, kept as a SOURCE for --head runs
    scores: str | None = None  # ood: the per-sample scores
    write_generation_config: bool = False  # fit --lm: temperature = T in MODEL/generation_config.json

    @property
    def progress(self) -> bool:
        """Whether progress is drawn on standard error: not when the JSON goes to standard output, nor under --quiet."""
        return self.json_out != "-" and not self.quiet

    def files(self) -> dict[str, str | None]:
        """The files asked for, by flag, for the checks before any work (``--output`` is the command's to name)."""
        return {"--json": self.json_out, "--scores": self.scores, "--plot": self.plot, "--html": self.html,
                "--markdown": self.markdown, "--save-model": self.save_model, "--save-logits": self.save_logits}


@dataclass(frozen=True)
class Texts:
    """The texts an ``--lm`` run reads: SOURCE's (``--text``) and the out-of-distribution sets' (``--ood-text``)."""

    text: str | None = None
    ood_text: list[str] | None = None


@dataclass(frozen=True, kw_only=True)
class Request:
    """What every reading command is given: SOURCE, how to read it, the texts of an ``--lm`` run, what to write, and
    the groups (``--group-by``), resamples and seed of its figures."""

    source: list[str] | None
    reading: SourceOptions
    outputs: Outputs
    texts: Texts = field(default_factory=Texts)
    chunk_rows: int | None = None
    group_by: str | None = None
    bootstrap: int = 0
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class FitRequest(Request):
    """``tempcal fit``: how T is fitted and what it is reported on."""

    eval_file: str | None = None
    val_fraction: float = 0.5  # as given (or defaulted)
    split: float | None = None  # the share that fits T; None: the default (``--val-fraction`` not given)
    folds: int | None = None
    group_prior: float | None = None
    objective: str = "nll"
    bins: int = 15
    max_ece: float | None = None
    estimators: str | None = None  # as given: names, comma-separated, or 'all'
    conformal_alpha: list[float] | None = None


@dataclass(frozen=True, kw_only=True)
class ReportRequest(Request):
    """``tempcal report``: the temperatures and the figures at each."""

    taus: list[str] | None = None
    sweep: str | None = None  # START:STOP:COUNT
    bins: int = 15
    estimators: str | None = None
    eval_rows: bool = False
    conformal_alpha: list[float] | None = None


@dataclass(frozen=True, kw_only=True)
class OodRequest(Request):
    """``tempcal ood``: the out-of-distribution sets, the scores and temperatures, the gates."""

    ood_files: list[str] | None = None
    ood_inputs: list[str] | None = None
    taus: list[str] | None = None
    score: str = "msp"
    gen_gamma: float = 0.1
    gen_top: int = 100
    odin_eps: float | None = None
    min_auroc: float | None = None
    max_fpr95: float | None = None


__all__ = ["FitRequest", "OodRequest", "Outputs", "ReportRequest", "Request", "Texts"]

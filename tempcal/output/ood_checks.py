"""What an OOD report's figures do not say by themselves: energy and MaxLogit on probabilities are not the scores
of their papers (so never named the best), and a best tau whose scores float32 cannot tell apart."""

from __future__ import annotations

from ..metrics.detection import float32_loss, sums_to_zero
from ..scores import score_label
from ..workflows.ood import OodBestOverall, OodReport, best_overall_sentence

#: The scores that mean nothing of their own on log-probabilities, and what each is there.
ON_LOG_PROBABILITIES = {
    "energy": "energy is log(sum p), 0 up to rounding, at tau = 1 (elsewhere (tau - 1) times a Renyi entropy)",
    "maxlogit": "MaxLogit is log(max p) / tau, which ranks as MSP at tau = 1",
}


def on_probabilities(report: OodReport) -> bool:
    """Whether the logits are log-probabilities: SOURCE was read so (``--probs``, or a T stored as fitted on
    probabilities), or, with energy at tau = 1 among the figures, every row's ``logsumexp(z)`` is 0 up to the 1e-3
    probabilities are checked to."""
    if report.binary:  # one column of probabilities becomes a log-odds logit, which is a logit
        return False
    probs = None if report.opened is None else report.opened.options.probs
    if probs is not None:
        return bool(probs)
    if "energy" not in report.id_scores or 1.0 not in report.taus:
        return False
    k = report.taus.index(1.0)
    return sums_to_zero(report.id_scores["energy"][k], *(side["energy"][k] for side in report.ood_scores))


def left_out(report: OodReport) -> list[str]:
    """The scores left out of the best: energy and MaxLogit on probabilities."""
    return [s for s in report.scores if s in ON_LOG_PROBABILITIES] if on_probabilities(report) else []


def best_overall(report: OodReport) -> list[OodBestOverall | None]:
    """Per OOD file, the best score and tau among the scores not :func:`left_out` (None when none is left)."""
    excluded = set(left_out(report))
    if not excluded:
        return list(report.best_overall)
    kept = [s for s in report.scores if s not in excluded]
    rows = {ood_file: [m for s in kept for m in report.rows(ood_file, s)] for ood_file in report.ood_files}
    return [best_overall_sentence(report.source, ood_file, rows[ood_file], report.stored_temperature, len(kept),
                                  len(report.taus)) if rows[ood_file] else None for ood_file in report.ood_files]


def best_sentence(report: OodReport, index: int) -> str:
    """The sentence naming OOD file ``index``'s best score and tau (or saying there is none to name)."""
    best = best_overall(report)[index]
    if best is not None:
        return best.sentence
    names = left_out(report)
    verb = "ranks" if len(names) == 1 else "rank"
    return (f"On {report.ood_files[index]} vs {report.source}, no score is named the best: "
            f"{' and '.join(score_label(s) for s in names)} on probabilities {verb} by rounding or as MSP does.")


def caveats(report: OodReport) -> list[str]:
    """Every caveat of the report, as warnings (one line each): why energy and MaxLogit are left out of the best,
    when they are; each OOD file and score whose best tau ranks by digits float32 does not hold."""
    lines = []
    excluded = left_out(report)
    if excluded:
        labels = " and ".join(score_label(s) for s in excluded)
        papers = "is not the score of its paper" if len(excluded) == 1 else "are not the scores of their papers"
        why = "; ".join(ON_LOG_PROBABILITIES[s] for s in excluded)
        lines.append(f"on probabilities (--probs) the logits are log(p): {why}; {labels} {papers}, so left out of "
                     "the best")
    for best in report.best:  # by OOD file, then score
        if best.score in excluded or best.score not in report.id_scores:
            continue
        i, k = report.ood_files.index(best.ood_file), report.taus.index(best.tau)
        id_values, ood_values = report.id_scores[best.score][k], report.ood_scores[i][best.score][k]
        lost, auroc32 = float32_loss(id_values, ood_values, best.auroc)
        if lost:
            m = report.rows(best.ood_file, best.score)[k]
            lines.append(f"{best.ood_file}: {score_label(best.score)}'s best tau = {best.tau:.4g} cannot be deployed "
                         f"in float32: its scores (mean ID {m.mean_id:.7g}, OOD {m.mean_ood:.7g}) differ in digits "
                         f"float32 does not hold; rounded to float32 they give AUROC {auroc32:.4f}, not "
                         f"{best.auroc:.4f}; compute the score in float64 or use a smaller tau")
    return lines


__all__ = ["best_overall", "best_sentence", "caveats", "left_out"]

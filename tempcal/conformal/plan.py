"""The conformal sets formed on the metrics pass: a :class:`~tempcal.metrics.calibration.ReadExtra` that sums each
temperature's sets (:class:`~.passes.SetSums`) on the rows the pass reads and adds them to each result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ..metrics.calibration import CalibrationMetrics, Finish
from .passes import SetSums, Thresholds, set_results


@dataclass(frozen=True)
class ConformalPlan:
    """Conformal sets to form in the metrics pass: the ``alphas`` and, per temperature, each score's thresholds. With
    ``groups`` the sets are summed per group too, handed to ``on_sums`` per temperature (each score's
    ``[num_groups, thresholds, 2]``); with ``judged``, only over the rows it marks."""

    alphas: list[float]
    thresholds: list[Thresholds]
    groups: torch.Tensor | None = None
    num_groups: int = 1
    on_sums: Callable[[float, dict[str, torch.Tensor]], None] | None = None
    judged: torch.Tensor | None = None  # this process's rows whose sets count (bool); None: every row

    def check(self, temperatures: int) -> None:
        if len(self.thresholds) != temperatures:
            raise ValueError(f"{len(self.thresholds)} sets of conformal thresholds for {temperatures} temperatures")

    def visitor(self, first: int, stop: int, device: torch.device) -> PlanSums:
        return PlanSums(replace(self, thresholds=self.thresholds[first:stop]), device)


class PlanSums(SetSums):
    """One read's :class:`SetSums` of a :class:`ConformalPlan`, which then adds each temperature's sets over every
    summed row to its result."""

    def __init__(self, plan: ConformalPlan, device: torch.device):
        super().__init__(plan.thresholds, device, groups=plan.groups, num_groups=plan.num_groups, judged=plan.judged)
        self.plan = plan

    def settle(self) -> Finish:
        reduced = self.reduced()

        def finish(k: int, tau: float, metrics: CalibrationMetrics, rows: int) -> CalibrationMetrics:
            if self.plan.on_sums is not None:
                self.plan.on_sums(tau, reduced[k])
            every = {score: values.sum(0, keepdim=True) for score, values in reduced[k].items()}
            return replace(metrics, conformal=set_results(self.plan.alphas, self.plan.thresholds[k], every, rows))

        return finish


__all__ = ["ConformalPlan", "PlanSums"]

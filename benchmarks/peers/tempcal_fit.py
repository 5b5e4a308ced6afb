"""tempcal: ``fit_temperature`` on the in-memory float32 logits (passes from ``FitResult.passes``).

``--profile`` prints a ``torch.profiler`` table of one extra fit (after the timed ones) on standard error.
"""

from __future__ import annotations

import sys

from _common import Contender, run


def load(args) -> Contender:
    import tempcal

    def fit(inputs):
        result = tempcal.fit_temperature(*inputs, device=args.device)
        if args.profile:
            profile(inputs)
        return result.temperature, result.passes

    def profile(inputs):
        from torch.profiler import ProfilerActivity, profile

        args.profile = False
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            tempcal.fit_temperature(*inputs, device=args.device)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), file=sys.stderr)

    return Contender("tempcal", tempcal.__version__, fit)


if __name__ == "__main__":
    run(load, lambda parser: parser.add_argument("--profile", action="store_true"))

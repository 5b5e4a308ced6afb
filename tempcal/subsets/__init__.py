"""Folds and groups (``--folds K``, ``--group-by KEY``, ``groups=``, ``folds=``): one capability, one package.

``options``: the three options, declared and checked once, and ``fit``'s plan. The fits: ``cells`` (the passes
whose sums are kept per cell of rows, a group within a fold, and a subset's figures from them), ``nll_fits`` and
``ece_fits`` (every subset's T from the global fit's reads), ``fits`` (their entry point, the folds, and the fit
registered as core's ``fit_temperature(groups=, folds=)``). The commands' parts: ``groups`` (each row's group, the
per-group temperatures stored beside T, each row at its own for ``apply``), ``fit_figures`` and ``fit_runs``
(``fit``'s subset fits, figures, conformal sets and JSON blocks), ``report`` (``report --group-by``), ``ood``
(``ood --group-by``). The drawing, at the output layer: ``console`` (the tables) and ``plots`` (the group bars).
Nothing is imported here, so that loading one part loads no other.
"""

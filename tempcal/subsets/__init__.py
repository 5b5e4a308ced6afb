"""Folds and groups (``--folds K``, ``--group-by KEY``, ``groups=``, ``folds=``): one capability, one package.

The fits: ``folds`` (the seeded stratified folds), ``cells`` (the passes whose sums are kept per cell of rows:
a group within a fold), ``nll_fits`` and ``ece_fits`` (every subset's T from the global fit's reads), ``fits``
(their entry point, registered as core's ``fit_temperature(groups=, folds=)``). The commands' parts: ``groups``
(each row's group, the stored per-group temperatures), ``metrics`` (a subset's figures from a pass's sums),
``fit_figures`` (``fit``'s subset fits, figures and JSON blocks), ``report`` (``report --group-by``), ``ood``
(``ood --group-by``), ``apply`` (each row at its group's stored T). The drawing: ``console`` (the tables) and
``plots`` (the group bars). Nothing is imported here, so that loading one part loads no other.
"""

"""Folds and groups (``--folds K``, ``--group-by KEY``, ``groups=``, ``folds=``): one capability, one package.

``options``: the three options, declared and checked once, ``fit``'s plan, and each row's group (read from a
SOURCE, the per-group temperatures stored beside T, each row at its own for ``apply``). ``cells``: the passes whose
sums are kept per cell of rows (a group within a fold) and the figures of a subset from them. ``fits``: every
subset's T from the global fit's reads (``ece_fits`` beside it for ``--objective ece``), the folds, and the fit
registered as core's ``fit_temperature(groups=, folds=)``. The commands' parts: ``fit_runs`` (``fit``'s two subset
runs), ``report`` (``report --group-by``), ``ood`` (``ood --group-by``). The drawing, at the output layer:
``console`` (the tables) and ``plots`` (the group bars). Nothing is imported here, so that loading one part loads no
other.
"""

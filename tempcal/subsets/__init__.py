"""Folds and groups (``--folds K``, ``--group-by KEY``, ``groups=``, ``folds=``): one capability, one package.

``flags``: the three options as the commands declare them. ``options``: their checks, done once, ``fit``'s plan, and
each row's group (read from a SOURCE; for ``apply``, each row at its group's T stored beside T). ``cells``: the
cells of rows (a group within a fold), the passes whose sums are kept per cell, and a subset's figures from them.
``fits``: every subset's T from the global fit's reads (``ece_fits`` beside it for ``--objective ece``), the fit
registered as core's ``fit_temperature(groups=, folds=)``, and ``fit``'s two subset runs. The other commands' parts:
``report`` (``report --group-by``), ``ood`` (``ood --group-by``). The drawing, at the output layer: ``console`` (the
tables) and ``plots`` (the group bars). Nothing is imported here, so that loading one part loads no other.
"""

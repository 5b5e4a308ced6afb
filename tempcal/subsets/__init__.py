"""Folds and groups (``--folds K``, ``--group-by KEY``, ``groups=``, ``folds=``): one capability, one package (its
modules: docs/architecture.md). Nothing is imported here, so that loading one part loads no other.
"""

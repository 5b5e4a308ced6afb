"""A causal language model run over texts as SOURCE (``--lm MODEL --text FILE``): everything only that path needs
(docs/architecture.md, ``lm/``). Importing this package loads nothing: torch and transformers come with a run.
"""

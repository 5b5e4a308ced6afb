"""A causal language model run over texts as SOURCE (``--lm MODEL --text FILE``): everything only that path needs.

:mod:`.options` declares the command-line options, :mod:`.command` checks them and words the outputs,
:mod:`.source` is the source kind (registered in :data:`tempcal.sources.registry.KINDS`), built from
:mod:`.texts` (the text files), :mod:`.model` and :mod:`.checks` (loading the model offline),
:mod:`.forward` (the batched forward pass), :mod:`.hidden` (where the hidden states live) and :mod:`.record`
(``MODEL/tempcal.json``). Importing this package loads nothing: torch and transformers come with a run.
"""

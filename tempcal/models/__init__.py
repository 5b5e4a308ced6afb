"""Models as a SOURCE: recognise the format (detect), load it (one module per format), run it over an
inputs file (inputs, run), write it calibrated or its logits (save), score by ODIN (odin).

To add a format: a module with ``load(path, device) -> LoadedModel`` (and saving, if it can be
written calibrated), recognised in :mod:`tempcal.models.detect`.
"""

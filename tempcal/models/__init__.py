"""Models as a SOURCE: recognise the format (detect), load it (one module per format: export for ``.pt2``, onnx,
torchscript), run it over an inputs file (run), write it calibrated or its logits (save), score by ODIN (odin).

To add a format: a module with ``load(path, device) -> LoadedModel`` (and
``save_calibrated(model, temperature, out_path, *, output_key, check_inputs)``, if it can be written
calibrated), recognised in :mod:`tempcal.models.detect` (``model_format`` and ``FORMAT_NAMES``).
"""

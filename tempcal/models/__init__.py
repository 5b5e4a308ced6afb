"""Models as a SOURCE: detect (which format), one module per format (export for ``.pt2``, onnx, torchscript: each
``load`` and ``save_calibrated``), run (over an inputs file), save (calibrated, or its logits), odin (ODIN scores).
"""

"""tempcal.models.torchscript."""

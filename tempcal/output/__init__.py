"""tempcal.output."""

"""tempcal.io."""

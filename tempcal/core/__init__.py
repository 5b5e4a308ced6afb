"""tempcal.core."""

"""tempcal.sources."""

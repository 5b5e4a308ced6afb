"""tempcal.workflows.common."""

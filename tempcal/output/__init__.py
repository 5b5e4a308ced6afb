"""Everything tempcal shows or writes about its results: console tables, plots, Markdown, JSON, score files."""

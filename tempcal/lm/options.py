"""The command-line options of ``--lm MODEL --text FILE``, declared once: the commands put them in their signatures
(through :mod:`tempcal.cli.options`). Nothing here imports torch.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

#: The panel of ``--help`` that shows these options.
PANEL = "Language models"

Lm = Annotated[Optional[str], typer.Option(
    "--lm", metavar="MODEL", help="A local Hugging Face causal LM folder, run over --text "
    "(pip install 'tempcal[lm]'; no SOURCE then).", rich_help_panel=PANEL)]
Text = Annotated[Optional[str], typer.Option(
    "--text", metavar="FILE", help="Texts for --lm: .txt, one per line, or .jsonl (--text-field).",
    rich_help_panel=PANEL)]
TextField = Annotated[str, typer.Option(
    "--text-field", metavar="NAME", help="The field of a .jsonl text file that holds the text (--lm).",
    rich_help_panel=PANEL)]
MaxLength = Annotated[Optional[int], typer.Option(
    "--max-length", metavar="N", min=2, help="Tokens per text, longer texts cut (--lm; default: the model's limit).",
    rich_help_panel=PANEL)]
BatchTokens = Annotated[Optional[int], typer.Option(
    "--batch-tokens", metavar="N", min=1, help="Padded tokens per --lm batch (16384 on CPU, 65536 on CUDA).",
    rich_help_panel=PANEL)]
DeviceMap = Annotated[Optional[str], typer.Option(
    "--device-map", metavar="MAP", help="transformers' device_map for --lm ('auto': over several GPUs).",
    rich_help_panel=PANEL)]
SaveHidden = Annotated[Optional[str], typer.Option(
    "--save-hidden", metavar="PATH", help="Keep --lm's hidden states as a SOURCE for --head runs.",
    rich_help_panel=PANEL)]
SpillDir = Annotated[Optional[str], typer.Option(
    "--spill-dir", metavar="DIR", help="Folder of --lm's unnamed spill file (default: MODEL, else the temporary "
    "folder).", rich_help_panel=PANEL)]
WriteGenerationConfig = Annotated[bool, typer.Option(
    "--write-generation-config", help="Also set temperature = T in MODEL/generation_config.json (--lm).",
    rich_help_panel=PANEL)]
OodText = Annotated[Optional[list[str]], typer.Option(
    "--ood-text", metavar="FILE", help="Out-of-distribution texts for --lm (.txt or .jsonl); repeatable.",
    rich_help_panel=PANEL)]


__all__ = ["BatchTokens", "DeviceMap", "Lm", "MaxLength", "OodText", "SaveHidden", "SpillDir", "Text", "TextField",
           "WriteGenerationConfig"]

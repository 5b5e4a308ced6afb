"""The command-line options of ``--lm MODEL --text FILE``, declared once: the commands put them in their signatures
(through :mod:`tempcal.cli.options`). Nothing here imports torch.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer


def _option(*flags: str, help: str, **settings: Any) -> Any:
    """A typer option shown in the "Language models" panel of ``--help``."""
    return typer.Option(*flags, help=help, rich_help_panel="Language models", **settings)


Lm = Annotated[Optional[str], _option("--lm", metavar="MODEL", help="A local Hugging Face causal LM folder, run over "
                                      "--text (pip install 'tempcal[lm]'; no SOURCE then).")]
Text = Annotated[Optional[str], _option("--text", metavar="FILE",
                                        help="Texts for --lm: .txt, one per line, or .jsonl (--text-field).")]
TextField = Annotated[str, _option("--text-field", metavar="NAME",
                                   help="The field of a .jsonl text file that holds the text (--lm).")]
MaxLength = Annotated[Optional[int], _option("--max-length", metavar="N", min=2, help="Tokens per text, longer texts "
                                             "cut (--lm; default: the model's limit).")]
BatchTokens = Annotated[Optional[int], _option("--batch-tokens", metavar="N", min=1, help="Padded tokens per --lm "
                                               "batch (16384 on CPU, 65536 on CUDA).")]
DeviceMap = Annotated[Optional[str], _option("--device-map", metavar="MAP",
                                             help="transformers' device_map for --lm ('auto': over several GPUs).")]
SaveHidden = Annotated[Optional[str], _option("--save-hidden", metavar="PATH",
                                              help="Keep --lm's hidden states as a SOURCE for --head runs.")]
SpillDir = Annotated[Optional[str], _option("--spill-dir", metavar="DIR", help="Folder of --lm's unnamed spill file "
                                            "(default: MODEL, else the temporary folder).")]
WriteGenerationConfig = Annotated[bool, _option("--write-generation-config", help="Also set temperature = T in "
                                                "MODEL/generation_config.json (--lm).")]
OodText = Annotated[Optional[list[str]], _option("--ood-text", metavar="FILE", help="Out-of-distribution texts for "
                                                 "--lm (.txt or .jsonl); repeatable.")]


__all__ = ["BatchTokens", "DeviceMap", "Lm", "MaxLength", "OodText", "SaveHidden", "SpillDir", "Text", "TextField",
           "WriteGenerationConfig"]

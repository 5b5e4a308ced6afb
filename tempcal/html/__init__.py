"""``--html PATH``: one self-contained page of a command's results, for reviewers and CI artefacts.

``option``: the option, its check and its writer, registered as an extra output (:mod:`tempcal.output.extra`);
``page``: the page built from the command's result model (every figure set labelled by its
:class:`~tempcal.workflows.basis.Basis`, as the console and the Markdown card label it) through one jinja2 template
with autoescaping (``templates/``); ``figures``: its figures as inline SVG.
"""

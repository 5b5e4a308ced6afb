"""``--html PATH``: one self-contained page of a command's results. ``option`` registers the option as an extra
output, ``page`` builds the page through one autoescaping jinja2 template, ``figures`` draws its inline SVG."""

"""The per-group temperatures a fit with ``--group-by`` keeps beside T: their metadata keys, and reading them back
checked (``apply``, ``report`` and ``inspect``); :func:`tempcal.sources.base.group_metadata` writes them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import DataError, shown_value, temperature_number, temperature_problem

#: The most groups a key may make.
MAX_GROUPS = 100_000
GROUP_KEY = "tempcal.group_key"
GROUP_TEMPERATURES = "tempcal.group_temperatures"


@dataclass(frozen=True)
class StoredGroups:
    """The group key and each group's T, as a fit with ``--group-by`` stored them."""

    key: str
    temperatures: dict[str, float]


def parse_stored_groups(metadata: Mapping[str, str], where: str) -> StoredGroups | None:
    """The per-group temperatures in ``metadata`` (None when there are none); ``where`` starts every error."""
    key, text = metadata.get(GROUP_KEY), metadata.get(GROUP_TEMPERATURES)
    if key is None and text is None:
        return None
    if key is None or text is None:
        present, absent = (GROUP_KEY, GROUP_TEMPERATURES) if text is None else (GROUP_TEMPERATURES, GROUP_KEY)
        raise DataError(f"{where} holds '{present}' without '{absent}' (fix it, or fit again)")
    try:  # integers read as floats: 10**400 is inf (then refused by name), not an OverflowError or a digit limit
        parsed = json.loads(text, parse_int=float)
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict) or len(parsed) > MAX_GROUPS:
        raise DataError(f"{where} '{GROUP_TEMPERATURES}' is not a JSON object of at most {MAX_GROUPS:,} group names "
                        "and temperatures (fix it, or fit again)")
    temperatures = {}
    for name, value in parsed.items():
        number = None if isinstance(value, bool) or not isinstance(value, (int, float)) else temperature_number(value)
        if number is None:
            raise DataError(f"{where} '{GROUP_TEMPERATURES}': group '{name}' has temperature {shown_value(value)}, "
                            f"{temperature_problem(value)} (fix it, or fit again)")
        temperatures[str(name)] = number
    return StoredGroups(key, temperatures)


__all__ = ["GROUP_KEY", "GROUP_TEMPERATURES", "MAX_GROUPS", "StoredGroups", "parse_stored_groups"]

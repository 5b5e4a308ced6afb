"""Project configuration (docs/configuration.md): ``tempcal.toml`` or ``[tool.tempcal]`` found, read safely (a bounded
regular file, nesting bounded) and checked on every run, then installed as each command's ``default_map``."""

from __future__ import annotations

import difflib
import glob
import os
import re
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import Bounds, TempcalError, check_option, for_cli
from ..io.paths import NotRegularFile, TooLarge, is_pattern, read_regular
from .config_schema import (
    SOURCE_KEY,
    TOP_SOURCE,
    CommandSchema,
    ConfigError,
    OptionSpec,
    command_schema,
    convert_value,
    expected,
    toml_kind,
)
from .help_format import HelpCommand

if sys.version_info >= (3, 11):
    import tomllib as _toml
else:  # pragma: no cover - Python 3.10: the 'tomli' backport, a dependency there
    try:
        import tomli as _toml
    except ModuleNotFoundError:
        _toml = None  # type: ignore[assignment]

CONFIG_NAME = "tempcal.toml"
PYPROJECT_NAME = "pyproject.toml"
PYPROJECT_TABLE = ("tool", "tempcal")
#: Where a run's :class:`ConfigState` is kept (``ctx.meta`` is shared by a context and its children).
META_KEY = "tempcal.config"


@dataclass(frozen=True)
class Config:
    """One configuration file's tempcal settings (the whole of tempcal.toml, or pyproject's [tool.tempcal])."""

    path: Path  # absolute
    display: str  # how messages name the file
    data: Mapping[str, Any]
    in_pyproject: bool = False

    def label(self, table: str | None, key: str) -> str:
        """``tempcal.toml: [ood] tau``; ``pyproject.toml: [tool.tempcal.ood] tau``; ``tempcal.toml: source``."""
        name = ".".join(p for p in (".".join(PYPROJECT_TABLE) if self.in_pyproject else "", table) if p)
        return f"{self.display}: [{name}] {key}" if name else f"{self.display}: {key}"

    def error(self, table: str | None, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.label(table, key)}: {message}")

    def check(self, schemas: Mapping[str, CommandSchema]) -> None:
        """Check every key and value of the file against the commands' schemas (no file is looked at)."""
        for key, value in self.data.items():
            if key == SOURCE_KEY:
                continue
            if key not in schemas:
                raise self._unknown_top_level(key, value, schemas)
            if not isinstance(value, dict):
                raise self.error(None, key, f"must be a table of {key}'s options ([{key}]), got {toml_kind(value)}")
        if SOURCE_KEY in self.data:
            self._convert(TOP_SOURCE, self.data[SOURCE_KEY], None, SOURCE_KEY)
        for command, schema in schemas.items():
            self._table_defaults(command, schema, (), check_files=False)

    def defaults_for(self, command: str, schema: CommandSchema, given: Collection[str] = (), *,
                     check_files: bool = True) -> dict[str, Any]:
        """The command's defaults from this file, by parameter name, as the command line would give them; the files of
        the parameters the command line sets (``given``) are not looked at."""
        out = self._table_defaults(command, schema, given, check_files=check_files)
        source = schema.source
        if source is not None and source.param_name not in out and SOURCE_KEY in self.data:
            paths = self._convert(TOP_SOURCE, self.data[SOURCE_KEY], None, SOURCE_KEY)
            if check_files and source.param_name not in given:
                self._check_files(TOP_SOURCE, paths, None, SOURCE_KEY)
            out[source.param_name] = paths
        return out

    def _table_defaults(self, command: str, schema: CommandSchema, given: Collection[str], *,
                        check_files: bool) -> dict[str, Any]:
        """The values of the command's own table, by parameter name."""
        table = self.data.get(command, {})
        out: dict[str, Any] = {}
        seen: dict[str, str] = {}
        for key, value in table.items():
            spec = self._spec(schema, command, key)
            if spec.param_name in seen:
                raise self.error(command, key, f"sets the same option as '{seen[spec.param_name]}'")
            seen[spec.param_name] = key
            converted = self._convert(spec, value, command, key)
            if check_files and spec.param_name not in given:
                self._check_files(spec, converted, command, key)
            out[spec.param_name] = converted
        return out

    def _spec(self, schema: CommandSchema, command: str, key: str) -> OptionSpec:
        """The spec of a key in a command's table, or an error saying why the key is not one."""
        spec = schema.options.get(key)
        if spec is not None:
            return spec
        if key in schema.refused:
            raise self.error(command, key, schema.refused[key])
        for candidate in schema.options.values():
            if key in candidate.negative:
                raise self.error(command, key, f"unknown key; write {candidate.key} = false")
        close = difflib.get_close_matches(key, list(schema.options), n=1)
        keys = sorted({spec.key for spec in schema.options.values()})
        hint = f" (did you mean '{close[0]}'?)" if close else f" ({command} options: {', '.join(keys)})"
        raise self.error(command, key, f"unknown key{hint}")

    def _unknown_top_level(self, key: str, value: Any, schemas: Mapping[str, CommandSchema]) -> ConfigError:
        """The message for a top-level key that is neither ``source`` nor a command's table."""
        tables = ", ".join(f"[{name}]" for name in schemas)
        if isinstance(value, dict):
            return self.error(None, key, f"unknown table; the tables are {tables}")
        owners = [name for name, schema in schemas.items() if key in schema.options]
        hint = f"; options go in a command's table ({', '.join(f'[{o}]' for o in owners)})" if owners else ""
        return self.error(None, key, f"unknown key; the top level holds 'source' and the tables {tables}{hint}")

    def _convert(self, spec: OptionSpec, value: Any, table: str | None, key: str) -> Any:
        """A TOML value as the command-line value of ``spec`` (a list for a repeatable option)."""
        if not spec.multiple:
            if isinstance(value, list):
                raise self.error(table, key, f"expected {expected(spec)}, got a list")
            return self._convert_one(spec, value, table, key)
        if not isinstance(value, list):
            return [self._convert_one(spec, value, table, key, list_hint=True)]
        if not value:
            raise self.error(table, key, f"expected {expected(spec)} or a list of them, got an empty list")
        return [self._convert_one(spec, item, table, f"{key}[{i}]") for i, item in enumerate(value)]

    def _convert_one(self, spec: OptionSpec, value: Any, table: str | None, key: str, *,
                     list_hint: bool = False) -> Any:
        try:
            return convert_value(spec, value, self.path.parent)
        except TypeError as exc:
            wanted = expected(spec) + (" or a list of them" if list_hint else "")
            raise self.error(table, key, str(exc) or f"expected {wanted}, got {toml_kind(value)}") from None
        except ValueError as exc:
            raise self.error(table, key, str(exc)) from None

    def _check_files(self, spec: OptionSpec, value: Any, table: str | None, key: str) -> None:
        """An input path the command is about to use must exist (a glob pattern must match a file)."""
        if spec.path is None or not spec.path.must_exist:
            return
        for item in value if isinstance(value, list) else [value]:
            if spec.path.allow_dash and item == "-":
                continue
            if spec.path.glob and is_pattern(item):
                if not glob.glob(item):
                    raise self.error(table, key, f"the pattern {item} matches no file")
            elif not os.path.exists(item):
                raise self.error(table, key, f"no such file: {item}")


# -- finding and reading files --------------------------------------------------------------------


def load_config(path: str | os.PathLike[str], *, display: str | None = None, named: str | None = None) -> Config:
    """Read a configuration file: a pyproject.toml gives its ``[tool.tempcal]`` table, any other name the whole file
    (``display`` names it in messages, ``named`` in those about the file itself)."""
    shown = display if display is not None else os.fspath(path)
    absolute = Path(os.path.abspath(path))
    config = _settings(absolute, shown, read_config_bytes(absolute, named or shown))
    if config is None:
        raise ConfigError(f"{shown}: has no [{'.'.join(PYPROJECT_TABLE)}] table")
    return config


def resolve_config(explicit: str | None, disabled: bool, cwd: str | os.PathLike[str] | None = None) -> Config | None:
    """The configuration a run uses: ``--config PATH``, none with ``--no-config``, else the nearest one."""
    if explicit is not None and disabled:
        raise ConfigError("--config and --no-config contradict each other")
    if disabled:
        return None
    if explicit is not None:
        if not os.path.lexists(explicit):
            raise ConfigError(f"--config {explicit}: no such file")
        return load_config(explicit, named=f"--config {explicit}")
    return _discover(cwd)


def _discover(start_dir: str | os.PathLike[str] | None) -> Config | None:
    """The first configuration from ``start_dir`` up: one that is no regular file is an error, not skipped; a
    pyproject.toml that never says 'tempcal' is not parsed."""
    start = Path(os.path.abspath(start_dir if start_dir is not None else os.getcwd()))
    for folder in (start, *start.parents):
        candidate = folder / CONFIG_NAME
        if os.path.lexists(candidate):
            return load_config(candidate, display=_display(candidate))
        pyproject = folder / PYPROJECT_NAME
        if os.path.lexists(pyproject):
            shown = _display(pyproject)
            data = read_config_bytes(pyproject, shown)
            if b"tempcal" in data and (config := _settings(pyproject, shown, data)) is not None:
                return config
    return None


def _display(path: Path) -> str:
    """A found file as messages name it: relative to the current folder (``tempcal.toml``, ``../tempcal.toml``)."""
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return str(path)


def _settings(path: Path, shown: str, data: bytes) -> Config | None:
    """The tempcal settings in a file's bytes: the whole file, or a pyproject.toml's ``[tool.tempcal]`` (None when
    it has none)."""
    parsed = parse_config(data, shown)
    if path.name != PYPROJECT_NAME:
        return Config(path=path, display=shown, data=parsed)
    tool = parsed.get(PYPROJECT_TABLE[0])
    if not isinstance(tool, dict) or PYPROJECT_TABLE[1] not in tool:
        return None
    table = tool[PYPROJECT_TABLE[1]]
    if not isinstance(table, dict):
        raise ConfigError(f"{shown}: [tool] tempcal: must be a table, got {toml_kind(table)}")
    return Config(path=path, display=shown, data=table, in_pyproject=True)


# -- reading a file safely ------------------------------------------------------------------------

#: The largest configuration file read (a tempcal.toml is a few hundred bytes; a big pyproject.toml some kB).
MAX_CONFIG_BYTES = 1 << 20
_LIMIT = f"a configuration file may hold at most {MAX_CONFIG_BYTES >> 20} MiB"
#: Brackets or braces a value may be nested in (tempcal's values are at most a flat list).
MAX_NESTING = 64


def read_config_bytes(path: Path, shown: str) -> bytes:
    """The bytes of a configuration file, which must be a regular file of at most :data:`MAX_CONFIG_BYTES`
    (checked before and after a non-blocking open: see :func:`~tempcal.io.paths.read_regular`)."""
    try:
        return read_regular(path, MAX_CONFIG_BYTES)
    except NotRegularFile as exc:
        link = f" (a link to {exc.link})" if exc.link is not None else ""
        raise ConfigError(f"{shown}: {exc.kind}{link}; a configuration file must be a regular file") from None
    except TooLarge as exc:
        grown = "grew past the limit as it was read" if exc.grew else f"is {exc.size} bytes"
        raise ConfigError(f"{shown}: {grown}; {_LIMIT}") from None
    except FileNotFoundError:
        missing = (f"is a link to {os.readlink(path)}, which does not exist" if os.path.islink(path)
                   else "no such configuration file")
        raise ConfigError(f"{shown}: {missing}") from None
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot read: {exc.strerror or exc}") from None


def parse_config(data: bytes, shown: str) -> dict[str, Any]:
    """The bytes as TOML; syntax errors carry the parser's '(at line L, column C)'."""
    if _toml is None:
        raise ConfigError(f"{shown}: reading it needs Python >= 3.11 or the 'tomli' package")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{shown}: not UTF-8 text (byte {exc.start + 1})") from None
    check_nesting(text, shown)
    try:
        parsed: dict[str, Any] = _toml.loads(text)
    except ValueError as exc:  # a TOMLDecodeError, or an integer of more digits than Python converts
        raise ConfigError(f"{shown}: invalid TOML: {exc}") from None
    except RecursionError:  # the scan above refuses deep nesting first; this is the backstop
        raise ConfigError(f"{shown}: invalid TOML: nested too deeply to read") from None
    return parsed


_TOKEN = re.compile(r'"""|\'\'\'|["\'#\[\]{}=\n]')
_TOKEN_OR_DIGITS = re.compile(r'"""|\'\'\'|["\'#\[\]{}=\n]|\d[\d_]*')
_DIGITS = re.compile(r"\d[\d_]*")
_STRING_END = {'"""': re.compile(r'(?:[^\\]|\\.)*?"""(?!")', re.S), "'''": re.compile(r"[\s\S]*?'''(?!')"),
               '"': re.compile(r'(?:[^"\\\n]|\\.)*"'), "'": re.compile(r"[^'\n]*'")}


def check_nesting(text: str, shown: str) -> None:
    """Refuse a value nested in more than :data:`MAX_NESTING` brackets or braces, naming its key and line (only the
    structure is followed; whatever else is wrong is left to the parser)."""
    line, line_start, depth, table, key, in_value, pos = 1, 0, 0, "", "", False, 0

    def where() -> str:
        return f"[{table}] {key or '?'}" if table else key or "?"

    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    long_runs = limit and any(len(run.group()) > limit for run in _DIGITS.finditer(text))
    tokens = _TOKEN_OR_DIGITS if long_runs else _TOKEN  # digits are followed only when some run is long
    while (match := tokens.search(text, pos)) is not None:
        token, pos = match.group(), match.end()
        if token in _STRING_END:
            end = _STRING_END[token].match(text, pos)
            if end is None:
                return  # an unterminated string: the parser says where
            line += text.count("\n", pos, end.end())
            pos = end.end()
        elif token == "#":
            newline = text.find("\n", pos)
            pos = len(text) if newline < 0 else newline
        elif token == "\n":
            line, line_start = line + 1, pos
            if depth == 0:
                in_value, key = False, ""
        elif token == "=" and depth == 0 and not in_value:
            key, in_value = text[line_start:match.start()].strip(), True
        elif token in "[{" and depth == 0 and not in_value:
            newline = text.find("\n", pos)
            table = text[match.start():len(text) if newline < 0 else newline].split("#")[0].strip(" \t[]")
            pos = len(text) if newline < 0 else newline
        elif token in "[{":
            depth += 1
            if depth > MAX_NESTING:
                raise ConfigError(f"{shown}: {where()}: nested more than {MAX_NESTING} brackets deep (line "
                                  f"{line}); a value is a number, a string, or a list of them")
        elif token in "]}":
            depth = max(depth - 1, 0)
        elif (digits := len(token) - token.count("_")) > limit and text[pos:pos + 1] not in (".", "e", "E"):
            # more digits than Python converts (4300 by default) stop the parser; a float of as many reads as inf
            raise ConfigError(f"{shown}: {where()}: an integer of {digits} digits (line {line}); at most "
                              f"{limit} are read")


# -- the commands' side ---------------------------------------------------------------------------


@dataclass
class ConfigState:
    """What a run took from its configuration: the file (or None) and, after parsing, the keys used."""

    config: Config | None
    used: dict[str, str] = field(default_factory=dict)  # parameter name -> "[ood] ood" / "source"

    def to_json(self) -> dict[str, Any]:
        """``{"config": PATH or None, "config_keys": [...]}`` for a command's JSON output."""
        return {"config": str(self.config.path) if self.config else None, "config_keys": sorted(self.used.values())}


def given_in(ctx: Any, name: str) -> str | None:
    """Where the parameter ``name`` took its value: the "command line" (or the environment), the configuration
    "file", or None (its default)."""
    kind = getattr(ctx.get_parameter_source(name), "name", "")
    return "command line" if kind in ("COMMANDLINE", "ENVIRONMENT") else "file" if kind == "DEFAULT_MAP" else None


def config_state(ctx: Any) -> ConfigState:
    """The run's :class:`ConfigState` (an empty one when no configuration was looked for)."""
    state = ctx.meta.get(META_KEY)
    return state if isinstance(state, ConfigState) else ConfigState(config=None)


class ConfiguredCommand(HelpCommand):
    """A Typer command whose defaults come from the project configuration: a first parse without side effects finds
    ``--config``, ``--help`` and what the command line sets, then the file becomes ``ctx.default_map``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:  # shell completion never reads files
            self._apply_config(ctx, args)
        rest = super().parse_args(ctx, args)
        self._record_sources(ctx)
        return rest

    def invoke(self, ctx: Any) -> Any:
        """Run the command, the command line's numbers range-checked first; an error about an option whose value came
        from the file names the file and key."""
        self._check_given_values(ctx)
        try:
            return super().invoke(ctx)
        except TempcalError as exc:
            state = config_state(ctx)
            if state.config is None or not state.used:
                raise
            message = for_cli(exc)
            options = {spec.param_name: spec for spec in self.schema.options.values()}
            for name, used in sorted(state.used.items()):
                spec = options[name]
                flag = f"--{spec.key}"
                if spec.is_argument or not re.search(rf"{re.escape(flag)}(?![\w-])", message):
                    continue
                where = state.config.label(str(self.name) if used.startswith("[") else None, spec.key)
                raise type(exc)(f"{exc.raw} ({flag} is set in {where})") from None
            raise

    @cached_property
    def schema(self) -> CommandSchema:
        """This command's schema, derived once."""
        return command_schema(self)

    def _apply_config(self, ctx: Any, args: Sequence[str]) -> None:
        try:  # the parser's raw {parameter name: value}, to find --config, --help and what the command line sets
            opts, _, _ = self.make_parser(ctx).parse_args(args=list(args))
        except Exception as exc:  # the real parse reports usage errors with the proper message
            if any(cls.__name__ == "UsageError" for cls in type(exc).__mro__):
                return
            raise
        if opts.get("help"):
            return
        config = resolve_config(opts.get("config"), bool(opts.get("no_config")))
        ctx.meta[META_KEY] = ConfigState(config=config)
        if config is None:
            return
        commands = getattr(getattr(ctx.parent, "command", None), "commands", None) or {self.name: self}
        config.check({name: command.schema if isinstance(command, ConfiguredCommand) else command_schema(command)
                      for name, command in commands.items()})
        given = {name for name, value in opts.items() if value not in (None, (), [])}
        ctx.default_map = {**(ctx.default_map or {}), **config.defaults_for(str(self.name), self.schema, given)}

    def _check_given_values(self, ctx: Any) -> None:
        """Range-check the values the command line gave (the file's were checked as it was read, and the defaults
        are in range): only their parameters' specs are derived unless a file made the whole schema."""
        given = {name for name, value in ctx.params.items()  # SOURCE is paths and a flag on or off: nothing to check
                 if value is not None and not isinstance(value, bool) and name != SOURCE_KEY
                 and given_in(ctx, name) == "command line"}
        if not given:
            return
        schema = self.__dict__.get("schema") or command_schema(self, only=given)  # the whole, once a file made it
        specs = {spec.param_name: spec for spec in schema.options.values() if spec.param_name in given}
        for name, spec in specs.items():
            value = ctx.params[name]
            for item in value if spec.multiple else [value]:  # "--seed -5: expected a whole number from 0 to ..."
                if spec.kind in ("int", "float"):
                    check_option(f"--{spec.key}", item, spec.bounds or Bounds(), whole=spec.kind == "int")
                elif spec.value_type is not None and spec.value_type.check is not None:
                    spec.value_type.check(item)

    def _record_sources(self, ctx: Any) -> None:
        """After parsing: note which parameters took their value from the file (parameter source DEFAULT_MAP)."""
        state = config_state(ctx)
        if state.config is None:
            return
        by_param = {spec.param_name: spec for spec in self.schema.options.values()}
        table = state.config.data.get(str(self.name), {})
        for name in ctx.params:
            if given_in(ctx, name) == "file" and name in by_param:
                spec = by_param[name]
                in_table = any(key in table for key in (spec.key, *spec.aliases))  # else: the top-level source
                state.used[name] = f"[{self.name}] {spec.key}" if in_table else spec.key


__all__ = ["CONFIG_NAME", "Config", "ConfigError", "ConfiguredCommand", "config_state", "given_in",
           "load_config", "resolve_config"]

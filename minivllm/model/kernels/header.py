"""kernels.h read into Python: its prototypes, checked against the definitions in the .c
files, and turned into the ctypes bindings cpu.py calls.

The compiler checks each definition's types against the header; what it cannot see is two
parameters of the same type swapped, or a Python caller passing arguments in an old order.
So `read` also checks that each definition names its parameters as the header does, and
`bind` makes keyword-only functions: every call names every argument, and a name the
header does not have is a TypeError, never a silent wrong call. A small parser for the
simple C the header keeps to (see its first comment), not a C parser."""

from __future__ import annotations

import ctypes
import keyword
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

HEADER = "kernels.h"
_SCALARS = {"int": ctypes.c_int, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
            "float": ctypes.c_float, "double": ctypes.c_double}
_QUALIFIERS = {"const", "restrict", "volatile"}
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_DIRECTIVE = re.compile(r"^\s*#(?:.*\\\n)*.*$", re.M)  # with its continuation lines
_PROTOTYPE = re.compile(r"(?P<ret>[\w\s*]+?)\b(?P<name>\w+)\s*\((?P<params>[^()]*)\)")


class HeaderError(Exception):
    """kernels.h cannot be parsed, or a definition in a .c file does not match it."""


@dataclass(frozen=True)
class Prototype:
    name: str
    restype: type | None  # a ctypes type; None for void
    params: tuple[tuple[type, str], ...]  # (ctypes type, name), in the C order


def _ctype(declaration: str, what: str) -> type | None:
    """The ctypes type of a C type without its name: a pointer, a _SCALARS key or void."""
    words = [w for w in re.findall(r"\w+|\*", declaration) if w not in _QUALIFIERS]
    if "*" in words:
        return ctypes.c_void_p
    base = " ".join(words)
    if base == "void":
        return None
    if base not in _SCALARS:
        raise HeaderError(f"{what}: type {declaration.strip()!r} is not one header.py knows")
    return _SCALARS[base]


def _param(text: str, function: str) -> tuple[type, str]:
    match = re.fullmatch(r"(?P<type>.*?)\b(?P<name>[A-Za-z_]\w*)\s*", text)
    if match is None or match["name"] in _QUALIFIERS or not match["type"].strip():
        raise HeaderError(f"{function}: cannot parse the parameter {text.strip()!r}")
    if keyword.iskeyword(match["name"]):  # cpu.py could not pass it by keyword
        raise HeaderError(f"{function}: parameter {match['name']!r} is a Python keyword")
    what = f"{function}({match['name']})"
    ctype = _ctype(match["type"], what)
    if ctype is None:
        raise HeaderError(f"{what}: a void parameter")
    return ctype, match["name"]


def _prototype(text: str) -> Prototype:
    match = _PROTOTYPE.fullmatch(" ".join(text.split()))
    if match is None:
        raise HeaderError(f"cannot parse the declaration {' '.join(text.split())!r}")
    name, params = match["name"], match["params"].strip()
    return Prototype(name, _ctype(match["ret"], name), tuple(
        _param(p, name) for p in params.split(",")) if params not in ("", "void") else ())


def _code(text: str) -> str:
    return _DIRECTIVE.sub("", _COMMENT.sub(" ", text))


def parse(text: str) -> dict[str, Prototype]:
    """The prototypes of a header, by name."""
    prototypes: dict[str, Prototype] = {}
    for declaration in _code(text).split(";"):
        if declaration.strip():
            prototype = _prototype(declaration)
            if prototype.name in prototypes:
                raise HeaderError(f"{prototype.name} is declared twice")
            prototypes[prototype.name] = prototype
    return prototypes


def check_definitions(prototypes: dict[str, Prototype], sources: list[Path]) -> None:
    """Each prototype is defined once in the sources, with the same parameter names and
    types in the same order (the compiler checks the types; this adds the names)."""
    code = {source.name: _code(source.read_text()) for source in sources}
    for name, prototype in prototypes.items():
        found = [(file, match) for file, text in code.items() for match in re.finditer(
            rf"[\w\s*]+?\b{name}\s*\([^()]*\)(?=\s*\{{)", text)]
        if len(found) != 1:
            raise HeaderError(f"{name}: {len(found)} definitions in the sources, not one")
        file, match = found[0]
        definition = _prototype(match[0])
        if definition != prototype:
            raise HeaderError(f"{name} in {file} does not match {HEADER}: parameters "
                              f"{[p for _, p in definition.params]} there, "
                              f"{[p for _, p in prototype.params]} in the header "
                              "(or a type differs)")


def read(source_dir: Path, sources: list[str]) -> dict[str, Prototype]:
    """The header's prototypes, checked against the definitions in the sources."""
    prototypes = parse((source_dir / HEADER).read_text())
    check_definitions(prototypes, [source_dir / s for s in sources])
    return prototypes


def bind(lib: ctypes.CDLL, prototypes: dict[str, Prototype]) -> SimpleNamespace:
    """One keyword-only Python function per prototype, calling the library's function.
    Raises AttributeError when the library lacks one."""
    functions = {}
    for prototype in prototypes.values():
        c_function = getattr(lib, prototype.name)
        c_function.argtypes = [ctype for ctype, _ in prototype.params]
        c_function.restype = prototype.restype
        names = ", ".join(name for _, name in prototype.params)
        # Generated source, as namedtuple does: Python's own argument binding then rejects
        # a missing or unknown keyword, for the cost of one Python call (a **kwargs
        # wrapper that reorders them costs about 1 us more per call, per layer per step).
        namespace = {"_c_function": c_function}
        exec(f"def {prototype.name}({'*, ' if names else ''}{names}):\n"
             f"    return _c_function({names})\n", namespace)
        functions[prototype.name] = namespace[prototype.name]
    return SimpleNamespace(library=lib, **functions)

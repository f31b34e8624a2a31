"""kernels.h, the one place each exported kernel is declared, read by pycparser and bound
through cffi: one keyword-only Python function per declaration, named as there.

The compiler checks each definition's types against the header; what it cannot see is two
parameters of the same type swapped, or a Python caller passing arguments in an old order.
So `read` also checks that each definition in the .c files names its parameters as the
header does, and `bind` makes keyword-only functions: every call names every argument, and
a name the header does not have is a TypeError, never a silent wrong call."""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import cffi
from pycparser import c_ast, c_parser

HEADER = "kernels.h"
# pycparser reads preprocessed C: these strip what the preprocessor would (comments, and #
# lines with their continuations), and <stdint.h>'s types are declared for it.
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_DIRECTIVE = re.compile(r"^\s*#(?:.*\\\n)*.*$", re.M)
_STDINT = "".join(f"typedef int {t}{bits}_t;" for t in ("int", "uint") for bits in (8, 16, 32, 64))


class DeclarationError(Exception):
    """kernels.h cannot be parsed, or a definition in a .c file does not match it."""


@dataclass(frozen=True)
class Declaration:
    name: str
    result: str  # its C type ("void", "int", "int64_t"...)
    params: tuple[tuple[str, str], ...]  # (C type, name), in the C order

    @property
    def names(self) -> list[str]:
        return [name for _, name in self.params]

    def cdef(self) -> str:
        """The declaration as cffi is given it: pointers as uintptr_t, so that a call passes
        tensor.data_ptr() as it is. cffi takes a pointer argument only as its own pointer
        object, and an ffi.cast per pointer costs more than the call (see _keyword_function);
        an address and a pointer are passed alike on the ABIs built for (x86-64 System V,
        AArch64: a general-purpose register or an 8-byte stack slot)."""
        params = ", ".join(f"{'uintptr_t' if ctype.endswith('*') else ctype} {name}"
                           for ctype, name in self.params)
        return f"{self.result} {self.name}({params or 'void'});"


def _ctype(node: c_ast.Node, what: str) -> str:
    """A parameter's or result's type as C text: qualifiers, scalar type, a * per level."""
    stars = ""
    while isinstance(node, c_ast.PtrDecl):
        stars, node = stars + "*", node.type
    if not (isinstance(node, c_ast.TypeDecl) and isinstance(node.type, c_ast.IdentifierType)):
        raise DeclarationError(f"{what}: only scalars and pointers cross into C")
    text = " ".join([*node.quals, *node.type.names])
    return f"{text} {stars}" if stars else text


def _declaration(decl: c_ast.Decl) -> Declaration:
    if not isinstance(decl.type, c_ast.FuncDecl):
        raise DeclarationError(f"{decl.name}: not a function declaration")
    params = []
    for param in decl.type.args.params if decl.type.args else []:
        if isinstance(param, c_ast.Typename) and _ctype(param.type, decl.name) == "void":
            continue  # f(void)
        if not isinstance(param, c_ast.Decl) or not param.name:
            raise DeclarationError(f"{decl.name}: every parameter needs a name")
        if keyword.iskeyword(param.name):  # it could not be passed by keyword
            raise DeclarationError(f"{decl.name}: parameter {param.name!r} is a Python keyword")
        what = f"{decl.name}({param.name})"
        ctype = _ctype(param.type, what)
        if ctype == "void":
            raise DeclarationError(f"{what}: a void parameter")
        params.append((ctype, param.name))
    return Declaration(decl.name, _ctype(decl.type.type, decl.name), tuple(params))


def _code(text: str) -> str:
    return _DIRECTIVE.sub("", _COMMENT.sub(" ", text))


def parse(text: str) -> dict[str, Declaration]:
    """The function declarations of a header, by name."""
    try:
        tree = c_parser.CParser().parse(_STDINT + _code(text))
    except c_parser.ParseError as exc:
        raise DeclarationError(f"cannot parse {HEADER}: {exc}") from None
    declarations: dict[str, Declaration] = {}
    for node in tree.ext:
        if isinstance(node, c_ast.Typedef):
            continue
        declaration = _declaration(node)
        if declaration.name in declarations:
            raise DeclarationError(f"{declaration.name} is declared twice")
        declarations[declaration.name] = declaration
    return declarations


def check_definitions(declarations: dict[str, Declaration], sources: list[Path]) -> None:
    """Each declaration is defined once in the sources, with the same parameter names and
    types in the same order (the compiler checks the types; this adds the names). An
    exported definition starts its line: `type name(params) {`; pycparser reads that part."""
    code = {source.name: _code(source.read_text()) for source in sources}
    for name, declaration in declarations.items():
        found = [(file, match[1]) for file, text in code.items() for match in re.finditer(
            rf"^([^;{{}}\n]*\b{name}\s*\([^()]*\))\s*\{{", text, re.M)]
        if len(found) != 1:
            raise DeclarationError(f"{name}: {len(found)} definitions in the sources, not one")
        file, signature = found[0]
        definition = parse(signature + ";")[name]
        if definition != declaration:
            raise DeclarationError(
                f"{name} in {file} does not match {HEADER}: parameters {definition.names} "
                f"there, {declaration.names} in the header (or a type differs)")


def read(source_dir: Path, sources: list[Path]) -> dict[str, Declaration]:
    """The header's declarations, checked against the definitions in the sources (the build
    does both steps itself, the check only when it compiles)."""
    declarations = parse((source_dir / HEADER).read_text())
    check_definitions(declarations, sources)
    return declarations


def _keyword_function(c_function, declaration: Declaration):
    """c_function called with keyword arguments only, named as declared; a pointer may be
    None (NULL). Generated source, as namedtuple does: Python's own argument binding then
    rejects a missing or unknown keyword, for the cost of one Python call. Measured per call
    on 15 arguments: this with cffi 3.2 us, an ffi.cast per pointer 5.7 us, ctypes 5.0 us."""
    names = ", ".join(declaration.names)
    passed = ", ".join(f"{name} or 0" if ctype.endswith("*") else name
                       for ctype, name in declaration.params)
    namespace = {"_c_function": c_function}
    exec(f"def {declaration.name}({'*, ' if names else ''}{names}):\n"
         f"    return _c_function({passed})\n", namespace)
    return namespace[declaration.name]


def bind(path: Path, declarations: dict[str, Declaration]) -> SimpleNamespace:
    """The library at path, one keyword-only function per declaration, and its path.
    Raises OSError when it does not load, AttributeError when it lacks a function."""
    ffi = cffi.FFI()
    ffi.cdef("\n".join(d.cdef() for d in declarations.values()))
    lib = ffi.dlopen(str(path))
    # held by the namespace: cffi closes the library when its lib object goes, and the
    # functions taken from it do not hold it
    return SimpleNamespace(path=path, library=lib, ffi=ffi, **{
        name: _keyword_function(getattr(lib, name), d) for name, d in declarations.items()})

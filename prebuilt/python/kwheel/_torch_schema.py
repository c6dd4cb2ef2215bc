"""Operator schemas as ``kwheel.torch`` reads them, without torch: the name, the arguments with
their types and defaults, the returns; and the check a direct call makes of each scalar
argument, by its schema type."""

import ast


class Argument:
    """One argument of a schema: its name, its type as written (``Tensor?``, ``Tensor(a!)``)
    and its default, if it has one."""

    __slots__ = ("name", "type", "has_default", "default")

    def __init__(self, name, type, has_default, default):
        self.name, self.type, self.has_default, self.default = name, type, has_default, default


class Schema:
    """A schema as ``read_schema`` reads it: the name, the overload name (``""`` for the
    default overload), the ``Argument`` list, the return types, and whether a ``*`` made some
    arguments keyword-only."""

    __slots__ = ("name", "overload", "arguments", "returns", "keyword_only")

    def __init__(self, name, overload, arguments, returns, keyword_only):
        self.name, self.overload, self.arguments = name, overload, arguments
        self.returns, self.keyword_only = returns, keyword_only


def read_schema(text):
    """The name, arguments and returns of an operator schema, ``name(Type name=default, ...)
    -> Tensor``, read without torch: torch reads the same text again when it defines the
    operator and refuses what it cannot parse (a type it does not know, say). Raises
    ``ValueError`` for text that is no schema, or a default that is not a number, bool,
    ``None``, string or list."""
    name, overload, argument_text, returns_text = _schema_parts(text)
    arguments = []
    keyword_only = False
    for part in _split_top_level(argument_text):
        if part == "*":
            keyword_only = True
            continue
        declaration, equals, default = part.partition("=")
        pieces = declaration.split()
        if len(pieces) != 2:
            raise ValueError(f"`{text}`: cannot read the argument `{part}` (`Type name`)")
        argument_type, argument_name = pieces
        value = _read_default(text, argument_type, argument_name, default.strip()) if equals else None
        arguments.append(Argument(argument_name, argument_type, bool(equals), value))
    returns_text = returns_text.strip()
    if returns_text.startswith("(") and returns_text.endswith(")"):
        returns = [part.split()[0] for part in _split_top_level(returns_text[1:-1])]
    else:
        returns = [returns_text.split()[0]] if returns_text else []
    return Schema(name, overload, arguments, returns, keyword_only)


def _schema_parts(text):
    """The name, overload name, argument text and return text of schema ``text``
    (``name.overload(arguments) -> returns``); ``ValueError`` for text that is no schema."""
    head, arrow, returns_text = text.rpartition("->")
    head = head.strip()
    opening = head.find("(")
    name, _, overload = head[:opening].strip().partition(".")
    well_formed = arrow and opening >= 0 and head.endswith(")") and name.isidentifier()
    if not well_formed or not (overload == "" or overload.isidentifier()):
        raise ValueError(f"`{text}`: not an operator schema `name(Type name, ...) -> Tensor`")
    return name, overload, head[opening + 1 : -1], returns_text


def _split_top_level(text):
    """``text`` cut at the commas outside brackets and quotes, each part stripped: cut at
    every comma, then pieces glued back while a bracket or quote is open."""
    parts = []
    for piece in text.split(","):
        if parts and _open(parts[-1]):
            parts[-1] += "," + piece
        else:
            parts.append(piece)
    return [part.strip() for part in parts if part.strip()]


def _open(text):
    return (
        text.count("[") > text.count("]")
        or text.count("(") > text.count(")")
        or text.count("'") % 2 == 1
        or text.count('"') % 2 == 1
    )


# The defaults a schema writes most, read without compiling them (`ast.literal_eval` compiles
# its text: tens of µs an argument, at import).
_PLAIN_DEFAULTS = {"None": None, "True": True, "False": False}


def _read_default(schema, argument_type, name, text):
    try:
        value = _PLAIN_DEFAULTS[text] if text in _PLAIN_DEFAULTS else _read_number(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ValueError(
            f"`{schema}`: the default `{text}` of `{name}` is not a number, bool, None, string "
            "or list"
        ) from None
    size = argument_type.rstrip("?").rpartition("[")[2][:-1]
    if argument_type.rstrip("?").endswith("]") and size.isdigit() and type(value) is int:
        return [value] * int(size)  # `int[2] stride=1` is [1, 1], as torch reads it
    if argument_type.startswith("float") and type(value) is int:
        return float(value)
    return value


def _read_number(text):
    """An ``int`` or ``float`` written as Python writes one, else ``ast.literal_eval``'s
    reading (strings, lists)."""
    if text[:1].isdigit() or text[:1] in "-.":
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            pass
    return ast.literal_eval(text)


def _schema_name(text):
    """The op name of schema ``text`` (``f`` of ``f(Tensor x) -> Tensor``), read as
    ``read_schema`` reads it, without the arguments; ``ValueError`` for text with no op name
    and for an overload (``f.out``), which an op cannot declare."""
    name, overload, _, _ = _schema_parts(text)
    if overload:
        raise ValueError(f"`{text}`: declare the default overload only")
    return name


# The Python type a direct call's scalar argument must have, by schema type (`int[2]`,
# `float?` included): what the dispatcher would hand the CUDA implementation.
_SCALAR_TYPES = {"int": int, "SymInt": int, "float": float, "bool": bool}


def _scalar_check(kind):
    """The check of one argument of schema type ``kind``, or ``None`` for a type a direct call
    passes as it is (tensors, strings, dtypes)."""
    optional = kind.endswith("?")
    base = kind.rstrip("?")
    listed = base.endswith("]")
    wanted = _SCALAR_TYPES.get(base.split("[", 1)[0])
    if wanted is None:
        return None

    def check(value):
        if value is None:
            return optional
        if listed:
            return type(value) in (list, tuple) and all(type(item) is wanted for item in value)
        return type(value) is wanted

    return check

"""fairseq's ``eval()`` of its settings, as literal parsing.

fairseq 0.12 turns some string settings into values with Python's ``eval()``:
``utils.eval_str_list``/``eval_str_dict``/``eval_bool`` (``--adaptive-softmax-cutoff``,
``--left-pad-source``, ``--xformers-att-config``, the pipeline options) and about 40
direct calls in its models, optimizers and criteria (``eval(cfg.adam_betas)``,
``eval(args.encoder_layers)`` in the convolutional models, ...). A model is built from
the settings stored in its checkpoint, so a checkpoint whose ``adaptive_softmax_cutoff``
is ``__import__('os').system('...')`` would run that command in ``fairseq-generate``.

:func:`install` replaces ``eval`` for code of the ``fairseq`` and ``fairseq_cli``
packages (and only for it: the builtin is wrapped, and the wrapper looks at the
calling module) by :func:`literal`, which parses literals and the list arithmetic
fairseq's own defaults use (``[(512, 3)] * 20``) and nothing else: no names, no
calls, no attributes. A string fairseq evaluates that is not such a literal raises,
naming the checkpoint and the setting it came from where it came from one
(:func:`remember_settings`), and nothing is evaluated.
"""
import ast
import builtins
import functools
import sys
import threading
from typing import Dict, Optional, Tuple

from fairseq_localness.checkpoint.errors import UntrustedCheckpointError, short_repr

MAX_SOURCE = 10_000
"""The longest string evaluated: fairseq's evaluated settings are a few dozen characters."""
MAX_SEQUENCE = 100_000
"""The most values the ``+`` and ``*`` of one literal may build, counted as a copy or a
walk counts them: every item of every nested list, tuple, set and dict, and every
character of a string, each time it is reached (``[[0] * 1000] * 1000`` builds a
million, though it holds two lists of a thousand references)."""
MAX_EXPONENT = 1_000
MAX_INT_BITS = 4_096


class NotALiteral(ValueError):
    """A string fairseq would evaluate is not a literal; one line."""


_OPS = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a ** b,
}
_NUMBER = (int, float, complex)
_KINDS = {ast.Call: "a call", ast.Name: "a name", ast.Attribute: "an attribute", ast.Subscript: "a subscript",
          ast.Lambda: "a lambda", ast.BoolOp: "a boolean operation", ast.Compare: "a comparison",
          ast.IfExp: "a conditional expression", ast.ListComp: "a comprehension", ast.SetComp: "a comprehension",
          ast.DictComp: "a comprehension", ast.GeneratorExp: "a generator", ast.NamedExpr: "an assignment",
          ast.JoinedStr: "an f-string", ast.Starred: "a starred expression", ast.Await: "an await"}


def _number(value) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool) or isinstance(value, bool)


_built = threading.local()  # .sizes: {id: (expanded size, value)} of what + and * built; .total: their sum


def _expanded(value) -> int:
    """The values in ``value`` counted as a copy counts them (see :data:`MAX_SEQUENCE`);
    what ``+`` and ``*`` built is looked up, not walked."""
    if isinstance(value, (str, bytes)):
        return max(len(value), 1)
    if not isinstance(value, (list, tuple, set, frozenset, dict)):
        return 1
    known = _built.sizes.get(id(value))
    if known is not None and known[1] is value:
        return known[0]
    items = list(value.keys()) + list(value.values()) if isinstance(value, dict) else value
    size = 1 + sum(_expanded(item) for item in items)
    _built.sizes[id(value)] = (size, value)
    return size


def _build(size: int, make):
    """``make()``, a sequence of ``size`` values (expanded), within :data:`MAX_SEQUENCE`
    for all that one literal builds."""
    _built.total += size
    if _built.total > MAX_SEQUENCE:
        raise NotALiteral(f"a literal of more than {MAX_SEQUENCE} values (nested values counted each time they "
                          "are reached)")
    value = make()
    if not isinstance(value, (str, bytes)):
        _built.sizes[id(value)] = (size, value)
    return value


def _binop(node: ast.BinOp, left, right):
    op = type(node.op)
    if op not in _OPS:
        raise NotALiteral(f"the operator {type(node.op).__name__}")
    sequences = (list, tuple, str, bytes)
    if op is ast.Mult and (isinstance(left, sequences) or isinstance(right, sequences)):
        seq, times = (left, right) if isinstance(left, sequences) else (right, left)
        if not isinstance(times, int) or isinstance(times, bool):
            raise NotALiteral("a sequence multiplied by something that is not an integer")
        times = max(times, 0)
        if isinstance(seq, (str, bytes)):
            return _build(len(seq) * times, lambda: seq * times)
        return _build((_expanded(seq) - 1) * times + 1, lambda: seq * times)
    if op is ast.Add and isinstance(left, sequences):
        if type(left) is not type(right):
            raise NotALiteral("+ of a sequence and something else")
        return _build(_expanded(left) + _expanded(right), lambda: left + right)
    if not (_number(left) and _number(right)):
        raise NotALiteral(f"{type(node.op).__name__} of {type(left).__name__} and {type(right).__name__}")
    if op is ast.Pow and (not isinstance(right, (int, float)) or abs(right) > MAX_EXPONENT
                          or (isinstance(left, int) and abs(left) > MAX_EXPONENT and isinstance(right, int))):
        raise NotALiteral("a power this large")
    try:
        value = _OPS[op](left, right)
    except (ArithmeticError, ValueError) as e:
        raise NotALiteral(str(e)) from None
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise NotALiteral(f"a number of more than {MAX_INT_BITS} bits")
    return value


def _value(node):
    if isinstance(node, ast.Constant):
        if node.value is Ellipsis:
            raise NotALiteral("...")
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_value(e) for e in node.elts]
        if isinstance(node, ast.Tuple):
            return tuple(items)
        if isinstance(node, ast.List):
            return items
        try:
            return set(items)
        except TypeError as e:
            raise NotALiteral(str(e)) from None
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise NotALiteral("** in a dict")
        try:
            return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
        except TypeError as e:
            raise NotALiteral(str(e)) from None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
        operand = _value(node.operand)
        if isinstance(node.op, ast.Not):
            return not operand
        if not _number(operand):
            raise NotALiteral(f"a sign before {type(operand).__name__}")
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.BinOp):
        return _binop(node, _value(node.left), _value(node.right))
    raise NotALiteral(f"it holds {_KINDS.get(type(node), 'an expression of kind ' + type(node).__name__)}")


def literal(source):
    """The value of ``source``, a Python literal: numbers, strings, bytes, ``True``,
    ``False``, ``None``, and tuples, lists, sets and dicts of them, with unary signs
    and binary arithmetic (``+ - * / // % **``) on numbers and ``+``/``*`` on
    sequences, bounded in what they build (:data:`MAX_SEQUENCE`). Raises
    :class:`NotALiteral` for anything else (a name, a call, an attribute, a
    subscript, a lambda, a comprehension)."""
    if not isinstance(source, str):
        raise NotALiteral(f"not a string but {type(source).__name__}")
    if len(source) > MAX_SOURCE:
        raise NotALiteral(f"longer than {MAX_SOURCE} characters")
    _built.sizes, _built.total = {}, 0
    try:
        tree = ast.parse(source.strip(), mode="eval")
        return _value(tree.body)
    except NotALiteral:
        raise
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError) as e:
        raise NotALiteral(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    finally:
        _built.sizes = {}


# --------------------------------------------------------------------------- where a string came from
_lock = threading.Lock()
_origins: Dict[str, Tuple[str, str]] = {}
MAX_REMEMBERED = 200_000


def remember_settings(file: str, strings: Dict[str, str]):
    """Note that the settings ``{path: text}`` came from checkpoint ``file``, so that
    a refusal of one of them names it."""
    with _lock:
        if len(_origins) + len(strings) > MAX_REMEMBERED:
            _origins.clear()
        for path, text in strings.items():
            _origins.setdefault(text, (file, path))


def origin(text: str) -> Optional[Tuple[str, str]]:
    """(checkpoint, setting) that held ``text``, if a loaded checkpoint did."""
    return _origins.get(text)


def refusal(text, problem: str) -> Exception:
    """The error for a string fairseq evaluates that is not a literal."""
    shown = short_repr(text)
    where = origin(text) if isinstance(text, str) else None
    if where is not None:
        return UntrustedCheckpointError(
            where[0], f"its setting {where[1]} = {shown} is not a Python literal ({problem}), and fairseq "
            "evaluates that setting; this package parses it as a literal and runs nothing", trust_helps=False)
    return NotALiteral(f"{shown} is not a Python literal ({problem}); fairseq's settings are parsed as literals "
                       "(numbers, strings, lists, tuples, dicts), nothing is evaluated")


# --------------------------------------------------------------------------- eval in fairseq's code
_PACKAGES = ("fairseq", "fairseq_cli")
_builtin_eval = builtins.eval


def _from_fairseq(module_name) -> bool:
    return isinstance(module_name, str) and any(
        module_name == p or module_name.startswith(p + ".") for p in _PACKAGES)


def fairseq_eval(source, globals=None, locals=None):  # noqa: A002  (eval's own signature)
    """``eval`` as fairseq's code sees it: :func:`literal` of ``source`` (see the module
    docstring); every other caller gets Python's ``eval``."""
    frame = sys._getframe(1)
    if not _from_fairseq(frame.f_globals.get("__name__")):
        if globals is None:  # as eval() does: the caller's namespaces
            globals, locals = frame.f_globals, frame.f_locals if locals is None else locals
        return _builtin_eval(source, globals, locals)
    try:
        return literal(source)
    except NotALiteral as e:
        raise refusal(source, str(e)) from None


# the wrapper stands in for the builtin: pickle, inspect and help() see ``builtins.eval``
functools.update_wrapper(fairseq_eval, _builtin_eval)


def install():
    """Make ``eval`` parse literals only for the code of fairseq (see the module
    docstring). Idempotent."""
    if builtins.eval is not fairseq_eval:
        builtins.eval = fairseq_eval

"""The NKI <= 0.6 front end's Python subset, checked on the kernel source before it runs.

The front end of Neuron SDK <= 2.32 does not execute a kernel as Python: it parses the
kernel and every function it calls into a small Python AST and traces that. What does not
fit the AST is refused at compile time. This module parses (with :mod:`ast`) a kernel and,
transitively, every helper function, method and class it reaches through module globals,
and raises :class:`NkiFrontendError` naming ``file:line``, the construct and the rule for
the first construct outside the subset.

The subset (see ``docs/nki-rules.md`` for the sources):

* expressions: constants, names, attributes, tuples, lists, subscripts and slices,
  ``and``/``or``/``not``, arithmetic and bitwise operators except ``@``, comparisons
  except ``in``/``not in``, conditional expressions, calls;
* statements: ``pass``, expressions, ``assert``, ``return``, assignment (at most one
  mutating target - an attribute or a subscript - per statement, and tuple targets made of
  plain names only), augmented and annotated assignment, ``if``, ``for`` over one plain name
  without ``else``, ``break``, ``continue``;
* functions: module level only, no ``*args``; classes: module level, deriving from
  ``NKIObject`` and nothing else;
* calls: NKI (``nki``/``nl``/``nisa``) APIs, the project's kernel helpers, the Python
  built-ins the tracer implements and the ``math`` functions it implements; never NumPy;
* ``nl.ds(...)`` is an index, not an object with fields: ``.start`` / ``.size`` refused.
"""

import ast
import inspect
import math
import os
import sys
import textwrap
import types

from .errors import NkiHardwareError

# Built-ins the NKI tracer implements (its Python builtin table), plus range.
ALLOWED_BUILTINS = frozenset({"range", "len", "min", "abs", "int", "float", "bool", "str", "print", "divmod",
                              "slice", "list", "dict"})
ALLOWED_MATH = frozenset({"ceil", "floor", "gcd", "log2", "log10", "pow", "sqrt", "pi", "e", "inf", "nan"})
REFUSED_MODULES = ("numpy", "torch", "ml_dtypes", "scipy")

_EXPRESSION_RULES = {
    ast.ListComp: ("list comprehension", "comprehensions are not in the NKI Python subset; build the list with a for loop and append"),
    ast.SetComp: ("set comprehension", "comprehensions are not in the NKI Python subset"),
    ast.DictComp: ("dict comprehension", "comprehensions are not in the NKI Python subset"),
    ast.GeneratorExp: ("generator expression", "generator expressions are not in the NKI Python subset; use a for loop"),
    ast.Lambda: ("lambda", "lambdas are not in the NKI Python subset; define a module-level function"),
    ast.Dict: ("dict literal", "dict displays are not in the NKI Python subset"),
    ast.Set: ("set literal", "set displays are not in the NKI Python subset"),
    ast.JoinedStr: ("f-string", "formatted strings are not in the NKI Python subset"),
    ast.Starred: ("starred expression", "unpacking with * is not in the NKI Python subset"),
    ast.NamedExpr: ("assignment expression (:=)", "assignment expressions are not in the NKI Python subset"),
    ast.Await: ("await", "coroutines are not in the NKI Python subset"),
    ast.Yield: ("yield", "generators are not in the NKI Python subset"),
    ast.YieldFrom: ("yield from", "generators are not in the NKI Python subset"),
}

_STATEMENT_RULES = {
    ast.FunctionDef: ("nested function definition", "helpers must be module-level functions"),
    ast.AsyncFunctionDef: ("nested function definition", "helpers must be module-level functions"),
    ast.ClassDef: ("class definition inside a function", "classes must be module-level NKIObject subclasses"),
    ast.While: ("while loop", "NKI <= 0.6 has no while loops; use a for loop over range"),
    ast.With: ("with statement", "context managers are not in the NKI Python subset"),
    ast.Try: ("try statement", "exceptions are not in the NKI Python subset; use assert"),
    ast.Raise: ("raise statement", "exceptions are not in the NKI Python subset; use assert (check arguments before the kernel)"),
    ast.Import: ("import statement", "imports belong at module level, outside kernel code"),
    ast.ImportFrom: ("import statement", "imports belong at module level, outside kernel code"),
    ast.Delete: ("del statement", "del is not in the NKI Python subset"),
    ast.Global: ("global statement", "global is not in the NKI Python subset"),
    ast.Nonlocal: ("nonlocal statement", "nonlocal is not in the NKI Python subset"),
}
if hasattr(ast, "Match"):
    _STATEMENT_RULES[ast.Match] = ("match statement", "match is not in the NKI Python subset")
if hasattr(ast, "TryStar"):
    _STATEMENT_RULES[ast.TryStar] = ("try statement", "exceptions are not in the NKI Python subset")


class NkiFrontendError(NkiHardwareError):
    """Kernel source outside the NKI <= 0.6 Python subset (the message gives file:line, construct, rule)."""


def _nki_object_class():
    from .language import NKIObject

    return NKIObject


class _Source:
    """One parsed function or class: its AST, file and first line, and its globals."""

    def __init__(self, obj):
        self.obj = obj
        self.file = _relative(inspect.getsourcefile(obj) or "<unknown>")
        lines, self.first_line = inspect.getsourcelines(obj)
        self.tree = ast.parse(textwrap.dedent("".join(lines)))
        self.globals = obj.__globals__ if isinstance(obj, types.FunctionType) else vars(inspect.getmodule(obj))

    def where(self, node) -> str:
        return f"{self.file}:{self.first_line + getattr(node, 'lineno', 1) - 1}"


def _refuse(source, node, construct, rule):
    raise NkiFrontendError(f"{source.where(node)}: {construct}: {rule} (NKI <= 0.6 front end)")


def _relative(path: str) -> str:
    """``path`` relative to the working directory when it lies below it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


class _Checker(ast.NodeVisitor):
    """Walks one function body; collects the functions and classes it calls."""

    def __init__(self, source, reached):
        self.source = source
        self.reached = reached
        self.ds_names = set()

    # ---- resolution ----------------------------------------------------------------------
    def _resolve(self, node):
        """The object a Name / dotted Attribute refers to through module globals, or None."""
        if isinstance(node, ast.Name):
            if node.id in self.source.globals:
                return self.source.globals[node.id]
            builtins = self.source.globals.get("__builtins__")
            table = builtins if isinstance(builtins, dict) else vars(builtins) if builtins else {}
            return table.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._resolve(node.value)
            if isinstance(base, (types.ModuleType, type)):
                return getattr(base, node.attr, None)
        return None

    def _is_ds_call(self, node):
        if not isinstance(node, ast.Call):
            return False
        target = self._resolve(node.func)
        return getattr(target, "__name__", None) == "ds" and getattr(target, "__module__", "").endswith("language")

    # ---- statements ----------------------------------------------------------------------
    def generic_visit(self, node):
        rule = _EXPRESSION_RULES.get(type(node)) or _STATEMENT_RULES.get(type(node))
        if rule is not None:
            _refuse(self.source, node, *rule)
        super().generic_visit(node)

    def visit_body(self, function):
        args = function.args
        if args.vararg is not None:
            _refuse(self.source, function, f"*{args.vararg.arg} parameter", "variable positional arguments are not supported")
        for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self.visit(default)
        for statement in function.body:
            self.visit(statement)

    def visit_For(self, node):
        if not isinstance(node.target, ast.Name):
            _refuse(self.source, node, "tuple loop target" if isinstance(node.target, (ast.Tuple, ast.List))
                    else "loop target that is not a plain name",
                    "a for loop binds one plain name; index the sequence inside the body")
        if node.orelse:
            _refuse(self.source, node, "for ... else", "for-else is not supported")
        self.generic_visit(node)

    def visit_Assign(self, node):
        mutating = [t for t in node.targets if isinstance(t, (ast.Attribute, ast.Subscript))]
        if len(mutating) > 1:
            _refuse(self.source, node, "chained assignment to attributes/subscripts",
                    "mutating assignments must be in separate statements")
        for target in node.targets:
            if isinstance(target, (ast.Tuple, ast.List)):
                for element in target.elts:
                    if not isinstance(element, ast.Name):
                        _refuse(self.source, node, "tuple assignment to an attribute/subscript" if
                                isinstance(element, (ast.Attribute, ast.Subscript)) else "nested tuple target",
                                "tuple targets must be plain names; assign each attribute in its own statement")
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if self._is_ds_call(node.value):
                self.ds_names.add(node.targets[0].id)
            else:
                self.ds_names.discard(node.targets[0].id)
        self.generic_visit(node)

    # ---- expressions ---------------------------------------------------------------------
    def visit_BinOp(self, node):
        if isinstance(node.op, ast.MatMult):
            _refuse(self.source, node, "@ operator", "the matmul operator is not supported; call nisa.nc_matmul")
        self.generic_visit(node)

    def visit_Compare(self, node):
        for op in node.ops:
            if isinstance(op, (ast.In, ast.NotIn)):
                _refuse(self.source, node, "'in' operator", "the 'in' operator is not supported in NKI")
        self.generic_visit(node)

    def visit_Attribute(self, node):
        if node.attr in ("size", "start") and (self._is_ds_call(node.value) or (
                isinstance(node.value, ast.Name) and node.value.id in self.ds_names)):
            _refuse(self.source, node, f"nl.ds(...).{node.attr}",
                    "nl.ds is an index expression without fields; keep the start and size in variables")
        if isinstance(node.value, ast.Name):
            base = self._resolve(node.value)
            if isinstance(base, types.ModuleType) and base.__name__.split(".")[0] in REFUSED_MODULES:
                _refuse(self.source, node, f"{node.value.id}.{node.attr}",
                        f"{base.__name__} is not available inside NKI kernels (use nl/nisa, or math for scalars)")
            if base is math and node.attr not in ALLOWED_MATH:
                _refuse(self.source, node, f"math.{node.attr}", "the NKI tracer implements only "
                        + ", ".join(sorted(ALLOWED_MATH)) + " from math")
        self.generic_visit(node)

    def visit_Call(self, node):
        target = self._resolve(node.func)
        if isinstance(node.func, ast.Name) and target is not None and inspect.isbuiltin(target) or (
                isinstance(node.func, ast.Name) and isinstance(target, type) and target.__module__ == "builtins"):
            if node.func.id not in ALLOWED_BUILTINS:
                _refuse(self.source, node, f"{node.func.id}(...)",
                        "not a built-in the NKI tracer implements (" + ", ".join(sorted(ALLOWED_BUILTINS)) + ")")
            if node.func.id == "min" and len(node.args) != 2:
                _refuse(self.source, node, "min with other than two arguments", "the NKI tracer's min takes two ints")
        module = getattr(target, "__module__", None) or ""
        if module.split(".")[0] in REFUSED_MODULES or isinstance(target, types.ModuleType):
            _refuse(self.source, node, ast.unparse(node.func) + "(...)",
                    "NumPy / torch calls are not available inside NKI kernels")
        self._reach(target)
        self.generic_visit(node)

    def visit_Name(self, node):
        target = self._resolve(node)
        if isinstance(target, type) and not target.__module__ == "builtins":
            self._reach(target)

    def _reach(self, target):
        if target is None:
            return
        func = getattr(target, "func", None)  # an @nki.jit kernel object
        if isinstance(func, types.FunctionType) and callable(target):
            target = func
        if isinstance(target, (types.FunctionType, type)):
            self.reached.append(target)


def _is_interpreter(obj) -> bool:
    module = getattr(obj, "__module__", "") or ""
    return module.startswith(__name__.rsplit(".", 1)[0])


def _is_kernel_code(obj) -> bool:
    """Functions and classes the front end would parse: Python source outside the standard
    library, the interpreter and third-party packages."""
    module = (getattr(obj, "__module__", "") or "").split(".")[0]
    if _is_interpreter(obj) or module in sys.stdlib_module_names or module in REFUSED_MODULES:
        return False
    path = inspect.getsourcefile(obj) if isinstance(obj, (types.FunctionType, type)) else None
    return path is not None and ("site-packages" not in path or module == "vllm_gdn_neuron")


def _check_class(cls, reached):
    nki_object = _nki_object_class()
    source = _Source(cls)
    if cls.__bases__ != (nki_object,):
        names = ", ".join(b.__name__ for b in cls.__bases__)
        _refuse(source, source.tree.body[0], f"class {cls.__name__}({names})",
                "a class used in a kernel must derive from NKIObject and from nothing else")
    for node in source.tree.body[0].body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            _refuse(source, node, "__slots__", "NKI copies an object's __dict__; slots are not seen by the front end")
        if isinstance(node, ast.FunctionDef):
            checker = _Checker(source, reached)
            checker.visit_body(node)


_checked = {}


def check(func) -> None:
    """Check ``func`` and everything it reaches; raise :class:`NkiFrontendError` on the first refusal.

    Results are cached per function (a kernel is checked once, at its first trace).
    """
    pending = [func]
    seen = set()
    while pending:
        obj = pending.pop()
        key = id(obj)
        if key in seen or not _is_kernel_code(obj) or obj is _nki_object_class():
            continue
        seen.add(key)
        if _checked.get(key) is obj:
            continue
        reached = []
        if isinstance(obj, type):
            _check_class(obj, reached)
        else:
            source = _Source(obj)
            definition = source.tree.body[0] if source.tree.body else None
            if not isinstance(definition, ast.FunctionDef):
                _refuse(source, definition, f"{getattr(obj, '__name__', obj)!s}",
                        "a kernel and its helpers must be functions defined with def at module level")
            _Checker(source, reached).visit_body(definition)
        _checked[key] = obj
        pending.extend(reached)

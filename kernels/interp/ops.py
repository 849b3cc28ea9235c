"""The operator tokens of ``nki.language`` (``nl.add``, ``nl.exp``, ``nl.equal`` ...).

In NKI these are passed as the ``op`` argument of ``nki.isa`` instructions. Here each is an
:class:`Op` carrying its float32 NumPy implementation: ``binary(a, b)`` for arithmetic and
comparison operators (comparisons yield 1.0 / 0.0), ``unary(x)`` for activation functions,
``reduce(x, axis)`` for the operators ``tensor_reduce`` accepts. NumPy ufuncs (``np.add``,
``np.exp`` ...) are accepted wherever an op is, as in NKI.
"""

import numpy as np


class Op:
    """One operator token. Dimensions are whatever the instruction passes; math is float32."""

    __slots__ = ("name", "binary", "unary", "reduce")

    def __init__(self, name, binary=None, unary=None, reduce=None):
        self.name = name
        self.binary = binary
        self.unary = unary
        self.reduce = reduce

    def __repr__(self):
        return f"nl.{self.name}"


def _compare(ufunc):
    return lambda a, b: ufunc(a, b).astype(np.float32)


def _softplus(x):
    return np.logaddexp(np.float32(0.0), x)


def _sigmoid(x):
    # exp of a negative number only: stable for large |x|
    z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + z), z / (1.0 + z)).astype(np.float32)


def _silu(x):
    return (x * _sigmoid(x)).astype(np.float32)


def _gelu_tanh(x):
    c = np.float32(np.sqrt(2.0 / np.pi))
    return (0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))).astype(np.float32)


add = Op("add", binary=np.add, reduce=np.add.reduce)
subtract = Op("subtract", binary=np.subtract)
multiply = Op("multiply", binary=np.multiply, reduce=np.multiply.reduce)
divide = Op("divide", binary=np.divide)
maximum = Op("maximum", binary=np.maximum, reduce=np.maximum.reduce)
minimum = Op("minimum", binary=np.minimum, reduce=np.minimum.reduce)
power = Op("power", binary=np.power)
# nl.max / nl.min are the names NKI documents for reductions; elementwise they equal maximum/minimum
max = Op("max", binary=np.maximum, reduce=np.maximum.reduce)  # noqa: A001 - NKI's name
min = Op("min", binary=np.minimum, reduce=np.minimum.reduce)  # noqa: A001 - NKI's name

equal = Op("equal", binary=_compare(np.equal))
not_equal = Op("not_equal", binary=_compare(np.not_equal))
greater = Op("greater", binary=_compare(np.greater))
greater_equal = Op("greater_equal", binary=_compare(np.greater_equal))
less = Op("less", binary=_compare(np.less))
less_equal = Op("less_equal", binary=_compare(np.less_equal))

copy = Op("copy", unary=lambda x: x)
exp = Op("exp", unary=np.exp)
log = Op("log", unary=np.log)
sigmoid = Op("sigmoid", unary=_sigmoid)
silu = Op("silu", unary=_silu)
tanh = Op("tanh", unary=np.tanh)
relu = Op("relu", unary=lambda x: np.maximum(x, np.float32(0.0)))
gelu_apprx_tanh = Op("gelu_apprx_tanh", unary=_gelu_tanh)
sqrt = Op("sqrt", unary=np.sqrt)
rsqrt = Op("rsqrt", unary=lambda x: (np.float32(1.0) / np.sqrt(x)).astype(np.float32))
square = Op("square", unary=np.square)
reciprocal = Op("reciprocal", unary=lambda x: (np.float32(1.0) / x).astype(np.float32))
softplus = Op("softplus", unary=_softplus)
abs = Op("abs", unary=np.abs)  # noqa: A001 - NKI's name
negative = Op("negative", unary=np.negative)


_FROM_NUMPY = {
    np.add: add, np.subtract: subtract, np.multiply: multiply, np.divide: divide,
    np.maximum: maximum, np.minimum: minimum, np.power: power,
    np.equal: equal, np.not_equal: not_equal, np.greater: greater,
    np.greater_equal: greater_equal, np.less: less, np.less_equal: less_equal,
    np.exp: exp, np.log: log, np.tanh: tanh, np.sqrt: sqrt, np.square: square,
    np.reciprocal: reciprocal, np.abs: abs, np.negative: negative,
}


def resolve(op, instruction: str, argument: str, kind: str) -> Op:
    """Return ``op`` as an :class:`Op` usable as ``kind`` ('binary', 'unary' or 'reduce').

    Raises a ValueError naming ``instruction`` and ``argument`` when ``op`` is not an NKI
    operator or cannot act as ``kind`` (e.g. ``nl.exp`` passed to ``tensor_tensor``).
    """
    resolved = _FROM_NUMPY.get(op, op)
    if not isinstance(resolved, Op):
        raise ValueError(f"{instruction}: {argument} must be an nl operator such as nl.add, got {op!r}")
    if getattr(resolved, kind) is None:
        raise ValueError(f"{instruction}: {argument}={resolved!r} is not a {kind} operator")
    return resolved

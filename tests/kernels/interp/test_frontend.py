"""The NKI <= 0.6 front-end subset: every rule refuses its known-bad snippet with file:line,
the construct and the rule; allowed Python passes; every kernel of the project passes."""

import importlib
import inspect
import pkgutil

import numpy as np
import pytest

import vllm_gdn_neuron.kernels as kernels_package
from vllm_gdn_neuron.kernels.interp import NkiFrontendError, frontend, nki
from vllm_gdn_neuron.kernels.interp.jit import Kernel

from . import frontend_snippets as snippets

RULES = {
    "comprehension": ("list comprehension", "comprehensions are not in the NKI Python subset"),
    "generator_expression": ("generator expression", "generator expressions are not in the NKI Python subset"),
    "nested_def": ("nested function definition", "helpers must be module-level functions"),
    "enumerate_call": (r"enumerate\(\.\.\.\)", "not a built-in the NKI tracer implements"),
    "zip_call": (r"zip\(\.\.\.\)", "not a built-in the NKI tracer implements"),
    "tuple_loop_target": ("tuple loop target", "a for loop binds one plain name"),
    "chained_attribute_assignment": ("chained assignment to attributes/subscripts",
                                     "mutating assignments must be in separate statements"),
    "tuple_attribute_assignment": ("tuple assignment to an attribute/subscript", "tuple targets must be plain names"),
    "numpy_call": (r"np.log2\(\.\.\.\)", "NumPy / torch calls are not available inside NKI kernels"),
    "unsupported_math": ("math.exp", "the NKI tracer implements only"),
    "ds_size": (r"nl.ds\(\.\.\.\).size", "nl.ds is an index expression without fields"),
    "ds_size_inline": (r"nl.ds\(\.\.\.\).size", "nl.ds is an index expression without fields"),
    "while_loop": ("while loop", "NKI <= 0.6 has no while loops"),
    "lambda_expression": ("lambda", "lambdas are not in the NKI Python subset"),
    "dict_display": ("dict literal", "dict displays are not in the NKI Python subset"),
    "f_string": ("f-string", "formatted strings are not in the NKI Python subset"),
    "in_operator": ("'in' operator", "the 'in' operator is not supported in NKI"),
    "matmul_operator": ("@ operator", "the matmul operator is not supported"),
    "starred_call": ("starred expression", r"unpacking with \* is not in the NKI Python subset"),
    "varargs": (r"\*tiles parameter", "variable positional arguments are not supported"),
    "with_statement": ("with statement", "context managers are not in the NKI Python subset"),
    "raise_statement": ("raise statement", "exceptions are not in the NKI Python subset"),
    "try_statement": ("try statement", "exceptions are not in the NKI Python subset"),
    "import_statement": ("import statement", "imports belong at module level"),
    "for_else": (r"for \.\.\. else", "for-else is not supported"),
    "min_of_three": ("min with other than two arguments", "the NKI tracer's min takes two ints"),
    "isinstance_call": (r"isinstance\(\.\.\.\)", "not a built-in the NKI tracer implements"),
    "plain_class": (r"class PlainHelper\(object\)", "a class used in a kernel must derive from NKIObject and from nothing else"),
    "slotted_class": ("__slots__", "NKI copies an object's __dict__; slots are not seen by the front end"),
    "reaches_a_bad_helper": ("list comprehension", "comprehensions are not in the NKI Python subset"),
}


def _refused_line(name):
    """The line marked ``# REFUSED`` that belongs to snippet ``name`` (or to what it reaches)."""
    source, _ = inspect.getsourcelines(snippets)
    targets = {"plain_class": "class PlainHelper", "slotted_class": "__slots__", "reaches_a_bad_helper":
               "def _bad_helper"}
    anchor = targets.get(name, f"def {name}(")
    start = next(i for i, line in enumerate(source) if anchor in line)
    return next(i for i in range(start, len(source)) if "# REFUSED" in source[i]) + 1


@pytest.mark.parametrize("name", sorted(RULES))
def test_each_rule_refuses_its_snippet_with_file_line_construct_and_rule(name):
    construct, rule = RULES[name]
    with pytest.raises(NkiFrontendError, match=rf"frontend_snippets.py:{_refused_line(name)}: {construct}: {rule}"):
        frontend.check(getattr(snippets, name))


def test_the_check_runs_at_trace_time_before_any_instruction():
    kernel = nki.jit(snippets.comprehension)
    with pytest.raises(NkiFrontendError, match="list comprehension"):
        kernel(np.zeros((4, 4), np.float32))


def test_allowed_python_passes_and_runs():
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    frontend.check(snippets.good_kernel)
    out = nki.jit(snippets.good_kernel)(x)
    np.testing.assert_array_equal(out, x * 3)  # size = min(log2(4), 2) + 1 = 3


def _project_kernels():
    found = []
    for module_info in pkgutil.walk_packages(kernels_package.__path__, f"{kernels_package.__name__}."):
        module = importlib.import_module(module_info.name)  # subpackages too (gdn2/)
        for value in vars(module).values():
            if isinstance(value, Kernel) and value.func.__module__ == module.__name__:
                found.append(value)
    return found


def test_every_kernel_of_the_project_passes_the_check():
    found = _project_kernels()
    names = sorted(k.func.__name__ for k in found)
    assert names == ["conv1d_decode_kernel", "conv1d_prefill_kernel", "gdn2_kernel", "gdn_cte_kernel",
                     "recurrent_step_kernel"]
    for kernel in found:
        frontend.check(kernel.func)


def test_the_check_follows_helpers_and_methods_across_modules(monkeypatch):
    from vllm_gdn_neuron.kernels import gdn_cte

    parsed = []
    original = frontend._Source

    def recording(obj):
        parsed.append(obj.__qualname__)
        return original(obj)

    monkeypatch.setattr(frontend, "_Source", recording)
    monkeypatch.setattr(frontend, "_checked", {})
    frontend.check(gdn_cte.gdn_cte_kernel.func)
    assert {"gdn_cte_kernel", "_head", "_prepare_chunk", "schur_levels", "advance", "Masks", "transpose",
            "_neumann_blocks", "_product", "_Chunk"} <= set(parsed)

"""Kernel bodies that break one rule of the NKI <= 0.6 front end each (read by test_frontend.py).

Never run: the front-end check parses them. Each function's marked line is the one refused.
"""

import math

import numpy as np

from vllm_gdn_neuron.kernels.interp import nisa, nl


def comprehension(x):
    shapes = [n for n in x.shape]  # REFUSED
    return shapes


def generator_expression(x):
    return list(n for n in x.shape)  # REFUSED


def nested_def(x):
    def helper(y):  # REFUSED
        return y
    return helper(x)


def enumerate_call(x):
    for i in enumerate(x.shape):  # REFUSED
        print(i)


def zip_call(x):
    for i in zip(x.shape, x.shape):  # REFUSED
        print(i)


def tuple_loop_target(pairs):
    for a, b in pairs:  # REFUSED
        print(a, b)


def chained_attribute_assignment(obj):
    obj.a = obj.b = None  # REFUSED


def tuple_attribute_assignment(obj):
    obj.a, obj.b = 1, 2  # REFUSED


def numpy_call(x):
    return np.log2(x.shape[0])  # REFUSED


def unsupported_math(x):
    return math.exp(x.shape[0])  # REFUSED


def ds_size(x):
    rows = nl.ds(0, 4)
    return rows.size  # REFUSED


def ds_size_inline(x):
    return nl.ds(0, 4).size  # REFUSED


def while_loop(x):
    n = 0
    while n < 3:  # REFUSED
        n += 1


def lambda_expression(x):
    return (lambda y: y)(x)  # REFUSED


def dict_display(x):
    return {"x": x}  # REFUSED


def f_string(x):
    print(f"{x}")  # REFUSED


def in_operator(x):
    return 3 in x.shape  # REFUSED


def matmul_operator(a, b):
    return a @ b  # REFUSED


def starred_call(x):
    return print(*x.shape)  # REFUSED


def varargs(*tiles):  # REFUSED
    return tiles


def with_statement(x):
    with open(x):  # REFUSED
        pass


def raise_statement(x):
    raise ValueError(x)  # REFUSED


def try_statement(x):
    try:  # REFUSED
        print(x)
    except ValueError:
        pass


def import_statement(x):
    import os  # REFUSED
    return os


def for_else(x):
    for n in range(3):  # REFUSED
        print(n)
    else:
        print(x)


def min_of_three(x):
    return min(1, 2, 3)  # REFUSED


def isinstance_call(x):
    return isinstance(x, int)  # REFUSED


class PlainHelper:  # REFUSED
    def __init__(self):
        self.x = 1


def plain_class(x):
    return PlainHelper()


class SlottedHelper(nl.NKIObject):
    __slots__ = ("x",)  # REFUSED


def slotted_class(x):
    return SlottedHelper()


def _bad_helper(x):
    return [n for n in x]  # REFUSED


def reaches_a_bad_helper(x):
    return _bad_helper(x)


class GoodHelper(nl.NKIObject):
    """An NKIObject with methods, as nki-library's kernels use them."""

    def __init__(self, tile):
        self.tile = tile

    def scaled(self, factor):
        dst = nl.ndarray(self.tile.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=dst, op=nl.copy, data=self.tile, scale=factor)
        return dst


def good_kernel(x, n=4):
    """Everything the subset allows: loops, ifs, tuples, lists, helpers, NKIObjects, math."""
    tile = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    tiles = []
    for i in range(n):
        if i % 2 == 0 and i is not None:
            tiles.append(i)
        elif i > 2:
            continue
    levels = int(math.log2(n))
    first, second = levels, len(tiles)
    size = min(first, second) + abs(-1)
    helper = GoodHelper(tile)
    out = helper.scaled(float(size))
    result = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=result, src=out)
    return result

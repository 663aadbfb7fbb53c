"""Triton's interpreter as the kernel tests need it: patched once a launch, its dot a GPU's (row-invariant).

Patching: the interpreter swaps `triton.language`'s builtins for numpy ones when a kernel launches, then again on every
call of a `@triton.jit` helper inside it, once per program (thousands a launch): the same modules patched to the same
functions. Here a helper's call inside a launch patches nothing when the launch, or a helper before it (the interpreter
never undoes a helper's patching), has already patched every language module the helper sees. A builtin left unpatched
would fail loudly (it needs a compiler), so a mistake here cannot make a kernel test pass. The interpreter's own
patching would take about a third of a kernel test's time on a CPU.

The dot: the interpreter's `tl.dot` is numpy's matmul, whose BLAS kernels may round a row by its place in the block
(OpenBLAS's Haswell kernels, what a Zen 3 runs: a third of a 64-row block's rows differ in their last bits from the same
row alone). A GPU's fp32 dot sums each output's products in one order wherever its row sits, the property the tests of a
tree row against the decode step check; here each row is multiplied alone, as one of a batch of one-row products.

Overflow checks: the interpreter checks every 32-bit integer +, - and * for overflow (in int64, then a compare) for a
device assert that, its debug mode off (as a compiled kernel's is), it then drops: work nothing reads, ~40% of a kernel
test's time. They are turned off while debug is off."""

from __future__ import annotations

import dataclasses
import functools
import inspect

import numpy as np
import triton.language as tl
from triton.runtime import interpreter


@functools.cache
def _languages(fn) -> frozenset[int]:
    """The language modules `fn`'s globals name (its module's imports, fixed once it has loaded)."""
    names = fn.__globals__.values()
    return frozenset(id(value) for value in names if inspect.ismodule(value) and value in (tl, tl.core))


def patch_interpreter() -> None:
    """Patch the interpreter: its language patching once a launch, its dot row by row, no overflow checks for asserts
    it drops."""
    _patch_once()
    _dot_row_by_row()
    options = interpreter.interpreter_builder.options
    if not options.debug:
        interpreter.interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _dot_row_by_row() -> None:
    builder = interpreter.InterpreterBuilder
    dot = builder.create_dot
    if getattr(dot, "row_by_row", False):
        return

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def handle(data, like):
            return interpreter.TensorHandle(data, like.dtype)

        rows = dot(self, handle(np.expand_dims(a.data, -2), a), handle(np.expand_dims(b.data, -3), b),
                   handle(np.expand_dims(d.data, -2), d), input_precision, max_num_imprecise_acc)  # fmt: skip
        return interpreter.TensorHandle(rows.data.squeeze(-2), rows.dtype)

    create_dot.row_by_row = True
    builder.create_dot = create_dot


def _patch_once() -> None:
    """Make the interpreter patch once a launch (where this Triton patches as described above)."""
    patch = getattr(interpreter, "_patch_lang", None)
    if patch is None or getattr(patch, "once", False):
        return
    launches: list[set[int]] = []  # the language modules the launch under way patched (launches do not nest)

    def patch_for_call(fn):
        languages = _languages(fn)
        if launches and languages <= launches[-1]:
            return None  # a helper's call: its result is not used, nothing is restored
        scope = patch(fn)
        if launches:  # a helper seeing more (triton.language.core): patched now for the rest of the launch
            launches[-1] |= languages
        else:  # a launch: its scope's restore ends it
            launches.append(languages)
            restore = scope.restore

            def restore_and_end():
                launches.pop()
                restore()

            scope.restore = restore_and_end
        return scope

    patch_for_call.once = True
    interpreter._patch_lang = patch_for_call

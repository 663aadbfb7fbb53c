"""Triton's interpreter without its repeated patching: about a third of a kernel test's time on a CPU.

The interpreter swaps `triton.language`'s builtins for numpy ones when a kernel launches, then again on every call
of a `@triton.jit` helper inside it, once per program (thousands a launch): the same modules patched to the same
functions. Here a helper's call inside a launch patches nothing when the launch, or a helper before it (the
interpreter never undoes a helper's patching), has already patched every language module the helper sees. A builtin
left unpatched would fail loudly (it needs a compiler), so a mistake here cannot make a kernel test pass."""

from __future__ import annotations

import inspect

import triton.language as tl
from triton.runtime import interpreter


def _languages(fn) -> set[int]:
    return {id(value) for value in fn.__globals__.values() if inspect.ismodule(value) and value in (tl, tl.core)}


def patch_once() -> None:
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

"""Running the Triton kernels on CPU in Triton's interpreter (`TRITON_INTERPRET=1`): tests and counts.

Import this before the kernels, in a process whose environment had TRITON_INTERPRET=1 before
`triton` was imported (Triton reads it when a kernel is decorated).
"""


def patch_numpy_index() -> None:
    """Triton 3.6's interpreter turns loop bounds into ints with int(ndarray); NumPy >= 2.4 refuses that
    for a 1-element array of more than 0 dims. Take its one element instead (a no-op where not needed)."""
    import triton.runtime.interpreter as interp

    if not hasattr(interp, "_patch_lang_tensor") or getattr(interp, "_rooftop_patched", False):
        return
    original = interp._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patched
    interp._rooftop_patched = True

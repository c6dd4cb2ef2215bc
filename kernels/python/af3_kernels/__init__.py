"""AlphaFold3-style CUDA kernels, shipped prebuilt.

The wheel carries compiled cubins for every supported GPU and CUDA build in ``_prebuilt/``;
the first call to a kernel loads the one that fits, or compiles it from the shipped sources
unless ``AF3_KERNELS_JIT_FALLBACK=0``.

    import af3_kernels
    print(af3_kernels.status())
    if af3_kernels.is_available("layernorm_bf16"):
        layernorm = af3_kernels.load("layernorm_bf16")
    # What a kernel requires of a shape, at setup, without a GPU (None: it runs):
    af3_kernels.unsupported_shape_reason("layernorm_bf16", rows=4096, cols=1024)
"""

import kwheel as _kwheel

__version__ = "0.1.0"

_registry = _kwheel.open(__name__)

status = _registry.status
is_available = _registry.is_available
unavailable_reason = _registry.unavailable_reason
select = _registry.select
unsupported_shape_reason = _registry.unsupported_shape_reason
load = _registry.load
fetch = _registry.fetch

__all__ = [
    "status",
    "is_available",
    "unavailable_reason",
    "unsupported_shape_reason",
    "select",
    "load",
    "fetch",
]

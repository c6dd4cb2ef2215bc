"""The kernels as PyTorch operators, with the arguments of their torch equivalents.

    import torch
    from af3_kernels import ops

    y = ops.layer_norm(x, (x.shape[-1],), weight, bias, 1e-5)   # as F.layer_norm
    h = ops.swiglu(x)                                            # silu(x[..., :h]) * x[..., h:]
    o = ops.sigmoid_gate(x, gate)                                # x * torch.sigmoid(gate)
    p = ops.masked_softmax_pair_bias(logits, bias, mask, scale)  # triangle-attention softmax
    s = ops.scale_rows(x, scale)                                 # x * scale[:, None]
    c = ops.matmul(a, b)                                         # a.float() @ b.float(), sm_90a

Each is a ``torch.library`` operator ``torch.ops.af3_kernels.<name>`` with a fake (so
``torch.compile`` keeps one graph through it), a CUDA implementation that launches the
prebuilt kernel on torch's current stream (safe to capture in a CUDA graph), and a CPU
implementation that is the torch reference. ``sigmoid_gate`` has a backward made of the
``sigmoid_gate_backward`` kernel.

Dtypes and layouts are the kernels': bf16 for ``layer_norm`` (over the last dimension only),
``swiglu`` and ``sigmoid_gate`` (same shapes, no broadcasting); fp32 for the softmax; fp32 or
bf16 ``x`` with an fp32 ``scale`` for ``scale_rows``; bf16 in and fp32 out for ``matmul``.
Anything else raises ``ValueError`` naming the op, also while tracing. What each kernel
requires of the sizes (an even last dimension for ``swiglu``, counts that fit its 32-bit
ints, ``matmul``'s grid) is declared with the kernel in ``kernels.toml`` (``requires``), not
here: each op passes the kernel's ``inputs`` and ``kwheel.torch`` refuses what breaks one,
naming it, and ``af3_kernels.unsupported_shape_reason(kernel, **inputs)`` answers the same
at setup without a GPU.

Policy where a kernel cannot load: when no prebuilt variant fits the GPU and the JIT is
disabled (``AF3_KERNELS_JIT_FALLBACK=0``: the loader's ``NoFitError``), the op runs its torch
reference and warns once per op and device with ``kwheel.torch.FallbackWarning``, whose
message is the loader's; make that warning an error to refuse instead. Every other loader error
(no driver, a cubin that fails verification, a JIT compile that fails) is raised as is.

``AF3_KERNELS_COMPILE_WRAP=disable``, read at import, defines no operators: each op is a plain
Python call, and ``torch.compile`` breaks its graph at each.

Importing this module declares the ops and defines none. ``ops.layer_norm`` is a
``kwheel.torch.Call``: an eager call on plain CUDA tensors that needs no gradient (and runs
under no profiler, mode, trace or transform) launches the kernel straight away; any other call,
and ``torch.compile``, goes through the operator, which is defined with torch
(``torch.ops.af3_kernels.<name>`` appears) the first time a call needs it.
``ops.layer_norm.default`` is that operator (for ``torch.library.opcheck``). A program that
names ``torch.ops.af3_kernels`` ops before it touches them here (one that loads a saved graph,
say) calls ``ops.library.define_all()`` first.
"""

import torch
import torch.nn.functional as F

import kwheel.torch
from kwheel.torch import Kept, Launch, ceil_div

from . import _registry

__all__ = [
    "layer_norm",
    "masked_softmax_pair_bias",
    "matmul",
    "scale_rows",
    "sigmoid_gate",
    "sigmoid_gate_backward",
    "swiglu",
]

library = kwheel.torch.library(_registry, fallback=True)


def __getattr__(name):
    # Each op's `Call` on its first lookup here (`ops.layer_norm`, `from af3_kernels.ops
    # import layer_norm`); kept as a module attribute after.
    value = library.lookup(name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(library.ops))


def _require(condition, op, message):
    if not condition:
        raise ValueError(f"af3_kernels.ops.{op}: {message}")


def _require_dtype(tensor, dtypes, op, name):
    if tensor.dtype not in dtypes:
        wanted = " or ".join(str(dtype).replace("torch.", "") for dtype in dtypes)
        _require(False, op, f"{name} must be {wanted}, not {str(tensor.dtype).replace('torch.', '')}")


def _rows(x):
    """The number of rows of ``x`` seen as [rows, last dimension]."""
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


# --- layer_norm ------------------------------------------------------------------------


def _layer_norm_shape(x, normalized_shape, weight, bias, eps):
    _require_dtype(x, (torch.bfloat16,), "layer_norm", "x")
    _require(
        len(normalized_shape) == 1 and x.dim() >= 1 and normalized_shape[0] == x.shape[-1],
        "layer_norm",
        f"normalizes over the last dimension only: normalized_shape {list(normalized_shape)} "
        f"for x of shape {list(x.shape)}",
    )
    for name, tensor in (("weight", weight), ("bias", bias)):
        if tensor is not None:
            _require_dtype(tensor, (torch.bfloat16,), "layer_norm", name)
            _require(
                list(tensor.shape) == list(normalized_shape),
                "layer_norm",
                f"{name} of shape {list(tensor.shape)} for normalized_shape "
                f"{list(normalized_shape)}",
            )
    return [(x.shape, x.dtype)]


def _layer_norm_inputs(x, normalized_shape, weight, bias, eps):
    return {"rows": _rows(x), "cols": x.shape[-1]}


def _layer_norm_launch(constants, outputs, x, normalized_shape, weight, bias, eps):
    cols = x.shape[-1]
    rows = _rows(x)
    if weight is None or bias is None:
        ones, zeros = _affine_defaults(x, cols)
        weight = ones if weight is None else weight
        bias = zeros if bias is None else bias
    # One block per row.
    return Launch(rows, constants["BLOCK_SIZE"], [outputs[0], x, weight, bias, rows, cols, eps])


# The weight and bias of a layer_norm called without them, by device, dtype and width: made
# once and passed as `Kept`, so such calls keep a launch plan like any other.
_AFFINE_DEFAULTS = {}
_AFFINE_DEFAULTS_KEPT = 64


def _affine_defaults(x, cols):
    """Ones and zeros of ``cols`` elements, ``x``'s dtype and device. Made during a CUDA graph
    capture they would be filled only when the graph replays, so there they are made for the
    call alone (plain tensors, and that launch is not planned)."""
    key = (x.device, x.dtype, cols)
    found = _AFFINE_DEFAULTS.get(key)
    if found is not None:
        return found
    ones, zeros = x.new_ones(cols), x.new_zeros(cols)
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return ones, zeros
    if len(_AFFINE_DEFAULTS) >= _AFFINE_DEFAULTS_KEPT:
        _AFFINE_DEFAULTS.clear()  # plans keep the tensors they use
    found = _AFFINE_DEFAULTS[key] = (Kept(ones), Kept(zeros))
    return found


def _layer_norm_reference(x, normalized_shape, weight, bias, eps):
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


library.declare(
    "layer_norm(Tensor x, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
    "float eps=1e-05) -> Tensor",
    kernel="layernorm_bf16",
    shape=_layer_norm_shape,
    inputs=_layer_norm_inputs,
    launch=_layer_norm_launch,
    reference=_layer_norm_reference,
)


# --- swiglu ----------------------------------------------------------------------------


def _swiglu_shape(x):
    _require_dtype(x, (torch.bfloat16,), "swiglu", "x")
    _require(x.dim() >= 1, "swiglu", "x must have at least one dimension: [..., 2 * hidden]")
    return [(tuple(x.shape[:-1]) + (x.shape[-1] // 2,), x.dtype)]


def _swiglu_inputs(x):
    return {"rows": _rows(x), "width": x.shape[-1]}


def _swiglu_launch(constants, outputs, x):
    hidden = x.shape[-1] // 2
    rows = _rows(x)
    block = constants["BLOCK_SIZE"]
    return Launch(ceil_div(rows * hidden, block), block, [outputs[0], x, rows, hidden])


def _swiglu_reference(x):
    a, b = x.float().chunk(2, dim=-1)
    return (F.silu(a) * b).to(x.dtype)


library.declare(
    "swiglu(Tensor x) -> Tensor",
    kernel="swiglu",
    shape=_swiglu_shape,
    inputs=_swiglu_inputs,
    launch=_swiglu_launch,
    reference=_swiglu_reference,
)


# --- sigmoid_gate and its backward -----------------------------------------------------


def _same_bf16(op, **tensors):
    shapes = {name: list(tensor.shape) for name, tensor in tensors.items()}
    for name, tensor in tensors.items():
        _require_dtype(tensor, (torch.bfloat16,), op, name)
    first = next(iter(shapes.values()))
    _require(
        # Compared, not hashed: symbolic sizes under dynamic shapes have no hash.
        all(shape == first for shape in shapes.values()),
        op,
        "takes tensors of one shape (no broadcasting): "
        + ", ".join(f"{name} {shape}" for name, shape in shapes.items()),
    )


def _sigmoid_gate_shape(x, gate):
    _same_bf16("sigmoid_gate", x=x, gate=gate)
    return [(x.shape, x.dtype)]


def _count_inputs(x, *others):
    return {"count": x.numel()}


def _sigmoid_gate_launch(constants, outputs, x, gate):
    count = x.numel()
    block = constants["BLOCK_SIZE"]
    return Launch(ceil_div(count, block), block, [outputs[0], x, gate, count])


def _sigmoid_gate_reference(x, gate):
    return (x.float() * torch.sigmoid(gate.float())).to(x.dtype)


library.declare(
    "sigmoid_gate(Tensor x, Tensor gate) -> Tensor",
    kernel="sigmoid_gate",
    shape=_sigmoid_gate_shape,
    inputs=_count_inputs,
    launch=_sigmoid_gate_launch,
    reference=_sigmoid_gate_reference,
)


def _sigmoid_gate_backward_shape(grad, x, gate):
    _same_bf16("sigmoid_gate_backward", grad=grad, x=x, gate=gate)
    return [(x.shape, x.dtype), (gate.shape, gate.dtype)]


def _sigmoid_gate_backward_launch(constants, outputs, grad, x, gate):
    count = x.numel()
    block = constants["BLOCK_SIZE"]
    grad_x, grad_gate = outputs
    return Launch(
        ceil_div(count, block), block, [grad_x, grad_gate, grad, x, gate, count]
    )


def _sigmoid_gate_backward_reference(grad, x, gate):
    grad = grad.float()
    s = torch.sigmoid(gate.float())
    return (grad * s).to(x.dtype), (grad * x.float() * (s * (1 - s))).to(gate.dtype)


library.declare(
    "sigmoid_gate_backward(Tensor grad, Tensor x, Tensor gate) -> (Tensor, Tensor)",
    kernel="sigmoid_gate_backward",
    shape=_sigmoid_gate_backward_shape,
    inputs=_count_inputs,
    launch=_sigmoid_gate_backward_launch,
    reference=_sigmoid_gate_backward_reference,
)


def _sigmoid_gate_setup_context(ctx, inputs, output):
    x, gate = inputs
    ctx.save_for_backward(x, gate)


def _sigmoid_gate_grad(ctx, grad):
    x, gate = ctx.saved_tensors
    grad_x, grad_gate = library.lookup("sigmoid_gate_backward")(grad.to(x.dtype), x, gate)
    return grad_x, grad_gate


library.autograd("sigmoid_gate", _sigmoid_gate_grad, _sigmoid_gate_setup_context)


# --- masked_softmax_pair_bias ----------------------------------------------------------


def _masked_softmax_shape(logits, bias, mask, scale):
    op = "masked_softmax_pair_bias"
    for name, tensor in (("logits", logits), ("bias", bias), ("mask", mask)):
        _require_dtype(tensor, (torch.float32,), op, name)
    _require(
        logits.dim() == 4 and logits.shape[-1] == logits.shape[-2],
        op,
        f"logits must be [batch, heads, n, n], not {list(logits.shape)}",
    )
    if logits.dim() == 4:
        batch, heads, n, _ = logits.shape
        _require(
            list(bias.shape) == [heads, n, n],
            op,
            f"bias must be [heads, n, n] = {[heads, n, n]}, not {list(bias.shape)}",
        )
        _require(
            list(mask.shape) == [batch, n],
            op,
            f"mask must be [batch, n] = {[batch, n]}, not {list(mask.shape)}",
        )
    return [(logits.shape, logits.dtype)]


def _masked_softmax_inputs(logits, bias, mask, scale):
    batch, heads, n, _ = logits.shape
    return {"batch": batch, "heads": heads, "n": n}


def _masked_softmax_launch(constants, outputs, logits, bias, mask, scale):
    batch, heads, n, _ = logits.shape
    # One block per (b, h, i) row.
    return Launch(
        batch * heads * n,
        constants["BLOCK_SIZE"],
        [outputs[0], logits, bias, mask, batch, heads, n, scale],
    )


def _masked_softmax_reference(logits, bias, mask, scale):
    x = torch.addcmul(bias.unsqueeze(0), logits, logits.new_full((), scale))
    x = x.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
    # A row with every key masked is all zeros, not NaN.
    return torch.nan_to_num(torch.softmax(x, dim=-1), nan=0.0)


library.declare(
    "masked_softmax_pair_bias(Tensor logits, Tensor bias, Tensor mask, float scale) -> Tensor",
    kernel="masked_softmax_pair_bias",
    shape=_masked_softmax_shape,
    inputs=_masked_softmax_inputs,
    launch=_masked_softmax_launch,
    reference=_masked_softmax_reference,
)


# --- scale_rows ------------------------------------------------------------------------


def _scale_rows_shape(x, scale):
    _require_dtype(x, (torch.float32, torch.bfloat16), "scale_rows", "x")
    _require_dtype(scale, (torch.float32,), "scale_rows", "scale")
    _require(
        x.dim() == 2 and list(scale.shape) == [x.shape[0]],
        "scale_rows",
        f"takes x [rows, cols] and scale [rows], not {list(x.shape)} and {list(scale.shape)}",
    )
    return [(x.shape, x.dtype)]


def _scale_rows_inputs(x, scale):
    rows, cols = x.shape
    return {"rows": rows, "cols": cols}


def _scale_rows_launch(constants, outputs, x, scale):
    rows, cols = x.shape
    block = constants["BLOCK_SIZE"]
    entry = "scale_rows<float>" if x.dtype == torch.float32 else "scale_rows<__nv_bfloat16>"
    return Launch(
        ceil_div(rows * cols, block), block, [outputs[0], x, scale, rows, cols], entry
    )


def _scale_rows_reference(x, scale):
    return (x.float() * scale[:, None]).to(x.dtype)


library.declare(
    "scale_rows(Tensor x, Tensor scale) -> Tensor",
    kernel="scale_rows",
    shape=_scale_rows_shape,
    inputs=_scale_rows_inputs,
    launch=_scale_rows_launch,
    reference=_scale_rows_reference,
)


# --- matmul (sm_90a) -------------------------------------------------------------------


def _matmul_shape(a, b):
    _require_dtype(a, (torch.bfloat16,), "matmul", "a")
    _require_dtype(b, (torch.bfloat16,), "matmul", "b")
    _require(
        a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0],
        "matmul",
        f"takes a [m, k] and b [k, n], not {list(a.shape)} and {list(b.shape)}",
    )
    return [((a.shape[0], b.shape[1]), torch.float32)]


def _matmul_inputs(a, b):
    return {"m": a.shape[0], "n": b.shape[1], "k": a.shape[1]}


def _matmul_launch(constants, outputs, a, b):
    m, k = a.shape
    n = b.shape[1]
    # One warpgroup per TILE_M x TILE_N tile of the product.
    grid = (ceil_div(n, constants["TILE_N"]), ceil_div(m, constants["TILE_M"]))
    return Launch(grid, constants["BLOCK_SIZE"], [outputs[0], a, b, m, n, k])


def _matmul_reference(a, b):
    return torch.matmul(a.float(), b.float())


library.declare(
    "matmul(Tensor a, Tensor b) -> Tensor",
    kernel="wgmma_matmul_bf16",
    shape=_matmul_shape,
    inputs=_matmul_inputs,
    launch=_matmul_launch,
    reference=_matmul_reference,
)

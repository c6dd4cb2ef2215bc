"""``kwheel.torch``'s launch plans: what a plan may keep of a launch function's arguments and
how it is checked not to depend on any tensor's address (``_Probe`` places the tensors a
second time; ``_looks_addressed`` where they are too large), and how a kept argument is
written again with this call's addresses."""

import torch

from . import TensorMap


class Kept:
    """A kernel argument tensor that is neither an input nor an output and that the launch
    function keeps, unchanged, for as long as the op is used (default weights, a table): a
    launch plan keeps it too and passes its pointer again. A plain tensor of the launch
    function's own making is passed as is, and such a launch is run on every call."""

    __module__ = "kwheel.torch"  # where it is documented and imported from

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    def __repr__(self):
        return f"kwheel.torch.Kept({self.tensor!r})"


class _Probe:
    """Stand-ins for an op's tensor arguments and outputs at other addresses: same shape,
    dtype, strides, device and alignment (up to ``_ALIGNMENT``: a plan's key holds it), but
    other low bits (an offset within a line shows as a difference) with the bit of
    ``_ALIGNMENT`` flipped (so does a larger alignment), and the rest wherever the allocator
    put them. The launch function runs on them once per new plan; a kernel never does.
    ``real`` and ``moved`` list each tensor's address and size, for ``relocation``; ``args``
    is ``None`` when the tensors are too large to place twice (``_PROBE_BYTES``)."""

    __slots__ = ("args", "outputs", "real", "moved")

    def __init__(self, args, positions, outputs):
        places = [(_INPUT, position) for position in positions if args[position] is not None]
        places += [(_OUTPUT, slot) for slot in range(len(outputs))]
        self.real = [_located(args, outputs, role, slot) for role, slot in places]
        self.args = self.outputs = None
        self.moved = []
        if sum(size for _, size, _, _ in self.real) > _PROBE_BYTES:
            return
        placed = {}
        try:
            # Placed in reverse: the stand-ins' distances apart are then not the tensors' own
            # (which the allocator made in order), so an address matches its own tensor only.
            moved_args = list(args)
            moved_outputs = list(outputs)
            for role, slot in reversed(places):
                moved = moved_args if role is _INPUT else moved_outputs
                source = args if role is _INPUT else outputs
                moved[slot] = self._place(source[slot], placed)
        except (RuntimeError, ValueError):  # out of memory, or an address no probe can mirror
            return
        self.moved = [_located(moved_args, moved_outputs, role, slot) for role, slot in places]
        self.args, self.outputs = moved_args, moved_outputs

    @staticmethod
    def _place(tensor, placed):
        found = placed.get(id(tensor))
        if found is not None:  # one tensor passed twice stays one tensor
            return found
        item = tensor.element_size()
        address = tensor.data_ptr()
        if tensor.numel() == 0:
            moved = torch.empty_like(tensor)
        else:
            if address % item:
                raise ValueError("an address that is no multiple of the element size")
            span = 1 + sum(
                (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride())
            )
            base = torch.empty(span + 2 * _ALIGNMENT // item, dtype=tensor.dtype, device=tensor.device)
            # Same alignment (up to `_ALIGNMENT`), other low bits: the bit above the
            # alignment and the bit of `_ALIGNMENT` flipped.
            alignment = (address | _ALIGNMENT) & -(address | _ALIGNMENT)
            flip = (alignment * 2 if alignment * 2 < _ALIGNMENT else 0) | _ALIGNMENT
            target = (address ^ flip) % (2 * _ALIGNMENT)
            shift = (target - base.data_ptr()) % (2 * _ALIGNMENT)
            moved = base.as_strided(tensor.shape, tensor.stride(), shift // item)
        placed[id(tensor)] = moved
        return moved

    def relocation(self, value, other):
        """The template entry of a kernel argument that differs between the real launch and
        the probe's: an ``int`` that is a tensor's address plus the same offset in both, or a
        struct whose differing 8-byte words are such addresses; ``None`` for anything else."""
        if type(value) is int and type(other) is int:
            found = self._address(value, other)
            return None if found is None else (_address_of, found)
        if not (_is_buffer(value) and _is_buffer(other)):
            return None
        if isinstance(value, TensorMap):
            return None  # the driver's encoding of an address: made again on every call
        first = bytes(memoryview(value))
        second = bytes(memoryview(other))
        if len(first) != len(second):
            return None
        fields = []
        for offset in range(0, len(first) - 7, 8):
            word, moved_word = first[offset:offset + 8], second[offset:offset + 8]
            if word == moved_word:
                continue
            found = self._address(int.from_bytes(word, "little"), int.from_bytes(moved_word, "little"))
            if found is None:
                return None
            fields.append((offset, *found))
        # Proof: the real struct, its addresses written as the probe's, is the probe's struct.
        fields = tuple(fields)
        if _struct_of((first, fields), self.args, self.outputs) != second:
            return None
        return (_struct_of, (first, fields))

    def _address(self, value, other):
        """``(role, slot, offset)``: ``value`` is that tensor's address plus ``offset`` and
        ``other`` its stand-in's plus the same offset. Where several tensors fit (two tensors
        the allocator placed as far apart as their stand-ins), the one the address lies
        inside is it; where that does not decide, none is (the launch keeps no plan)."""
        found = [
            (role, slot, value - address, 0 <= value - address <= size)
            for (address, size, role, slot), (moved, _, _, _) in zip(self.real, self.moved)
            if address and value - address == other - moved
        ]
        inside = [candidate for candidate in found if candidate[3]]
        found = inside or found
        if len(found) != 1:
            return None
        role, slot, offset, _ = found[0]
        return role, slot, offset


def _looks_addressed(kernel_args, tensors):
    """Whether a kernel argument could hold an address near one of ``tensors`` (``_Probe``'s
    ``real``): an ``int``, or an 8-byte word of a struct, within 64 KiB of one, or a value of
    a kind that cannot be read. The check of launches whose tensors are too large to place
    twice: unlike the probe, it cannot see an address transformed (shifted, hashed)."""

    def near(word):
        return any(
            address and address - 65536 <= word <= address + size + 65536
            for address, size, _, _ in tensors
        )

    for value in kernel_args:
        if value is None or isinstance(value, (Kept, torch.Tensor, float, bool)):
            continue
        if type(value) is int:
            if near(value):
                return True
        elif _is_buffer(value):
            data = bytes(memoryview(value))
            if any(near(int.from_bytes(data[i:i + 8], "little")) for i in range(0, len(data) - 7, 8)):
                return True
        else:
            return True
    return False


def _located(args, outputs, role, slot):
    """``(address, size in bytes, role, slot)`` of an input (``args[slot]``) or output."""
    tensor = (args if role is _INPUT else outputs)[slot]
    return tensor.data_ptr(), tensor.numel() * tensor.element_size(), role, slot


def _is_buffer(value):
    """Bytes, or an object with the buffer protocol (a ``ctypes.Structure``), that a launch
    passes as its bytes."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return True
    if isinstance(value, (torch.Tensor, int, float, str)) or value is None:
        return False
    try:
        memoryview(value)
    except TypeError:
        return False
    return True


def _same(first, second):
    """Equal and of one type (``1``, ``True`` and ``1.0`` are three arguments); buffers by
    their bytes."""
    if _is_buffer(first) or _is_buffer(second):
        return (
            _is_buffer(first)
            and _is_buffer(second)
            and bytes(memoryview(first)) == bytes(memoryview(second))
        )
    if type(first) is not type(second):
        return False
    try:
        return bool(first == second)
    except Exception:  # noqa: BLE001 - a value that cannot say it is equal is not kept
        return False


def _address_of(found, args, outputs):
    """A planned ``int`` argument: a tensor's address plus an offset (``_Probe._address``)."""
    role, slot, offset = found
    return (args if role is _INPUT else outputs)[slot].data_ptr() + offset


def _struct_of(planned, args, outputs):
    """A planned struct argument: its bytes, each address field ``(offset, role, slot,
    delta)`` written with that tensor's address of this call."""
    data, fields = planned
    written = bytearray(data)
    for offset, role, slot, delta in fields:
        address = (args if role is _INPUT else outputs)[slot].data_ptr() + delta
        written[offset:offset + 8] = (address & _WORD).to_bytes(8, "little")
    return bytes(written)


def _find(tensors, tensor, positions):
    for position in positions:
        if tensors[position] is tensor:
            return position
    return None


# How many launch plans an op keeps before it starts over.
_PLANS_PER_OP = 256
_INPUT = "input"
_OUTPUT = "output"
_CONSTANT = "constant"
_UNCACHEABLE = "uncacheable"
# The most bytes of tensors a new plan places a second time to check its launch; past it, a
# launch is checked by `_looks_addressed` alone.
_PROBE_BYTES = 256 << 20
# The largest alignment of an input's address a plan tells apart: CUDA's caching allocator
# places every block at 512 bytes, so a plain tensor's is this, a slice's its own.
_ALIGNMENT = 512
_WORD = (1 << 64) - 1

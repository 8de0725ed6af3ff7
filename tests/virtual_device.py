"""A second device for a CPU-only machine: catches the host/device mix-ups that only a GPU would report.

Inside `VirtualDevice()`, every tensor is either on the (virtual) device or on the host, and an op that mixes a
non-scalar host tensor with a device tensor raises `DeviceMix`, as CUDA raises "Expected all tensors to be on the
same device", and reading a device tensor as a numpy array fails too. Tensors reach the device by
`place(module_or_tensor)`, by any call given a `torch.device` (`torch.arange(n, device=x.device)`: the device a
caller passed on), by `.to(device)`, or by being computed from device tensors; a factory with no device, or with
the string "cpu", makes a host tensor. What CUDA allows stays allowed: 0-dim host tensors in device ops, host
indices into a device tensor, and copies by assignment.

Not seen: `x.device` cannot be told apart here (a host tensor's device reads as a torch.device too, so
`device=host.device` makes a device tensor), CPU generators, and 0-dim host tensors in the ops CUDA does not
let them into (masked_fill's mask, cat, searchsorted).

    with VirtualDevice() as dev:
        dev.place(model, encoder)
        decode_ar(ARBackbone(model, encoder, 3.0), captions)   # DeviceMix where a GPU run would fail
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

T = torch.Tensor
FACTORIES = {torch.arange, torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.full, torch.empty,
             torch.rand, torch.randn, torch.randint, torch.randperm, torch.linspace, torch.eye}
LIKE = {torch.zeros_like, torch.ones_like, torch.full_like, torch.empty_like, torch.rand_like, torch.randn_like,
        torch.randint_like}
NEW = {T.new_zeros, T.new_ones, T.new_full, T.new_empty, T.new_tensor}
TO_HOST = {T.cpu}
MOVES = {T.cpu, T.to, torch.as_tensor}  # each may return its input unchanged on the CPU
ASSIGN = {T.__setitem__, T.copy_}  # cross-device copies are legal


class DeviceMix(RuntimeError):
    pass


def _wants_device(device) -> bool:
    """A factory's or .to()'s device argument: a torch.device (a caller's device, passed on) is the device;
    None or the literal "cpu" is the host."""
    return isinstance(device, (torch.device, int)) or (isinstance(device, str) and device != "cpu")


class VirtualDevice(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.on = WeakIdKeyDictionary()

    def place(self, *things) -> None:
        for thing in things:
            tensors = [thing] if isinstance(thing, T) else [*thing.parameters(), *thing.buffers()]
            for t in tensors:
                self.on[t] = True

    def is_on(self, t: T) -> bool:
        return t in self.on

    def _mark(self, out, on: bool) -> None:
        for t in tree_flatten(out)[0]:
            if isinstance(t, T):
                if on:
                    self.on[t] = True
                else:
                    self.on.pop(t, None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (T.numpy, T.__array__) and self.is_on(args[0]):
            raise DeviceMix("a device tensor read as a numpy array (needs .cpu() first)")
        if func is T.__setitem__ and isinstance(args[2], T) and args[2].dim() > 0:
            index = [t for t in tree_flatten(args[1])[0] if isinstance(t, T)]
            if index and self.is_on(args[0]) != self.is_on(args[2]):  # index_put_ moves 0-dim values only
                raise DeviceMix(f"values {tuple(args[2].shape)} put by tensor index across devices")
        out = func(*args, **kwargs)
        if func in MOVES and out is args[0]:  # on the CPU these return their input; a real move makes a copy
            out = out.clone()
        if "device" in kwargs and func is not T.to:
            self._mark(out, _wants_device(kwargs["device"]))
        elif func in FACTORIES:  # no device given: the host, or the data's own side
            data = args[0] if args and isinstance(args[0], T) else None
            self._mark(out, data is not None and self.is_on(data))
        elif func in LIKE or func in NEW:
            self._mark(out, self.is_on(args[0]))
        elif func in TO_HOST:
            self._mark(out, False)
        elif func is T.to:
            target = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device, T))), None))
            if isinstance(target, T):
                self._mark(out, self.is_on(target))
            elif target is not None:
                self._mark(out, _wants_device(target))
            else:
                self._mark(out, self.is_on(args[0]))
        elif func in ASSIGN:
            pass
        else:
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, T)]
            on = [t for t in tensors if self.is_on(t)]
            if func is T.__getitem__:  # host indices into a device tensor are fine; the reverse is not
                if not self.is_on(args[0]) and args[0].dim() > 0 and any(t.dim() > 0 for t in on):
                    raise DeviceMix(f"a host tensor {tuple(args[0].shape)} indexed by a device tensor")
                self._mark(out, self.is_on(args[0]))
            else:
                host = [t for t in tensors if not self.is_on(t) and t.dim() > 0]
                if on and host:
                    name = getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
                    raise DeviceMix(f"{name}: host tensor(s) {[tuple(t.shape) for t in host]} mixed with device "
                                    f"tensor(s) {[tuple(t.shape) for t in on]}")
                self._mark(out, bool(on))
        return out

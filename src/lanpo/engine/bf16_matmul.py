"""bf16 matmuls on a CPU without native bf16, as float32 GEMMs of the bf16 operands.

Where a CPU has no AVX512-BF16 or AMX, torch computes a bf16 matmul in a slow reference kernel: SmolLM2-135M's
forward and backward pass under bf16 autocast took 28.0 times as long as in float32 on a 2-core AVX2 EPYC, and
vLLM's CPU sampler (oneDNN cannot build a bf16 matmul there, so it falls back to torch's) sampled 4.5 times more
slowly (``benchmarks/cpu_bf16.py``). A native bf16 GEMM multiplies bf16 operands and accumulates the products in
float32 before rounding the result to bf16. Every product of two bf16 numbers is exact in float32 (8 + 8 significant
bits), so upcasting the operands, multiplying in float32 and rounding once computes the same thing, up to the order
of the float32 sums (which already differs from one CPU's kernels to another's), at float32's speed.

:func:`install` re-registers torch's CPU kernels of ``mm``, ``addmm``, ``bmm`` and ``baddbmm`` (each also in its
``out=`` form, which compiled graphs such as vLLM's call): when every tensor argument is bf16 they call torch's own
kernel on float32 copies and round the result to bf16; any other call goes to torch's kernel untouched. It acts
below autograd, so backward passes use it too. Nothing is installed on a CPU with native bf16, and
``LANPO_BF16_MATMUL=torch`` keeps torch's own kernels (to measure one against the other).
"""

from __future__ import annotations

import logging
import warnings

import torch

from lanpo.engine.bf16_env import ENV, setting

logger = logging.getLogger(__name__)

OPS = ("mm", "addmm", "bmm", "baddbmm")  # every dense matmul a linear layer or attention reaches on CPU
_library: torch.library.Library | None = None


def torch_kept_because() -> str | None:
    """Why torch's own bf16 kernels stay where bf16 is emulated (``LANPO_BF16_MATMUL=torch``, or a torch that cannot
    keep its kernel beside lanpo's), or None where lanpo's run."""
    if setting() == "torch":
        return f"{ENV}=torch"
    if not hasattr(torch.library, "get_kernel"):
        return "this torch has no torch.library.get_kernel"
    return None


def mode(native: bool) -> str:
    """How this process computes CPU bf16 matmuls: ``native`` (the CPU's bf16 units), ``fp32-accumulate`` (this
    module) or ``torch`` (torch's emulation: see :func:`torch_kept_because`). A value of ``LANPO_BF16_MATMUL`` it
    does not know is refused on every CPU."""
    setting()
    if native:
        return "native"
    return "torch" if torch_kept_because() else "fp32-accumulate"


def installed() -> bool:
    return _library is not None


def _bf16(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16


def _upcast(value):
    return value.float() if isinstance(value, torch.Tensor) else value


def _kernel(name: str):
    """torch's CPU kernel of ``aten::name`` (an overload: ``mm`` or ``mm.out``) behind one that computes all-bf16
    calls in float32."""
    original = torch.library.get_kernel(f"aten::{name}", "CPU")
    functional = torch.library.get_kernel(f"aten::{name.split('.')[0]}", "CPU")

    def kernel(keyset, *args, **kwargs):
        out = kwargs.get("out")
        tensors = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
        if not all(_bf16(value) for value in tensors):
            return original.call_boxed(keyset, *args, **kwargs)
        inputs = {key: value for key, value in kwargs.items() if key != "out"}
        result = functional.call_boxed(
            keyset, *(_upcast(value) for value in args), **{key: _upcast(v) for key, v in inputs.items()}
        )
        result = result.to(torch.bfloat16)
        if out is None:
            return result
        if out.shape != result.shape:
            out.resize_(result.shape)  # as torch's out= forms do
        return out.copy_(result)

    return kernel


def install() -> bool:
    """Compute this process's CPU bf16 matmuls as float32 GEMMs of the bf16 operands (idempotent). Returns whether
    they are (false where ``LANPO_BF16_MATMUL=torch`` asks for torch's own kernels, or torch is too old to keep
    them beside these)."""
    global _library
    if _library is not None:
        return True
    if torch_kept_because():
        return False
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # torch warns, with its whole dispatch table, that a kernel is overridden
        warnings.simplefilter("ignore", UserWarning)
        for name in (*OPS, *(f"{op}.out" for op in OPS)):
            library.impl(name, _kernel(name), "CPU", with_keyset=True)
    _library = library
    logger.debug("CPU bf16 matmuls (%s) now run as float32 GEMMs of their bf16 operands", ", ".join(OPS))
    return True


def uninstall() -> None:
    """Give the CPU bf16 matmuls back to torch's own kernels."""
    global _library
    if _library is not None:
        _library._destroy()
        _library = None

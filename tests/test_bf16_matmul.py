"""lanpo's CPU bf16 matmuls (float32 GEMMs of the bf16 operands, rounded once): the arithmetic of a native bf16
GEMM, torch's own kernel for every other call, below autograd, and gone again on uninstall."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lanpo.engine import bf16_matmul

BF16 = torch.bfloat16


@pytest.fixture()
def fast():
    assert bf16_matmul.install()
    yield
    bf16_matmul.uninstall()


def operands(seed: int, m: int, k: int, n: int, batch: int | None, scale: float, transposed: bool):
    generator = torch.Generator().manual_seed(seed)
    shape_a, shape_b = (m, k), (n, k) if transposed else (k, n)
    if batch is not None:
        shape_a, shape_b = (batch, *shape_a), (batch, *shape_b)
    a = (torch.randn(shape_a, generator=generator) * scale).to(BF16)
    b = (torch.randn(shape_b, generator=generator) * scale).to(BF16)
    return a, b.transpose(-1, -2) if transposed else b


def within_one_rounding(result, reference, a, b, sums: int = 1) -> torch.Tensor:
    """Whether ``result`` is as near ``reference`` as a bf16 GEMM that accumulates in float32 may be: one bf16 ulp for
    the one rounding (half, and the sum's own error may tip it), plus ``sums`` float32 accumulation errors."""
    ulp = torch.finfo(BF16).eps * reference.double().abs()
    accumulation = a.shape[-1] * torch.finfo(torch.float32).eps * (a.double().abs() @ b.double().abs())
    return (result.double() - reference.double()).abs() <= ulp + sums * accumulation + torch.finfo(BF16).tiny


shapes = dict(
    seed=st.integers(0, 2**16),
    m=st.integers(1, 24),
    k=st.integers(1, 96),
    n=st.integers(1, 24),
    batch=st.none() | st.integers(1, 3),
    scale=st.sampled_from([1e-3, 1.0, 30.0]),
    transposed=st.booleans(),
)


@given(**shapes)
def test_a_bf16_product_is_the_exact_product_rounded_once_like_a_native_bf16_gemm(
    seed, m, k, n, batch, scale, transposed
):
    a, b = operands(seed, m, k, n, batch, scale, transposed)
    torch_result = a @ b  # torch's own (emulated) kernel, the arithmetic lanpo's must match
    assert bf16_matmul.install()
    try:
        result = a @ b
        out = torch.empty(0, dtype=BF16)
        torch.matmul(a, b, out=out)  # the out= form (a compiled graph's) resizes an empty out, as torch does
    finally:
        bf16_matmul.uninstall()
    assert result.dtype == BF16 and result.shape == torch_result.shape and torch.equal(out, result)
    exact = a.double() @ b.double()
    assert within_one_rounding(result, exact, a, b).all()
    assert within_one_rounding(torch_result, exact, a, b).all()  # the bound is one torch's kernel meets too
    # about one bf16 ulp apart from torch's kernel at most: the same arithmetic, summed in another order
    assert within_one_rounding(result, torch_result, a, b, sums=2).all()


@given(seed=st.integers(0, 2**16), beta=st.sampled_from([0.0, 0.5, 1.0]), alpha=st.sampled_from([1.0, 2.0]))
def test_addmm_and_baddbmm_add_the_bias_before_the_one_rounding(seed, beta, alpha):
    a, b = operands(seed, 5, 40, 7, None, 1.0, False)
    bias = torch.randn(7, generator=torch.Generator().manual_seed(seed + 1)).to(BF16)
    if beta == 0:
        bias[0] = float("nan")  # beta 0 ignores the bias, NaN included, as torch's addmm does
    exact = beta * bias.double() + alpha * (a.double() @ b.double()) if beta else alpha * (a.double() @ b.double())
    with_fast = []
    assert bf16_matmul.install()
    try:
        with_fast.append(torch.addmm(bias, a, b, beta=beta, alpha=alpha))
        with_fast.append(torch.baddbmm(bias, a[None], b[None], beta=beta, alpha=alpha)[0])
    finally:
        bf16_matmul.uninstall()
    for result in with_fast:
        assert not result.isnan().any()
        assert (
            torch.equal(result, exact.to(BF16))
            or ((result.double() - exact).abs() <= torch.finfo(BF16).eps * exact.abs() + 1e-6 * (1 + exact.abs())).all()
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.complex64])
def test_every_other_call_runs_torchs_own_kernel_bit_for_bit(dtype, fast):
    generator = torch.Generator().manual_seed(0)
    a, b = (
        (torch.randn(6, 9, generator=generator) * 4).to(dtype),
        (torch.randn(9, 5, generator=generator) * 4).to(dtype),
    )
    with_fast = [a @ b, torch.addmm(a @ b, a, b, beta=0.5 if dtype != torch.int64 else 1), torch.bmm(a[None], b[None])]
    bf16_matmul.uninstall()
    with_torch = [a @ b, torch.addmm(a @ b, a, b, beta=0.5 if dtype != torch.int64 else 1), torch.bmm(a[None], b[None])]
    for mine, theirs in zip(with_fast, with_torch):
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs)


def torch_error(call) -> str:
    try:
        call()
    except RuntimeError as error:
        return str(error)
    raise AssertionError("no error")


def test_a_bad_call_fails_with_torchs_own_message(fast):
    a, b = torch.randn(4, 8).to(BF16), torch.randn(8, 3).to(BF16)
    calls = [
        lambda: torch.mm(a, torch.randn(8, 3)),  # mixed dtypes
        lambda: torch.mm(a, b, out=torch.empty(4, 3)),  # an out of another dtype
        lambda: torch.mm(a, torch.randn(5, 3).to(BF16)),  # shapes that do not chain
    ]
    with_fast = [torch_error(call) for call in calls]
    bf16_matmul.uninstall()
    assert with_fast == [torch_error(call) for call in calls]


def test_backward_under_bf16_autocast_runs_through_it_and_matches_torchs_gradients(monkeypatch):
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    x = torch.randn(16, 48)
    upcasts = []
    upcast = bf16_matmul._upcast
    monkeypatch.setattr(bf16_matmul, "_upcast", lambda value: upcasts.append(value) or upcast(value))

    def gradients():
        layer.zero_grad()
        with torch.autocast("cpu", dtype=BF16):
            loss = layer(x).float().square().mean()
        forward = len(upcasts)
        loss.backward()
        return [p.grad.clone() for p in layer.parameters()], forward

    reference, _ = gradients()
    assert upcasts == []  # torch's kernels: nothing of lanpo's ran
    assert bf16_matmul.install()
    try:
        fast_grads, forward = gradients()
    finally:
        bf16_matmul.uninstall()
    assert forward > 0 and len(upcasts) > forward  # the forward's bf16 matmuls, and the backward's after them
    for mine, theirs in zip(fast_grads, reference):
        assert torch.allclose(mine, theirs, rtol=0.02, atol=1e-3 * theirs.abs().max().item())


def test_install_is_idempotent_and_uninstall_gives_torchs_kernels_back(monkeypatch):
    a, b = operands(3, 16, 64, 16, None, 1.0, True)
    before = a @ b
    assert bf16_matmul.install() and bf16_matmul.install() and bf16_matmul.installed()
    bf16_matmul.uninstall()
    assert not bf16_matmul.installed() and torch.equal(a @ b, before)
    monkeypatch.setenv(bf16_matmul.ENV, "torch")
    assert bf16_matmul.install() is False and not bf16_matmul.installed()
    monkeypatch.delenv(bf16_matmul.ENV)
    monkeypatch.delattr(torch.library, "get_kernel")  # a torch that cannot keep its kernel beside lanpo's
    assert bf16_matmul.mode(False) == "torch" and bf16_matmul.install() is False and not bf16_matmul.installed()


@pytest.mark.parametrize(
    "setting, native, mode",
    [
        ("", True, "native"),
        ("torch", True, "native"),
        ("", False, "fp32-accumulate"),
        ("Torch", False, "torch"),
        ("fp32-accumulate", False, "fp32-accumulate"),
    ],
)
def test_the_mode_a_cell_records(monkeypatch, setting, native, mode):
    monkeypatch.setenv(bf16_matmul.ENV, setting)
    assert bf16_matmul.mode(native) == mode


def test_a_setting_it_does_not_know_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv(bf16_matmul.ENV, "fp16")
    with pytest.raises(ValueError, match="torch .* or fp32-accumulate"):
        bf16_matmul.mode(False)
    with pytest.raises(ValueError, match="LANPO_BF16_MATMUL='fp16'"):
        bf16_matmul.install()
    assert not bf16_matmul.installed()
    with pytest.raises(ValueError, match="fp32-accumulate"):
        bf16_matmul.mode(True)  # a CPU with native bf16 refuses it too


@pytest.mark.parametrize("command", ["train", "sft", "eval", "gate", "experiment", "sft-data"])
def test_every_command_that_may_run_bf16_refuses_a_bad_setting_before_it_starts(monkeypatch, capsys, command):
    from lanpo.cli import main

    monkeypatch.setenv(bf16_matmul.ENV, "fp16")
    assert main([command, "--no-such-flag"]) == 2  # refused before the command reads a flag or a model
    assert "LANPO_BF16_MATMUL='fp16'" in capsys.readouterr().err

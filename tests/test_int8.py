"""8-bit integer linear layers (`translate --precision int8`) against exact integer arithmetic.

The reference below quantizes in float64 and multiplies in int64, so it is exact: the
int8 kernel must give the same sums, whatever the CPU, batch or row.
"""

from __future__ import annotations

import pytest
import torch

from nmt_cli.errors import NmtError
from nmt_cli.models.fast import int8
from nmt_cli.models.fast.int8 import Int8Linear, int8_unavailable_reason, quantize_linears, quantize_rows
from nmt_cli.models.registry import ARCHITECTURES, build_model

pytestmark = pytest.mark.skipif(int8_unavailable_reason() is not None, reason=str(int8_unavailable_reason()))


def reference_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per output row, [-127, 127], in float64."""
    w = weight.double()
    scale = w.abs().amax(dim=1) / 127
    scale[scale == 0] = 1
    return torch.round(w / scale[:, None]).clamp(-127, 127).long(), scale


def reference_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per row, x ~ scale * q with q in [-63, 63], rounded half up, in float64."""
    x = x.double()
    scale = x.abs().amax(dim=1, keepdim=True) / 63
    scale[scale == 0] = 1
    return torch.floor(x / scale + 0.5).clamp(-63, 63).long(), scale


def integer_product(q_x: torch.Tensor, x_scale: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
    """x_scale * w_scale * (q_x @ q_w^T) + bias, the integer sum exact (int64), in float64."""
    q_w, w_scale = reference_weight(linear.weight.detach())
    out = (q_x @ q_w.T).double() * w_scale * x_scale
    return out if linear.bias is None else out + linear.bias.detach().double()


def awkward_rows(k: int) -> torch.Tensor:
    """Rows a quantizer can get wrong: zeros, one sign only, one outlier, tiny and huge values."""
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(8, k, generator=gen)
    rows[0] = 0
    rows[1] = rows[1].abs()
    rows[2] = -rows[2].abs()
    rows[3, 5] = 40.0
    rows[4] *= 1e-30
    rows[5] *= 1e30
    rows[6] = 1.0
    rows[7] = torch.where(torch.arange(k) % 2 == 0, 1.0, -1.0)
    return rows


def test_rows_are_quantized_symmetrically_per_row():
    x = awkward_rows(64)
    values, scale = quantize_rows(x)
    q_ref, scale_ref = reference_rows(x)
    assert values.dtype == torch.uint8 and int(values.min()) >= 1 and int(values.max()) <= 127
    assert scale.double().squeeze(1)[1:] == pytest.approx(scale_ref.squeeze(1)[1:], rel=1e-6)
    # float32 against float64 division: a value exactly between two steps may round either way.
    off = (values.long() - 64 - q_ref).abs()
    assert int(off.max()) <= 1 and int(off.sum()) <= 2
    assert torch.equal(values[0], torch.full((64,), 64, dtype=torch.uint8))  # zeros stay exactly zero


@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_equals_the_exact_integer_product(bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 40, bias=bias)
    with torch.no_grad():
        linear.weight[3] = 0  # an all-zero output row
    x = awkward_rows(48)
    values, scale = quantize_rows(x)
    expected = integer_product(values.long() - 64, scale.double(), linear)
    got = Int8Linear(linear)(x)
    assert got.dtype == torch.float32 and got.shape == (8, 40)
    # Rows span 1e-30 to 1e30: float32 rounding, relative to each row's largest output.
    row_size = expected.abs().amax(dim=1, keepdim=True)
    assert bool(((got.double() - expected).abs() <= 1e-6 * row_size).all())


def test_long_sums_of_extreme_values_do_not_overflow():
    """Every term at +-63 x 127: pairs of products that 16-bit sums would saturate with 8-bit activations."""
    k = 1024
    linear = torch.nn.Linear(k, 3, bias=False)
    with torch.no_grad():
        linear.weight[0] = 1.0
        linear.weight[1] = -1.0
        linear.weight[2] = torch.where(torch.arange(k) % 2 == 0, 1.0, -1.0)
    x = torch.stack([torch.ones(k), -torch.ones(k), torch.where(torch.arange(k) % 2 == 0, 1.0, -1.0)])
    got = Int8Linear(linear)(x)
    expected = torch.tensor([[k, -k, 0], [-k, k, 0], [0, 0, k]], dtype=torch.float32)
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-3)


def test_a_row_does_not_depend_on_the_rest_of_its_batch():
    torch.manual_seed(1)
    layer = Int8Linear(torch.nn.Linear(64, 96))
    x = torch.randn(2, 7, 64) * torch.logspace(-2, 2, 7)[:, None]
    together = layer(x)
    assert together.shape == (2, 7, 96)
    for b in range(2):
        for t in range(7):
            assert torch.equal(layer(x[b, t : t + 1]), together[b, t : t + 1])


def test_int8_linear_stays_close_to_float32():
    torch.manual_seed(2)
    linear = torch.nn.Linear(256, 512)
    x = torch.randn(64, 256)
    exact = linear(x).detach()
    error = (Int8Linear(linear)(x) - exact).norm() / exact.norm()
    assert float(error) < 0.02


def test_quantize_linears_replaces_every_linear_and_keeps_tied_embeddings_float():
    cfg = ARCHITECTURES["transformer_tiny"]
    cfg = type(cfg)(**{**cfg.to_dict(), "dropout": 0.0, "share_all_embeddings": True})
    torch.manual_seed(0)
    model = build_model(cfg, 30, 30).eval()
    embedding = model.decoder.embed_tokens.weight.clone()
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    quantize_linears(model)
    assert sum(isinstance(m, torch.nn.Linear) for m in model.modules()) == 0
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == linears
    assert torch.equal(model.decoder.embed_tokens.weight, embedding)
    assert model.decoder.embed_tokens.weight.dtype == torch.float32


def test_a_torch_without_the_kernels_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(int8, "int8_unavailable_reason", lambda: "this torch build has no oneDNN")
    with pytest.raises(NmtError, match="--precision int8: this torch build has no oneDNN"):
        quantize_linears(torch.nn.Sequential(torch.nn.Linear(4, 4)))

"""CPU int8 inference with torch's quantized operators (fbgemm on x86).

torch >= 2.10 deprecates the quantized tensor API (``quantize_per_tensor``,
``quantize_dynamic``) in favour of torchao, which these machines do not have;
we use the API knowingly and keep its warnings out of users' logs
(:func:`quantized_api_quiet`).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from torch import nn

__all__ = ["Int8Linear", "quantized_api_quiet"]


@contextmanager
def quantized_api_quiet() -> Iterator[None]:
    """Silence torch's deprecation of the quantized tensor API (``quantize_per_tensor``,
    ``quantize_dynamic``; torch >= 2.10) while we use it knowingly for CPU int8 inference."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, message=r".*quantize_per_(tensor|channel).*")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        yield


class Int8Linear(nn.Module):
    """``x @ weight.T + bias`` in int8 for CPU inference (fbgemm's dynamic quantization: the weight
    per output row, the input per call, at 7 bits as torch's own dynamic ``Linear`` does on x86)."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        super().__init__()
        weight = weight.detach().float().contiguous()
        if not bool(torch.isfinite(weight).all()) or (bias is not None and not bool(torch.isfinite(bias).all())):
            raise ValueError(
                f"Int8Linear: the {tuple(weight.shape)} layer holds non-finite weights (NaN or inf), which would "
                "quantize to NaN scales: the model is damaged; load or train it again"
            )
        scales = (weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0).double()
        with quantized_api_quiet():
            qweight = torch.quantize_per_channel(
                weight, scales, torch.zeros(len(scales), dtype=torch.long), 0, torch.qint8
            )
            self._packed = torch.ops.quantized.linear_prepack(qweight, None if bias is None else bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x.contiguous(), self._packed, True)

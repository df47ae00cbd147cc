"""``sparsile::refused_gradient``: a second derivative the layers lack, refused when it runs, in a traced backward.

A sparse layer's gradient computed with ``create_graph=True`` (under torch.func's transforms, always) sits on a
node whose backward raises the layer's diagnostic (``autograd._RefusedSecondDerivative``: SP0916, SP0922) if it is
differentiated again. Eagerly that backward runs only when the user asks for the second derivative. AOTAutograd
(torch.compile's backends "aot_eager", "inductor") traces the backward of a compiled function's every output in
every input that requires grad, ahead, whether or not it will run: ``torch.compile`` of ``torch.func.grad`` (or
``vmap(grad)``) in x through a ``SemiSparseLinear`` whose weight requires grad stopped at SP0916 at compile time,
though no second derivative was asked. While traced, the backward returns this op's outputs instead of raising:
the graph holds the refusal, which raises the diagnostic when (if) that backward runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake

from ..errors import IntegrationError


@torch.library.custom_op("sparsile::refused_gradient", mutates_args=())
def refused_gradient(like: torch.Tensor, code: str, message: str, help: str) -> torch.Tensor:
    """Raises the diagnostic (code, message, help) when run; a tensor of ``like``'s shape to tracers."""
    raise IntegrationError(code, message, help=help or None)


@refused_gradient.register_fake
def _refused_gradient_fake(like: torch.Tensor, code: str, message: str, help: str) -> torch.Tensor:
    return torch.empty_like(like)


@refused_gradient.register_vmap
def _refused_gradient_vmap(info: Any, in_dims: tuple[Any, ...], like: torch.Tensor, code: str, message: str,
                           help: str) -> tuple[torch.Tensor, Any]:
    return refused_gradient(like, code, message, help), in_dims[0]


def traced_backward(grad: torch.Tensor) -> bool:
    """The backward runs under a tracer (AOTAutograd's joint graph, make_fx): ``grad`` is fake, or a dispatch
    mode is on (a FunctionalTensor over a fake)."""
    return is_fake(grad) or torch._C._len_torch_dispatch_stack() > 0 or torch.compiler.is_compiling()


@dataclass(frozen=True)
class Refusal:
    """A diagnostic kept on a gradient's node, to raise if (when) that node is differentiated: its code,
    message and help, the :class:`IntegrationError` built only by :meth:`error`, when it is raised. (Built
    where it is kept, in a backward that dynamo runs on fake tensors under a compiled ``torch.func.grad``,
    the error stopped the trace: traced_errors' hook takes an error built there for one being raised.)"""

    code: str
    message: str
    help: str | None = None

    def error(self) -> IntegrationError:
        """The diagnostic, to raise."""
        return IntegrationError(self.code, self.message, help=self.help)


def refused_like(refusal: Refusal, grad: torch.Tensor,
                 like: tuple[tuple[torch.Size, torch.dtype], ...]) -> tuple[torch.Tensor, ...]:
    """For each (shape, dtype) of ``like`` a refused gradient raising ``refusal`` (on ``grad``'s device)."""
    return tuple(refused_gradient(grad.new_empty(shape, dtype=dtype), refusal.code, refusal.message,
                                  refusal.help or "") for shape, dtype in like)

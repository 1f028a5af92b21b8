"""Finds a backward-only overflow: the loss is finite, a gradient is not.

The second layer's backward multiplies the gradient entering it by 1e8 in
float16, which overflows (float16's largest value is 65504) although every
forward value is small. The locator reports the first gradient that is not
finite (its bias's gradient, the first tensor `2`'s backward writes) and, as
"finite on its way in", the gradient that entered `2`'s output, read once
after the step.
"""

import torch

import fastnorm


class Amplify(torch.autograd.Function):
    """Identity forward; a backward that overflows in float16."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return (grad.half() * 1e8).to(grad.dtype)


class Overflowing(torch.nn.Linear):
    def forward(self, x):
        return Amplify.apply(super().forward(x))


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), Overflowing(16, 16), torch.nn.Linear(16, 1))
locator = fastnorm.Locator(model)
loss = model(torch.randn(8, 16)).square().mean()
loss.backward()
locator.step(1)
print(f"loss {loss.item():.3f} (finite)")
print(locator.report())
locator.remove()

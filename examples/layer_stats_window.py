"""Which layer went non-finite, counted over every step of the window, from the norm's own pass.

The third layer's weight gradient overflows float16 on two steps of a window
of 20 (its backward multiplies it by 1e8 in float16, while the gradient it
passes back stays finite): the total norm is inf on those steps and the
clipper skips them. ``LayerGradNorms.with_stats`` gives each layer's
statistics from the pass that computes the total, the monitor folds them into
the window on the device, and its one read per window says which layer went
non-finite, first and how often; nothing is read on the host in between.
"""

import torch

import fastnorm

FAULTY_STEPS = (7, 12)


class Amplify(torch.autograd.Function):
    """Identity forward; a backward that overflows in float16 while ``on``."""

    on = False

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return (grad.half() * 1e8).to(grad.dtype) if Amplify.on else grad


class Overflowing(torch.nn.Linear):
    def forward(self, x):  # the fault is in this layer's weight gradient alone
        return torch.nn.functional.linear(x, Amplify.apply(self.weight), self.bias)


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), Overflowing(32, 32), torch.nn.Linear(32, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
clipper = fastnorm.StepClipper(optimizer, max_norm=1.0)  # skips a step whose norm is not finite
layers = fastnorm.LayerGradNorms(model)
monitor = fastnorm.GradNormMonitor(20, [], max_norm=1.0, layer_names=layers.names, warn=False)

with monitor:
    for step in range(20):
        Amplify.on = step in FAULTY_STEPS
        loss = model(torch.randn(32, 16)).square().mean()
        loss.backward()
        total, per_layer, stats = layers.with_stats()  # one fused pass: the total and each layer's rows
        clipper.arm(total_norm=total)
        optimizer.step()
        monitor.update(total, loss=loss, skipped=clipper.skipped, layers=per_layer, layer_stats=stats)
        optimizer.zero_grad(set_to_none=True)

print(monitor.layer_window.report())
print(monitor.diagnosis.report())

"""Where it broke: the first module, pass and tensor of a step that went non-finite or overflowed.

* ``finding``: what was found, on the host (names, numbers, the sentence, the logged keys; no torch);
* ``buffer``: the device buffer every watched tensor's statistics go into;
* ``locator``: the hooks, the step and the reads (:class:`Locator`).
"""

from fastnorm import _lazy

_NAMES = {
    "Locator": "fastnorm.locate.locator",
    "Located": "fastnorm.locate.finding",
    "Finding": "fastnorm.locate.finding",
    "Frame": "fastnorm.locate.finding",
    "Site": "fastnorm.locate.finding",
}

__all__ = list(_NAMES)

__getattr__, __dir__ = _lazy.attach(__name__, _NAMES)

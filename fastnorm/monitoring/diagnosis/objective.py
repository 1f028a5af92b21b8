"""What the loss is: the objective a run optimises, given or read from its log, and what it changes.

Most runs minimise a loss toward a floor (a cross-entropy, a squared error):
a loss that rises has diverged, one that stays put has stalled. Not every
objective is one:

* ``adversarial`` (a GAN's generator): its loss rises from ln 2 while it
  learns, against a discriminator that learns too; the generator's norm falling
  by orders of magnitude is the discriminator winning;
* ``reinforcement`` (a policy gradient: REINFORCE, PPO, GRPO): the loss sits
  near 0 by design, takes either sign and follows the reward; a batch whose
  rewards tie gives a gradient of exactly 0;
* ``contrastive`` (InfoNCE and its kin): a loss to minimise, whose collapse
  sits at the log of its number of negatives.

For the first two the loss is no evidence of a divergence or a stall: only the
norm (and non-finite values) is read. The objective is inferred where the log
says it: keys such as ``reward``, ``advantage``, ``policy_loss`` (reinforcement) or
``discriminator``, ``loss_d`` (adversarial), or a loss that goes negative,
which no cross-entropy or squared error can (read as reinforcement, and said).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from fastnorm.monitoring.diagnosis.advice import RAISE_LR, Action
from fastnorm.monitoring.diagnosis.events import DIVERGED, STALLED, Event, num
from fastnorm.monitoring.diagnosis.robust import median

MINIMISE, ADVERSARIAL, REINFORCEMENT, CONTRASTIVE = "minimise", "adversarial", "reinforcement", "contrastive"
OBJECTIVES = (MINIMISE, ADVERSARIAL, REINFORCEMENT, CONTRASTIVE)
NOT_A_FLOOR = (ADVERSARIAL, REINFORCEMENT)  # a loss that is no evidence of a divergence or a stall

# The words of a metric's name (split at / _ . -) that say what the loss is. Not "kl" (a VAE's loss has
# one) nor "entropy" (cross_entropy); a preference loss's rewards (DPO's rewards/chosen) are no reward.
_PREFERENCE = {"chosen", "rejected", "margins", "accuracies"}
_WORDS = (
    (REINFORCEMENT, {"reward", "rewards", "advantage", "advantages"}),
    (ADVERSARIAL, {"discriminator", "disc", "d", "dis"}),
    (CONTRASTIVE, {"infonce", "contrastive", "nce"}),
)
# An adversarial or reward-driven norm that fell this far (in orders of magnitude, 10x) from its first
# points to its last third: a healthy policy's or generator's stays within a few times its start.
FALL_ORDERS = 1.0
NEGATIVE_SHARE = 0.1  # a loss below 0 at this share of its points is no cross-entropy or squared error

DISCRIMINATOR = Action(
    "discriminator",
    "The discriminator wins: the generator's gradient vanished. Slow the discriminator (a lower learning "
    "rate, fewer steps per generator step), give the generator the non-saturating loss -log D(G(z)), or "
    "regularise the discriminator (spectral norm, a gradient penalty, instance noise).",
)
POLICY_SATURATED = Action(
    "lower_lr",
    "The policy's gradient fell 10x and more: a policy turned deterministic (its entropy collapsed, most "
    "often a learning rate too high) or one that converged; the reward tells them apart (stuck below what "
    "the task allows: saturated). If saturated, lower the learning rate or add an entropy bonus; log the "
    "entropy and the reward's spread.",
)


# The reward, where a reward-driven run logs it: what it learned, which its loss (near 0 by design) and its
# norm cannot say. Judged over at least this many points.
REWARD_POINTS = 20
# Kept at most this finely, as the loss (pairs averaged beyond: a point's noise and the points' count shrink
# together, so the means' standard error is the same).
REWARD_KEPT = 1024
REWARD_ROSE_SE = 2.0  # a rise of this many standard errors (of the two means' difference) is learning
REWARD_FELL_SE = 3.0  # and a fall of this many no noise,
REWARD_FELL_SHARE = 0.1  # where it is a tenth of the reward's level or more
REWARD_FLAT = Action(
    "check_labels",
    "The reward never rose. The log cannot tell a reward the policy never earns (a task too hard for it, a "
    "reward function or answer parser that never pays out: score a few of its samples by hand) from a "
    "learning rate too low to move it (then raise it, or lower the KL penalty). If the reward is already "
    "the best the task allows, nothing is wrong.",
    unless="raise_lr",
)
REWARD_FELL = Action(
    "lower_lr",
    "The reward fell below where it started: the policy got worse. Lower the learning rate (or raise the KL "
    "penalty, tighten the clip range), and check that the reward measures what you want (a policy that "
    "found a loophole in it scores well on another part).",
)


_REWARD_BIG = 2.0**1000
_REWARD_SCALE = 2.0**-24


def _trimmed_mean(values: list[float]) -> float:
    """The mean of the middle 80%: a reward is often a mean of a few discrete scores, which a median
    reads in steps of one score; an outlier moves this little."""
    ordered = sorted(values)
    cut = len(ordered) // 10
    kept = ordered[cut : len(ordered) - cut]
    return sum(kept) / len(kept)


def reward_event(points: list[tuple[int, float]]) -> Event | None:
    """A reward-driven run's finite rewards ``(step, reward)``, in step order, judged.

    A stall where the mean of its last third is not :data:`REWARD_ROSE_SE`
    standard errors above that of its first fifth (the reward never rose, or
    stayed put); a divergence where it is :data:`REWARD_FELL_SE` below, and a
    tenth of its level or more; None when it rose, or with fewer than
    :data:`REWARD_POINTS` points. The means are of the middle 80%; a point's
    noise is read from its moves from one point to the next (1.48 times their
    median over sqrt 2: a trend barely moves them), the means' standard error
    from it.
    """
    if len(points) < REWARD_POINTS:
        return None
    # Rewards beyond 2^1000 (about 1e301) are judged scaled down by a power of two, exactly: their sums,
    # moves and differences would pass the largest float, and inf - inf reads as no fall and no stall.
    # The judgement does not depend on the scale; everywhere else the scale is 1 and the bits are as ever.
    scale = _REWARD_SCALE if max(abs(v) for _, v in points) > _REWARD_BIG else 1.0
    values = [v * scale for _, v in points]
    n = len(values)
    head, tail = values[: max(3, n // 5)], values[n - n // 3 :]
    moves = sorted(abs(b - a) for a, b in zip(values, values[1:]))
    noise = 1.4826 * median(moves) / math.sqrt(2)
    se = noise * math.sqrt(1 / len(head) + 1 / len(tail))
    first, last = _trimmed_mean(head), _trimmed_mean(tail)
    rise = last - first
    said = (
        f"{num(first / scale)} over its first {len(head)} points, {num(last / scale)} over its last "
        f"{len(tail)} (a point's noise {num(noise / scale)})"
    )
    start, end = points[0][0], points[-1][0]
    # A fall is judged against the reward's level too: a smoothed reward's tiny noise makes any drift many
    # standard errors.
    if rise < -REWARD_FELL_SE * se and -rise >= REWARD_FELL_SHARE * max(abs(first), abs(last)):
        return Event(DIVERGED, start, end, f"the reward fell: {said}", (REWARD_FELL,))
    if rise <= REWARD_ROSE_SE * se:
        return Event(STALLED, start, end, f"the reward never rose: {said}", (REWARD_FLAT, RAISE_LR))
    return None


def check(objective: str | None, owner: str) -> str | None:
    """``objective=``: one of :data:`OBJECTIVES`, or None (inferred from the log)."""
    if objective is not None and objective not in OBJECTIVES:
        names = ", ".join(OBJECTIVES)
        raise ValueError(f"{owner}: objective must be one of {names} or None, got {objective!r}")
    return objective


def from_keys(keys: Iterable[str]) -> tuple[str, str] | None:
    """The objective the log's keys name, with the key that names it; None if none does."""
    for key in keys:
        words = set(key.lower().replace("/", "_").replace(".", "_").replace("-", "_").split("_"))
        if words & _PREFERENCE:
            continue
        if "policy" in words and "loss" in words:
            return REINFORCEMENT, f"the log holds '{key}'"
        for objective, named in _WORDS:
            # "d" names a discriminator only beside "loss" (loss_d, d_loss), never alone.
            if words & named and (objective != ADVERSARIAL or words & (named - {"d"}) or "loss" in words):
                return objective, f"the log holds '{key}'"
    return None


def infer(keys: Iterable[str], losses: list[float]) -> tuple[str, str] | None:
    """The objective read from the log (its keys, then a loss that goes negative), with why; None when the
    log says nothing (a loss to minimise, today's reading)."""
    named = from_keys(keys)
    if named is not None:
        return named
    if losses:
        negative = sum(v < 0 for v in losses)
        if negative >= max(1, NEGATIVE_SHARE * len(losses)):
            return REINFORCEMENT, (
                f"the loss is negative at {negative} of its {len(losses)} points, which no cross-entropy or "
                "squared error can be: read as a reward-driven loss (if it is a loss to minimise, it is "
                "wrong: check its sign and its inputs; say so with objective='minimise')"
            )
    return None

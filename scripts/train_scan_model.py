"""Train the scanner's learned second opinion (memd/core/learned.py) on the development corpus
and write memd/core/scan_model.tsv. Pure Python, deterministic: the same corpus gives the same
file. Run it after changing tests/corpus/attacks.txt or benign.txt (a test insists).

The model is L2-regularised logistic regression, classes weighted to count equally, fitted with
L-BFGS. Its threshold is a fixed probability, chosen by cross-validation on the development set
(`--folds 5`: five more fits, and the figures for each candidate threshold): the lowest at which
the model alone refuses at most 0.25% of the ordinary notes it was not trained on.

The held-out files are never read here: they judge the result (scripts/scan_accuracy.py).

Run from the repository root: python scripts/train_scan_model.py [--folds 5]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# After the path insert above, so the checkout is importable.
from memd.core.learned import MODEL_FILE, Model, feature_value, features, format_model, logit  # noqa: E402
from memd.core.scan import normalised_views  # noqa: E402
from scan_accuracy import CORPUS, every_entry, read_slices  # noqa: E402

TRAINING_FILES = ("attacks.txt", "benign.txt")
STRENGTH = 10.0  # sklearn's C: the weight of the data against the L2 penalty 1/2 |w|^2
THRESHOLD = 0.9
# How the threshold is chosen (`--folds 5`): the lowest of these at which the model alone, in
# cross-validation, refuses at most this share of ordinary notes. The rules refuse about 1.3% of
# unseen notes; the model may add little to that within the 2% aimed at.
CANDIDATE_THRESHOLDS = (0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
MAX_REFUSED_IN_CROSS_VALIDATION = 0.0025
# One sentence of an entry of several is judged alone too, more strictly. Chosen by leaving one
# development batch out of training and scanning it (four batches: orders addressed to the
# assistant, indirect injection, and two of one bad sentence among facts): judging sentences at
# 0.95 caught 62 more of their 1,067 attacks and refused 2 more of their 1,317 notes; at 0.9,
# 86 more and 7 more.
SENTENCE_THRESHOLD = 0.95
SMALLEST_KEPT = 0.05  # weights below this change no score that matters; the file stays small

Sample = tuple[list[int], float, float]  # feature indices, their value, label


def corpus_digest(corpus: Path = CORPUS) -> str:
    digest = hashlib.sha256()
    for name in TRAINING_FILES:
        digest.update((corpus / name).read_bytes())
    return digest.hexdigest()


def entries(name: str) -> list[str]:
    return every_entry(read_slices(CORPUS / name))


def featurise(texts: Sequence[str]) -> list[set[str]]:
    return [features(normalised_views(text)) for text in texts]


def samples_of(found: Sequence[set[str]], labels: Sequence[int], index: dict[str, int]) -> list[Sample]:
    samples = []
    for features_, label in zip(found, labels):
        known = sorted(index[feature] for feature in features_ if feature in index)
        samples.append((known, feature_value(len(features_)), float(label)))
    return samples


def fit(samples: Sequence[Sample], size: int, strength: float = STRENGTH) -> tuple[float, list[float]]:
    """Bias and weights minimising 1/2 |w|^2 + strength * sum of class-weighted log losses."""
    positives = sum(1 for _, _, label in samples if label)
    share = {1.0: len(samples) / (2 * positives), 0.0: len(samples) / (2 * (len(samples) - positives))}
    scale = [strength * share[label] for _, _, label in samples]

    def objective(point: list[float]) -> tuple[float, list[float]]:
        bias, weights = point[0], point[1:]
        value = 0.5 * sum(w * w for w in weights)
        gradient = [0.0, *weights]
        for (indices, x, label), s in zip(samples, scale):
            z = bias + x * sum([weights[i] for i in indices])
            # log(1 + e^-m) with m the signed margin, computed without overflow
            margin = z if label else -z
            value += s * (math.log1p(math.exp(-margin)) if margin > 0 else math.log1p(math.exp(margin)) - margin)
            p = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
            error = s * (p - label)
            gradient[0] += error
            step = error * x
            for i in indices:
                gradient[i + 1] += step
        return value, gradient

    point = lbfgs(objective, [0.0] * (size + 1))
    return point[0], point[1:]


Objective = Callable[[list[float]], tuple[float, list[float]]]  # value and gradient at a point


def lbfgs(
    objective: Objective, start: list[float], memory: int = 10, iterations: int = 400, tolerance: float = 1e-5,
) -> list[float]:
    """Minimise a smooth convex function by limited-memory BFGS with a backtracking line search."""
    point = start
    value, gradient = objective(point)
    history: list[tuple[list[float], list[float], float]] = []
    for _ in range(iterations):
        # Two-loop recursion: the direction -H g from the last `memory` steps.
        direction = [-g for g in gradient]
        alphas = []
        for s, y, rho in reversed(history):
            alpha = rho * _dot(s, direction)
            alphas.append(alpha)
            direction = [d - alpha * yi for d, yi in zip(direction, y)]
        if history:
            s, y, _ = history[-1]
            gamma = _dot(s, y) / _dot(y, y)
            direction = [gamma * d for d in direction]
        for (s, y, rho), alpha in zip(history, reversed(alphas)):
            beta = rho * _dot(y, direction)
            direction = [d + (alpha - beta) * si for d, si in zip(direction, s)]
        slope = _dot(gradient, direction)
        if slope >= 0:  # not a descent direction: start the curvature estimate again
            history.clear()
            direction = [-g for g in gradient]
            slope = -_dot(gradient, gradient)
        step = 1.0 if history else 1.0 / math.sqrt(-slope)
        while True:
            candidate = [p + step * d for p, d in zip(point, direction)]
            new_value, new_gradient = objective(candidate)
            if new_value <= value + 1e-4 * step * slope or step < 1e-12:
                break
            step /= 2
        s = [c - p for c, p in zip(candidate, point)]
        y = [n - g for n, g in zip(new_gradient, gradient)]
        curvature = _dot(s, y)
        if curvature > 1e-12:
            history.append((s, y, 1.0 / curvature))
            del history[:-memory]
        converged = abs(value - new_value) <= tolerance * max(1.0, abs(value))
        point, value, gradient = candidate, new_value, new_gradient
        if converged:
            break
    return point


def _dot(first: Sequence[float], second: Sequence[float]) -> float:
    return math.fsum(a * b for a, b in zip(first, second))


def train(found: Sequence[set[str]], labels: Sequence[int]) -> tuple[float, dict[str, float]]:
    vocabulary = sorted(set().union(*found))
    index = {feature: position for position, feature in enumerate(vocabulary)}
    bias, weights = fit(samples_of(found, labels, index), len(vocabulary))
    return bias, {feature: weight for feature, weight in zip(vocabulary, weights)}


def cross_validate(found: Sequence[set[str]], labels: Sequence[int], folds: int) -> None:
    """Print, for each candidate threshold, what the model alone does on entries it was not
    trained on, and the lowest threshold that keeps refusals within the aim."""
    order = list(range(len(found)))
    random.Random(0).shuffle(order)
    scores: dict[int, float] = {}
    for fold in range(folds):
        held = set(order[fold::folds])
        kept = [i for i in order if i not in held]
        bias, weights = train([found[i] for i in kept], [labels[i] for i in kept])
        model = Model(bias, 0.0, 0.0, weights, "")
        scores.update((i, model.score(found[i])) for i in held)
    attacks = [scores[i] for i in order if labels[i]]
    notes = [scores[i] for i in order if not labels[i]]
    fitting = []
    for candidate in CANDIDATE_THRESHOLDS:
        cut = logit(candidate)
        caught = sum(score >= cut for score in attacks) / len(attacks)
        refused = sum(score >= cut for score in notes) / len(notes)
        if refused <= MAX_REFUSED_IN_CROSS_VALIDATION:
            fitting.append(candidate)
        print(f"threshold {candidate:.2f}: the model alone catches {caught:6.1%} of attacks, refuses {refused:6.2%}"
              f" of ordinary notes ({folds}-fold cross-validation)")
    print(f"lowest threshold refusing at most {MAX_REFUSED_IN_CROSS_VALIDATION:.2%}: {min(fitting, default=None)}"
          f" (in use: {THRESHOLD})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folds", type=int, default=0, help="cross-validate with this many folds first")
    options = parser.parse_args()
    started = time.monotonic()
    attacks, notes = entries("attacks.txt"), entries("benign.txt")
    found = featurise(attacks + notes)
    labels = [1] * len(attacks) + [0] * len(notes)
    if options.folds:
        cross_validate(found, labels, options.folds)
    bias, weights = train(found, labels)
    kept = {feature: weight for feature, weight in weights.items() if abs(weight) >= SMALLEST_KEPT}
    model = Model(bias, logit(THRESHOLD), logit(SENTENCE_THRESHOLD), kept, corpus_digest())
    comments = [
        "The injection scanner's learned model (memd/core/learned.py), written by",
        "scripts/train_scan_model.py from tests/corpus/attacks.txt and benign.txt: do not edit.",
        f"{len(attacks)} attacks, {len(notes)} ordinary notes; {len(weights)} features, {len(kept)} kept;",
        f"C {STRENGTH}, threshold probability {THRESHOLD}, for one sentence of several {SENTENCE_THRESHOLD}.",
    ]
    (ROOT / "memd" / "core" / MODEL_FILE).write_text(format_model(model, comments), encoding="utf-8")
    print(f"{len(kept)} of {len(weights)} weights written to memd/core/{MODEL_FILE}"
          f" in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()

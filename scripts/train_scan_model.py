"""Train the scanner's learned second opinion (memd/core/learned.py) on the development corpus
and write memd/core/scan_model.tsv, in about a minute. Run it after changing tests/corpus/attacks.txt
or benign.txt (a test insists). It needs numpy (in the `test` extra; memd itself does not): the
corpus is a sparse matrix of some 130,000 entries by 1.5 million features, whose products in pure Python
made a training take half an hour and the test of the shipped file seven minutes. Deterministic on
one machine; on another, sums taken in another order may move a weight in the file's last digits,
within the distance from the optimum that training allows (GRADIENT_TOLERANCE), as the test does.

The model is L2-regularised logistic regression, classes weighted to count equally, each feature
scaled by how well it tells attacks from notes on its own (NBSVM's naive-Bayes ratios), fitted with
L-BFGS to its optimum (to within GRADIENT_TOLERANCE, so the model is the corpus's, not wherever a
search happened to stop). Its two thresholds (for a whole entry, and for one sentence of several
judged alone) are fixed probabilities, chosen by leaving each development batch written for the
model out of training in turn and scanning it with the rules and the rest's model
(`--leave-batches-out`): a batch left out is a kind of attack and note the model has not seen, as
real ones will be. The pair kept catches the most left-out attacks while the rules and the model
together refuse at most 1.75% of the left-out notes. With `--folds N` the batches are dealt into
N groups and each group is left out at once: N trainings instead of one per batch (minutes instead
of hours), each on a little less data, so the figures err low.

The held-out files are never read here: they judge the result (scripts/scan_accuracy.py).

Run from the repository root: python scripts/train_scan_model.py [--leave-batches-out [--folds N]]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# After the path insert above, so the checkout is importable.
from memd.core.learned import MODEL_FILE, Model, feature_value, features, format_model, logit  # noqa: E402
import memd.core.scan as scanner  # noqa: E402
from scan_accuracy import CORPUS, LEARNED_BATCHES, entries_of, read_slices  # noqa: E402

TRAINING_FILES = ("attacks.txt", "benign.txt")
STRENGTH = 10.0  # sklearn's C: the weight of the data against the L2 penalty 1/2 |w|^2
THRESHOLD = 0.85
SENTENCE_THRESHOLD = 0.95
# What `--leave-batches-out` tries, and the share of left-out notes the rules and the model may
# refuse together: 2% is the aim, and a quarter of a point is kept in hand for notes harder than
# the development batches' (the batches' share has run a little above the held-out files').
CANDIDATE_THRESHOLDS = (0.65, 0.7, 0.725, 0.75, 0.775, 0.8, 0.825, 0.85, 0.875, 0.9)
CANDIDATE_SENTENCE_THRESHOLDS = (0.85, 0.9, 0.95)
MAX_REFUSED_LEFT_OUT = 0.0175
# Weights below this are dropped from the file. Leaving each of 48 batches out, the model kept at
# 0.1 blocked 64.0% of their attacks against 64.1% at 0.05, with 30% fewer weights in memory. With
# 64 batches, left out in four groups: 65.4% at 0.1, 65.3% at 0.15 with 29% fewer weights again,
# 65.1% at 0.2 with half as many, the notes refused the same (1.48%, 1.48%, 1.46%). Raised to 0.25
# when the model of 270 batches had grown to 246,909 weights, 30.9 MB of the daemon's memory, and the
# soak harness's peak to 94.7 MB of its 96: at 0.25 that corpus kept 150,034 weights (18.5 MB) and
# blocked 27 held-out attacks fewer of 8,973 (0.3 points), refusing 3 notes fewer. (Not weighing the
# features found in one training entry alone saved as much, but the model then refused notes of the
# original sample, which it had learned from their own words.)
SMALLEST_KEPT = 0.25
# Each feature's weight is scaled by how well it tells attacks from notes on its own (the log of the
# ratio of its shares in each, counted from RATIO_SMOOTHING up), the way NBSVM (Wang and Manning,
# 2012) weighs a linear model's words by naive Bayes: a word common to both is held near zero, so
# what is learned leans on words that mark an attack, which carries to attacks not seen. Leaving the
# 117 batches out in four groups, at 0.85 and 0.95: 73.1% blocked and 1.64% refused (the models judged
# cut as shipped); with the first 82, uncut, 72.4% and 1.61% against 69.5% and 1.71% unscaled.
RATIO_SMOOTHING = 1.0
SMALLEST_RATIO = 0.1
# Training stops when v is this near the optimum (see `fit`); each weight is then within the same
# distance times its scale, and was found within 0.002 of the optimum's measured on the corpus.
GRADIENT_TOLERANCE = 0.005

@dataclasses.dataclass(frozen=True)
class Samples:
    """The corpus as the trainer's arrays: a sparse matrix of entries by features, as the pairs of
    (entry, feature) found (the feature's index and the entry's, side by side), with each entry's
    feature value and label."""

    columns: np.ndarray  # the feature of each pair
    rows: np.ndarray  # the entry of each pair
    values: np.ndarray  # each entry's feature value, learned.feature_value of how many it has
    labels: np.ndarray  # each entry's label, 1.0 for an attack

    def per_entry(self, weights: np.ndarray) -> np.ndarray:
        """Each entry's sum of the weights of its features."""
        return np.bincount(self.rows, weights=weights[self.columns], minlength=len(self.labels))

    def per_feature(self, amounts: np.ndarray, size: int) -> np.ndarray:
        """Each feature's sum of the amounts of the entries it is found in."""
        return np.bincount(self.columns, weights=amounts[self.rows], minlength=size)


def corpus_digest(corpus: Path = CORPUS) -> str:
    digest = hashlib.sha256()
    for name in TRAINING_FILES:
        digest.update((corpus / name).read_bytes())
    return digest.hexdigest()


def titled_entries(name: str) -> tuple[list[str], list[str]]:
    """The entries of a corpus file, and beside each the title of the batch it belongs to."""
    pairs = [(entry, title) for title, sections in read_slices(CORPUS / name).items() for entry in entries_of(sections)]
    return [entry for entry, _ in pairs], [title for _, title in pairs]


def featurise(texts: Sequence[str]) -> list[set[str]]:
    return [features(scanner.normalised_views(text)) for text in texts]


def samples_of(found: Sequence[set[str]], labels: Sequence[int], index: dict[str, int]) -> Samples:
    """The entries' features in `index` (a feature outside it is counted in the entry's value only)."""
    columns: list[int] = []
    rows: list[int] = []
    for row, features_ in enumerate(found):
        # (In the index's order, not the set's, which changes with each process's string hashing: each
        # entry's weights are then summed in one order, and the same corpus trains the same file.)
        known = sorted(index[feature] for feature in features_ if feature in index)
        columns += known
        rows += [row] * len(known)
    return Samples(np.array(columns, dtype=np.int64), np.array(rows, dtype=np.int64),
                   np.array([feature_value(len(features_)) for features_ in found]), np.array(labels, dtype=float))


def attack_ratios(samples: Samples, size: int) -> np.ndarray:
    """Each feature's scale: how much more often it occurs in attacks than in notes, as the size of
    the log of the ratio of its smoothed shares in each (never less than SMALLEST_RATIO)."""
    in_attacks = RATIO_SMOOTHING + samples.per_feature(samples.labels, size)
    in_notes = RATIO_SMOOTHING + samples.per_feature(1.0 - samples.labels, size)
    ratios = np.abs(np.log((in_attacks / in_attacks.sum()) / (in_notes / in_notes.sum())))
    return np.maximum(ratios, SMALLEST_RATIO)


def fit(
    samples: Samples, scales: np.ndarray, strength: float = STRENGTH, start: tuple[float, np.ndarray] | None = None,
) -> tuple[float, np.ndarray]:
    """Bias and weights minimising 1/2 |v|^2 + strength * sum of class-weighted log losses, where each
    feature's weight is its scale times v: a feature seen as often in notes as in attacks is held
    near zero, one that tells them apart is let go far. Returns the weights, not v; searches from
    `start` (a bias and weights) if given, else from zero."""
    labels, values, size = samples.labels, samples.values, len(scales)
    positives = labels.sum()
    class_weight = strength * np.where(labels == 1.0, len(labels) / (2 * positives),
                                       len(labels) / (2 * (len(labels) - positives)))
    # The objective's curvature along each variable where every probability is 1/2, as L-BFGS's first
    # guess at the inverse Hessian: the bias and a word in thousands of entries curve the objective
    # thousands of times as steeply as a word in one, and without the guess the search crawls along
    # the steep directions (on the corpus, 170 steps from zero ended 9.1 above the optimum's value
    # without it, 0.01 above with it).
    inverse_curvature = np.concatenate((
        [4.0 / class_weight.sum()],
        1.0 / (1.0 + 0.25 * scales ** 2 * samples.per_feature(class_weight * values ** 2, size)),
    ))
    signs = 2.0 * labels - 1.0

    def objective(point: np.ndarray) -> tuple[float, np.ndarray]:
        unscaled = point[1:]
        z = point[0] + values * samples.per_entry(scales * unscaled)
        # log(1 + e^-m), m the signed margin, without overflow
        value = 0.5 * _dot(unscaled, unscaled) + _dot(class_weight, np.logaddexp(0.0, -signs * z))
        errors = class_weight * (_probability(z) - labels)
        gradient = np.concatenate(([errors.sum()], scales * samples.per_feature(errors * values, size) + unscaled))
        return value, gradient

    point = np.zeros(size + 1)
    if start is not None:
        point = np.concatenate(([start[0]], start[1] / scales))
    # Stop when the gradient's part for the weights is shorter than GRADIENT_TOLERANCE: the objective
    # is 1-strongly convex in v (the penalty alone is), so v is then at most that far from the
    # optimum's. (The bias's part is left out: the bias curves the objective so steeply that its
    # gradient stays large while the bias itself is near its best. How near varies, up to 4e-5 seen,
    # so the bias is then set to its best for those weights, which moves their gradient by far less than
    # the tolerance.)
    point = lbfgs(objective, point, inverse_curvature, lambda gradient: _length(gradient[1:]) <= GRADIENT_TOLERANCE)
    weights = scales * point[1:]
    return _best_bias(point[0], values * samples.per_entry(weights), labels, class_weight), weights


def _probability(z: np.ndarray) -> np.ndarray:
    """The logistic function, computed without overflow."""
    return np.exp(-np.logaddexp(0.0, -z))


def _best_bias(bias: float, margins: np.ndarray, labels: np.ndarray, class_weight: np.ndarray) -> float:
    """The bias minimising the class-weighted log losses of samples scored `margins` without it: Newton's
    method from `bias` (the loss is convex in it, and a step or two from L-BFGS's bias is enough)."""
    for _ in range(100):
        p = _probability(bias + margins)
        step = _dot(class_weight, p - labels) / _dot(class_weight, p * (1.0 - p))
        bias -= step
        if abs(step) < 1e-9:
            break
    return float(bias)


Objective = Callable[[np.ndarray], tuple[float, np.ndarray]]  # value and gradient at a point


def lbfgs(
    objective: Objective, start: np.ndarray, inverse_curvature: np.ndarray,
    near_enough: Callable[[np.ndarray], bool], memory: int = 10, iterations: int = 2000,
) -> np.ndarray:
    """Minimise a smooth convex function by limited-memory BFGS with a backtracking line search,
    from `start`, taking `inverse_curvature` (a diagonal) as the inverse Hessian's shape before the
    steps refine it. Stops where `near_enough` says of the gradient, or where floating point can
    lower the value no further."""
    point = start
    value, gradient = objective(point)
    history: list[tuple[np.ndarray, np.ndarray, float]] = []
    for _ in range(iterations):
        if near_enough(gradient):
            break
        # Two-loop recursion: the direction -H g from the last `memory` steps.
        direction = -gradient
        alphas = []
        for s, y, rho in reversed(history):
            alpha = rho * _dot(s, direction)
            alphas.append(alpha)
            direction = direction - alpha * y
        direction = inverse_curvature * direction
        if history:
            s, y, _ = history[-1]
            direction *= _dot(s, y) / _dot(y, inverse_curvature * y)
        for (s, y, rho), alpha in zip(history, reversed(alphas)):
            direction = direction + (alpha - rho * _dot(y, direction)) * s
        slope = _dot(gradient, direction)
        if slope >= 0:  # not a descent direction: start the curvature estimate again
            history.clear()
            direction = -inverse_curvature * gradient
            slope = _dot(gradient, direction)
        step = 1.0 if history else 1.0 / math.sqrt(-slope)
        while True:
            candidate = point + step * direction
            new_value, new_gradient = objective(candidate)
            if new_value <= value + 1e-4 * step * slope:
                break
            step /= 2
            if step < 1e-12:  # no step lowers the value any more: as near as floating point comes
                return point
        s, y = candidate - point, new_gradient - gradient
        curvature = _dot(s, y)
        if curvature > 1e-12:
            history.append((s, y, 1.0 / curvature))
            del history[:-memory]
        point, value, gradient = candidate, new_value, new_gradient
    return point


def _dot(first: np.ndarray, second: np.ndarray) -> float:
    # (numpy's own pairwise sum rather than `@`, whose BLAS splits a long sum among as many threads as
    # it is given, so that its last bits, and the search's path, would depend on the machine's cores.)
    return float(np.add.reduce(first * second))


def _length(vector: np.ndarray) -> float:
    return math.sqrt(_dot(vector, vector))


def train(
    found: Sequence[set[str]], labels: Sequence[int], start: tuple[float, dict[str, float]] | None = None,
) -> tuple[float, dict[str, float]]:
    """The bias and each feature's weight; the search starts from `start`'s bias and weights (a
    feature it lacks at zero) if given, and ends at the same optimum either way."""
    vocabulary = sorted(set().union(*found))
    index = {feature: position for position, feature in enumerate(vocabulary)}
    samples = samples_of(found, labels, index)
    origin = None if start is None else (start[0], np.array([start[1].get(feature, 0.0) for feature in vocabulary]))
    bias, weights = fit(samples, attack_ratios(samples, len(vocabulary)), start=origin)
    return bias, dict(zip(vocabulary, weights.tolist()))


# What each process of `leave_batches_out` works on, set once per process (see `_take`).
_corpus: tuple[list[str], list[set[str]], list[int], list[str]] = ([], [], [], [])
# threshold pair -> (attacks blocked, notes the model refuses that the rules let through)
Counts = dict[tuple[float, float], tuple[int, int]]


def _take(corpus: tuple[list[str], list[set[str]], list[int], list[str]]) -> None:
    global _corpus
    _corpus = corpus


@dataclasses.dataclass(frozen=True)
class _Asked(Model):
    """The model as a scan asks it, never objecting, so that the scan's findings are the rules'
    alone, and keeping the highest scores it was asked to judge (an entry's own and any decoded
    payload's; for the whole, and for a sentence alone): each pair of thresholds is then compared
    with those, where it would take a scan of its own."""

    highest: list[float] = dataclasses.field(default_factory=lambda: [-math.inf, -math.inf])

    def objects(self, texts: Sequence[str]) -> bool:
        whole, sentences = self.scores(texts)
        self.highest[:] = max(self.highest[0], whole), max(self.highest[1], max(sentences, default=-math.inf))
        return False


def _judge_left_out(group: tuple[str, ...]) -> list[tuple[int, int, int, Counts]]:
    """Train on every entry outside the batches of `group`, then scan each of them: with the rules
    alone (how many notes they refuse), then with the rules and the model at each candidate pair
    of thresholds (how many attacks are blocked, and how many notes the model adds to the rules')."""
    texts, found, labels, titles = _corpus
    kept = [i for i, title in enumerate(titles) if title not in group]
    bias, weights = train([found[i] for i in kept], [labels[i] for i in kept])
    # (Cut as the shipped model's weights are, so that what is judged is what would ship.)
    weights = {feature: weight for feature, weight in weights.items() if abs(weight) >= SMALLEST_KEPT}
    asked = _Asked(bias, math.inf, math.inf, weights, "")
    scanner.MODEL = asked
    results = []
    for batch in group:
        left = [i for i, title in enumerate(titles) if title == batch]
        by_rules, highest = set(), {}
        for i in left:
            asked.highest[:] = -math.inf, -math.inf
            if scanner.scan(texts[i]):
                by_rules.add(i)
            highest[i] = tuple(asked.highest)
        counts: Counts = {}
        for threshold in CANDIDATE_THRESHOLDS:
            for sentence_threshold in CANDIDATE_SENTENCE_THRESHOLDS:
                at = logit(threshold), logit(sentence_threshold)
                by_model = {i for i in left if i not in by_rules and (highest[i][0] >= at[0] or highest[i][1] >= at[1])}
                counts[threshold, sentence_threshold] = (
                    sum(labels[i] for i in by_rules | by_model), sum(1 - labels[i] for i in by_model),
                )
        results.append((sum(labels[i] for i in left), sum(1 - labels[i] for i in left),
                        sum(1 - labels[i] for i in by_rules), counts))
    return results


def leave_batches_out(
    texts: list[str], found: list[set[str]], labels: list[int], titles: list[str], folds: int | None = None,
) -> None:
    """Print, for each candidate pair of thresholds, what the scanner does on each development
    batch written for the model when that batch (or, given `folds`, its group of batches) is left
    out of training, and the pair to use."""
    batches = list(dict.fromkeys(title for title in titles if LEARNED_BATCHES in title))
    # Dealt in turn, so that each group holds early and late batches alike.
    groups = [tuple(batches[start::folds]) for start in range(folds)] if folds else [(batch,) for batch in batches]
    workers = min(len(groups), os.cpu_count() or 1)
    with ProcessPoolExecutor(workers, initializer=_take, initargs=((texts, found, labels, titles),)) as pool:
        by_group = list(pool.map(_judge_left_out, groups))
    # Each batch's result, in the batches' own order again.
    of_batch = dict(zip([batch for group in groups for batch in group],
                        [result for group_results in by_group for result in group_results]))
    results = [of_batch[batch] for batch in batches]
    attacks = sum(result[0] for result in results)
    notes = sum(result[1] for result in results)
    by_rules = sum(result[2] for result in results)
    best: tuple[int, float, float] | None = None
    how = f"in {len(groups)} groups" if folds else "in turn"
    print(f"{len(batches)} batches left out {how} ({attacks} attacks, {notes} notes); the rules alone refuse"
          f" {by_rules / notes:.2%} of the notes")
    for pair in results[0][3]:
        caught = sum(result[3][pair][0] for result in results)
        added = sum(result[3][pair][1] for result in results)
        print(f"threshold {pair[0]:.3g}, for one sentence {pair[1]:.3g}: {caught / attacks:6.1%} of attacks blocked,"
              f" {(by_rules + added) / notes:6.2%} of notes refused ({added / notes:.2%} by the model)")
        if by_rules + added <= MAX_REFUSED_LEFT_OUT * notes and (best is None or caught > best[0]):
            best = (caught, *pair)
    if best is None:
        print(f"no pair refuses at most {MAX_REFUSED_LEFT_OUT:.2%}")
        return
    print(f"most caught with at most {MAX_REFUSED_LEFT_OUT:.2%} refused: {best[1]}, {best[2]}"
          f" (in use: {THRESHOLD}, {SENTENCE_THRESHOLD})")
    for batch, (batch_attacks, batch_notes, batch_by_rules, counts) in zip(batches, results):
        caught, added = counts[best[1], best[2]]
        print(f"    {caught / batch_attacks:6.1%} blocked, {(batch_by_rules + added) / batch_notes:6.2%} refused: {batch}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--leave-batches-out", action="store_true",
        help="first measure candidate thresholds by leaving each batch written for the model out in turn",
    )
    parser.add_argument(
        "--folds", type=int, metavar="N",
        help="with --leave-batches-out: leave the batches out in N groups (N trainings) rather than one by one",
    )
    options = parser.parse_args()
    if options.folds is not None and (options.folds < 2 or not options.leave_batches_out):
        parser.error("--folds needs --leave-batches-out and at least 2 groups")
    started = time.monotonic()
    attacks, attack_titles = titled_entries("attacks.txt")
    notes, note_titles = titled_entries("benign.txt")
    found = featurise(attacks + notes)
    labels = [1] * len(attacks) + [0] * len(notes)
    if options.leave_batches_out:
        leave_batches_out(attacks + notes, found, labels, attack_titles + note_titles, options.folds)
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

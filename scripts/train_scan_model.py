"""Train the scanner's learned second opinion (memd/core/learned.py) on the development corpus
and write memd/core/scan_model.tsv. Pure Python, deterministic: the same corpus gives the same
file. Run it after changing tests/corpus/attacks.txt or benign.txt (a test insists).

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
from operator import itemgetter, mul
from pathlib import Path

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
# 65.1% at 0.2 with half as many, the notes refused the same (1.48%, 1.48%, 1.46%); and the daemon
# stays well inside the soak harness's memory limit.
SMALLEST_KEPT = 0.15
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

Sample = tuple[list[int], float, float]  # feature indices, their value, label


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


def samples_of(found: Sequence[set[str]], labels: Sequence[int], index: dict[str, int]) -> list[Sample]:
    samples = []
    for features_, label in zip(found, labels):
        known = sorted(index[feature] for feature in features_ if feature in index)
        samples.append((known, feature_value(len(features_)), float(label)))
    return samples


def attack_ratios(found: Sequence[set[str]], labels: Sequence[int], index: dict[str, int]) -> list[float]:
    """Each feature's scale: how much more often it occurs in attacks than in notes, as the size of
    the log of the ratio of its smoothed shares in each (never less than SMALLEST_RATIO)."""
    in_attacks, in_notes = [RATIO_SMOOTHING] * len(index), [RATIO_SMOOTHING] * len(index)
    for features_, label in zip(found, labels):
        counts = in_attacks if label else in_notes
        for feature in features_:
            counts[index[feature]] += 1
    attacks_total, notes_total = sum(in_attacks), sum(in_notes)
    return [max(abs(math.log((a / attacks_total) / (n / notes_total))), SMALLEST_RATIO)
            for a, n in zip(in_attacks, in_notes)]


def fit(
    samples: Sequence[Sample], scales: Sequence[float], strength: float = STRENGTH,
    start: tuple[float, Sequence[float]] | None = None,
) -> tuple[float, list[float]]:
    """Bias and weights minimising 1/2 |v|^2 + strength * sum of class-weighted log losses, where each
    feature's weight is its scale times v: a feature seen as often in notes as in attacks is held
    near zero, one that tells them apart is let go far. Returns the weights, not v; searches from
    `start` (a bias and weights) if given, else from zero."""
    positives = sum(1 for _, _, label in samples if label)
    share = {1.0: len(samples) / (2 * positives), 0.0: len(samples) / (2 * (len(samples) - positives))}
    class_weight = [strength * share[label] for _, _, label in samples]
    columns, groups = _alike(samples, len(scales))
    # Features found in exactly the same samples share a scale (it is counted from those samples) and
    # are fitted as one. The data see only the sum of their weights, and for a given sum the penalty
    # 1/2 sum v_j^2 is least with every v_j alike: k of them act as one feature of scale s sqrt(k)
    # (the length of their scales) whose v is the length of theirs, each weight being s^2 / (s sqrt(k))
    # times that v. The optimum is the same, and the vectors L-BFGS works on are shorter: the
    # corpus's 895,070 features make 249,411 groups.
    lengths = [math.sqrt(math.fsum(scales[j] ** 2 for j in group)) for group in groups]
    # Each sample's weights, and each weight's samples, gathered by itemgetter rather than a Python
    # loop over every feature of every sample.
    rows: list[list[int]] = [[] for _ in samples]
    for position, column in enumerate(columns):
        for i in column:
            rows[i].append(position)
    row_gathers = [_gather(row) for row in rows]
    gathers = [_gather(column) for column in columns]
    # The objective's curvature along each variable where every probability is 1/2, as L-BFGS's first
    # guess at the inverse Hessian: the bias and a word in thousands of entries curve the objective
    # thousands of times as steeply as a word in one, and without the guess the search crawls along
    # the steep directions (on the corpus, 170 steps from zero ended 9.1 above the optimum's value
    # without it, 0.01 above with it).
    squares = [weight * x * x for (_, x, _), weight in zip(samples, class_weight)]
    inverse_curvature = [4.0 / sum(class_weight)]
    inverse_curvature += [1.0 / (1.0 + 0.25 * length * length * sum(gather(squares)))
                          for gather, length in zip(gathers, lengths)]

    def objective(point: list[float]) -> tuple[float, list[float]]:
        bias, unscaled = point[0], point[1:]
        weights = list(map(mul, lengths, unscaled))
        value = 0.5 * sum(v * v for v in unscaled)
        errors, steps = [], []
        for (_, x, label), s, row in zip(samples, class_weight, row_gathers):
            z = bias + x * sum(row(weights))
            # log(1 + e^-m) with m the signed margin, computed without overflow
            margin = z if label else -z
            value += s * (math.log1p(math.exp(-margin)) if margin > 0 else math.log1p(math.exp(margin)) - margin)
            error = s * (_probability(z) - label)
            errors.append(error)
            steps.append(error * x)
        gradient = [sum(errors, 0.0)]
        gradient += [length * sum(gather(steps)) + v for gather, length, v in zip(gathers, lengths, unscaled)]
        return value, gradient

    point = [0.0] * (len(groups) + 1)
    if start is not None:
        # The group's v from its members' weights: their sum is |s| times it.
        point = [start[0]] + [math.fsum(start[1][j] for j in group) / length for group, length in zip(groups, lengths)]
    # Stop when the gradient's part for the weights is shorter than GRADIENT_TOLERANCE: the objective
    # is 1-strongly convex in v (the penalty alone is), so v is then at most that far from the
    # optimum's. (The bias's part is left out: the bias curves the objective so steeply that its
    # gradient stays large while the bias itself is near its best. How near varies, up to 4e-5 seen,
    # so the bias is then set to its best for those weights, which moves their gradient by far less than
    # the tolerance.)
    point = lbfgs(objective, point, inverse_curvature,
                  lambda gradient: math.sqrt(_dot(gradient[1:], gradient[1:])) <= GRADIENT_TOLERANCE)
    weights_found = list(map(mul, lengths, point[1:]))
    margins = [x * sum(row(weights_found)) for (_, x, _), row in zip(samples, row_gathers)]
    point[0] = _best_bias(point[0], margins, [label for _, _, label in samples], class_weight)
    weights = [0.0] * len(scales)
    for group, length, v in zip(groups, lengths, point[1:]):
        for j in group:
            weights[j] = scales[j] ** 2 / length * v
    return point[0], weights


def _probability(z: float) -> float:
    """The logistic function, computed without overflow."""
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def _best_bias(bias: float, margins: Sequence[float], labels: Sequence[float], class_weight: Sequence[float]) -> float:
    """The bias minimising the class-weighted log losses of samples scored `margins` without it: Newton's
    method from `bias` (the loss is convex in it, and a step or two from L-BFGS's bias is enough)."""
    for _ in range(100):
        gradient = curvature = 0.0
        for margin, label, weight in zip(margins, labels, class_weight):
            p = _probability(bias + margin)
            gradient += weight * (p - label)
            curvature += weight * p * (1.0 - p)
        step = gradient / curvature
        bias -= step
        if abs(step) < 1e-9:
            break
    return bias


def _alike(samples: Sequence[Sample], size: int) -> tuple[list[tuple[int, ...]], list[list[int]]]:
    """The features (indices below `size`) gathered by the samples they are found in: each distinct
    column of positions in `samples`, and the features found in exactly those."""
    columns: list[list[int]] = [[] for _ in range(size)]
    for position, (indices, _, _) in enumerate(samples):
        for i in indices:
            columns[i].append(position)
    groups: dict[tuple[int, ...], list[int]] = {}
    for feature, column in enumerate(columns):
        groups.setdefault(tuple(column), []).append(feature)
    return list(groups), list(groups.values())


def _gather(positions: list[int]) -> Callable[[Sequence[float]], Sequence[float]]:
    """The values at `positions`, in order, gathered in C (a lone position as a one-item slice,
    since itemgetter of one index returns the value itself)."""
    if len(positions) == 1:
        return itemgetter(slice(positions[0], positions[0] + 1))
    return itemgetter(*positions) if positions else itemgetter(slice(0, 0))


Objective = Callable[[list[float]], tuple[float, list[float]]]  # value and gradient at a point


def lbfgs(
    objective: Objective, start: list[float], inverse_curvature: Sequence[float],
    near_enough: Callable[[list[float]], bool], memory: int = 10, iterations: int = 2000,
) -> list[float]:
    """Minimise a smooth convex function by limited-memory BFGS with a backtracking line search,
    from `start`, taking `inverse_curvature` (a diagonal) as the inverse Hessian's shape before the
    steps refine it. Stops where `near_enough` says of the gradient, or where floating point can
    lower the value no further."""
    point = start
    value, gradient = objective(point)
    history: list[tuple[list[float], list[float], float]] = []
    for _ in range(iterations):
        if near_enough(gradient):
            break
        # Two-loop recursion: the direction -H g from the last `memory` steps.
        direction = [-g for g in gradient]
        alphas = []
        for s, y, rho in reversed(history):
            alpha = rho * _dot(s, direction)
            alphas.append(alpha)
            direction = [d - alpha * yi for d, yi in zip(direction, y)]
        direction = list(map(mul, inverse_curvature, direction))
        if history:
            s, y, _ = history[-1]
            gamma = _dot(s, y) / _dot(y, list(map(mul, inverse_curvature, y)))
            direction = [gamma * d for d in direction]
        for (s, y, rho), alpha in zip(history, reversed(alphas)):
            beta = rho * _dot(y, direction)
            direction = [d + (alpha - beta) * si for d, si in zip(direction, s)]
        slope = _dot(gradient, direction)
        if slope >= 0:  # not a descent direction: start the curvature estimate again
            history.clear()
            direction = [-c * g for c, g in zip(inverse_curvature, gradient)]
            slope = _dot(gradient, direction)
        step = 1.0 if history else 1.0 / math.sqrt(-slope)
        while True:
            candidate = [p + step * d for p, d in zip(point, direction)]
            new_value, new_gradient = objective(candidate)
            if new_value <= value + 1e-4 * step * slope:
                break
            step /= 2
            if step < 1e-12:  # no step lowers the value any more: as near as floating point comes
                return point
        s = [c - p for c, p in zip(candidate, point)]
        y = [n - g for n, g in zip(new_gradient, gradient)]
        curvature = _dot(s, y)
        if curvature > 1e-12:
            history.append((s, y, 1.0 / curvature))
            del history[:-memory]
        point, value, gradient = candidate, new_value, new_gradient
    return point


def _dot(first: Sequence[float], second: Sequence[float]) -> float:
    return math.fsum(a * b for a, b in zip(first, second))


def train(
    found: Sequence[set[str]], labels: Sequence[int], start: tuple[float, dict[str, float]] | None = None,
) -> tuple[float, dict[str, float]]:
    """The bias and each feature's weight; the search starts from `start`'s bias and weights (a
    feature it lacks at zero) if given, and ends at the same optimum either way."""
    vocabulary = sorted(set().union(*found))
    index = {feature: position for position, feature in enumerate(vocabulary)}
    origin = None if start is None else (start[0], [start[1].get(feature, 0.0) for feature in vocabulary])
    bias, weights = fit(samples_of(found, labels, index), attack_ratios(found, labels, index), start=origin)
    return bias, {feature: weight for feature, weight in zip(vocabulary, weights)}


# What each process of `leave_batches_out` works on, set once per process (see `_take`).
_corpus: tuple[list[str], list[set[str]], list[int], list[str]] = ([], [], [], [])
# threshold pair -> (attacks blocked, notes the model refuses that the rules let through)
Counts = dict[tuple[float, float], tuple[int, int]]


def _take(corpus: tuple[list[str], list[set[str]], list[int], list[str]]) -> None:
    global _corpus
    _corpus = corpus


def _judge_left_out(group: tuple[str, ...]) -> list[tuple[int, int, int, Counts]]:
    """Train on every entry outside the batches of `group`, then scan each of them: with the rules
    alone (how many notes they refuse), then with the rules and the model at each candidate pair
    of thresholds (how many attacks are blocked, and how many notes the model adds to the rules')."""
    texts, found, labels, titles = _corpus
    kept = [i for i, title in enumerate(titles) if title not in group]
    bias, weights = train([found[i] for i in kept], [labels[i] for i in kept])
    # (Cut as the shipped model's weights are, so that what is judged is what would ship.)
    weights = {feature: weight for feature, weight in weights.items() if abs(weight) >= SMALLEST_KEPT}
    model = Model(bias, math.inf, math.inf, weights, "")
    results = []
    for batch in group:
        left = [i for i, title in enumerate(titles) if title == batch]
        scanner.MODEL = model
        by_rules = {i for i in left if scanner.scan(texts[i])}
        counts: Counts = {}
        for threshold in CANDIDATE_THRESHOLDS:
            for sentence_threshold in CANDIDATE_SENTENCE_THRESHOLDS:
                scanner.MODEL = dataclasses.replace(
                    model, threshold=logit(threshold), sentence_threshold=logit(sentence_threshold))
                flagged = [i for i in left if i in by_rules or scanner.scan(texts[i])]
                counts[threshold, sentence_threshold] = (
                    sum(labels[i] for i in flagged), sum(1 - labels[i] for i in flagged if i not in by_rules),
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

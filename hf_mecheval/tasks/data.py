"""``TaskData``: a column store of generated documents.

Documents have different lengths (ATR, MQAR), so tokens are kept flat with offsets (the layout of
an Arrow list column): converting to a ``datasets.Dataset`` or to parquet is zero-copy.
An Arrow list column (``datasets.List``, what the ``Features`` say) has 32-bit offsets, so it holds
at most 2^31 - 1 tokens per chunk: larger data (~58 M ``ar_32`` documents) becomes a table of
several chunks, each a whole number of documents, with the same type.

A document has one answer (AR, ATR: the answer columns ``answer`` and ``*_pos`` are one number
per document) or several (MQAR: one answer per query, the same columns hold one list per
document, kept flat with their own offsets as ``query_columns``). ``per_query`` turns the second
kind into the first: one row per (document, query), which is what interventions read.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
import pyarrow as pa

IGNORE_INDEX = -100
PAD, BOS, EOS = 0, 1, 2
NUM_SPECIAL = 3

# Per-document columns every task provides, in dataset column order.
POSITION_COLUMNS = ("key_pos", "value_pos", "divider_pos", "query_pos", "answer_pos")
DOCUMENT_COLUMNS = ("answer",) + POSITION_COLUMNS
# Per-query columns of a document with several answers (MQAR; no divider: queries follow the
# context without one), in dataset column order.
QUERY_COLUMNS = ("answer", "key_pos", "value_pos", "query_pos", "answer_pos")
MAX_LIST_TOKENS = 2**31 - 1      # values one Arrow list array can address with its int32 offsets


def chunk_bounds(offsets: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Consecutive document ranges ``[lo, hi)`` covering every document, each of at most
    ``limit`` tokens (``offsets``: as ``TaskData.offsets``)."""
    n = len(offsets) - 1
    bounds, lo = [], 0
    while lo < n:
        hi = int(np.searchsorted(offsets, offsets[lo] + limit, side="right")) - 1
        if hi <= lo:
            raise ValueError(f"document {lo} has more than {limit} tokens")
        bounds.append((lo, hi))
        lo = hi
    return bounds or [(0, 0)]


def _rows(flat: np.ndarray, offsets: np.ndarray, fill: int) -> np.ndarray:
    """A flat array cut at ``offsets`` (n + 1,) into n rows, (n, longest) int64, right-padded with ``fill``."""
    lengths = np.diff(offsets)
    out = np.full((len(lengths), int(lengths.max(initial=0))), fill, dtype=np.int64)
    row = np.repeat(np.arange(len(lengths)), lengths)
    out[row, np.arange(len(flat)) - np.repeat(offsets[:-1], lengths)] = flat
    return out


@dataclasses.dataclass
class TaskData:
    """``n`` documents.

    tokens:  (total_tokens,) int32 — all documents concatenated.
    offsets: (n + 1,) int64 — document i is ``tokens[offsets[i]:offsets[i + 1]]``.
    columns: per-document int32 arrays of shape (n,): ``answer``, the ``*_pos`` columns and
             task metadata (with several answers per document: task metadata only).
    token_columns: per-token int32 arrays aligned with ``tokens`` (e.g. ATR's ``tree_parent``).
    query_columns: with several answers per document (MQAR), the ``QUERY_COLUMNS`` as flat int32
             arrays of shape (total_queries,); document i's queries are
             ``query_offsets[i]:query_offsets[i + 1]``, in the order they occur in it.
    query_offsets: (n + 1,) int64, or None for one answer per document.
    """

    tokens: np.ndarray
    offsets: np.ndarray
    columns: dict[str, np.ndarray]
    token_columns: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    query_columns: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    query_offsets: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def multi_query(self) -> bool:
        """Whether documents have several answers (one per query) instead of one."""
        return self.query_offsets is not None

    def answer_rows(self) -> dict[str, np.ndarray]:
        """Every answer of every document, flat: ``document`` (A,) the document it belongs to and
        the answer columns (A,) (``answer``, ``key_pos``, ... as the documents have them); A = n
        for one answer per document."""
        if not self.multi_query:
            return {"document": np.arange(len(self)), **{k: v for k, v in self.columns.items()
                                                         if k in DOCUMENT_COLUMNS}}
        counts = np.diff(self.query_offsets)
        return {"document": np.repeat(np.arange(len(self)), counts), **self.query_columns}

    def labels(self) -> np.ndarray:
        """Flat labels: ``IGNORE_INDEX`` everywhere except the answer tokens (loss on the answers only)."""
        labels = np.full(len(self.tokens), IGNORE_INDEX, dtype=np.int32)
        rows = self.answer_rows()
        labels[self.offsets[:-1][rows["document"]] + rows["answer_pos"]] = rows["answer"]
        return labels

    def document(self, i: int) -> dict:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        out = {"input_ids": self.tokens[lo:hi].tolist()}
        labels = [IGNORE_INDEX] * (hi - lo)
        if self.multi_query:
            qlo, qhi = int(self.query_offsets[i]), int(self.query_offsets[i + 1])
            for pos, answer in zip(self.query_columns["answer_pos"][qlo:qhi], self.query_columns["answer"][qlo:qhi]):
                labels[int(pos)] = int(answer)
        else:
            labels[int(self.columns["answer_pos"][i])] = int(self.columns["answer"][i])
        out["labels"] = labels
        if self.multi_query:
            out.update({k: v[qlo:qhi].tolist() for k, v in self.query_columns.items()})
        out.update({k: int(v[i]) for k, v in self.columns.items()})
        out.update({k: v[lo:hi].tolist() for k, v in self.token_columns.items()})
        return out

    def per_query(self, limit: int | None = None) -> "TaskData":
        """One document per answer, for what reads one answer per document (interventions): the
        queries of the first documents, in order, at most ``limit`` of them. Each row is its
        document again (tokens copied) with that query's ``answer`` and positions, ``document``
        (its index here), ``query_index`` (its rank among the document's queries) and
        ``query_distance`` (``query_pos - key_pos``: how far the query is from its pair), beside
        the document's own columns. Data with one answer per document is returned as it is
        (its first ``limit`` documents)."""
        if not self.multi_query:
            return self if limit is None else self.head(min(limit, len(self)))
        total = len(self.query_columns["answer"]) if limit is None else min(limit, int(self.query_offsets[-1]))
        rows = {k: v[:total] for k, v in self.answer_rows().items()}
        doc = rows.pop("document")
        starts = self.query_offsets[:-1][doc]
        lengths = self.lengths[doc]
        source = np.repeat(self.offsets[:-1][doc] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) \
            + np.arange(int(lengths.sum()))                                       # token index of each copy
        columns = {k: v.astype(np.int32) for k, v in rows.items()}
        columns.update({k: v[doc] for k, v in self.columns.items()})
        columns.update(document=doc.astype(np.int32), query_index=(np.arange(total) - starts).astype(np.int32),
                       query_distance=(rows["query_pos"] - rows["key_pos"]).astype(np.int32))
        return TaskData(tokens=self.tokens[source], offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                        columns=columns, token_columns={k: v[source] for k, v in self.token_columns.items()})

    def __iter__(self) -> Iterator[dict]:
        for i in range(len(self)):
            yield self.document(i)

    def padded(self, pad_id: int = PAD, values: np.ndarray | None = None) -> np.ndarray:
        """(n, max_length) int64 matrix of the tokens (or of ``values``, a flat per-token array
        such as :meth:`labels`), right-padded with ``pad_id``."""
        return _rows(self.tokens if values is None else values, self.offsets, pad_id)

    def query_rows(self, column: str, fill: int = -1) -> np.ndarray:
        """(n, most queries) int64 matrix of a query column (``key_pos``, ...), each document's
        queries in the order they occur, right-padded with ``fill``."""
        return _rows(self.query_columns[column], self.query_offsets, fill)

    def head(self, n: int) -> "TaskData":
        """The first ``n`` documents."""
        end = int(self.offsets[n])
        queries = None if self.query_offsets is None else int(self.query_offsets[n])
        return TaskData(
            tokens=self.tokens[:end],
            offsets=self.offsets[: n + 1],
            columns={k: v[:n] for k, v in self.columns.items()},
            token_columns={k: v[:end] for k, v in self.token_columns.items()},
            query_columns={k: v[:queries] for k, v in self.query_columns.items()},
            query_offsets=None if self.query_offsets is None else self.query_offsets[: n + 1],
        )

    @staticmethod
    def concatenate(parts: list["TaskData"]) -> "TaskData":
        if len(parts) == 1:
            return parts[0]
        query_offsets = None
        if parts[0].query_offsets is not None:
            query_offsets = _joined_offsets([p.query_offsets for p in parts])
        return TaskData(
            tokens=np.concatenate([p.tokens for p in parts]),
            offsets=_joined_offsets([p.offsets for p in parts]),
            columns={k: np.concatenate([p.columns[k] for p in parts]) for k in parts[0].columns},
            token_columns={
                k: np.concatenate([p.token_columns[k] for p in parts]) for k in parts[0].token_columns
            },
            query_columns={
                k: np.concatenate([p.query_columns[k] for p in parts]) for k in parts[0].query_columns
            },
            query_offsets=query_offsets,
        )

    # ----------------------------------------------------------------------------- Arrow
    def to_arrow(self) -> pa.Table:
        labels = self.labels()
        batches = [self._arrow_arrays(lo, hi, labels) for lo, hi in chunk_bounds(self.offsets, MAX_LIST_TOKENS)]
        if len(batches) == 1:
            return pa.table(batches[0])
        return pa.Table.from_batches([pa.record_batch(b) for b in batches])

    def _arrow_arrays(self, lo: int, hi: int, labels: np.ndarray) -> dict[str, pa.Array]:
        """Documents lo:hi as Arrow arrays (fewer than 2^31 tokens)."""
        start, end = int(self.offsets[lo]), int(self.offsets[hi])
        offsets = pa.array((self.offsets[lo:hi + 1] - start).astype(np.int32))

        def list_column(flat: np.ndarray) -> pa.Array:
            return pa.ListArray.from_arrays(offsets, pa.array(flat[start:end].astype(np.int32)))

        arrays = {"input_ids": list_column(self.tokens), "labels": list_column(labels)}
        if self.multi_query:       # one list per document: its queries' answers and positions
            qstart, qend = int(self.query_offsets[lo]), int(self.query_offsets[hi])
            query_offsets = pa.array((self.query_offsets[lo:hi + 1] - qstart).astype(np.int32))
            for name in QUERY_COLUMNS:
                flat = pa.array(self.query_columns[name][qstart:qend].astype(np.int32))
                arrays[name] = pa.ListArray.from_arrays(query_offsets, flat)
        else:
            for name in DOCUMENT_COLUMNS:
                arrays[name] = pa.array(self.columns[name][lo:hi].astype(np.int32))
        for name, values in self.columns.items():
            if name not in DOCUMENT_COLUMNS:
                arrays[name] = pa.array(values[lo:hi].astype(np.int32))
        for name, values in self.token_columns.items():
            arrays[name] = list_column(values)
        return arrays

    @staticmethod
    def from_arrow(table: pa.Table) -> "TaskData":
        """Inverse of :meth:`to_arrow` (``labels`` is derived, so it is dropped). Answer columns
        holding lists are documents with several answers (MQAR)."""
        from ..errors import MechEvalError

        multi = "answer" in table.column_names and _is_list(table.column("answer").type)
        needed = QUERY_COLUMNS if multi else DOCUMENT_COLUMNS
        missing = [c for c in ("input_ids",) + needed if c not in table.column_names]
        if missing:
            raise MechEvalError(
                f"dataset lacks the column(s) {', '.join(missing)}; hf-mecheval needs "
                f"input_ids, {', '.join(needed)}"
            )
        tokens, offsets = _flat_lists(table.column("input_ids"))
        columns, token_columns, query_columns, query_offsets = {}, {}, {}, None
        for name in table.column_names:
            if name in ("input_ids", "labels"):
                continue
            col = table.column(name)
            if multi and name in QUERY_COLUMNS:
                query_columns[name], query_offsets = _flat_lists(col)
            elif _is_list(col.type):
                token_columns[name] = _flat_lists(col)[0]
            else:
                columns[name] = col.to_numpy().astype(np.int32)
        return TaskData(tokens, offsets, columns, token_columns, query_columns, query_offsets)

    @staticmethod
    def from_dataset(dataset) -> "TaskData":
        """A ``datasets.Dataset`` split of a task (``mecheval data publish``, the builders,
        ``Task.dataset``), selections and shuffles included."""
        return TaskData.from_arrow(dataset.with_format("arrow")[:])

    def features(self):
        """The typed ``datasets.Features`` of :meth:`to_arrow`'s table."""
        return features_for(
            [c for c in self.columns if c not in DOCUMENT_COLUMNS], list(self.token_columns), self.multi_query
        )

    def to_dataset(self, info=None):
        """A ``datasets.Dataset`` backed by this data's Arrow table (no per-example Python)."""
        import datasets

        if info is None:
            info = datasets.DatasetInfo(features=self.features())
        return datasets.Dataset(self.to_arrow(), info=info)


def _joined_offsets(parts: list[np.ndarray]) -> np.ndarray:
    """The offsets of consecutive parts' lists, each part's (n_i + 1,) offsets starting at 0."""
    shifts = np.concatenate([[0], np.cumsum([int(o[-1]) for o in parts])[:-1]])
    return np.concatenate([[0]] + [o[1:] + s for o, s in zip(parts, shifts)]).astype(np.int64)


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _flat_lists(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values (int32) and its offsets (int64) over all its chunks, never
    combining them into one array (more than 2^31 values would not fit one)."""
    values, offsets, base = [], [np.zeros(1, dtype=np.int64)], 0
    for chunk in column.chunks:
        local = chunk.offsets.to_numpy().astype(np.int64)
        local = local - local[0]                 # a slice's offsets start where the slice does
        values.append(chunk.flatten().to_numpy(zero_copy_only=False).astype(np.int32))
        offsets.append(local[1:] + base)
        base += int(local[-1])
    flat = np.concatenate(values) if values else np.zeros(0, dtype=np.int32)
    return flat, np.concatenate(offsets)


def features_for(document_metadata: list[str], token_metadata: list[str], multi_query: bool = False):
    """``datasets.Features`` for a task whose documents carry the given metadata columns, with
    one answer each or (``multi_query``) a list of answers and positions, one per query."""
    import datasets

    tokens = datasets.List(datasets.Value("int32"))
    spec = {"input_ids": tokens, "labels": tokens}
    if multi_query:
        spec.update({name: datasets.List(datasets.Value("int32")) for name in QUERY_COLUMNS})
    else:
        spec.update({name: datasets.Value("int32") for name in DOCUMENT_COLUMNS})
    spec.update({name: datasets.Value("int32") for name in document_metadata})
    spec.update({name: tokens for name in token_metadata})
    return datasets.Features(spec)

"""pgvector's binary form, both ways: embeddings written and read without their text form.

Writing: pgvector's SQLAlchemy type sends every vector as text ("[0.0123,...]"); the worker
spends about 0.17 ms formatting a 384-dimension vector, and Postgres parsing it again, twice
per chunk (the chunk and its embedding-cache row). A numpy vector is sent instead as the bytes of
pgvector's binary input format (a dimension count, a reserved zero, big-endian float4s)
under no type OID, so Postgres reads it with the receive function of the column it fills.
Anything else (a list of floats from a query) still goes as text.

Reading: select :func:`vector_bytes` of the column and decode it with :func:`vector_from_bytes`;
the text form costs a Python float() per dimension (6 ms for the 128 vectors of a
100-result search).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import psycopg
from pgvector.sqlalchemy import Vector
from psycopg.adapt import Dumper
from psycopg.pq import Format
from sqlalchemy import ColumnElement, LargeBinary, func
from sqlalchemy.engine import Dialect


class PackedVector:
    """A vector already in pgvector's binary input format."""

    __slots__ = ("data",)

    def __init__(self, values: np.ndarray) -> None:
        floats = np.asarray(values, dtype=">f4")
        if floats.ndim != 1:
            raise ValueError(f"a vector has one dimension, not {floats.ndim}")
        self.data = struct.pack(">HH", floats.shape[0], 0) + floats.tobytes()


class _PackedVectorDumper(Dumper):
    format = Format.BINARY  # oid stays 0: Postgres takes the type from where it goes

    def dump(self, obj: PackedVector) -> bytes:
        return obj.data


psycopg.adapters.register_dumper(PackedVector, _PackedVectorDumper)


class EmbeddingVector(Vector):
    """The ``vector`` column type for embeddings: see the module docstring."""

    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> Any:
        as_text = super().bind_processor(dialect)

        def process(value: Any) -> Any:
            if isinstance(value, np.ndarray):
                return PackedVector(value)
            return as_text(value)

        return process


def vector_bytes(column: Any) -> ColumnElement[bytes]:
    """``column`` in pgvector's binary form, for :func:`vector_from_bytes`."""
    return func.vector_send(column, type_=LargeBinary)


def vector_from_bytes(raw: bytes) -> np.ndarray:
    """pgvector's binary form: int16 dimensions, int16 unused, then big-endian float32s."""
    dimensions = int.from_bytes(raw[:2], "big")
    return np.frombuffer(raw, dtype=">f4", count=dimensions, offset=4).astype(np.float32)

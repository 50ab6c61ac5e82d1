"""The protobuf half of Tinker's wire format: the SDK sends ``forward_backward`` requests as protobuf and reads
``forward_backward`` and ``sample`` results only as protobuf (every other body is JSON).

The message classes are the SDK's own generated ones (``tinker.proto.tinker_public_pb2``, the protocol's schema);
the conversion to and from rlkit's values is written here. Tensors travel as raw little-endian bytes: tokens as
int32, per-token values as float32, int64 where the tensor says so; a batched result carries all datums' values
back to back with int64 byte offsets (``num_datums + 1`` of them).

Deliberate simplifications: image and audio chunks are refused; a sparse (CSR) tensor is made dense.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

from rlkit.tinker_api.convert import Datum, TinkerRequestError

PROTOBUF = "application/x-protobuf"


def _pb():
    try:
        from tinker.proto import tinker_public_pb2  # the schema ships with the SDK
    except ImportError as e:
        raise ImportError("rlkit's Tinker service reads the tinker SDK's protobuf schema: pip install tinker==0.38.0 "
                          "(pinned in requirements/cpu-lock.txt)") from e
    return tinker_public_pb2


def check_schema() -> None:
    """Raise the ImportError that says what to install, before a service starts without the schema."""
    _pb()


_NUMPY = {1: np.float32, 2: np.int64, 3: np.int32}  # DType: FLOAT32, INT64, INT32


@dataclass(frozen=True)
class ForwardBackwardCall:
    """A decoded ``/api/v1/forward_backward`` request."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: Mapping[str, float | str]
    forward_only: bool
    data: tuple[Datum, ...]


def _tensor(msg) -> np.ndarray:
    dtype = _NUMPY.get(msg.dtype)
    if dtype is None:
        raise TinkerRequestError(f"unsupported tensor dtype {msg.dtype} (the service reads float32, int64, int32)")
    shape = list(msg.shape)
    if msg.HasField("sparse_csr"):
        rows, cols = shape
        dense = np.zeros((rows, cols), dtype=dtype)
        crow = np.frombuffer(msg.sparse_csr.crow_indices, dtype=np.int64)
        col = np.frombuffer(msg.sparse_csr.col_indices, dtype=np.int64)
        values = np.frombuffer(msg.sparse_csr.values, dtype=dtype)
        for r in range(rows):
            dense[r, col[crow[r]:crow[r + 1]]] = values[crow[r]:crow[r + 1]]
        return dense
    values = np.frombuffer(msg.dense, dtype=dtype)
    return values.reshape(shape) if shape else values


def _tokens(chunks: Sequence) -> tuple[int, ...]:
    out: list[int] = []
    for chunk in chunks:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise TinkerRequestError(f"model_input chunk {kind!r} is not served: rlkit's service takes token chunks "
                                     "(ModelInput.from_ints) only")
        out.extend(int(t) for t in np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32))
    return tuple(out)


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    msg = _pb().ForwardBackwardRequest()
    msg.ParseFromString(body)
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = tuple(Datum(_tokens(d.model_input), {k: _tensor(v) for k, v in d.loss_fn_inputs.items()})
                 for d in msg.data)
    return ForwardBackwardCall(msg.model_id, msg.seq_id, msg.loss_fn, config, msg.forward_only, data)


def encode_forward_backward(outputs: Sequence[Mapping[str, np.ndarray]], metrics: Mapping[str, float]) -> bytes:
    """``ForwardBackwardOutput``: one record of float32 fields (each [N_i] per datum) and the metrics."""
    pb = _pb()
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in metrics.items():
        msg.metrics[key] = float(value)
    record = msg.loss_fn_outputs.add()
    record.num_datums = len(outputs)
    for name in (outputs[0].keys() if outputs else ()):
        arrays = [np.ascontiguousarray(o[name], dtype=np.float32) for o in outputs]
        field = record.fields[name]
        field.dtype = pb.DTYPE_FLOAT32
        field.data = b"".join(a.tobytes() for a in arrays)
        field.offsets = np.concatenate([[0], np.cumsum([a.nbytes for a in arrays])]).astype(np.int64).tobytes()
    return msg.SerializeToString()


@dataclass(frozen=True)
class Sequence_:
    tokens: Sequence[int]  # [n] sampled ids (a stop token included, as the engine returns it)
    logprobs: Optional[Sequence[float]]  # [n] or None
    stop_reason: str  # "stop" | "length"


def encode_sample(sequences: Sequence[Sequence_], prompt_logprobs: Optional[Sequence[float]] = None) -> bytes:
    """``SampleResponse``; ``prompt_logprobs`` [len(prompt)] with NaN at position 0."""
    pb = _pb()
    msg = pb.SampleResponse()
    for seq in sequences:
        out = msg.sequences.add()
        out.stop_reason = pb.STOP_REASON_STOP if seq.stop_reason == "stop" else pb.STOP_REASON_LENGTH
        out.tokens = np.asarray(seq.tokens, dtype=np.int32).tobytes()
        if seq.logprobs is not None:
            out.logprobs = np.asarray(seq.logprobs, dtype=np.float32).tobytes()
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return msg.SerializeToString()

"""A step as a row of the steps table: its StepStats' numbers, the ids it ran, and its cache stats
flattened into kv_* columns with the derived ratios (kv_fields)."""

from __future__ import annotations

import dataclasses
from operator import attrgetter
from typing import Any

# List columns of the steps table: request ids scheduled in the step (batch order), the new tokens each
# got, the ids that were prefilling (prompt chunks, recomputation after preemption) and those preempted.
STEP_ID_COLUMNS = ("scheduled_ids", "scheduled_tokens", "prefill_ids", "preempted_ids")

# dataclass_columns' (getter, column names) of each stats dataclass
_DATACLASS_FIELDS: dict[type, tuple] = {}
_SCALARS = {int, float, bool, type(None)}


def dataclass_columns(kind: type[Any]) -> tuple:
    """A stats dataclass's (getter of its field values, their kv_* column names), made once per type."""
    spec = _DATACLASS_FIELDS.get(kind)
    if spec is None:
        names = [f.name for f in dataclasses.fields(kind)]
        getter = attrgetter(*names) if len(names) > 1 else lambda o: (getattr(o, names[0]),)
        spec = _DATACLASS_FIELDS[kind] = (getter, [f"kv_{name}" for name in names])
    return spec


def kv_fields(kv) -> dict:
    """Flatten a KVCacheStats (any version) into kv_* columns plus the derived ratios.

    kv_usage = used_blocks / num_blocks. frag_internal / frag_reserved / frag_external are fractions of all
    token slots, from the allocator's memory breakdown (internal_slots: held, beyond the request's final
    length; reserved_slots: held for the request's own future tokens; external_slots: free but unusable by
    the request waiting for memory). Stats without that breakdown (older KVCacheStats) count every empty
    held slot (slack_token_slots) as internal and report 0 for the other two."""
    spec = _DATACLASS_FIELDS.get(type(kv))
    if spec is None and dataclasses.is_dataclass(kv):
        spec = dataclass_columns(type(kv))
    if spec is not None:
        getter, keys = spec
        values = getter(kv)
        if set(map(type, values)) <= _SCALARS:  # the usual case: every field a plain number
            row = dict(zip(keys, values))
        else:
            row = {k: v for k, v in zip(keys, values) if v is None or isinstance(v, (int, float, bool))}
    else:
        raw = {k: v for k, v in vars(kv).items() if not k.startswith("_")}
        row = {f"kv_{k}": v for k, v in raw.items() if isinstance(v, (int, float, bool)) or v is None}
    num_blocks = getattr(kv, "num_blocks", 0) or 0
    total = num_blocks * (getattr(kv, "block_size", 1) or 1) or 1
    row["kv_usage"] = (getattr(kv, "used_blocks", 0) or 0) / num_blocks if num_blocks else 0.0
    parts = [
        getattr(kv, name, None)
        for name in ("token_slots", "reserved_slots", "internal_slots", "external_slots", "free_slots")
    ]
    ints = [p for p in parts if isinstance(p, int)]
    if len(ints) == len(parts) and sum(ints) == total:
        row["frag_internal"] = ints[2] / total
        row["frag_reserved"] = ints[1] / total
        row["frag_external"] = ints[3] / total
    else:
        row["frag_internal"] = (getattr(kv, "slack_token_slots", 0) or 0) / total
        row["frag_reserved"] = 0.0
        row["frag_external"] = 0.0
    return row


def step_row(stats) -> dict:
    """A StepStats as a row of the steps table."""
    row = {
        "step": stats.step,
        "start_time": stats.start_time,
        "duration_s": stats.duration_s,
        "num_seqs": stats.num_seqs,
        "num_prefill_tokens": stats.num_prefill_tokens,
        "num_decode_tokens": stats.num_decode_tokens,
        "num_preempted": stats.num_preempted,
        "num_waiting": stats.num_waiting,
        "num_running": stats.num_running,
    }
    # optional fields: spec decode; structured output's grammar time (seconds of the step)
    for name in ("num_spec_tokens", "num_accepted_tokens", "grammar_time_s"):
        if hasattr(stats, name):
            row[name] = getattr(stats, name)
    for name in STEP_ID_COLUMNS:  # who ran and who was preempted (list columns; experiments.statistics.compare)
        row[name] = getattr(stats, name, None) or []
    row.update(kv_fields(stats.kv))
    return row

"""The per-step work that is claimed to be O(changed requests) is: counted in calls and rows, not time.

In a steady decode step (host executor, N requests decoding) the allocator is called only for requests
whose next token needs a block or fills one (the rest stay below their slot limit), the block-table
changes pushed to the executor name only the requests that took a block, the executor's block tables
rewrite only those rows, and the batch's row index is reused while the batch is unchanged."""

import numpy as np

from benchmarks.host import make_steady_engine


def test_decode_step_touches_only_changed_requests():
    block_size, n, steps = 16, 48, 40
    engine = make_steady_engine(n, block_size=block_size, prompt_range=(20, 200))
    kv, tables = engine.kv, engine.executor.tables
    calls, taken, updates, written = [], [], [], []
    allocate, apply = kv.allocate_slots, tables.apply

    def counting_allocate(request, *args, **kwargs):
        result = allocate(request, *args, **kwargs)
        calls.append(request.request_id)
        if result:
            taken.append(request.request_id)
        return result

    def counting_apply(finished_ids, block_updates):
        updates.append(sorted(block_updates))
        before = tables.table.copy()
        apply(finished_ids, block_updates)
        written.append(int(np.any(before != tables.table, axis=1).sum()))

    kv.allocate_slots, tables.apply = counting_allocate, counting_apply
    rows_objects = set()
    for _ in range(steps):
        step_calls = len(calls)
        step_taken = len(taken)
        engine.step()
        rows_objects.add(id(tables._last[1]))
        new_blocks = sorted(taken[step_taken:])
        # the allocator saw at most the requests at a block boundary (a block fills, or a new one is needed)
        assert len(calls) - step_calls <= 2 * (-(-n // block_size)) + len(new_blocks) + 4
        # what went to the executor, and the rows it wrote: exactly the requests that took a block
        assert updates[-1] == new_blocks
        assert written[-1] <= len(new_blocks)
    # over the run: about two calls per request per block_size tokens, far below one per request per step
    assert len(calls) <= n * (2 * steps / block_size + 1)
    assert len(calls) < n * steps / 4
    assert len(set(taken)) > n / 2  # the check above was not empty: most requests crossed a block
    assert len(rows_objects) == 1  # the batch never changed: its row index array was built once


def test_decode_step_builds_one_object_per_output():
    """Scheduler.update hands the step's own lists on (no per-request pair is built), and each output is one
    object: a steady decode step leaves the outputs, the tokens each got and a fixed number of objects."""
    import gc

    n = 48
    engine = make_steady_engine(n, prompt_range=(20, 200))
    scheduler, update = engine.scheduler, engine.scheduler.update
    seen = []

    def recording_update(out, sampled, *args):
        updates = update(out, sampled, *args)
        seen.append((updates.requests is out.requests, updates.new_tokens is sampled))
        return updates

    scheduler.update = recording_update
    gc.collect()
    gc.disable()
    try:
        for _ in range(5):
            before = len(gc.get_objects(generation=0))
            outputs = engine.step()
            left = len(gc.get_objects(generation=0)) - before
            assert len(outputs) == n
            # the outputs and the lists of tokens they carry (the executor's), plus the step's fixed objects
            # (SchedulerOutput, its lists, StepStats; the id list is the last step's): nothing else per request
            assert left <= 2 * n + 16, left
            del outputs
    finally:
        gc.enable()
    assert seen == [(True, True)] * 5


def test_decode_step_stages_only_changed_block_table_rows():
    """Input staging copies into a buffer set only the block-table rows written since that set last held
    the batch (two steps ago: the sets are used in turn), not the whole batch's rows; a set is rewritten
    whole only when the table's width grows (the longest request takes a block)."""
    n, steps = 48, 40
    engine = make_steady_engine(n, prompt_range=(20, 200))
    tables = engine.executor.tables
    step, written, staged = [0], {}, {}
    apply, changed_since = tables.apply, tables.changed_since

    def counting_apply(finished_ids, block_updates):
        written[step[0]] = len(block_updates)
        apply(finished_ids, block_updates)

    def counting_changed_since(rows, version):
        changed = changed_since(rows, version)
        staged[step[0]] = len(changed)
        return changed

    tables.apply, tables.changed_since = counting_apply, counting_changed_since
    for s in range(steps):
        step[0] = s
        engine.step()
    assert len(staged) >= steps - 8  # the width grows about every block_size steps: both sets rewritten then
    for s, copied in staged.items():
        if s >= 2:  # the set's last batch was staged in this loop
            assert copied <= written.get(s, 0) + written.get(s - 1, 0)
    assert sum(staged.values()) < n * len(staged) / 4  # far below a full copy per step

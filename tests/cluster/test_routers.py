"""Routers' choices on hand-built replica states."""

import collections

import pytest

from testbed.cluster.config import ClusterConfig
from testbed.cluster.prefix import leading_block_hashes
from testbed.cluster.routers import ROUTERS, NoHealthyReplica, ReplicaSnapshot, RouteRequest, get_router
from testbed.cluster.routers.prefix_affinity import HashRing, cached_prefix_blocks
from testbed.core.allocators.paged import PagedAllocator
from testbed.request import Request
from testbed.sampling_params import SamplingParams


def replicas(*loads, **fields):
    """ReplicaSnapshots with the given outstanding counts (other fields per keyword: lists by replica)."""
    out = []
    for i, load in enumerate(loads):
        extra = {k: v[i] for k, v in fields.items()}
        out.append(ReplicaSnapshot(i, outstanding=load, total_blocks=100, **{"free_blocks": 50, **extra}))
    return out


def request(hashes=(), rid="r"):
    return RouteRequest(rid, prompt_len=16 * len(hashes) + 1, block_hashes=tuple(hashes))


def test_round_robin_cycles_and_skips_unhealthy():
    router = get_router("round_robin")
    views = replicas(0, 0, 0)
    assert [router.route(request(), views) for _ in range(4)] == [0, 1, 2, 0]
    views[1].healthy = False
    assert [router.route(request(), views) for _ in range(3)] == [2, 0, 2]
    views[1].healthy = True  # back in its turn
    assert [router.route(request(), views) for _ in range(3)] == [0, 1, 2]


def test_no_healthy_replica_is_a_clear_error():
    views = replicas(0, 0)
    for v in views:
        v.healthy = False
    for name in ROUTERS:
        with pytest.raises(NoHealthyReplica, match="no healthy replica"):
            get_router(name).route(request(), views)


def test_random_is_seeded_uniform_and_healthy_only():
    views = replicas(0, 0, 0, 0)
    views[3].healthy = False
    picks = [get_router("random", seed=1).route(request(), views) for _ in range(3)]
    assert picks[0] == picks[1] == picks[2]  # same seed, same first draw
    router = get_router("random", seed=7)
    counts = collections.Counter(router.route(request(), views) for _ in range(3000))
    assert set(counts) == {0, 1, 2}
    assert all(900 < c < 1100 for c in counts.values())


def test_least_outstanding_picks_the_shortest_queue_then_engine_queue_then_in_turn():
    router = get_router("least_outstanding")
    assert router.route(request(), replicas(3, 1, 2)) == 1
    assert router.route(request(), replicas(2, 1, 1, running=[0, 5, 2], waiting=[0, 0, 1])) == 2
    assert [router.route(request(), replicas(1, 1, 1)) for _ in range(4)] == [0, 1, 2, 0]  # ties in turn
    assert get_router("least_outstanding").route(request(), replicas(0, 0)) == 0


def test_least_kv_prefers_the_largest_free_share():
    router = get_router("least_kv")
    views = replicas(0, 9, 0, free_blocks=[10, 80, 40])
    assert router.route(request(), views) == 1  # most free, however busy
    views = replicas(4, 2, free_blocks=[50, 50])
    assert router.route(request(), views) == 1  # tie on free: fewer outstanding
    assert [router.route(request(), replicas(0, 0, 0)) for _ in range(3)] == [2, 0, 1]  # full ties: in turn
    views = replicas(0, 0, free_blocks=[50, 40])
    views[1].total_blocks = 50  # 80% free beats 50% free
    assert router.route(request(), views) == 1


def test_power_of_two_takes_the_less_loaded_of_two_samples():
    views = replicas(0, 100, 100, 100)
    router = get_router("power_of_two", seed=3)
    picks = collections.Counter(router.route(request(), views) for _ in range(2000))
    # replica 0 is in the sample with probability 1/2 and then always wins; the others split the rest
    assert 900 < picks[0] < 1100
    assert picks[0] > 2 * max(picks[i] for i in (1, 2, 3))
    assert get_router("power_of_two").route(request(), replicas(5)) == 0


def hashes_of(tokens, block_size=16):
    return leading_block_hashes(tokens, block_size)


def test_leading_block_hashes_are_the_engine_prefix_cache_hashes():
    tokens = list(range(100, 170))  # 70 tokens: 4 full blocks of 16, the hittable ones are (70 - 1) // 16 = 4
    kv = PagedAllocator(num_blocks=16, block_size=16)
    req = Request("a", tokens, SamplingParams(max_tokens=4), 0.0)
    kv.allocate_slots(req, len(tokens))
    assert hashes_of(tokens) == req.block_hashes[:4]
    assert all(kv.pool.get_cached_block(h) is not None for h in hashes_of(tokens))
    assert len(hashes_of(tokens[:64])) == 3  # 64 tokens: the 4th block holds the token that must be computed
    assert len(hashes_of(tokens, 16)[:2]) == len(leading_block_hashes(tokens, 16, max_blocks=2))


def test_prefix_affinity_sends_a_shared_prefix_home_and_spreads_distinct_ones():
    router = get_router("prefix_affinity", cache_aware=False)
    views = replicas(0, 0, 0, 0)
    shared = [11, 12, 13, 14, 15]
    homes = {router.route(request([*shared[:4], 100 + i]), views) for i in range(20)}
    assert len(homes) == 1  # the key is the 4th chained hash: equal leading 4 blocks, same home
    spread = collections.Counter(router.route(request([1000 + i] * 4), views) for i in range(400))
    assert len(spread) == 4 and min(spread.values()) > 40  # distinct prefixes land all over the ring


def test_prefix_affinity_load_bound_spills_to_the_next_replica_on_the_ring():
    router = get_router("prefix_affinity", cache_aware=False, load_factor=1.25)
    key = [7, 8, 9, 10]
    home = router.route(request(key), replicas(0, 0, 0, 0))
    ring_order = router.ring.order(key[3])
    assert ring_order[0] == home and sorted(ring_order) == [0, 1, 2, 3]
    loads = [2, 2, 2, 2]
    loads[home] = 6  # bound = ceil(1.25 * (12 + 1) / 4) = 5: home is over it
    assert router.route(request(key), replicas(*loads)) == ring_order[1]
    loads[ring_order[1]] = 5  # at the bound counts as full too
    assert router.route(request(key), replicas(*loads)) == ring_order[2]


def test_prefix_affinity_prefers_the_replica_that_has_the_prefix_cached():
    router = get_router("prefix_affinity")
    key = [21, 22, 23, 24, 25, 26]
    order = get_router("prefix_affinity", cache_aware=False)
    home = order.route(request(key), replicas(0, 0, 0))
    other = (home + 1) % 3
    views = replicas(0, 0, 0)
    views[other].cached = set(key[:5])
    views[home].cached = set(key[:2])
    assert router.route(request(key), views) == other  # the longest cached prefix wins
    views[other].outstanding = 10  # ... unless it is over the load bound
    assert router.route(request(key), views) == home
    assert router.route(request(key), replicas(0, 0, 0)) == home  # nothing cached: the ring's choice


def test_cached_prefix_is_found_by_bisection():
    view = ReplicaSnapshot(0, cached={1, 2, 3})
    assert cached_prefix_blocks(view, [1, 2, 3, 4, 5, 6, 7]) == 3
    assert cached_prefix_blocks(view, [9, 1, 2]) == 0
    assert cached_prefix_blocks(view, [1, 2, 3]) == 3
    assert cached_prefix_blocks(view, []) == 0


def test_prefix_affinity_without_blocks_goes_to_the_least_loaded():
    assert get_router("prefix_affinity").route(request(()), replicas(3, 0, 2)) == 1
    router = get_router("prefix_affinity")
    assert [router.route(request(()), replicas(0, 0)) for _ in range(3)] == [0, 1, 0]


def test_hash_ring_moves_only_the_keys_of_a_removed_replica():
    ring = HashRing(4, 64)
    keys = range(-500, 500)
    before = {k: ring.order(k)[0] for k in keys}
    for k in keys:  # with replica 2 gone, a key's new home is its next replica clockwise
        alive = [r for r in ring.order(k) if r != 2]
        assert alive[0] == before[k] or before[k] == 2


def test_bad_router_options_and_names_are_refused():
    with pytest.raises(ValueError, match="unknown router 'nope'"):
        get_router("nope")
    with pytest.raises(ValueError, match="takes no options"):
        get_router("round_robin", weight=2)
    with pytest.raises(ValueError, match="load_factor"):
        get_router("prefix_affinity", load_factor=0.5)
    with pytest.raises(ValueError, match="cluster.router: unknown router"):
        ClusterConfig(replicas=2, router="fastest")


@pytest.mark.parametrize(
    "values, match",
    [
        ({"replicas": 0}, "cluster.replicas"),
        ({"prefill_replicas": 2}, "go together"),
        ({"prefill_replicas": 1, "decode_replicas": 1, "replicas": 3}, "disagrees"),
        ({"probe_interval_s": 0}, "probe_interval_s"),
        ({"backends": "http://a"}, "list of URLs"),
        ({"colour": 1}, "unknown cluster keys"),
    ],
)
def test_bad_cluster_config_is_refused(values, match):
    with pytest.raises(ValueError, match=match):
        ClusterConfig.from_any(values)


def test_default_cluster_is_a_single_engine():
    assert not ClusterConfig().enabled
    assert ClusterConfig(replicas=2).enabled
    pd = ClusterConfig(prefill_replicas=1, decode_replicas=3)
    assert pd.enabled and pd.disaggregated and pd.num_replicas == 4

"""In a threaded Ray actor (math-verify's SIGALRM cannot work there) graders stay bounded: in-process and in the pool."""

import pytest

pytestmark = pytest.mark.e2e


def test_former_hang_returns_zero_within_the_bound_in_threaded_actor(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0, max_concurrency=2)
    class Scorer:
        def score(self, timeout_s):
            import threading
            import time

            from deepscaler.rewards import ScorerSpec
            from verl.workers.reward_manager import ScoringPool

            from deepscaler.rewards import score_response

            items = [
                ("math", "x\n</think>\n\\boxed{9^{9^{9}}}", "1", None),
                ("math", "x\n</think>\n\\boxed{\\frac{1}{2}}", "0.5", None),
            ]
            start = time.monotonic()
            direct = score_response(*items[0])  # no pool: verify() on this never returned before the guards
            direct_elapsed = time.monotonic() - start
            with ScoringPool(ScorerSpec(3), num_workers=1, timeout_s=timeout_s) as pool:
                pool.wait_ready()
                start = time.monotonic()
                results, stats = pool.score(items)
                elapsed = time.monotonic() - start
            return (
                threading.current_thread() is threading.main_thread(),
                [r.score for r in results],
                (stats.timeout_count, stats.unparseable_count),
                elapsed,
                (direct.score, direct.unparseable),
                direct_elapsed,
            )

    actor = Scorer.remote()
    on_main_thread, scores, counts, elapsed, direct, direct_elapsed = ray.get(actor.score.remote(3.0), timeout=300)
    assert on_main_thread is False  # really a worker thread, where SIGALRM-based timeouts raise
    assert direct == (0.0, True) and direct_elapsed < 5.0
    assert scores == [0.0, 1.0] and counts == (0, 1)
    assert elapsed < 3.0 + 60.0
    ray.kill(actor)

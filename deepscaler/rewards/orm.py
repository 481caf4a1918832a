"""LLM-as-judge (ORM) reward: an OpenAI-compatible chat-completions client with retries and a cache.

Used by the reward manager for responses the rule/math-verify grader marked wrong (docs/METHOD.md §4.2,
off by default). The API key is read from the environment variable named in the config
(``reward.orm.api_key_env``) when the judge is built; it is never logged, cached or stored in a config.
Requests are rate-limited (``requests_per_second``), time-limited (``timeout_s`` per call) and retried
(``max_retries``, exponential backoff capped at 64 s on connection errors, timeouts, 429 and 5xx).
Verdicts are cached in memory and, if ``cache_path`` is set, in a JSON-lines file keyed by a hash of
(prompt version, model, problem, reference, response). A judge that fails (no verdict) for more than
``max_failure_rate`` of a step's calls stops the step (``on_failure=raise``, the default; the remaining
calls are skipped) or logs a warning every such step (``warn``), naming the endpoint and the last error:
a dead judge must not silently turn every answer it was asked about into a 0.

Circuit breaker (what keeps ``warn`` mode cheap with a dead or hung endpoint): a step in which the judge
is down (more than ``max_failure_rate`` of its calls failed) opens the breaker; the next steps skip the
judge without a call (``error=CIRCUIT_OPEN``, counted as failures, so ``warn`` still says so each step),
1, 2, 4 ... up to ``BREAKER_MAX_SKIP_STEPS`` steps; then one probe call with no retries decides: an
answer closes the breaker, a failure opens it again for twice as long. The endpoint in every message
has any key inside its URL masked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence
from urllib.parse import urlparse

from deepscaler.system_prompts import ORM_PROMPT_VERSION, ORM_SYSTEM_PROMPT, ORM_USER_TEMPLATE

# The judge reads the solution section; reasoning chains can be 30k tokens, the verdict needs the end.
MAX_RESPONSE_CHARS = 4000
MAX_PROBLEM_CHARS = 4000
DEFAULT_MAX_TOKENS = 512
_VERDICT = re.compile(r"\[\[\s*(YES|NO)\s*\]\]", re.IGNORECASE)
ON_FAILURE = ("raise", "warn")
SKIPPED = "skipped: too many judge failures in this step"
CIRCUIT_OPEN = "skipped: judge circuit open after failing steps"
BREAKER_MAX_SKIP_STEPS = 32

logger = logging.getLogger(__name__)


class JudgeUnavailableError(RuntimeError):
    """More judge calls failed in one step than ``reward.orm.max_failure_rate`` allows."""


@dataclasses.dataclass(frozen=True)
class OrmConfig:
    """``reward.orm`` keys (defaults in parentheses).

    enable (False): ask the judge about responses the grader marked wrong.
    base_url (None): OpenAI-compatible endpoint, e.g. ``http://127.0.0.1:8000/v1``.
    model (None): model name sent in each request.
    api_key_env ("OPENAI_API_KEY"): name of the environment variable holding the key. When it is unset,
        loopback endpoints get the placeholder key "EMPTY" (local vLLM servers need none) and any other
        endpoint is an error.
    timeout_s (30): per-request timeout in seconds.
    max_retries (3): retries after the first attempt on transient errors.
    requests_per_second (5): client-side rate limit across all threads.
    cache_path (None): JSON-lines verdict cache; None keeps the cache in memory only.
    max_failure_rate (0.5): largest fraction of a step's judge calls that may fail (no verdict) before
        ``on_failure`` acts.
    on_failure ("raise"): ``raise`` stops training with the endpoint and the last error; ``warn`` logs
        them every such step and scores those answers as the grader did.
    """

    enable: bool = False
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 30.0
    max_retries: int = 3
    requests_per_second: float = 5.0
    cache_path: str | None = None
    max_failure_rate: float = 0.5
    on_failure: str = "raise"

    def __post_init__(self):
        if self.enable and (not self.base_url or not self.model):
            raise ValueError("reward.orm.enable=True needs reward.orm.base_url and reward.orm.model")
        if self.timeout_s <= 0:
            raise ValueError(f"reward.orm.timeout_s must be > 0, got {self.timeout_s}")
        if self.max_retries < 0:
            raise ValueError(f"reward.orm.max_retries must be >= 0, got {self.max_retries}")
        if self.requests_per_second <= 0:
            raise ValueError(f"reward.orm.requests_per_second must be > 0, got {self.requests_per_second}")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise ValueError(f"reward.orm.max_failure_rate must be in [0, 1], got {self.max_failure_rate}")
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"reward.orm.on_failure must be one of {ON_FAILURE}, got {self.on_failure!r}")


@dataclasses.dataclass(frozen=True)
class JudgeResult:
    verdict: bool | None  # None: no usable verdict (error or unparsable reply)
    cached: bool = False
    error: str | None = None
    reply: str | None = None


def parse_verdict(reply: str | None) -> bool | None:
    """The last ``[[YES]]`` / ``[[NO]]`` in the reply (a judge may quote the format first), else None."""
    if not reply:
        return None
    matches = _VERDICT.findall(reply)
    if not matches:
        return None
    return matches[-1].upper() == "YES"


def build_messages(problem: str, reference_answer: str, response: str) -> list[dict]:
    """Chat messages for one judgment; long fields keep their ends (where the answer is)."""
    user = ORM_USER_TEMPLATE.format(
        problem=problem[:MAX_PROBLEM_CHARS],
        reference_answer=reference_answer,
        response=response[-MAX_RESPONSE_CHARS:],
    )
    return [{"role": "system", "content": ORM_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def is_loopback_url(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RateLimiter:
    """Spaces request starts at least ``1 / rate`` seconds apart, across threads."""

    def __init__(self, rate: float):
        self.interval = 1.0 / rate
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            time.sleep(start - now)


class VerdictCache:
    """Hash -> verdict map, optionally persisted as JSON lines (append-only, last write wins)."""

    def __init__(self, path: str | None):
        self.path = path
        self._verdicts: dict[str, bool] = {}
        self._lock = threading.Lock()
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for line_no, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                        self._verdicts[row["key"]] = bool(row["verdict"])
                    except (ValueError, KeyError, TypeError) as exc:
                        raise ValueError(f"reward.orm.cache_path {path}: bad line {line_no}: {exc}") from exc

    @staticmethod
    def key(model: str, problem: str, reference_answer: str, response: str) -> str:
        blob = json.dumps([ORM_PROMPT_VERSION, model, problem, reference_answer, response], ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def get(self, key: str) -> bool | None:
        return self._verdicts.get(key)

    def put(self, key: str, verdict: bool) -> None:
        with self._lock:
            self._verdicts[key] = verdict
            if self.path:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"key": key, "verdict": verdict}) + "\n")


class OrmJudge:
    """Asks an OpenAI-compatible model whether a response's final answer equals the reference."""

    def __init__(self, config: OrmConfig, max_tokens: int = DEFAULT_MAX_TOKENS, client=None):
        if not config.base_url or not config.model:
            raise ValueError("reward.orm needs base_url and model")
        self.config = config
        self.max_tokens = max_tokens
        self._limiter = RateLimiter(config.requests_per_second)
        self._cache = VerdictCache(config.cache_path)
        self._client = client if client is not None else self._make_client(config)
        self._breaker_skip = 0  # steps the open breaker still skips
        self._breaker_span = 0  # length of the last open period (0: closed)

    @property
    def endpoint(self) -> str:
        from deepscaler.secret_text import mask_url

        return mask_url(str(self.config.base_url))

    @property
    def breaker_open(self) -> bool:
        return self._breaker_span > 0

    @staticmethod
    def _make_client(config: OrmConfig):
        from openai import OpenAI

        api_key = os.environ.get(config.api_key_env)
        if not api_key:
            if not is_loopback_url(config.base_url):
                raise ValueError(
                    f"reward.orm: environment variable {config.api_key_env} is not set (needed for {config.base_url})"
                )
            api_key = "EMPTY"
        # Retries are ours (they also cover the rate limiter and the backoff cap).
        return OpenAI(base_url=config.base_url, api_key=api_key, timeout=config.timeout_s, max_retries=0)

    def __repr__(self) -> str:  # never show the client (it holds the key)
        return f"OrmJudge(base_url={self.endpoint!r}, model={self.config.model!r})"

    def judge(self, problem: str, reference_answer: str, response: str, max_retries: int | None = None) -> JudgeResult:
        import openai

        key = VerdictCache.key(self.config.model, problem, reference_answer, response)
        cached = self._cache.get(key)
        if cached is not None:
            return JudgeResult(cached, cached=True)
        messages = build_messages(problem, reference_answer, response)
        transient = (
            openai.APITimeoutError,
            openai.APIConnectionError,
            openai.RateLimitError,
            openai.InternalServerError,
        )
        last_error = None
        retries = self.config.max_retries if max_retries is None else max_retries
        for attempt in range(retries + 1):
            self._limiter.wait()
            try:
                completion = self._client.chat.completions.create(
                    model=self.config.model, messages=messages, temperature=0.0, max_tokens=self.max_tokens
                )
            except transient as exc:
                from deepscaler.secret_text import mask_url

                last_error = f"{type(exc).__name__}: {mask_url(str(exc))[:200]}"
                if attempt < retries:
                    time.sleep(min(2.0**attempt, 64.0))
                continue
            except openai.APIError as exc:  # 4xx other than 429: retrying will not help
                return JudgeResult(None, error=f"{type(exc).__name__}: {getattr(exc, 'status_code', '')}")
            reply = completion.choices[0].message.content if completion.choices else None
            verdict = parse_verdict(reply)
            if verdict is not None:
                self._cache.put(key, verdict)
            return JudgeResult(verdict, reply=reply, error=None if verdict is not None else "no verdict in reply")
        return JudgeResult(None, error=last_error)

    def judge_many(self, triples: Sequence[tuple[str, str, str]], abort_after: int | None = None) -> list[JudgeResult]:
        """Judge (problem, reference, response) triples concurrently within the rate limit.

        Calls not yet started are skipped (``error=SKIPPED``) once more than ``abort_after`` have failed,
        or once the first ``threads`` calls of the step all failed (the endpoint is down): a dead judge
        then costs one round of retries per step, not one per call.
        """
        if not triples:
            return []
        if self.breaker_open:
            if self._breaker_skip > 0:
                self._breaker_skip -= 1
                return [JudgeResult(None, error=CIRCUIT_OPEN) for _ in triples]
            probe = self.judge(*triples[0], max_retries=0)  # half-open: one call, no retries, decides
            if probe.verdict is None:
                self._open_breaker()
                return [probe] + [JudgeResult(None, error=CIRCUIT_OPEN) for _ in triples[1:]]
            logger.warning("reward.orm: judge at %s answers again; circuit closed", self.endpoint)
            self._breaker_span = 0
            return [probe] + self._judge_all(triples[1:], abort_after)
        results = self._judge_all(triples, abort_after)
        failed = sum(1 for r in results if r.verdict is None)
        if failed and failed / len(results) > self.config.max_failure_rate:
            self._open_breaker()
        return results

    def _open_breaker(self) -> None:
        self._breaker_span = min(BREAKER_MAX_SKIP_STEPS, max(1, 2 * self._breaker_span))
        self._breaker_skip = self._breaker_span
        logger.warning(
            "reward.orm: judge at %s is failing; circuit open: the next %d step(s) skip it, then one "
            "probe call decides",
            self.endpoint,
            self._breaker_skip,
        )

    def _judge_all(self, triples, abort_after: int | None) -> list[JudgeResult]:
        if not triples:
            return []
        threads = max(1, min(16, int(self.config.requests_per_second)))
        state = {"failed": 0, "answered": 0}
        lock = threading.Lock()

        def one(triple):
            with lock:
                down = state["answered"] == 0 and state["failed"] >= threads
                if down or (abort_after is not None and state["failed"] > abort_after):
                    return JudgeResult(None, error=SKIPPED)
            result = self.judge(*triple)
            with lock:
                state["failed" if result.verdict is None else "answered"] += 1
            return result

        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="orm") as ex:
            return list(ex.map(one, triples))

    def check_failures(self, judgments: Sequence[JudgeResult]) -> float:
        """The step's failure rate; past ``max_failure_rate`` raise or warn (``on_failure``)."""
        if not judgments:
            return 0.0
        failed = [j for j in judgments if j.verdict is None]
        rate = len(failed) / len(judgments)
        if rate > self.config.max_failure_rate:
            errors = [j.error for j in failed if j.error and j.error not in (SKIPPED, CIRCUIT_OPEN)]
            skipped = sum(1 for j in failed if j.error == SKIPPED)
            open_skips = sum(1 for j in failed if j.error == CIRCUIT_OPEN)
            msg = (
                f"reward.orm: {len(failed)} of {len(judgments)} judge calls failed this step"
                f"{f' ({skipped} skipped after repeated failures)' if skipped else ''}"
                f"{f' ({open_skips} skipped: circuit open)' if open_skips else ''} (more than "
                f"max_failure_rate={self.config.max_failure_rate}); endpoint {self.endpoint}, model "
                f"{self.config.model}; last error: {errors[-1] if errors else 'none recorded'}"
            )
            if self.config.on_failure == "raise":
                raise JudgeUnavailableError(msg + " (reward.orm.on_failure=warn continues with the grader's scores)")
            logger.warning(msg)
        return rate

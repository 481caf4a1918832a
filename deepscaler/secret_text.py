"""Which names and URL parts carry a credential: shared by the judge client (its error lines) and the trackers.

A field is secret when its name ends like a credential (``hf_token``, ``openai_api_key``, ``client_secret``), never
because a word appears inside it (``ppo_max_token_len_per_gpu`` is a count), and a tokenizer's special tokens
(``pad_token``, ``eos_token``) are vocabulary. ``mask_url`` masks a key inside a URL (``https://key@host``,
``https://user:pass@host``, ``?api_key=...``). It lives here, with no dependency, so the rewards import no verl
module.
"""

from __future__ import annotations

import re

# A field is secret when its name ends with one of these word sequences (``hf_token``, ``openai_api_key``,
# ``client_secret``), never because a word appears inside it (``ppo_max_token_len_per_gpu`` is a count).
_SECRET_ENDINGS = (
    ("api", "key"),
    ("apikey",),
    ("secret", "key"),
    ("access", "key"),
    ("private", "key"),
    ("token",),
    ("secret",),
    ("password",),
    ("passwd",),
)
# ``<word>_token`` names a tokenizer's special token, not a credential, for these words.
_SPECIAL_TOKEN_WORDS = {
    "pad",
    "eos",
    "bos",
    "unk",
    "sep",
    "cls",
    "mask",
    "start",
    "end",
    "stop",
    "special",
    "think",
    "image",
    "audio",
    "video",
    "additional",
    "placeholder",
    "eot",
    "sot",
    "im",
    "fim",
    "boi",
    "eoi",
}
# Query parameters that carry a credential.
_SECRET_QUERY_NAMES = {
    "key",
    "apikey",
    "api_key",
    "token",
    "access_token",
    "auth",
    "secret",
    "password",
    "sig",
    "signature",
    "x-api-key",
    "code",
}
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/@\s?#]+)@")
_URL_QUERY_SECRET = re.compile(r"(?P<sep>[?&;])(?P<name>[^=&#\s]+)=(?P<value>[^&#\s]*)")


def _words(name: str) -> tuple[str, ...]:
    """``openaiApiKey`` / ``OPENAI_API_KEY`` / ``openai-api.key`` -> ('openai', 'api', 'key')."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(name))
    return tuple(w for w in re.split(r"[^a-zA-Z0-9]+", spaced.lower()) if w)


def is_secret_name(name: str) -> bool:
    words = _words(name)
    if len(words) >= 2 and words[-1] == "token" and words[-2] in _SPECIAL_TOKEN_WORDS:
        return False  # pad_token, eos_token, think_token ...: vocabulary, not credentials
    return any(words[-len(end) :] == end for end in _SECRET_ENDINGS if len(words) >= len(end))


def mask_url(text: str) -> str:
    """``text`` with credentials inside URLs masked: userinfo (``https://KEY@host``, ``user:pass@``)
    and secret query parameters (``?api_key=...``, ``&token=...``)."""
    if "://" not in text and "=" not in text:
        return text
    out = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}***@", text)

    def query(m):
        name = m.group("name")
        secret = name.lower() in _SECRET_QUERY_NAMES or is_secret_name(name)
        return f"{m.group('sep')}{name}=***" if secret and m.group("value") else m.group(0)

    return _URL_QUERY_SECRET.sub(query, out) if "?" in out else out

"""Search attributes (tags): the bounds every tag of an instance is checked against.

Tags are plain ``str -> str`` pairs that an instance carries in its status so that
``list --tag KEY=VALUE`` finds it. They are set at start (``Client.start(tags=...)``,
``start --tag``) and from workflow code (``ctx.upsert_tags``). Every status record repeats
them, so they are bounded: a few short pairs, not a document store (use the input or the
custom status for data).
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.core.errors import InvalidTagsError

__all__ = ["MAX_KEY_CHARS", "MAX_TAGS", "MAX_VALUE_CHARS", "checked_tags", "merged_tags"]

#: The most tags an instance may carry (start tags and upserted ones together).
MAX_TAGS = 32
#: The longest tag key, in characters.
MAX_KEY_CHARS = 64
#: The longest tag value, in characters.
MAX_VALUE_CHARS = 256


def checked_tags(
    tags: Mapping[str, str] | None, *, allow_empty_values: bool = False
) -> dict[str, str]:
    """``tags`` as a plain dict, or InvalidTagsError naming the first bad pair and the fix.

    ``allow_empty_values``: an upsert removes a key by setting it to "".
    """
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise InvalidTagsError(
            f"tags must be a mapping of str to str, got {type(tags).__name__}; "
            f'pass e.g. {{"customer": "c-42"}}'
        )
    out: dict[str, str] = {}
    for key, value in tags.items():
        _check_pair(key, value, allow_empty_values)
        out[key] = value
    if len(out) > MAX_TAGS:
        raise InvalidTagsError(_too_many(len(out)))
    return out


def merged_tags(current: Mapping[str, str], upsert: Mapping[str, str]) -> dict[str, str]:
    """``current`` with ``upsert`` applied (an empty value removes the key), checked."""
    merged = dict(current)
    for key, value in checked_tags(upsert, allow_empty_values=True).items():
        if value:
            merged[key] = value
        else:
            merged.pop(key, None)
    if len(merged) > MAX_TAGS:
        raise InvalidTagsError(_too_many(len(merged)))
    return merged


def _check_pair(key: object, value: object, allow_empty_values: bool) -> None:
    if not isinstance(key, str) or not isinstance(value, str):
        raise InvalidTagsError(
            f"tag {key!r}: keys and values must be str, got {type(key).__name__} -> "
            f"{type(value).__name__}; convert the value with str() first"
        )
    if not key or len(key) > MAX_KEY_CHARS or "=" in key:
        raise InvalidTagsError(
            f"tag key {key[:80]!r}: a key is 1 to {MAX_KEY_CHARS} characters without '='"
        )
    if len(value) > MAX_VALUE_CHARS:
        raise InvalidTagsError(
            f"tag {key!r}: its value has {len(value)} characters, at most {MAX_VALUE_CHARS} "
            f"are allowed; keep tags short and put data in the input or the custom status"
        )
    if not value and not allow_empty_values:
        raise InvalidTagsError(f"tag {key!r} has an empty value; give it a value or leave it out")


def _too_many(count: int) -> str:
    return (
        f"{count} tags, at most {MAX_TAGS} are allowed per instance; remove some "
        f'(upsert a key with the value "" to remove it)'
    )

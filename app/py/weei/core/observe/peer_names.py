"""Peers' display names and what each says it is doing, as untrusted text made safe to show.

A peer's name comes from that peer (its ``peerCard`` message, or the
coordinator's name in an invitation): it is bounded, stripped of control,
format (bidirectional overrides, zero-width) and private-use characters,
and its whitespace collapsed, before anything keeps it. Hosts show it as
text, never as markup. Two peers may pick the same name (two tabs of one
browser both default to "Chrome on Linux"): :func:`labels` numbers the
repeats in the order of their peer IDs, which every peer of the room sees
alike, so "Chrome on Linux #2" is the same tab for everyone.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["MAX_NAME_CHARS", "ACTIVITIES", "PeerCard", "clean_name", "default_name", "labels"]

#: A name longer than this is cut (after cleaning): enough for "Firefox on Windows (Ana's laptop)".
MAX_NAME_CHARS = 48
#: What a peer says it does: nothing, coordinating a job, or taking part in one.
ACTIVITIES = ("idle", "coordinating", "training")
_MAX_RAW_CHARS = 1000  # what is looked at before cleaning: a megabyte of spaces is not cleaned character by character
_DROPPED = ("Cc", "Cf", "Cs", "Co", "Cn")  # controls, formats (RLO, ZWJ...), surrogates, private use, unassigned


def clean_name(raw: Any) -> str:
    """``raw`` as a displayable name: text only, no controls or invisible formatting, single spaces,
    at most ``MAX_NAME_CHARS`` characters; ``""`` when nothing is left (or ``raw`` is not a string)."""
    if not isinstance(raw, str):
        return ""
    return _clean(raw[:_MAX_RAW_CHARS])


@lru_cache(maxsize=64)  # keys of at most _MAX_RAW_CHARS: what a peer sends cannot make the cache large
def _clean(raw: str) -> str:
    # Asked for this device's own card after every drain (the job's model name, the same text each time).
    kept = []
    for ch in unicodedata.normalize("NFC", raw):
        category = unicodedata.category(ch)
        if category in _DROPPED or category in ("Zl", "Zp"):
            kept.append(" " if category in ("Cc", "Zl", "Zp") else "")
        else:
            kept.append(" " if category == "Zs" else ch)
    return " ".join("".join(kept).split())[:MAX_NAME_CHARS].rstrip()


def default_name(environment: Mapping[str, Any] | None) -> str:
    """The name a peer has until its person picks one: "Chrome on Linux", "Weei agent on Linux"."""
    env = environment or {}
    browser = clean_name(env.get("browser")) or "A browser"
    if browser == "unknown":
        browser = "A browser"
    if browser == "agent":
        browser = "Weei agent"
    os_name = clean_name(env.get("os"))
    # The agent's os is platform.platform() ("Linux-6.1.0-x86_64-with-glibc2.36"): its first word is enough.
    os_name = os_name.split("-")[0] if os_name and os_name != "unknown" else ""
    return clean_name(f"{browser} on {os_name}" if os_name else browser)


@dataclass(frozen=True)
class PeerCard:
    """What a peer tells the others about itself: its name, whether it is an agent, what it is doing
    (``ACTIVITIES``) and the name of the model of its job (empty when idle)."""

    name: str
    agent: bool = False
    activity: str = "idle"
    job: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "agent": self.agent, "activity": self.activity, "job": self.job}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PeerCard | None:
        """A card from untrusted JSON, cleaned; None when it has no usable name."""
        name = clean_name(obj.get("name"))
        if not name:
            return None
        activity = obj.get("activity")
        return cls(name=name, agent=obj.get("agent") is True,
                   activity=activity if activity in ACTIVITIES else "idle", job=clean_name(obj.get("job")))


def labels(cards: Mapping[str, PeerCard]) -> dict[str, str]:
    """Peer ID -> the label to show: its name, with " #2", " #3"... on the second and later peers (by peer
    ID) of the same name."""
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for peer in sorted(cards):
        name = cards[peer].name
        key = name.casefold()
        seen[key] = seen.get(key, 0) + 1
        out[peer] = name if seen[key] == 1 else f"{name} #{seen[key]}"
    return out

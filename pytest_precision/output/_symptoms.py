"""Symptoms: what users see before any dump, detected in generated text or ids.

Garbled output (replacement characters, ``<unk>``, control characters, a sudden switch of
script), a repetition loop at the tail, and jitter (identical requests under determinism giving
different answers) are the first three symptoms of the precision guides. Each detector returns
findings with a location and a reason; every threshold is an argument, and the defaults stay
silent on ordinary English and Chinese prose.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .._errors import PrecisionInputError
from ._common import OutputCheckFailed, as_int_list, decoder

Kind = Literal["garbled", "repetition", "jitter"]


@dataclass(frozen=True)
class Symptom:
    """One finding: what, where (``location`` in ``unit``: characters or tokens) and why."""

    kind: Kind
    location: int
    unit: Literal["char", "token"]
    reason: str
    #: repetition: the loop's period and how many times it repeats (a cut last period counts
    #: as a fraction); jitter: which response differs from response 0.
    period: int | None = None
    count: float | None = None
    response: int | None = None


def _excerpt(text: str, start: int, width: int = 40) -> str:
    return repr(text[start : start + width])


# --- garbled ------------------------------------------------------------------------------------

#: Literal unknown-token spellings (Llama / BERT / T5 style).
UNK_STRINGS = ("<unk>", "[UNK]", "<|unk|>")
#: A run of letters of a script the text does not use must be this long to count (4 would flag
#: a Greek word in a physics answer; a garbled switch runs on for many more).
MIN_SCRIPT_RUN = 6
#: Scripts never counted as a switch: Latin appears in ordinary text of every language.
ALWAYS_EXPECTED = frozenset({"LATIN"})
#: Without ``expected_scripts``, the scripts of the first this many letters are expected.
HEAD_LETTERS = 20
_SCRIPT_ALIASES = {"CJK": "HAN", "HIRAGANA": "HAN", "KATAKANA": "HAN", "IDEOGRAPHIC": "HAN"}


def _script(char: str) -> str | None:
    """The script of a letter (``LATIN``, ``HAN`` for Chinese and Japanese, ``CYRILLIC``...)."""
    if not unicodedata.category(char).startswith("L"):
        return None
    name = unicodedata.name(char, "")
    first = name.split(" ", 1)[0] if name else "UNKNOWN"
    return _SCRIPT_ALIASES.get(first, first)


def detect_garbled(
    output: str | Sequence[int] | Any,
    *,
    decode: Any = None,
    unk_id: int | None = None,
    unk_strings: Iterable[str] = UNK_STRINGS,
    expected_scripts: Iterable[str] | None = None,
    min_script_run: int = MIN_SCRIPT_RUN,
) -> list[Symptom]:
    """Find garbled text: U+FFFD replacement characters (undecodable bytes), unknown tokens,
    control characters other than tab / newline / carriage return, private-use or unassigned
    code points, and a run of at least ``min_script_run`` letters of a script the text does not
    use (by default it uses Latin, the scripts of its first 20 letters and any script holding
    most of its letters; ``expected_scripts`` such as ``["Han"]`` overrides all but Latin).

    ``output`` is text, or ids; ids are decoded with ``decode`` (a tokenizer or a callable),
    and ``unk_id`` flags the unknown token by id. Locations are character offsets in the text
    (token positions for ``unk_id``).
    """
    findings: list[Symptom] = []
    if isinstance(output, str):
        text = output
    else:
        ids = as_int_list(output, "output")
        if unk_id is not None and unk_id in ids:
            at = ids.index(unk_id)
            count = ids.count(unk_id)
            reason = f"{count} unknown token(s) (id {unk_id}) from token {at}"
            findings.append(Symptom("garbled", at, "token", reason))
        fn = decoder(decode)
        if fn is None:
            return findings
        text = fn(ids)
    findings += _character_findings(text, tuple(unk_strings))
    scripts = None if expected_scripts is None else {s.upper() for s in expected_scripts}
    findings += _script_switches(text, scripts, min_script_run)
    return sorted(findings, key=lambda f: (f.unit, f.location))


def _character_findings(text: str, unk_strings: tuple[str, ...]) -> list[Symptom]:
    rules: list[tuple[str, Callable[[str], bool]]] = [
        ("replacement character(s) U+FFFD (undecodable bytes)", lambda c: c == "\ufffd"),
        (
            "control character(s)",
            lambda c: unicodedata.category(c) == "Cc" and c not in "\t\n\r",
        ),
        (
            "private-use or unassigned code point(s)",
            lambda c: unicodedata.category(c) in ("Co", "Cn"),
        ),
    ]
    findings = []
    for label, rule in rules:
        hits = [i for i, c in enumerate(text) if rule(c)]
        if hits:
            findings.append(
                Symptom(
                    "garbled",
                    hits[0],
                    "char",
                    f"{len(hits)} {label} from offset {hits[0]}: {_excerpt(text, hits[0])}",
                )
            )
    for unk in unk_strings:
        at = text.find(unk)
        if unk and at >= 0:
            findings.append(
                Symptom(
                    "garbled",
                    at,
                    "char",
                    f"{text.count(unk)} {unk!r} from offset {at}: {_excerpt(text, at)}",
                )
            )
    return findings


def _script_switches(text: str, expected: set[str] | None, min_run: int) -> list[Symptom]:
    letters = [(i, s) for i, c in enumerate(text) if (s := _script(c)) is not None]
    if not letters:
        return []
    if expected is None:
        # The scripts the answer starts in (garbling comes after a divergence, at the tail),
        # and any script holding most of the letters (code before a Chinese explanation).
        expected = {s for _, s in letters[:HEAD_LETTERS]}
        counts: dict[str, int] = {}
        for _, s in letters:
            counts[s] = counts.get(s, 0) + 1
        expected |= {s for s, n in counts.items() if n > len(letters) / 2}
    expected = {_SCRIPT_ALIASES.get(s, s) for s in expected} | ALWAYS_EXPECTED
    findings = []
    run: list[tuple[int, str]] = []
    for item in [*letters, (len(text), None)]:
        if item[1] is not None and item[1] not in expected:
            run.append(item)  # type: ignore[arg-type]
            continue
        if len(run) >= min_run:
            start = run[0][0]
            names = sorted({s for _, s in run})
            findings.append(
                Symptom(
                    "garbled",
                    start,
                    "char",
                    f"switch to {'/'.join(names)} script for {len(run)} letters at offset "
                    f"{start} (text is {'/'.join(sorted(expected))}): {_excerpt(text, start)}",
                )
            )
        run = []
    return findings


# --- repetition ---------------------------------------------------------------------------------

MIN_REPEATS = 3.0
#: The loop must cover at least this many units at the tail (tokens for ids, characters for
#: text): "hahaha" or a markdown rule "----------" is not a loop.
MIN_SPAN_TOKENS = 12
MIN_SPAN_CHARS = 32
MAX_PERIOD = 64


def detect_repetition(
    output: str | Sequence[int] | Any,
    *,
    min_repeats: float = MIN_REPEATS,
    min_span: int | None = None,
    max_period: int = MAX_PERIOD,
    pad_id: int | None = None,
) -> list[Symptom]:
    """Find a loop at the tail: the end of ``output`` repeating a unit of ``period`` tokens
    (characters, for text) at least ``min_repeats`` times over at least ``min_span`` units
    (default 12 tokens or 32 characters). A last period cut short by the length limit counts
    as a fraction. Of the loops found, the one covering the most units (then the shortest
    period) is reported, with its start. ``pad_id`` padding after the end of ids is ignored.
    """
    if isinstance(output, str):
        seq: Sequence[Any] = output
        unit: Literal["char", "token"] = "char"
        span_min = MIN_SPAN_CHARS if min_span is None else min_span
    else:
        seq = as_int_list(output, "output")
        while pad_id is not None and seq and seq[-1] == pad_id:
            seq = seq[:-1]
        unit = "token"
        span_min = MIN_SPAN_TOKENS if min_span is None else min_span
    n = len(seq)
    best: tuple[int, int] | None = None  # (span, period)
    for period in range(1, min(max_period, n // 2) + 1):
        # the longest tail where every unit equals the one a period earlier
        length = 0
        while length < n - period and seq[n - 1 - length] == seq[n - 1 - length - period]:
            length += 1
        span = length + period
        if span / period >= min_repeats and span >= span_min and (best is None or span > best[0]):
            best = (span, period)
    if best is None:
        return []
    span, period = best
    start = n - span
    unit_text = seq[start : start + period]
    shown = repr(unit_text) if unit == "char" else str(list(unit_text))
    count = span / period
    return [
        Symptom(
            "repetition",
            start,
            unit,
            f"loop at the tail from {unit} {start}: a unit of {period} {unit}(s) repeated "
            f"{count:.3g} times ({span} of {n} {unit}s): {shown[:80]}",
            period=period,
            count=count,
        )
    ]


# --- jitter -------------------------------------------------------------------------------------


def detect_jitter(responses: Sequence[str | Sequence[int] | Any]) -> list[Symptom]:
    """Compare N responses to the same request (run with determinism on): one finding per
    response that differs from response 0, at its first differing position (characters for
    text, tokens for ids). Under determinism any difference is a symptom (an op bug, state
    left over between runs), so there is no threshold."""
    if len(responses) < 2:
        raise PrecisionInputError(f"detect_jitter needs at least 2 responses, got {len(responses)}")
    texts = all(isinstance(r, str) for r in responses)
    if not texts and any(isinstance(r, str) for r in responses):
        raise PrecisionInputError("responses: give all texts or all token ids, not a mix")
    seqs: list[Sequence[Any]] = list(responses)
    if not texts:
        seqs = [as_int_list(r, f"responses[{i}]") for i, r in enumerate(responses)]
    unit: Literal["char", "token"] = "char" if texts else "token"
    first = seqs[0]
    findings = []
    for i, seq in enumerate(seqs[1:], start=1):
        common = min(len(first), len(seq))
        at = next((p for p in range(common) if first[p] != seq[p]), None)
        if at is None and len(first) == len(seq):
            continue
        if at is None:
            at = common
        mine = repr(seq[at]) if at < len(seq) else "(end)"
        theirs = repr(first[at]) if at < len(first) else "(end)"
        findings.append(
            Symptom(
                "jitter",
                at,
                unit,
                f"response {i} differs from response 0 at {unit} {at}: {mine} vs {theirs} "
                f"({sum(1 for s in seqs if s == seq)} of {len(seqs)} responses give this one)",
                response=i,
            )
        )
    return findings


# --- all of them --------------------------------------------------------------------------------


def detect_symptoms(output: str | Sequence[int] | Any, **options: Any) -> list[Symptom]:
    """Run :func:`detect_garbled` and :func:`detect_repetition` on one output; ``options`` go
    to whichever detector takes them."""
    garbled_keys = {"decode", "unk_id", "unk_strings", "expected_scripts", "min_script_run"}
    repetition_keys = {"min_repeats", "min_span", "max_period", "pad_id"}
    unknown = set(options) - garbled_keys - repetition_keys
    if unknown:
        raise PrecisionInputError(f"detect_symptoms: unknown option(s) {sorted(unknown)}")
    findings = detect_garbled(output, **{k: v for k, v in options.items() if k in garbled_keys})
    # ids are searched for loops as ids (a period is exact there), not as decoded text
    findings += detect_repetition(
        output, **{k: v for k, v in options.items() if k in repetition_keys}
    )
    return findings


class SymptomsFound(OutputCheckFailed):
    """:func:`assert_no_symptoms` or :func:`assert_no_jitter` failed; ``result`` holds the
    findings."""


def assert_no_symptoms(output: str | Sequence[int] | Any, **options: Any) -> None:
    """Assert :func:`detect_symptoms` finds nothing; the message lists every finding."""
    __tracebackhide__ = True
    findings = detect_symptoms(output, **options)
    if findings:
        raise SymptomsFound(_message("symptom(s) in the output", findings), tuple(findings))


def assert_no_jitter(responses: Sequence[str | Sequence[int] | Any]) -> None:
    """Assert every response equals the first (see :func:`detect_jitter`)."""
    __tracebackhide__ = True
    findings = detect_jitter(responses)
    if findings:
        what = f"of {len(responses)} responses to one request differ"
        raise SymptomsFound(_message(what, findings), tuple(findings))


def _message(what: str, findings: Sequence[Symptom]) -> str:
    return "\n".join([f"{len(findings)} {what}", *(f"  {f.kind}: {f.reason}" for f in findings)])

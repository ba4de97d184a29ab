"""``apply`` over files: scan, plan and rewrite until nothing changes (writing is
:mod:`adopter.rewrite.write`)."""

from __future__ import annotations

import difflib
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from ..dsl.errors import LocatedError
from ..dsl.syntax import Rule
from ..extract.source import (
    SourceError,
    decode_source_file,
    failure_as_error,
    parse_source,
    read_source_bytes,
    split_lines,
)
from ..extract.structure import FileAnalysis
from ..match.matcher import Matcher
from ..match.scan import collect_python_files, map_files, strip_details
from .apply import FileRewrite, SiteResult, rewrite_source
from .encoding import EncodingRefusal, encode_patched
from .outcome import SiteStatus, SkipReason
from .plan import edit_location

# Rounds of rewriting one file: a round that skipped a site (it overlapped one applied instead,
# or its edit could not be made beside the others) is followed by another on the text it
# produced, where the site, now alone, may apply (a ``nn.Sequential`` call nested in another's
# call). A round that patched every site it found leaves nothing for another: the rewritten
# statements call kernels, which no rule matches. Real files settle in two; the limit only
# bounds a pathological rule set.
MAX_ROUNDS = 8


def rewrite_once(text: str, path: str, matcher: Matcher, modular: bool = False) -> FileRewrite:
    """One round: the sites of ``text`` rewritten (parsed once; never imported)."""
    tree = parse_source(text, path)
    structure = FileAnalysis(tree, path, matcher.opaque_methods, text).analyse()
    return rewrite_source(text, path, matcher.match_file(structure), tree, modular=modular)


def rewrite_text(text: str, path: str, matcher: Matcher, *, modular: bool = False) -> FileRewrite:
    """The patched text of one file, at the fixpoint: rewritten again while a round changes
    something and skipped a site, so that one ``apply`` does what repeated ones would and a
    second one changes nothing. Site results give lines of ``text``.

    A file that ends every line with CRLF, or every line with CR, is rewritten as LF text and
    turned back (exactly: each of its line breaks is one LF in between), so that new lines get
    the file's line ending and LibCST, which drops a final lone CR, never sees one.

    ``modular``: patch transformers' ``modular_*.py`` sources rather than the ``modeling_*.py``
    files generated from them (the default patches what runs)."""
    newline = _uniform_line_ending(text)
    if newline != "\n":
        inner = rewrite_text(text.replace(newline, "\n"), path, matcher, modular=modular)
        return replace(inner, original=text, patched=inner.patched.replace("\n", newline))
    rounds = [rewrite_once(text, path, matcher, modular)]
    to_original: list[Callable[[int], int]] = [lambda line: line]
    while rounds[-1].changed and (
        rounds[-1].reopened or any(r.status is SiteStatus.SKIPPED for r in rounds[-1].results)
    ):
        current = rounds[-1].patched
        try:
            following = rewrite_once(current, path, matcher, modular)
        except (LocatedError, RecursionError):  # cannot happen to compiled code; keep the last
            break
        back = _line_map(split_lines(rounds[-1].original), split_lines(current))
        previous = to_original[-1]
        to_original.append(lambda line, back=back, previous=previous: previous(back(line)))
        if following.changed and len(rounds) == MAX_ROUNDS:
            following = FileRewrite(
                path,
                current,
                current,
                [
                    r.now_skipped(
                        SkipReason.TOO_MANY_ROUNDS,
                        f"still rewritable after {MAX_ROUNDS} rounds of apply; run apply again",
                    )
                    if r.status is SiteStatus.PATCHED
                    else r
                    for r in following.results
                ],
            )
        rounds.append(following)
    if len(rounds) == 1:
        return rounds[0]
    results = _merge_rounds([r.results for r in rounds], to_original)
    return FileRewrite(path, text, rounds[-1].patched, results)


def _uniform_line_ending(text: str) -> str:
    r"""``"\r\n"`` or ``"\r"`` when every line break of ``text`` is that one, else ``"\n"``."""
    carriage_returns = text.count("\r")
    if not carriage_returns:
        return "\n"
    line_feeds = text.count("\n")
    if not line_feeds:
        return "\r"
    if carriage_returns == line_feeds == text.count("\r\n"):
        return "\r\n"
    return "\n"


def _line_map(old: list[str], new: list[str]) -> Callable[[int], int]:
    """Line of ``new`` -> line of ``old`` it comes from: the same line, or for a line the
    rewrite wrote, the line at the same place in the block it replaced (its last line when the
    new block is longer; the next line for an insertion)."""
    opcodes = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()

    def back(line: int) -> int:
        index = line - 1
        for _, old_start, old_end, new_start, new_end in opcodes:
            if new_start <= index < new_end:
                offset = min(index - new_start, max(old_end - old_start - 1, 0))
                return min(old_start + offset, max(len(old) - 1, 0)) + 1
        return line

    return back


_LINE_REFERENCE = re.compile(r"\b(lines? )(\d+)(?:-(\d+))?")


def _merge_rounds(
    rounds: list[list[SiteResult]], to_original: list[Callable[[int], int]]
) -> list[SiteResult]:
    """One list of results over all rounds, in lines of the original text: every patched site;
    the skipped and covered ones of the last round (their reasons still hold); and those of
    earlier rounds that no later round saw again (a site another rewrite took away).

    A later round's skip of a site the first round did not have is left out: the earlier
    rounds' edits made it (the other arm a fused norm left behind now meets a norm that the
    original's overlapping site did not take), scan never reported it, and apply skipping it
    leaves the file as scan saw it there."""
    merged: list[SiteResult] = []
    seen_later: Counter[tuple[str, int]] = Counter()
    last = len(rounds) - 1
    original = {(result.site.rule.id, to_original[0](result.line)) for result in rounds[0]}
    for index in range(last, -1, -1):
        to_line = to_original[index]
        mapped = [_in_original(result, to_line) for result in rounds[index]]
        # A site a later round saw again is dropped from this one: its skip first (two sites
        # of one line, one covered here and one skipped for overlapping, seen once more later)
        for result in sorted(mapped, key=lambda r: r.status is not SiteStatus.SKIPPED):
            key = (result.site.rule.id, result.line)
            if index and result.status is SiteStatus.SKIPPED and key not in original:
                continue
            if result.status is SiteStatus.PATCHED or index == last:
                merged.append(result)
            elif seen_later[key]:
                seen_later[key] -= 1
            else:
                merged.append(result)
        for result in rounds[index]:  # a site reached through several calls edits each of them
            for site in (result.site, *result.site.instances):
                seen_later[(site.rule.id, to_line(edit_location(site)[0]))] += 1
    return sorted(merged, key=lambda r: (r.line, r.column, r.site.rule.id))


def _in_original(result: SiteResult, to_original: Callable[[int], int]) -> SiteResult:
    site = result.site
    if to_original(site.line) != site.line:
        site = replace(site, line=to_original(site.line))

    def moved(match: re.Match[str]) -> str:
        first = str(to_original(int(match.group(2))))
        return (
            match.group(1)
            + first
            + (f"-{to_original(int(match.group(3)))}" if match.group(3) else "")
        )

    return replace(
        result,
        site=site,
        line=to_original(result.line),
        reason=_LINE_REFERENCE.sub(moved, result.reason),
    )


def rewrite_file(path: str, matcher: Matcher, modular: bool = False) -> FileRewrite:
    """Read, decode (coding cookie, BOM) and rewrite one file. A patch that cannot be written
    in the file's own encoding, byte for byte outside the edits, leaves the file unchanged and
    its sites skipped with the reason. Never raises: a failure becomes the file's located
    error, so a worker always returns a record."""
    try:
        data = read_source_bytes(path)
        source = decode_source_file(data, path)
        rewrite = rewrite_text(source.text, path, matcher, modular=modular)
    except Exception as error:  # noqa: BLE001 - a worker must always return a record
        return FileRewrite(path, "", "", error=str(failure_as_error(path, error)))
    if rewrite.changed:
        try:
            encode_patched(path, data, source, rewrite.patched)
        except EncodingRefusal as refusal:
            results = [
                r.now_skipped(SkipReason.ENCODING, refusal.message)
                if r.status is SiteStatus.PATCHED
                else r
                for r in rewrite.results
            ]
            return FileRewrite(path, rewrite.original, rewrite.original, results)
    return rewrite


def _rewrite_light(path: str, matcher: Matcher, modular: bool = False) -> FileRewrite:
    rewrite = rewrite_file(path, matcher, modular)
    for result in rewrite.results:
        strip_details(result.site)
    return rewrite


@dataclass
class ApplyResult:
    files: list[FileRewrite]
    seconds: float
    errors: list[str] = field(default_factory=list)
    # Changed files ``apply --verify`` left unpatched (refuted, not exercised, not checkable):
    # the run did not do what it found, so it must not end as a success.
    held_back: int = 0

    @property
    def results(self) -> list[SiteResult]:
        return [result for rewrite in self.files for result in rewrite.results]

    @property
    def changed(self) -> list[FileRewrite]:
        return [rewrite for rewrite in self.files if rewrite.error is None and rewrite.changed]

    def keep(self, proven: list[FileRewrite], *, held_back: int = 0) -> None:
        """Replace the changed files by ``proven`` (those a gate kept, possibly narrowed);
        ``held_back`` counts the changed files the gate refused."""
        unchanged = [r for r in self.files if not r.changed or r.error is not None]
        self.files = unchanged + proven
        self.held_back += held_back

    def skip_lines(self) -> list[str]:
        """One line per skipped site: where, which rule, and why."""
        return [
            f"skipped {r.site.rule.id} at {r.site.path}:{r.line}:{r.column}: {r.reason}"
            for r in self.results
            if r.status is SiteStatus.SKIPPED
        ]

    def summary(self, done: list[FileRewrite], *, written: bool, not_written: int) -> str:
        """``apply``'s last line: what ``done`` (the files patched or to patch) holds, and the
        sites covered, skipped, files not written and errors of the whole run."""
        patched = sum(len(rewrite.with_status(SiteStatus.PATCHED)) for rewrite in done)
        covered = sum(r.status is SiteStatus.COVERED for r in self.results)
        skipped = sum(r.status is SiteStatus.SKIPPED for r in self.results)
        verb = "patched" if written else "to patch"
        return (
            f"{patched} site(s) {verb} in {len(done)} file(s), {covered} covered by an "
            f"enclosing rewrite, {skipped} skipped, "
            + (f"{not_written} file(s) not written, " if not_written else "")
            + (f"{self.held_back} file(s) held back unproven, " if self.held_back else "")
            + f"{len(self.errors)} error(s), {self.seconds:.2f} s"
        )


def rewrite_paths(
    paths: Iterable[str | Path],
    rules: list[Rule],
    *,
    jobs: int | None = None,
    progress: Callable[[FileRewrite], None] | None = None,
    modular: bool = False,
) -> ApplyResult:
    started = time.perf_counter()
    files, missing = collect_python_files(paths)
    errors = [str(error) for error in missing]
    names = [str(p) for p in files]
    rewrites = map_files(
        names,
        rules,
        partial(rewrite_file, modular=modular),
        jobs=jobs,
        progress=progress,
        parallel_work=partial(_rewrite_light, modular=modular),
    )
    errors += [rewrite.error for rewrite in rewrites if rewrite.error]
    return ApplyResult(rewrites, time.perf_counter() - started, errors)


__all__ = [
    "MAX_ROUNDS",
    "ApplyResult",
    "FileRewrite",
    "SiteResult",
    "SourceError",
    "rewrite_file",
    "rewrite_once",
    "rewrite_paths",
    "rewrite_text",
]

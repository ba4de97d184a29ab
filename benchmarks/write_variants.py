"""``apply --write`` on real model code saved five ways: every ``modeling_*.py`` of
transformers 4.34.0 as fetched (LF, UTF-8), with CRLF line endings, with CR line endings, with a
UTF-8 BOM, and in latin-1 under a coding cookie (the files latin-1 can hold). Each variant's
written file must be byte for byte the LF result converted the same way, and a second apply must
change nothing. Prints a Markdown table (docs/reliability.md quotes it).

    python benchmarks/write_variants.py [--jobs N] [--rule-set all]
"""

from __future__ import annotations

import argparse
import codecs
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adopter.corpus import fetch_wheel  # noqa: E402
from adopter.rewrite import (  # noqa: E402
    SiteStatus,
    WriteStatus,
    rewrite_paths,
    write_rewrites,
)
from adopter.rules import load_rule_set  # noqa: E402

COOKIE = "# -*- coding: latin-1 -*-\n"
VARIANTS: dict[str, Callable[[str], bytes]] = {
    "LF, UTF-8 (as fetched)": lambda text: text.encode("utf-8"),
    "CRLF": lambda text: text.replace("\n", "\r\n").encode("utf-8"),
    "CR": lambda text: text.replace("\n", "\r").encode("utf-8"),
    "UTF-8 BOM": lambda text: codecs.BOM_UTF8 + text.encode("utf-8"),
    "latin-1 + cookie": lambda text: (COOKIE + text).encode("latin-1"),
}


def _holds(convert: Callable[[str], bytes], text: str) -> bool:
    try:
        convert(text)
    except UnicodeEncodeError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--rule-set", default="all")
    args = parser.parse_args()
    models = fetch_wheel("transformers==4.34.0") / "transformers" / "models"
    texts = {
        path: path.read_text(encoding="utf-8") for path in sorted(models.glob("*/modeling_*.py"))
    }
    rules = load_rule_set(args.rule_set)
    scratch = Path(tempfile.mkdtemp(prefix="adopter-variants-"))
    baseline: dict[Path, str] = {}
    print(
        "| variant | files | changed | sites patched | skipped | not written | "
        "differ from the LF result | second apply changes | seconds |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    try:
        for name, convert in VARIANTS.items():
            copies = {}
            for path, text in texts.items():
                if not _holds(convert, text):
                    continue
                copy = scratch / name.split()[0].replace(",", "") / path.parent.name / path.name
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.write_bytes(convert(text))
                copies[path] = copy
            started = time.perf_counter()
            result = rewrite_paths(list(copies.values()), rules, jobs=args.jobs)
            outcomes = write_rewrites(result.changed)
            seconds = time.perf_counter() - started
            again = rewrite_paths(list(copies.values()), rules, jobs=args.jobs)
            if not baseline:
                baseline = {path: copy.read_text(encoding="utf-8") for path, copy in copies.items()}
            differ = sum(
                copy.read_bytes() != convert(baseline[path]) for path, copy in copies.items()
            )
            print(
                f"| {name} | {len(copies)} | {len(result.changed)} | "
                f"{sum(r.status is SiteStatus.PATCHED for r in result.results)} | "
                f"{sum(r.status is SiteStatus.SKIPPED for r in result.results)} | "
                f"{sum(o.status is not WriteStatus.WRITTEN for o in outcomes)} | {differ} | "
                f"{len(again.changed)} | {seconds:.0f} |",
                flush=True,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

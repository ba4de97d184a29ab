"""The ``adopter`` command line: ``scan``, ``structure``, ``rules``."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from .dsl import DslError, Rule, load_rule_file
from .executor import EXECUTOR_HELP, Executor
from .extract import analyse_file, failure_as_error
from .extract.printer import format_class
from .files import FileRefused, max_file_bytes
from .match import Matcher
from .match.report import json_records, sarif_log
from .match.scan import collect_python_files, scan_paths
from .models.factories import FACTORY_HELP, parse_factory
from .rules import DEFAULT_RULE_SET, RULE_SETS, load_rule_set

if TYPE_CHECKING:
    from .bench.many import BenchJob

app = typer.Typer(
    help="Find (and patch) the places in deep-learning model source where optimized kernels fit.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
EXIT_ERROR = 2
PROGRESS_MIN_FILES = 20


@app.callback()
def _check_environment() -> None:
    """Settings read from the environment are checked once, before any file is read."""
    try:
        max_file_bytes()
    except FileRefused as error:
        raise _fail(str(error)) from None


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    sarif = "sarif"


class MemoryMethod(StrEnum):
    auto = "auto"
    rss = "rss"
    profiler = "profiler"
    cuda = "cuda"
    none = "none"


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


@contextmanager
def _progress_bar(console: Console, label: str, total: int) -> Iterator[Callable[[], None]]:
    """A transient progress bar on ``console``; yields the function that advances it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with progress:
        task = progress.add_task(label, total=total)
        yield lambda: progress.advance(task)


def _print_error(console: Console, message: object) -> None:
    """``error: <message>`` in red; the message is the user's text (paths, rule names, parser
    messages quoting source) and is never read as Rich markup: ``[red]x.py`` stays as written."""
    console.print(Text.assemble(("error:", "red"), " ", str(message)), soft_wrap=True)


def _fail(message: str) -> typer.Exit:
    _print_error(_stderr(), message)
    return typer.Exit(EXIT_ERROR)


def _user_path(text: str) -> Path:
    # An empty argument would become Path("."), the current folder: a typo (an unset shell
    # variable) must not turn into a scan of everything below here.
    if not text:
        raise typer.BadParameter("empty path (use . for the current folder)")
    return Path(text)


def _positive(value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be a positive number of seconds, not {value:g}")
    return value


def _comma_list(text: str, option: str, known: tuple[str, ...] | None = None) -> list[str]:
    """The items of a comma-separated option, each checked against ``known`` when given."""
    items = list(dict.fromkeys(item.strip() for item in text.split(",") if item.strip()))
    choices = f"; use {', '.join(known)}" if known else ""
    if not items:
        raise _fail(f"{option} {text!r} names nothing{choices}")
    unknown = [item for item in items if known is not None and item not in known]
    if unknown:
        raise _fail(f"{option}: unknown {', '.join(map(repr, unknown))}{choices}")
    return items


ExecutorOption = Annotated[
    str,
    typer.Option("--executor", help="Where the jobs run: " + EXECUTOR_HELP),
]
RuntimeEnvOption = Annotated[
    str | None,
    typer.Option(
        "--runtime-env",
        help="With --executor ray: a JSON Ray runtime environment merged with the one that "
        'carries adopter, e.g. \'{"pip": ["transformers==5.24.0"]}\'.',
    ),
]


@contextmanager
def _open_executor(
    spec: str, jobs: int | None, runtime_env: str | None, placement: str = "task"
) -> Iterator[Executor]:
    """The executor named on the command line, connected (a clear error when it cannot be)
    and closed afterwards; SIGTERM meanwhile acts as Ctrl-C: tasks cancelled, workers ended."""
    from .executor import ExecutorUnavailable, make_executor, terminate_as_interrupt

    environment = None
    if runtime_env is not None:
        try:
            environment = json.loads(runtime_env)
        except json.JSONDecodeError as error:
            raise _fail(f"--runtime-env is not JSON: {error}") from None
        if not isinstance(environment, dict):
            raise _fail("--runtime-env must be a JSON object")
    try:
        executor = make_executor(spec, workers=jobs, placement=placement, runtime_env=environment)
        executor.__enter__()
    except (ExecutorUnavailable, ValueError) as error:
        raise _fail(f"--executor {spec}: {error}") from None
    with terminate_as_interrupt(), executor:
        yield executor


def _check_factory(option: str, spec: str | None) -> None:
    if spec is not None:
        try:
            parse_factory(spec)
        except ValueError as error:
            raise _fail(f"{option}: {error}") from None


def load_rules(
    rule_files: list[Path] | None, rule_set: str | None, select: str | None
) -> list[Rule]:
    """The rules a command runs: built-in set and/or rule files, narrowed by ``--select``."""
    rules: list[Rule] = []
    if rule_set or not rule_files:
        try:
            rules.extend(load_rule_set(rule_set or DEFAULT_RULE_SET))
        except KeyError as error:
            raise _fail(str(error.args[0])) from None
        except DslError as error:  # a built-in rule file that is misnamed or broken
            raise _fail(str(error)) from None
    for path in rule_files or []:
        try:
            rules.extend(load_rule_file(path))
        except DslError as error:
            raise _fail(str(error)) from None
    if select is not None:
        wanted = [item.strip() for item in select.split(",") if item.strip()]
        if not wanted:
            raise _fail(f"no rule selected: --select {select!r} names no rule id (e.g. paper.4)")
        known = {rule.id for rule in rules}
        unknown = [
            item
            for item in wanted
            if item not in known and not any(rule_id.startswith(item + ".") for rule_id in known)
        ]
        if unknown:
            raise _fail(f"--select names unknown rule(s): {', '.join(unknown)}")
        rules = [
            rule
            for rule in rules
            if any(rule.id == item or rule.id.startswith(item + ".") for item in wanted)
        ]
    seen: set[str] = set()
    for rule in rules:
        if rule.id in seen:
            raise _fail(f"{rule.source}:{rule.line}:1: rule id {rule.id!r} is defined twice")
        seen.add(rule.id)
    return rules


_RULE_SET_HELP = (
    f"Built-in rule set ({', '.join(RULE_SETS)}); default {DEFAULT_RULE_SET}, none with --rules "
    "unless named."
)
RulesOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--rules",
        parser=_user_path,
        help="A rule file in the Adopter DSL (repeatable).",
        show_default=False,
    ),
]
RuleSetOption = Annotated[
    str | None,
    typer.Option(
        "--rule-set",
        help=_RULE_SET_HELP,
    ),
]
SelectOption = Annotated[
    str | None, typer.Option("--select", help="Comma-separated rule ids (or prefixes) to run.")
]


@app.command()
def scan(
    paths: Annotated[
        list[Path],
        typer.Argument(parser=_user_path, help="Python files or directories (recursive)."),
    ],
    output_format: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="Output format.")
    ] = OutputFormat.table,
    rule_files: RulesOption = None,
    rule_set: RuleSetOption = None,
    select: SelectOption = None,
    show_not_applicable: Annotated[
        bool,
        typer.Option(
            "--show-not-applicable", help="Also list matches whose fused value is used elsewhere."
        ),
    ] = False,
    jobs: Annotated[
        int | None, typer.Option("--jobs", "-j", min=1, help="Worker processes.")
    ] = None,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain",
            envvar="ADOPTER_EXPLAIN",
            help="Also say, on stderr, where each rule could have started and why it did not "
            "fire: the pattern step that failed, at which line, and why.",
        ),
    ] = False,
) -> None:
    """List every site where a rule applies. Never imports or runs the scanned code.

    Exit code 0 when the scan ran (with or without sites), 2 when any input was bad.
    """
    from .rewrite.judge import mark_unwritable  # scan says what apply would skip, and why

    rules = load_rules(rule_files, rule_set, select)
    files, _ = collect_python_files(paths)
    console = _stderr()
    if len(files) >= PROGRESS_MIN_FILES and console.is_terminal:
        with _progress_bar(console, "scanning", len(files)) as advance:
            result = scan_paths(
                paths,
                rules,
                jobs=jobs,
                progress=lambda _: advance(),
                explain=explain,
                judge=mark_unwritable,
            )
    else:  # a few files finish before a bar would be drawn
        result = scan_paths(paths, rules, jobs=jobs, explain=explain, judge=mark_unwritable)
    for error in result.errors:
        _print_error(console, error)
    misses, never_started = result.explained()
    for miss in [*misses, *never_started]:  # plain lines, as a rule author greps them
        typer.echo(str(miss), err=True)
    sites = result.sites + (result.not_applicable if show_not_applicable else [])
    sites.sort(key=lambda s: (s.path, s.line, s.column, s.rule.id))
    if output_format is OutputFormat.json:
        typer.echo(json.dumps(json_records(sites), indent=2))
    elif output_format is OutputFormat.sarif:
        typer.echo(json.dumps(sarif_log(sites, rules), indent=2))
    else:
        _print_table(sites, result, rules)
    if result.errors:
        raise typer.Exit(EXIT_ERROR)


def _display_path(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return path


# A location column is padded to the longest location up to this width; a longer one is
# printed whole and pushes its own row's other columns right.
LOCATION_PAD_MAX = 60


def _print_rows_unfolded(console: Console, rows: list[list[Text]]) -> None:
    """Rows of cells as aligned columns, one line each, never wrapped or cut: the first cell
    (a ``path:line:col`` or a path) stays whole on its line, so it can be copied, clicked and
    grepped at any terminal width and when piped. A table would fold or ellipsize it."""
    if not rows:
        return
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    widths[0] = min(widths[0], LOCATION_PAD_MAX)
    for row in rows:
        line = Text()
        for cell, width in zip(row, widths):
            line.append_text(cell)
            line.append(" " * max(width - len(cell), 0) + "  ")
        line.append_text(row[-1])
        line.rstrip()
        console.print(line, soft_wrap=True, overflow="ignore", crop=False)


def _print_table(sites, result, rules) -> None:
    console = Console(highlight=False)
    rows = []
    for site in sites:  # Text cells: paths and rule texts are never Rich markup
        owner = f"{site.cls}.{site.method}" if site.cls else site.method
        if not site.applicable:
            message = Text(f"not applicable: {site.reason}", style="dim")
        elif not site.rewritable:
            message = Text(f"{site.message}; not rewritable: {site.rewrite_reason}", style="yellow")
        else:
            message = Text(site.message)
        location = f"{_display_path(site.path)}:{site.line}:{site.column}"
        rule = site.rule.id
        if site.rule.third_party_kernel:
            rule += f" (third-party kernel {site.rule.kernel})"
        rows.append([Text(location), Text(rule, style="bold"), Text(owner), message])
    _print_rows_unfolded(console, rows)
    files = len(result.files)
    unwritable = sum(not site.rewritable for site in result.sites)
    console.print(
        f"{len(result.sites)} site(s) in {files} file(s), {len(rules)} rule(s), "
        f"{len(result.not_applicable)} not applicable, "
        + (f"{unwritable} not rewritable, " if unwritable else "")
        + f"{len(result.errors)} error(s), "
        f"{result.seconds:.2f} s"
    )


@app.command()
def structure(
    path: Annotated[Path, typer.Argument(parser=_user_path, help="A Python file.")],
    class_name: Annotated[
        list[str] | None, typer.Option("--class", "-c", help="Only these classes (repeatable).")
    ] = None,
    max_paths: Annotated[int, typer.Option("--paths", min=1, help="Paths shown per method.")] = 4,
    rule_files: RulesOption = None,
    rule_set: RuleSetOption = None,
) -> None:
    """Print the structure Adopter extracted from FILE, per module class, in the DSL."""
    rules = load_rules(rule_files, rule_set, None)
    try:
        extracted = analyse_file(str(path), Matcher(rules).opaque_methods)
        wanted = set(class_name or [])
        missing = wanted - set(extracted.classes)
        if missing:
            raise _fail(f"{path}: no class named {', '.join(sorted(missing))}")
        blocks = [
            format_class(info, max_paths, extracted.branch_labels)
            for info in extracted.classes.values()
            if info.is_module and (not wanted or info.name in wanted)
        ]
    except typer.Exit:
        raise
    except Exception as error:  # noqa: BLE001 - as scan and apply report it: at the file
        raise _fail(str(failure_as_error(str(path), error))) from None
    typer.echo("\n\n".join(blocks) if blocks else f"{path}: no nn.Module classes found")


@app.command()
def apply(
    paths: Annotated[
        list[Path],
        typer.Argument(parser=_user_path, help="Python files or directories (recursive)."),
    ],
    write: Annotated[bool, typer.Option("--write", help="Write the patched files.")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 when something would change (CI, pre-commit).")
    ] = False,
    output_format: Annotated[
        str, typer.Option("--format", "-f", help="diff (default) or json (the edits).")
    ] = "diff",
    rule_files: RulesOption = None,
    rule_set: RuleSetOption = None,
    select: SelectOption = None,
    jobs: Annotated[
        int | None, typer.Option("--jobs", "-j", min=1, help="Worker processes.")
    ] = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Differentially test each patched file (imports it in a subprocess) and keep "
            "only verified patches; a refuted file is narrowed down rule by rule.",
        ),
    ] = False,
    verify_timeout: Annotated[
        float,
        typer.Option("--verify-timeout", callback=_positive, help="Seconds per file for --verify."),
    ] = 300,
    only_faster: Annotated[
        bool,
        typer.Option(
            "--only-faster",
            help="Benchmark each rule alone on this machine (imports the model) and keep only "
            "the rules that make it faster.",
        ),
    ] = False,
    force_read_only: Annotated[
        bool,
        typer.Option(
            "--force-read-only",
            help="With --write, also write read-only files (their mode stays read-only).",
        ),
    ] = False,
    in_place_hard_links: Annotated[
        bool,
        typer.Option(
            "--in-place-hard-links",
            help="With --write, rewrite a file that has several hard links in place, so every "
            "name sees the patch (not atomic); without it such a file is skipped.",
        ),
    ] = False,
    modular: Annotated[
        bool,
        typer.Option(
            "--modular",
            help="transformers 5.x: patch the modular_*.py sources (what a contributor edits) "
            "instead of the modeling_*.py files generated from them (what runs; the default).",
        ),
    ] = False,
) -> None:
    """Rewrite every site to call its kernel. Prints a unified diff unless --write is given.

    Files are never imported. A site that cannot be rewritten safely is skipped with a reason;
    the others still apply, until nothing more changes. --write writes a file only if it still
    holds what was analysed, atomically, in its own encoding and line endings, keeping its
    owner and mode (a symlink's target is written); a file it skips is named with the reason
    and the exit code is 2.
    """
    from .rewrite import WriteOptions, rewrite_paths, unified_diff, write_changed

    if output_format not in ("diff", "json"):
        raise _fail(f"--format must be diff or json, not {output_format!r}")
    rules = load_rules(rule_files, rule_set, select)
    console = _stderr()

    def say(message: str) -> None:  # file names and reasons are never Rich markup
        console.print(message, soft_wrap=True, markup=False, highlight=False)

    result = rewrite_paths(paths, rules, jobs=jobs, modular=modular)
    for error in result.errors:
        _print_error(console, error)
    if only_faster:
        from .bench.command import keep_faster_rules

        result = keep_faster_rules(result, rules, say)
    if verify:
        from .gate import keep_verified

        keep_verified(result, rules, timeout=verify_timeout, say=say)
    out = Console(highlight=False)
    if output_format == "json":
        records = [r.as_record() for r in result.results]
        typer.echo(json.dumps(records, indent=2))
    elif not write:
        for rewrite in result.changed:
            diff = unified_diff(rewrite)
            if out.is_terminal:
                from rich.syntax import Syntax

                out.print(Syntax(diff, "diff", theme="ansi_dark", background_color="default"))
            else:
                typer.echo(diff, nl=False)
    done, not_written = result.changed, 0
    if write:
        options = WriteOptions(force_read_only, in_place_hard_links)
        done, not_written = write_changed(result, options, say)
    for line in result.skip_lines():
        say(line)
    for line in _third_party_lines(rules, result):
        say(line)
    say(result.summary(done, written=write, not_written=not_written))
    if result.errors or not_written or result.held_back:
        raise typer.Exit(EXIT_ERROR)
    if check and result.changed:
        raise typer.Exit(1)


def _third_party_lines(rules: list[Rule], result) -> list[str]:
    """One line per rule with a third-party kernel that found a site: its call is not Adopter's."""
    found = {site_result.site.rule.id for site_result in result.results}
    return [
        f"rule {rule.id} calls the third-party kernel {rule.kernel}"
        for rule in rules
        if rule.third_party_kernel and rule.id in found
    ]


@app.command()
def bench(
    targets: Annotated[
        list[str] | None,
        typer.Argument(
            help="Model names (bert, llama, resnet50, UNet2DConditionModel), modules or modeling "
            "files; several are "
            "benchmarked one after another here, or one per node with --executor ray.",
            show_default=False,
        ),
    ] = None,
    rule_files: RulesOption = None,
    rule_set: RuleSetOption = None,
    select: SelectOption = None,
    factory: Annotated[
        str | None,
        typer.Option(
            "--factory",
            help=f"Build the original from a factory: {FACTORY_HELP} Without --patched-factory "
            "the rules are applied to the factory's own file.",
        ),
    ] = None,
    patched_factory: Annotated[
        str | None,
        typer.Option("--patched-factory", help="The patched model's factory, same form."),
    ] = None,
    model_class: Annotated[str | None, typer.Option("--class", help="Model class.")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", min=1)] = 2,
    seq_len: Annotated[int, typer.Option("--seq-len", "-s", min=1)] = 128,
    image_size: Annotated[int, typer.Option("--image-size", min=1)] = 224,
    layers: Annotated[int, typer.Option("--layers", min=0, help="Layers per stack (0: all).")] = 2,
    dropout: Annotated[
        str, typer.Option("--dropout", help="config, no-attention or none")
    ] = "config",
    device: Annotated[str, typer.Option("--device")] = "cpu",
    dtype: Annotated[str, typer.Option("--dtype")] = "float32",
    compile_both: Annotated[
        bool,
        typer.Option(
            "--compile",
            help="Also time both sides under torch.compile: original and patched, eager and "
            "compiled, in one interleaved run.",
        ),
    ] = False,
    ablation: Annotated[bool, typer.Option("--ablation", help="Each rule alone too.")] = False,
    backends: Annotated[
        bool,
        typer.Option(
            "--backends",
            help="Time every installed backend of each kernel op (at the model's sizes, or a "
            "default set without a model) and record the winners in this machine's table "
            "(ADOPTER_BACKENDS_TABLE overrides its path), which the kernels read.",
        ),
    ] = False,
    modes: Annotated[str, typer.Option("--modes", help="inference,train")] = "inference,train",
    warmup: Annotated[int, typer.Option("--warmup", min=0)] = 2,
    repeats: Annotated[int, typer.Option("--repeats", min=1)] = 10,
    memory: Annotated[
        MemoryMethod,
        typer.Option(
            "--memory",
            help="How peak memory is measured: auto (RSS of a fresh process per variant on "
            "CPU, a few seconds each; the CUDA allocator on a GPU), rss, profiler (tensor bytes, "
            "in-process), cuda, or none (not measured).",
        ),
    ] = "auto",  # type: ignore[assignment]
    threads: Annotated[int | None, typer.Option("--threads", min=1)] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results as JSON.")] = None,
    plot_out: Annotated[Path | None, typer.Option("--plot", help="Write a PNG bar chart.")] = None,
    executor_spec: ExecutorOption = "local",
    runtime_env: RuntimeEnvOption = None,
    full_size: Annotated[
        bool,
        typer.Option(
            "--full-size",
            help="Build the library's full-size model (default: small - transformers narrowed "
            "to 768 wide, timm and diffusers at their adapters' small settings).",
        ),
    ] = False,
) -> None:
    """Measure the payoff: training step time, inference latency and peak memory of the
    original and the patched model (same weights and inputs, interleaved runs, bootstrap
    confidence intervals). Imports the model code (as training it would). A speed-up whose
    interval is too wide to decide is flagged as noisy.

    Several models: each is one job, and no two are ever timed at once on one machine - here
    they run one after another; with --executor ray each runs on a node of its own, holding all
    of that node's CPUs. Each model's table is printed as it finishes; --json then holds
    {model: result}."""
    if plot_out is not None and importlib.util.find_spec("matplotlib") is None:
        # Checked before the run: a missing plotter must not cost the user the measurements.
        raise _fail("--plot needs matplotlib: pip install matplotlib (or 'adopter[torch]')")
    if backends:
        _bench_backends(
            targets,
            batch_size,
            seq_len,
            device,
            dtype,
            modes,
            repeats,
            warmup,
            memory,
            json_out,
            plot_out,
        )
        return
    if not targets and factory is None:
        raise _fail("give a model (e.g. bert) or --factory module:function")
    if targets and factory is not None:
        raise _fail("give models or --factory, not both")
    target = targets[0] if targets else None
    _check_factory("--factory", factory)
    _check_factory("--patched-factory", patched_factory)
    rules = load_rules(rule_files, rule_set, select)

    from dataclasses import replace

    from .bench import many
    from .bench.command import BenchTargetError, run_bench
    from .bench.measure import MODES, VariantBuildError
    from .bench.options import BenchOptions

    try:
        options = BenchOptions(
            factory=factory,
            patched_factory=patched_factory,
            model_class=model_class,
            batch_size=batch_size,
            seq_len=seq_len,
            image_size=image_size,
            layers=layers or None,
            dropout=dropout,
            full_size=full_size,
            ablation=ablation,
            device=device,
            dtype=dtype,
            compile=compile_both,
            modes=_comma_list(modes, "--modes", MODES),
            warmup=warmup,
            repeats=repeats,
            memory=None if memory is MemoryMethod.none else memory.value,
            threads=threads,
        )
    except ValueError as error:  # before anything is built: a bad option costs no run
        raise _fail(str(error)) from None
    if len(targets or []) > 1 or executor_spec != "local":
        jobs = [many.BenchJob(target, options, tuple(rules)) for target in targets or [None]]
        _bench_many(jobs, executor_spec, runtime_env, json_out, plot_out)
        return
    try:
        result = run_bench(
            target,
            replace(options, plot_path=plot_out, json_out=json_out),
            rules=rules,
            progress=lambda message: _stderr().print(message, markup=False, highlight=False),
        )
    except (BenchTargetError, ValueError, VariantBuildError) as error:
        raise _fail(str(error)) from None
    _print_bench(result)


def _bench_backends(
    targets: list[str] | None,
    batch_size: int,
    seq_len: int,
    device: str,
    dtype: str,
    modes: str,
    repeats: int,
    warmup: int,
    memory: MemoryMethod,
    json_out: Path | None,
    plot_out: Path | None,
) -> None:
    """``bench --backends``: measure each kernel op's backends, record and show the winners."""
    if targets and len(targets) > 1:
        raise _fail("--backends measures one model's sizes (or the default set without one)")
    from .bench.backends import plot_backends, render_backends, run_backend_bench
    from .bench.command import BenchTargetError
    from .bench.measure import MODES

    # Without a model the default shapes are 2 x 512 tokens (bench's --seq-len default is 128).
    given = bool(targets)
    try:
        rows, chosen, path = run_backend_bench(
            targets[0] if targets else None,
            batch=batch_size if given else 2,
            seq=seq_len if given else 512,
            device=device,
            dtype=dtype,
            modes=_comma_list(modes, "--modes", MODES),
            repeats=repeats,
            warmup=warmup,
            memory=memory is not MemoryMethod.none,
            progress=lambda message: _stderr().print(message, markup=False, highlight=False),
        )
    except (BenchTargetError, ValueError) as error:
        raise _fail(str(error)) from None
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 160
    console.print(render_backends(rows, chosen))
    console.print(f"winners recorded in {path}", markup=False, soft_wrap=True)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        data = {"winners": chosen, "rows": [row.to_json() for row in rows]}
        json_out.write_text(json.dumps(data, indent=1), encoding="utf-8")
    if plot_out is not None:
        plot_backends(rows, plot_out)


def _print_bench(result) -> None:
    from .bench.report import against_compiled_lines, noise_warnings, render_table

    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 160
    console.print(render_table(result))
    for line in against_compiled_lines(result):
        console.print(Text(line), soft_wrap=True)
    for warning in noise_warnings(result):
        console.print(Text.assemble(("warning:", "yellow"), " ", warning), soft_wrap=True)


def _bench_many(
    jobs: list[BenchJob],
    executor_spec: str,
    runtime_env: str | None,
    json_out: Path | None,
    plot_out: Path | None,
) -> None:
    """Benchmark several models through an executor, one per machine at a time; print each
    model's table as it is done."""
    from .bench.many import bench_many
    from .bench.report import plot

    console = _stderr()

    def heard(index: int, outcome) -> None:
        if outcome.error is not None:
            _print_error(console, f"{outcome.label}: {outcome.error}")
            return
        console.print(
            f"{outcome.label}: measured on {outcome.where} in {outcome.seconds:.0f} s",
            markup=False,
            soft_wrap=True,
        )
        _print_bench(outcome.bench_result())

    with _open_executor(executor_spec, None, runtime_env, placement="node") as executor:
        console.print(f"benchmarking {len(jobs)} model(s) on {executor.describe()}", markup=False)
        outcomes = bench_many(jobs, executor, on_result=heard)
    measured = {o.label: o for o in outcomes if o.result is not None}
    if json_out is not None:
        data = {o.label: o.result if o.result is not None else {"error": o.error} for o in outcomes}
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    if plot_out is not None and measured:
        plot({label: o.bench_result() for label, o in measured.items()}, plot_out)
    if len(measured) < len(outcomes):
        raise typer.Exit(EXIT_ERROR)


@app.command(name="verify")
def verify_command(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(parser=_user_path, help="Model files or directories (transformers)."),
    ] = None,
    rule_files: RulesOption = None,
    rule_set: RuleSetOption = None,
    select: SelectOption = None,
    factory: Annotated[
        str | None,
        typer.Option("--factory", help=f"The original model's factory: {FACTORY_HELP}"),
    ] = None,
    patched_factory: Annotated[
        str | None,
        typer.Option("--patched-factory", help="The patched model's factory, same form."),
    ] = None,
    classes: Annotated[
        str | None, typer.Option("--classes", help="Comma-separated model classes to check.")
    ] = None,
    modes: Annotated[str, typer.Option("--modes", help="eval,train")] = "eval,train",
    timeout: Annotated[
        float, typer.Option("--timeout", callback=_positive, help="Seconds per file.")
    ] = 300,
    memory_limit: Annotated[
        float | None,
        typer.Option(
            "--memory-limit",
            min=0.01,
            help="GiB a file's worker (with all it started) may hold resident; more is not "
            "checkable. With Ray also reserved per task. Default: no limit.",
        ),
    ] = None,
    executor_spec: ExecutorOption = "local",
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            help="Local worker processes (default 1), or the CPUs of a Ray instance started here.",
        ),
    ] = None,
    runtime_env: RuntimeEnvOption = None,
    output_format: Annotated[
        str, typer.Option("--format", "-f", help="table, json or jsonl (rows as files finish)")
    ] = "table",
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Exit 1 unless every patched file is verified (not exercised or not "
            "checkable fail too): a gate for CI.",
        ),
    ] = False,
) -> None:
    """Prove patches: build the original and the patched model from the same small config,
    load the original weights strictly into the patch, and compare outputs and gradients in
    eval and train mode (and train with dropout where the kernels draw random numbers alike).

    A file is verified only when every patched site (every adopter.kernels call) ran in a
    comparison that matched; a site that never ran makes it "not exercised", naming the site.
    To reach sites, verify also checks every model class whose code holds one and flips the
    boolean/enum config options that guard them.

    What runs and how it is contained: the model code (original and patched) is imported and
    executed only in a worker subprocess (python -m adopter.verify.worker), never in this
    process, with a timeout per file (--timeout). The worker runs in its own session with a mark
    in its environment; when it ends or times out, it and every process it started - also ones
    that called setsid() - are killed. There is no sandbox: the model code runs as you, with
    your files and network (hub downloads are switched off via HF_HUB_OFFLINE only).

    Where it runs: --executor local (default) runs the files in --jobs worker processes here;
    --executor ray[:ADDRESS] runs each file as a Ray task (same worker, same containment, on
    whichever node Ray picks; a task whose Ray worker dies is retried once). Each verdict is
    reported on stderr as it comes; --format jsonl prints each file's rows as soon as it is done.

    Exit code 0 when nothing was refuted, 1 when a patch was refuted (with --strict: when any
    patched file is not verified), 2 on bad input.
    """
    from .rewrite import rewrite_paths
    from .verify import PatchedFile, VerifyOptions, verify_factories
    from .verify.report import class_row, unchanged_row

    if output_format not in ("table", "json", "jsonl"):
        raise _fail(f"--format {output_format!r}: use table, json or jsonl")
    mode_list = _comma_list(modes, "--modes")
    try:  # checks the options (modes, timeout) before any work
        options = VerifyOptions.of(timeout=timeout, modes=mode_list, memory_limit_gib=memory_limit)
    except ValueError as error:
        raise _fail(str(error)) from None
    wanted = [c.strip() for c in classes.split(",")] if classes else None
    rows: list[dict[str, object]] = []
    if factory or patched_factory:
        if not (factory and patched_factory):
            raise _fail("--factory and --patched-factory go together")
        _check_factory("--factory", factory)
        _check_factory("--patched-factory", patched_factory)
        with _open_executor(executor_spec, jobs, runtime_env) as executor:
            (verdict,) = verify_factories([(factory, patched_factory)], options, executor=executor)
        rows.append({**class_row(factory, verdict), "kind": "file"})
        if output_format == "jsonl":
            _print_rows(rows)
    else:
        if not paths:
            raise _fail("give model files or directories, or --factory/--patched-factory")
        rules = load_rules(rule_files, rule_set, select)
        result = rewrite_paths(paths, rules)
        for error in result.errors:
            _print_error(_stderr(), error)
        items = [PatchedFile(r.path, r.patched, classes=wanted) for r in result.changed]
        unchanged = [r for r in result.files if r.error is None and not r.changed]
        on_disk, not_found = _patched_on_disk(unchanged, wanted)
        items += on_disk
        checked = {item.label for item in on_disk} | set(not_found)
        rows += [unchanged_row(r.path) for r in unchanged if r.path not in checked]
        rows += [_no_pristine_row(path) for path in not_found]
        if output_format == "jsonl":
            _print_rows(rows)
        # Progress on stderr where someone watches, or where the run is a long one of many
        # workers; the default run keeps stderr for errors, as it always did.
        watched = _stderr().is_terminal or executor_spec != "local" or (jobs or 1) > 1
        heard = _verdict_stream(items, output_format, watched)
        with _open_executor(executor_spec, jobs, runtime_env) as executor:
            rows += _verified_rows(items, options, executor=executor, on_result=heard)
        if result.errors:
            _print_verdicts(rows, output_format)
            raise typer.Exit(EXIT_ERROR)
    _print_verdicts(rows, output_format)
    _exit_if_refuted(rows)
    if strict and any(row["kind"] == "file" and _unproven(row["status"]) for row in rows):
        raise typer.Exit(1)


def _verified_rows(items: list, options: Any, **run: Any) -> list[dict[str, object]]:
    """The report rows of verifying ``items`` (``run``: the executor, the verdict listener);
    ``verify`` and ``learn --verify`` print them alike."""
    from .verify import verify_patched_files
    from .verify.report import verification_rows

    verdicts = verify_patched_files(items, options, **run)
    rows: list[dict[str, object]] = []
    for item, verification in zip(items, verdicts, strict=True):
        rows += verification_rows(item.label or item.original_path, verification)
    return rows


def _exit_if_refuted(rows: list[dict[str, object]]) -> None:
    """Exit code 1 where a row refutes a patch."""
    from .verify.results import REFUTED

    if any(row["status"] == REFUTED for row in rows):
        raise typer.Exit(1)


def _patched_on_disk(unchanged, classes: list[str] | None) -> tuple[list, list[str]]:
    """Files no rule changes because ``apply --write`` already patched them: each compared
    with its pristine source (the installed module it is, or is a copy of; else git's HEAD).
    Also the paths of patched files with no pristine source found."""
    from .models.origin import pristine_of
    from .models.sites import calls_kernels
    from .verify import PatchedFile

    items, not_found = [], []
    for rewrite in unchanged:
        if not calls_kernels(rewrite.original):
            continue
        found = pristine_of(Path(rewrite.path), rewrite.original, calls_kernels)
        if found is None:
            not_found.append(rewrite.path)
            continue
        original_path, original_text, module_name = found
        items.append(
            PatchedFile(
                original_path,
                rewrite.original,
                module_name=module_name,
                classes=classes,
                original_text=original_text,
                label=str(rewrite.path),
            )
        )
    return items, not_found


def _no_pristine_row(path: str) -> dict[str, object]:
    from .verify.results import NOT_CHECKABLE

    reason = (
        "already patched (calls adopter.kernels), and no pristine source was found to compare "
        "it with: neither an installed module it is a copy of nor a git HEAD without kernels"
    )
    return {"kind": "file", "path": str(path), "class": "-", "status": NOT_CHECKABLE,
            "reason": reason, "max_abs_diff": None, "where": None}  # fmt: skip


def _unproven(status: object) -> bool:
    """A file verdict that ``--strict`` fails: anything but verified, or no site to patch."""
    from .verify.results import VERIFIED

    return status not in (VERIFIED, "unchanged")


def _verdict_stream(items, output_format: str, progress: bool) -> Callable[[int, object], None]:
    """What happens as each file's verdict comes: a progress line on stderr (with
    ``progress``), and with ``jsonl`` the file's rows on stdout at once."""
    from .verify.report import verification_rows

    console = _stderr()
    done = 0

    def heard(index: int, verification) -> None:
        nonlocal done
        done += 1
        path = items[index].label or items[index].original_path
        if progress:
            console.print(
                f"[{done}/{len(items)}] {verification.status}: {_display_path(str(path))} "
                f"({verification.seconds:.1f} s)",
                markup=False,
                soft_wrap=True,
            )
        if output_format == "jsonl":
            _print_rows(verification_rows(path, verification))

    return heard


def _print_rows(rows: list[dict[str, object]]) -> None:
    for row in rows:
        typer.echo(json.dumps(row, default=str))


def _print_verdicts(rows: list[dict[str, object]], output_format: str) -> None:
    if output_format == "jsonl":  # the rows went out as they came
        return
    if output_format == "json":
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    console = Console(highlight=False)
    colors = {"verified": "green", "refuted": "red"}
    cells = []
    for row in rows:  # Text cells: paths, class names and reasons are never Rich markup
        diff = row.get("max_abs_diff")
        status = str(row["status"])
        cells.append(
            [
                Text(_display_path(str(row["path"]))),
                Text(str(row["class"])),
                Text(status, style=colors.get(status, "yellow")),
                # no place named: nothing differed (as FileVerification.summary says)
                Text(
                    ""
                    if diff is None
                    else f"|diff| {diff:.2e} ({row.get('where') or 'bit-identical'})"
                ),
                Text(str(row.get("reason") or "")),
            ]
        )
    _print_rows_unfolded(console, cells)
    counts: dict[str, int] = {}
    for row in rows:
        if row.get("kind", "file") == "file":
            counts[str(row["status"])] = counts.get(str(row["status"]), 0) + 1
    summary = ", ".join(f"{n} {status} file(s)" for status, n in sorted(counts.items()))
    console.print(summary, markup=False)


@app.command()
def fetch(
    spec: Annotated[
        str, typer.Argument(help="A pinned PyPI requirement, e.g. transformers==4.34.0.")
    ],
    cache: Annotated[
        Path | None,
        typer.Option("--cache-dir", help="Where wheels are kept (default .cache/corpus)."),
    ] = None,
) -> None:
    """Download a model zoo's wheel from PyPI (no install, no import), unpack it into the cache
    and print the folder, ready for ``adopter scan``."""
    from .corpus import FetchError, fetch_wheel

    try:
        folder = fetch_wheel(spec, cache)
    except FetchError as error:
        raise _fail(str(error)) from None
    typer.echo(str(folder))


@app.command(name="learn")
def learn_command(
    files: Annotated[
        list[Path],
        typer.Argument(
            parser=_user_path,
            help="BEFORE AFTER [BEFORE2 AFTER2 ...]: model code and the same code calling a "
            "kernel.",
        ),
    ],
    name: Annotated[str, typer.Option("--name", help="The learned rule's id.")] = "learned.1",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the rule file here.")
    ] = None,
    fixture: Annotated[
        Path | None,
        typer.Option("--fixture", help="Write the first example as the rule's fixture here."),
    ] = None,
    counter: Annotated[
        list[Path] | None,
        typer.Option("--not", help="A counter-example the rule must not match (repeatable)."),
    ] = None,
    scan_paths_: Annotated[
        list[Path] | None,
        typer.Option("--scan", help="List the sites the rule would patch here (repeatable)."),
    ] = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify", help="Prove the patches of the --scan files (runs the model code)."
        ),
    ] = False,
    constraints: Annotated[
        str,
        typer.Option(
            "--constraints",
            help="What the rule checks of each __init__ construction at first: class, flags "
            "(also its boolean parameters) or literals (every constant parameter); --not "
            "narrows further.",
        ),
    ] = "class",
    timeout: Annotated[
        float, typer.Option("--timeout", callback=_positive, help="verify: seconds per file.")
    ] = 300,
) -> None:
    """Learn a rule from one (or more) before/after examples and check it: it parses, its kernel
    exists, and applied to each BEFORE it writes that AFTER (modulo formatting). Prints the rule
    file (What / Why / Before / After header) or writes it with -o.

    Exit code 0 when a rule was learnt (and, with --verify, nothing was refuted), 1 when a patch
    was refuted, 2 on bad input (each reported as file:line:col: message).
    """
    from .dsl import LocatedError
    from .learn import learn

    if len(files) % 2:
        raise _fail("give BEFORE AFTER pairs: an even number of files")
    try:
        examples = _learn_examples(files)
        counters = [(str(path), _learn_read(path)) for path in counter or []]
        learned = learn(examples, rule_id=name, counter_examples=counters, constraints=constraints)
    except LocatedError as error:
        raise _fail(str(error)) from None
    if output is not None:
        output.write_text(learned.text, encoding="utf-8")
        typer.echo(f"wrote {output}", err=True)
    else:
        typer.echo(learned.text, nl=False)
    if fixture is not None:
        fixture.write_text(learned.fixture, encoding="utf-8")
        typer.echo(f"wrote {fixture}", err=True)
    if scan_paths_:
        _learn_scan(learned.rule, scan_paths_, verify, timeout)
    elif verify:
        raise _fail("--verify proves the sites of --scan PATH: give --scan")


def _learn_read(path: Path) -> str:
    from .extract import read_source
    from .learn import LearnError

    try:
        return read_source(str(path))
    except OSError as error:
        raise LearnError(str(path), 1, 1, f"cannot read: {error.strerror or error}") from None


def _learn_examples(files: list[Path]):
    from .learn import Example

    return [
        Example(str(before), str(after), _learn_read(before), _learn_read(after))
        for before, after in zip(files[::2], files[1::2], strict=True)
    ]


def _learn_scan(rule: Rule, paths: list[Path], verify: bool, timeout: float) -> None:
    """The sites the learned rule patches under ``paths`` (on stderr, so the rule text on stdout
    stays a rule file), and with ``verify`` the verdict of each patched file."""
    result = scan_paths(paths, [rule])
    for error in result.errors:
        _print_error(_stderr(), error)
    for site in sorted(result.sites, key=lambda s: (s.path, s.line, s.column)):
        where = f"{site.cls}.{site.method}" if site.cls else site.method
        typer.echo(f"{site.path}:{site.line}:{site.column}: {rule.id} in {where}", err=True)
    typer.echo(f"{len(result.sites)} site(s) in {len(paths)} path(s)", err=True)
    if not verify:
        if result.errors:
            raise typer.Exit(EXIT_ERROR)
        return
    from .rewrite import rewrite_paths
    from .verify import PatchedFile, VerifyOptions

    rewrite = rewrite_paths(paths, [rule])
    items = [PatchedFile(r.path, r.patched) for r in rewrite.changed]
    rows = _verified_rows(items, VerifyOptions(timeout=timeout))
    _print_verdicts(rows, "table")
    _exit_if_refuted(rows)
    if result.errors or rewrite.errors:
        raise typer.Exit(EXIT_ERROR)


@app.command(name="rules")
def list_rules(
    rule_files: RulesOption = None,
    rule_set: RuleSetOption = None,
    select: SelectOption = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show each rule's docs.")
    ] = False,
) -> None:
    """List the rules (with --verbose, their documentation and DSL)."""
    rules = load_rules(rule_files, rule_set, select)
    console = Console(highlight=False)
    for rule in rules:  # rule texts are the user's: Text, never Rich markup
        console.print(Text.assemble((rule.id, "bold"), f" {rule.name}: {rule.description}"))
        if verbose:
            if rule.doc:
                console.print(rule.doc, markup=False)
            console.print(Text(str(rule.source), style="dim"), "\n")


@app.command(
    name="run",
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
def run(
    command: Annotated[
        list[str], typer.Argument(help="The command, after --: python train.py ...")
    ],
    rule_files: RulesOption = None,
    rule_set: Annotated[
        str | None,
        typer.Option(
            "--rule-set",
            help=_RULE_SET_HELP,
        ),
    ] = None,
    select: SelectOption = None,
    exclude: Annotated[
        str | None,
        typer.Option(
            "--exclude", help="Comma-separated rule ids (or prefixes) to leave out, e.g. modern.7."
        ),
    ] = None,
    packages: Annotated[
        str,
        typer.Option("--packages", help="Comma-separated packages patched as they are imported."),
    ] = "transformers,timm,diffusers",
    verify: Annotated[
        bool,
        typer.Option("--verify", help="Keep a module's patch only when verify proves it."),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Do not print what was patched.")
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="One line per module (patched, left alone, and why)."),
    ] = False,
) -> None:
    """Run COMMAND with the matching modules of transformers, timm and diffusers patched in
    memory as they are imported (no file is edited). Exit code: the command's."""
    import os

    from .runtime.launch import run_command, run_environment
    from .runtime.rulechoice import unmatched

    if not command:
        raise _fail("give the command to run, e.g. adopter run -- python train.py")
    rules = load_rules(rule_files, rule_set, select)
    excluded = [item.strip() for item in (exclude or "").split(",") if item.strip()]
    unknown = unmatched(excluded, [rule.id for rule in rules])
    if unknown:
        raise _fail(f"--exclude names unknown rule(s): {', '.join(unknown)}")
    if not rules:
        raise _fail("no rules selected")
    names = ([rule_set] if rule_set else [DEFAULT_RULE_SET] if not rule_files else []) + [
        str(path.resolve()) for path in rule_files or []
    ]
    env = run_environment(
        os.environ,
        rules=names,
        select=select,
        exclude=",".join(excluded) or None,
        packages=[p.strip() for p in packages.split(",") if p.strip()],
        verify=verify,
        log_level=None if quiet else "DEBUG" if verbose else "INFO",
    )
    raise typer.Exit(run_command(command, env))


cache_app = typer.Typer(
    help="The per-user cache of adopter.patch and adopter run.", no_args_is_help=True
)
app.add_typer(cache_app, name="cache")


@cache_app.command(name="clear")
def cache_clear() -> None:
    """Delete the cached rewrites and verdicts (the next start rewrites again)."""
    from .runtime.cache import CacheRefused, cache_dir, clear_cache

    try:
        removed = clear_cache()
    except CacheRefused as error:
        raise _fail(str(error)) from None
    typer.echo(f"removed {removed} entries from {cache_dir()}")


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())

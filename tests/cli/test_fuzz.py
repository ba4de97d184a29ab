"""Fuzzing the command line: mutated rule files and mutated model sources go through ``scan``,
``structure``, ``rules`` and ``apply`` (without ``--write``), in-process. Whatever the input,
each command ends with exit code 0, 1 or 2, prints no traceback and no "internal error" (the
located record a defect would produce), and finishes within a deadline.

The mutations: deleted and duplicated byte ranges, random Unicode (separators, NUL, surrogate-free
text), swapped tokens, and deep nesting of the kinds that reach Python's limits (parentheses,
subscripts, calls, long operator chains). Hypothesis runs a fixed number of derandomised
examples, so the cases are the same on every run.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from adopter.cli import app

pytestmark = pytest.mark.slow  # see pyproject.toml's markers

try:
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()

RULE_FILES = sorted(Path(__file__).parents[2].joinpath("adopter", "rules").glob("*.adopt"))
DEADLINE_S = 20.0

BERT_LIKE = '''\
"""A small BERT-like model, written the way model repositories write it."""

import math

import torch
from torch import nn
import torch.nn.functional as F

ACT2FN = {"gelu": nn.GELU(), "relu": nn.ReLU()}


class BertSelfAttention(nn.Module):
    def __init__(self, config, position_embedding_type=None):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(config.hidden_size, self.all_head_size)
        self.key = nn.Linear(config.hidden_size, self.all_head_size)
        self.value = nn.Linear(config.hidden_size, self.all_head_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def transpose_for_scores(self, x):
        new_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(new_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask=None):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        scores = scores / math.sqrt(self.attention_head_size)
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = nn.functional.softmax(scores, dim=-1)
        probs = self.dropout(probs)
        context = torch.matmul(probs, value_layer).permute(0, 2, 1, 3).contiguous()
        return context.view(context.size()[:-2] + (self.all_head_size,))


class SelfOutput(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.LayerNorm(hidden_states + input_tensor)
        return hidden_states


class Intermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.intermediate_act_fn(hidden_states)
        return hidden_states


class Stem(nn.Module):
    def __init__(self, channels=8):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, kernel_size=3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class Layer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = BertSelfAttention(config, position_embedding_type=None)
        self.output = SelfOutput(config)
        self.intermediate = Intermediate(config)

    def forward(self, hidden_states, attention_mask=None):
        attended = self.attention(hidden_states, attention_mask)
        attended = self.output(attended, hidden_states)
        return self.intermediate(attended)
'''

# Deep nesting of every kind the grammars accept, sized past Python's recursion limit.
# (opener, core, closer): ``opener * depth + core + closer * depth``; an empty core keeps the
# wrapped identifier.
_NESTING = {
    "parentheses": ("(", "", ")"),
    "subscripts": ("", "", "[0]"),
    "calls": ("f(", "", ")"),
    "lists": ("[", "", "]"),
    "additions": ("1+", "", ""),
    "attributes": ("", "", ".a"),
    "hex": ("0x", "f", "f"),
}
_SOURCE_NAMES = rb"\b(hidden_states|scores|probs|x|config\.hidden_size|channels)\b"
_RULE_NESTING = {
    "parentheses": ("(", "", ")"),
    "subscripts": ("", "", "[0]"),
    "nested-subscripts": ("$x[", "", "]"),
    "calls": ("g(", "", ")"),
    "chained-calls": ("", "", "(0)"),
}
_RULE_NAMES = rb"\$\w+"
_FILE_NAMES = ["mutated", "[red]mutated", "exp[/v2]", "[b]x[/b]", "a b"]  # "/": a subfolder
_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)),
    max_size=12,
) | st.sampled_from(
    ["\x00", "\x0c", "\u2028", "\x85", "\x1c", "\r", "\r\n", "\ufeff", "\t", "[/]", "[red]", "$"]
)


@st.composite
def mutated(draw, data: bytes, nesting: dict[str, tuple[str, str, str]], names: bytes) -> bytes:
    """``data`` after one to three mutations. ``names`` matches the identifiers that deep
    nesting wraps, so that the nested expression sits where an expression belongs and the
    file still parses up to the analysis (random positions mostly give syntax errors)."""
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["delete", "duplicate", "insert", "in-string", "swap", "wrap"]))
        start = draw(st.integers(0, len(data)))
        end = draw(st.integers(start, min(len(data), start + 400)))
        if kind == "delete":
            data = data[:start] + data[end:]
        elif kind == "duplicate":
            data = data[:end] + data[start:end] * draw(st.integers(1, 50)) + data[end:]
        elif kind == "insert":
            data = data[:start] + draw(_TEXT).encode("utf-8", "surrogatepass") + data[start:]
        elif kind == "in-string":  # names, messages and docstrings reach the output
            quotes = [m.end() for m in re.finditer(rb'"', data)]
            if quotes:
                at = draw(st.sampled_from(quotes))
                data = data[:at] + draw(_TEXT).encode("utf-8", "surrogatepass") + data[at:]
        elif kind == "swap":
            tokens = re.findall(rb"\w+|[^\w\s]", data)
            if tokens:
                old, new = draw(st.sampled_from(tokens)), draw(st.sampled_from(tokens))
                data = data.replace(old, new, 1)
        else:
            spots = list(re.finditer(names, data))
            if spots:
                spot = draw(st.sampled_from(spots))
                opener, core, closer = nesting[draw(st.sampled_from(sorted(nesting)))]
                depth = draw(st.sampled_from([60, 300, 1100, 3000]))
                inner = core.encode() if core else spot.group()
                chunk = opener.encode() * depth + inner + closer.encode() * depth
                data = data[: spot.start()] + chunk + data[spot.end() :]
    return data


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail instead of hanging: SIGALRM interrupts even a blocking read."""

    def expire(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run(*args: str) -> None:
    with deadline(DEADLINE_S):
        result = runner.invoke(app, list(args))
    text = result.stdout + result.stderr
    context = f"adopter {' '.join(args)}:\n{text[-2000:]}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{context}\n{result.exception!r}"
    )
    assert result.exit_code in (0, 1, 2), context
    assert "Traceback" not in text, context
    assert "internal error" not in text, context


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Iterator[Path]:
    """A folder for the cases, and a private rule cache (mutated rules are cached as parsed)."""
    folder = tmp_path_factory.mktemp("fuzz")
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(folder / "cache")
    (folder / "model.py").write_text(BERT_LIKE)
    yield folder
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


FUZZ = settings(
    max_examples=30,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(data=st.data(), rule_file=st.sampled_from(RULE_FILES), name=st.sampled_from(_FILE_NAMES))
def test_mutated_rule_files(workdir, data, rule_file, name):
    text = data.draw(mutated(rule_file.read_bytes(), _RULE_NESTING, _RULE_NAMES))
    path = workdir / f"{name}.adopt"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(text)
    model = str(workdir / "model.py")
    run("rules", "--rules", str(path), "-v")
    run("scan", "--rules", str(path), model)
    run("structure", "--rules", str(path), model)
    run("apply", "--rules", str(path), model)


@FUZZ
@given(data=st.data(), name=st.sampled_from(_FILE_NAMES))
def test_mutated_model_sources(workdir, data, name):
    path = workdir / f"{name}.py"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data.draw(mutated(BERT_LIKE.encode(), _NESTING, _SOURCE_NAMES)))
    run("scan", "--rule-set", "all", "--show-not-applicable", str(path))
    run("scan", "--format", "sarif", str(path))
    run("structure", str(path))
    run("apply", "--rule-set", "all", str(path))
    run("apply", "--format", "json", str(path))


def test_the_unmutated_inputs_find_sites(workdir):
    """The fuzz cases start from inputs on which every rule kind has a site."""
    result = runner.invoke(app, ["scan", "--format", "json", str(workdir / "model.py")])
    assert result.exit_code == 0, result.stderr
    found = {record["rule"] for record in __import__("json").loads(result.stdout)}
    assert {"paper.1", "paper.4", "paper.5", "paper.6", "paper.7"} <= found, found

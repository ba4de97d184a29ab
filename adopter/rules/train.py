"""The ``train`` set: call-site rules for training code (ids ``train.N``).

Training code is not model structure: the optimizer is built once, from a class the script
imports, in a script, a function or a trainer's method. These rules find such calls anywhere in
a file (``adopter/match/calls.py``) and route them through a kernel that picks the fused
implementation at run time where every parameter allows it. They are data, not DSL text: a
call-site rule has no data flow to describe, only the callees it names and the keywords that
leave a call as written (see :class:`~adopter.dsl.syntax.CallPattern`).

The set is not part of ``all``: ``all`` patches model code, and ``adopter run`` / ``patch``
apply it to library modules, whose optimizer constructions (a trainer's) are not the user's
call to change. Name it: ``--rule-set train``.
"""

from __future__ import annotations

from ..dsl.syntax import CallPattern, Rule

SOURCE = __file__

# Keywords with which the user has already chosen the implementation, or asked for something the
# fused kernels do not do.
_CHOSEN = (
    ("fused", "the implementation is already chosen"),
    ("foreach", "the implementation is already chosen (fused and foreach exclude each other)"),
    ("capturable", "a CUDA-graph setting: left as written"),
    ("differentiable", "the fused kernels do not support differentiable=True"),
)

_FUSED_OPTIMIZER_DOC = """\
train.1 fused-optimizer: torch.optim.Adam, AdamW and SGD built with their fused kernel.

What it does
  Rewrites the construction of a torch.optim.Adam, AdamW or SGD optimizer - under any import
  spelling (torch.optim.AdamW, optim.AdamW, from torch.optim import AdamW as W, the
  torch.optim.adamw module) - to adopter.kernels.fused_optimizer, which builds the same
  optimizer with fused=True when every parameter is a dense floating-point tensor on a device
  with fused kernels (CPU, CUDA, ...), and exactly as written otherwise.

Why
  By default these optimizers update parameter by parameter or with foreach kernels whose
  temporaries set a training step's peak memory: on a Llama at vocab 128k the default AdamW
  step peaked at 1,611 MiB where fused AdamW peaked at 860 MiB (issue 23). The fused kernel
  updates each parameter in one pass, with no whole-model temporaries.

Before
  optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)

After
  optimizer = fused_optimizer(torch.optim.AdamW, model.parameters(), lr=3e-4, weight_decay=0.1)

Site
  The optimizer's constructor call. A call that already passes fused=, foreach=, capturable=
  or differentiable=, or **kwargs, is reported as not applicable and left alone.
"""

_TRAINING_ARGUMENTS_DOC = """\
train.2 fused-training-optimizer: transformers' TrainingArguments(optim="adamw_torch") fused.

What it does
  Rewrites optim="adamw_torch" in a transformers TrainingArguments (or
  Seq2SeqTrainingArguments) call to optim=fused_training_optimizer("adamw_torch"), which
  returns "adamw_torch_fused" (the Trainer then builds torch.optim.AdamW(..., fused=True)) when
  the installed torch has fused AdamW for the device training will use, and "adamw_torch"
  otherwise (no accelerator with fused kernels, torch_xla in use).

Why
  The same optimizer-step peak memory as train.1, for code that lets the Trainer build the
  optimizer. A TrainingArguments without optim= is left alone: transformers 5.x already
  defaults to "adamw_torch_fused" with torch >= 2.8 (read in transformers 5.24's
  training_args.py), and older versions' defaults are other optimizers (adamw_hf).

Before
  args = TrainingArguments("out", optim="adamw_torch", learning_rate=3e-4)

After
  args = TrainingArguments("out", optim=fused_training_optimizer("adamw_torch"), learning_rate=3e-4)

Site
  The TrainingArguments call. An optim= computed at run time is reported as not applicable.
"""

RULES: tuple[Rule, ...] = (
    Rule(
        id="train.1",
        name="fused-optimizer",
        description="Adam/AdamW/SGD built with the fused kernel where the parameters allow it",
        kernel="adopter.kernels.fused_optimizer",
        message="optimizer construction: the fused kernel cuts the optimizer step's memory",
        site="call",
        source=SOURCE,
        doc=_FUSED_OPTIMIZER_DOC,
        call=CallPattern(
            callees=tuple(
                f"torch.optim.{module}{name}"
                for name, file in (("Adam", "adam"), ("AdamW", "adamw"), ("SGD", "sgd"))
                for module in ("", f"{file}.")
            ),
            refused=_CHOSEN,
        ),
    ),
    Rule(
        id="train.2",
        name="fused-training-optimizer",
        description='transformers TrainingArguments(optim="adamw_torch") with the fused AdamW',
        kernel="adopter.kernels.fused_training_optimizer",
        message='optim="adamw_torch": the fused AdamW cuts the optimizer step\'s memory',
        site="call",
        source=SOURCE,
        doc=_TRAINING_ARGUMENTS_DOC,
        call=CallPattern(
            callees=tuple(
                f"transformers{module}.{name}"
                for name in ("TrainingArguments", "Seq2SeqTrainingArguments")
                for module in (
                    "",
                    ".training_args" if name == "TrainingArguments" else ".training_args_seq2seq",
                )
            ),
            wrap_keyword="optim",
            values=("adamw_torch",),
        ),
    ),
)

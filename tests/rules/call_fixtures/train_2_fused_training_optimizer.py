# Cases for train.2 (adopter/rules/train.py): transformers' TrainingArguments(optim=...).
import transformers
from transformers import Seq2SeqTrainingArguments, TrainingArguments


# %% the per-tensor AdamW named
args = TrainingArguments("out", optim="adamw_torch", learning_rate=3e-4)  # site


# %% through the package, in a function
def arguments(output_dir):
    return transformers.TrainingArguments(output_dir=output_dir, optim="adamw_torch")  # site


# %% the seq2seq arguments
args = Seq2SeqTrainingArguments("out", optim="adamw_torch", predict_with_generate=True)  # site


# %% already fused
args = TrainingArguments("out", optim="adamw_torch_fused")


# %% another optimizer
args = TrainingArguments("out", optim="adafactor")


# %% no optim=: transformers 5.x already defaults to adamw_torch_fused with torch >= 2.8
args = TrainingArguments("out", learning_rate=3e-4)


# %% an optim= computed at run time
name = "adamw_torch"
args = TrainingArguments("out", optim=name)  # not-applicable

# Cases for train.1 (adopter/rules/train.py): optimizer construction in training code.
import torch
import torch.nn as nn
from torch import optim
from torch.optim import SGD
from torch.optim import AdamW as W
from torch.optim.adam import Adam

model = nn.Linear(8, 8)


# %% the full dotted spelling at module level
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)  # site


# %% a module alias inside a function
def build(model):
    return optim.Adam(model.parameters(), lr=1e-3)  # site


# %% an imported class under an alias, with parameter groups
groups = [{"params": model.weight}, {"params": model.bias, "weight_decay": 0.0}]
optimizer = W(groups, lr=1e-3)  # site


# %% SGD with momentum in a trainer's method
class Trainer:
    def configure(self, model):
        self.optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9)  # site


# %% the class from its own module, params by keyword
optimizer = Adam(params=model.parameters())  # site


# %% arguments on their own lines, with a comment after the parenthesis
optimizer = torch.optim.AdamW(  # the optimizer  # site
    model.parameters(),
    lr=1e-3,
)
optimizer = torch.optim.SGD(model.parameters(), 0.1)  # site


# %% two on one line
first, second = optim.SGD(model.parameters(), lr=0.1), optim.Adam(model.parameters())  # site


# %% fused= already chosen
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=False)  # not-applicable


# %% foreach= chosen
optimizer = torch.optim.AdamW(model.parameters(), foreach=True)  # not-applicable


# %% differentiable and capturable
optimizer = torch.optim.Adam(model.parameters(), differentiable=True)  # not-applicable
optimizer = torch.optim.Adam(model.parameters(), capturable=True)  # not-applicable


# %% keywords unpacked from a dict may hold fused=
settings = {"lr": 1e-3}
optimizer = torch.optim.AdamW(model.parameters(), **settings)  # not-applicable


# %% not a torch optimizer: a class of the script's own with the same name
class AdamW:
    def __init__(self, params, lr):
        self.params = list(params)


optimizer = AdamW(model.parameters(), lr=1e-3)


# %% an optimizer without a fused kernel worth taking
optimizer = torch.optim.RMSprop(model.parameters())
optimizer = torch.optim.Adagrad(model.parameters())


# %% a name bound both by an import and an assignment is not resolved
optim = None
optimizer = optim.Adam(model.parameters())

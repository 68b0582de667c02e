"""Learner tests run torch on one thread: the machine has two cores shared by many tests."""

import torch

torch.set_num_threads(1)

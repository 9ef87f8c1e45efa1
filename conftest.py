"""Test-session settings shared by every test and every notebook kernel."""

import os

# Under pytest-xdist two workers share the machine's two cores. Each worker
# (and the notebook kernels it starts, which inherit this environment) uses
# one thread: two processes with two OpenMP threads each on two cores run far
# slower than two with one, because the threads spin-wait on each other.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)

# Hugging Face models are built from small random configs; nothing is fetched.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

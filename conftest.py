"""Test-session settings shared by every test and every notebook kernel."""

import os

# Portability: the committed outputs are made with the machine's native
# instruction set (`tools/notebooks.py execute` removes these variables), and
# the suite runs everything, notebook kernels included (they inherit this
# environment), with the baseline one: PyTorch's scalar/default kernels, MKL
# and oneDNN limited to SSE4.2. So nbval compares every output across two
# instruction sets, and an output whose last digits depend on the CPU fails on
# the author's own machine (tests/test_portability.py shows it does). Set
# before torch is imported anywhere, since torch and MKL read them once. An
# explicit setting wins, e.g. to compare the other way round.
os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")
os.environ.setdefault("MKL_ENABLE_INSTRUCTIONS", "SSE4_2")
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "SSE41")

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

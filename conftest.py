"""Test-session settings shared by every test and every notebook kernel."""

import os

import pytest

# Portability: the committed outputs are made with the machine's native
# instruction set (`tools/notebooks.py execute` removes these variables), and
# the suite runs everything, notebook kernels included (they inherit this
# environment), with another one: AVX2 on a machine with AVX-512, otherwise the
# baseline (PyTorch's default kernels, MKL limited to SSE4.2). So nbval
# compares every output across two instruction sets, and an output whose last
# digits depend on the CPU fails on the author's own machine
# (tests/test_portability.py shows it does). AVX2 rather than the baseline where
# it can: it costs nothing (book/ch04: 55.6 s CPU against 54.8 s native), the
# baseline doubles a notebook's time (110 s), and AVX2 is what most other
# machines run. Set before torch is imported anywhere, since torch and MKL read
# them once. An explicit setting wins, e.g. to compare against another one.
AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}  # what PyTorch's AVX512 kernels need


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return next((set(line.split(":", 1)[1].split()) for line in cpuinfo if line.startswith("flags")), set())
    except OSError:  # not Linux: compare with the baseline
        return set()


COMPARED_ISA = (
    {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    if AVX512 <= _cpu_flags()
    else {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"}
)
for _name, _value in COMPARED_ISA.items():
    os.environ.setdefault(_name, _value)

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

# Submitted notebooks kept as grader fixtures (some loop forever on purpose) are
# graded by tests/test_grading_hostile.py, never collected by nbval.
collect_ignore_glob = ["tests/fixtures/*"]


# The device the device-aware tests run on: `pytest --device cuda`, or COMPANION_TEST_DEVICE=cuda, else the CPU.
# The same suite then checks a GPU machine (tools/gpu_run.sh); tests without the `device` fixture stay on the CPU.
def pytest_addoption(parser):
    parser.addoption("--device", default=None,
                     help="device for tests that take the `device` fixture (default: $COMPANION_TEST_DEVICE or cpu)")


def _test_device_name(config) -> str:
    return config.getoption("--device", default=None) or os.environ.get("COMPANION_TEST_DEVICE", "").strip() or "cpu"



@pytest.fixture(scope="session")
def device(request):
    """The torch.device to test on; a device this machine lacks is a usage error, never a silent CPU run."""
    from companion.device import pick_device

    try:
        return pick_device(_test_device_name(request.config))
    except (RuntimeError, ValueError) as error:
        raise pytest.UsageError(f"--device / COMPANION_TEST_DEVICE: {error}") from None


def pytest_terminal_summary(terminalreporter):
    """The Chinese edition's state, page by page, and the website's build times, in every run's output."""
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent
    sys.path.insert(0, str(root / "tools"))
    try:
        import i18n

        lines = i18n.report_lines()
    except Exception as exc:  # the summary must never hide the tests' own result
        lines = [f"(no report: {exc})"]
    finally:
        sys.path.remove(str(root / "tools"))
    terminalreporter.write_sep("-", "Chinese edition: catalogue entries per page (tools/i18n.py report)")
    for line in lines:
        terminalreporter.write_line(line)
    times = root / "_build" / "site-build-seconds.json"
    if times.exists():
        seconds = json.loads(times.read_text(encoding="utf-8"))
        terminalreporter.write_line("website build (this run): " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()))


def pytest_sessionstart(session):
    from pathlib import Path

    # The build times printed at the end are this run's (tests/sitebuild.py writes them).
    Path(__file__).resolve().parent.joinpath("_build", "site-build-seconds.json").unlink(missing_ok=True)

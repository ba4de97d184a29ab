"""One line describing the machine a benchmark ran on, for the reports in docs/."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def describe_machine() -> str:
    """Cores and CPU model (from /proc/cpuinfo where there is one), Python and OS."""
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {platform.system()}"
    )

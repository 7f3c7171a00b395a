"""What the zinf-vs-DeepSpeed benchmarks share: the medians, the peak RSS, the machine's CPU and
how a result is printed (one JSON object per line, prefixed "RESULT ", which report.py
collects)."""

import json
import os
import resource
import statistics
import time

RESULT_PREFIX = "RESULT "


def median(values):
    return statistics.median(values) if values else float("nan")


def peak_rss_bytes():
    """This process's peak resident set (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def disk_io_bytes():
    """(read, written) bytes this process made the block layer transfer (/proc/self/io; O_DIRECT
    I/O included, page-cache hits not): the same meter for both sides."""
    fields = {}
    with open("/proc/self/io") as f:
        for line in f:
            key, value = line.split(":")
            fields[key] = int(value)
    return fields["read_bytes"], fields["write_bytes"]


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def emit(kind, **fields):
    """Prints one result as a JSON line report.py reads, stamped with when and on which CPU it
    was measured (a report may gather the rows of several runs)."""
    stamp = {"utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "cpu": cpu_model()}
    print(RESULT_PREFIX + json.dumps({"kind": kind, **fields, **stamp}), flush=True)


def cores():
    return len(os.sched_getaffinity(0))

"""CPU time of processes from /proc, for the bench's alternating rounds (gateway.sh)."""
import os

HZ = os.sysconf("SC_CLK_TCK")


def ticks(pids):
    """utime + stime of `pids`, in clock ticks."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total


def micros_per_call(before, after, calls):
    """Ticks between two readings as µs of CPU per call."""
    return (after - before) / HZ / calls * 1e6


def nanoseconds(pids):
    """CPU time of every thread of `pids` in nanoseconds (schedstat: finer than the ticks)."""
    total = 0
    for pid in pids:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    return total

"""The default host budget: MemTotal and cgroup v2/v1 limits, read from a fake root."""

from __future__ import annotations

from pathlib import Path

import pytest

from outcore.errors import OutcoreError
from outcore.host import HostLimit, cgroup_limits, host_limit, meminfo_total


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTCORE_HOST_BUDGET", raising=False)


def test_meminfo_total_is_read_in_bytes(tmp_path: Path) -> None:
    _write(tmp_path, "proc/meminfo", "MemFree:  100 kB\nMemTotal:       2048 kB\n")
    assert meminfo_total(tmp_path) == 2048 * 1024
    assert meminfo_total(tmp_path / "nowhere") is None


def test_cgroup_v2_limit_of_the_cgroup_or_an_ancestor_wins_over_memtotal(tmp_path: Path) -> None:
    _write(tmp_path, "proc/meminfo", "MemTotal: 1048576 kB\n")  # 1 GiB
    _write(tmp_path, "proc/self/cgroup", "0::/jobs/job7\n")
    _write(tmp_path, "sys/fs/cgroup/jobs/job7/memory.max", "max\n")
    _write(tmp_path, "sys/fs/cgroup/jobs/memory.max", "536870912\n")  # 512 MiB on the parent
    limit = host_limit(tmp_path)
    assert limit == HostLimit(536870912, "cgroup v2 /jobs")
    _write(tmp_path, "sys/fs/cgroup/jobs/job7/memory.max", "268435456\n")
    assert host_limit(tmp_path).bytes == 268435456
    assert [c.bytes for c in cgroup_limits(tmp_path)] == [268435456, 536870912]


def test_no_cgroup_limit_leaves_memtotal(tmp_path: Path) -> None:
    _write(tmp_path, "proc/meminfo", "MemTotal: 4096 kB\n")
    _write(tmp_path, "proc/self/cgroup", "0::/\n")
    _write(tmp_path, "sys/fs/cgroup/memory.max", "max\n")
    assert host_limit(tmp_path) == HostLimit(4096 * 1024, "MemTotal of /proc/meminfo")


def test_cgroup_v1_limit_and_its_no_limit_value(tmp_path: Path) -> None:
    _write(tmp_path, "proc/meminfo", "MemTotal: 4194304 kB\n")  # 4 GiB
    _write(tmp_path, "proc/self/cgroup", "5:cpuacct,cpu:/x\n4:memory:/docker/abc\n")
    path = "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"
    _write(tmp_path, path, "9223372036854771712\n")  # the kernel's "unlimited"
    assert host_limit(tmp_path).source == "MemTotal of /proc/meminfo"
    _write(tmp_path, path, "1073741824\n")
    assert host_limit(tmp_path) == HostLimit(1 << 30, "cgroup v1 /docker/abc")


def test_override_and_unreadable_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(OutcoreError, match="host_budget="):
        host_limit(tmp_path)
    monkeypatch.setenv("OUTCORE_HOST_BUDGET", "3GiB")
    assert host_limit(tmp_path) == HostLimit(3 << 30, "OUTCORE_HOST_BUDGET")


def test_this_machine_has_a_limit() -> None:
    found = host_limit()
    total = meminfo_total()
    assert total is not None and 0 < found.bytes <= total

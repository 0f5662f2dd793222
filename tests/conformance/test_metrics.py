"""Sandbox metrics: the SDK's `get_metrics`, measured on the sandbox's own processes and files."""

import datetime

from e2b import Sandbox


def test_get_metrics_reports_the_sandboxs_use(sandbox):
    sandbox.commands.run("head -c 4194304 /dev/urandom > ~/blob")
    busy = sandbox.commands.run("while :; do :; done", background=True, timeout=0)
    metrics = sandbox.get_metrics()
    assert len(metrics) == 1
    metric = metrics[0]
    assert metric.cpu_count == 2
    assert metric.cpu_used_pct > 5
    assert 0 < metric.mem_used <= metric.mem_total
    assert metric.disk_used >= 4 * 1024 * 1024
    assert metric.disk_total == 1024 * 1024 * 1024
    assert isinstance(metric.timestamp, datetime.datetime)
    busy.kill()
    # The class method, and a window that ends before the sandbox existed.
    assert len(Sandbox.get_metrics(sandbox.sandbox_id)) == 1
    past = datetime.datetime(2001, 1, 1, tzinfo=datetime.timezone.utc)
    assert sandbox.get_metrics(end=past) == []

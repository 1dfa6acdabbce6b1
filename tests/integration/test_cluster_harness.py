"""The test harness's own promises (``estream/devcluster/cluster.py``).

``Cluster.wait_servers_alive`` returns only once PD has heard from each range server's
current process: a restarted server's predecessor stays listed alive (same id, same address,
its last load) until its beats age out, and a test's next create must not land in that gap.
"""

from __future__ import annotations

import pytest

from estream.devcluster.cluster import Cluster
from estream.devcluster.process import free_port
from estream.net.pdclient import PDClient

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_nodes=1, range_servers=1)]


async def test_wait_servers_alive_waits_for_the_restarted_process_not_its_predecessor(
        cluster: Cluster) -> None:
    server = cluster.servers[0]
    assert server.process is not None
    [listed] = cluster.alive_servers()
    old_load, old_pid = listed["load"], server.process.pid
    assert old_load["pid"] == old_pid
    real_pd = server.pd
    server.stop()
    server.pd = f"127.0.0.1:{free_port()}"  # nothing listens: it can neither register nor beat
    try:
        server.start()  # the new process listens; PD has not heard from it
        assert server.process.pid != old_pid
        members = cluster.member_pool()
        try:  # the predecessor's last beat, as PD may still hold it during a restart's gap
            async with PDClient(cluster.pd_addresses, pool=members) as pd:
                answered, registered = await pd.heartbeat(server.server_id, server.address,
                                                          old_load)
            assert (answered, registered) == (1, 1)
        finally:
            await members.close()
        assert [s["id"] for s in cluster.alive_servers()] == [server.server_id]
        with pytest.raises(TimeoutError, match="missing"):
            cluster.wait_servers_alive(timeout_s=1.0)
    finally:
        server.stop()
        server.pd = real_pd
        server.start()
    cluster.wait_servers_alive()
    [listed] = cluster.alive_servers()
    assert listed["load"]["pid"] == server.process.pid != old_pid

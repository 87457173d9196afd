"""ControllerClient.alter_partition through gRPC to a real QuorumController (in-memory Raft): the answer
comes after the ISR-only change committed, and a follower controller's NOT_CONTROLLER is followed."""

from __future__ import annotations

import grpc
import pytest

from kraft.client.controller import ControllerClient
from kraft.errors import ErrorCode
from kraft.metadata.controller import ControllerOptions
from kraft.metadata.service import ControllerServicer, add_controller_service
from kraft.netutil import free_port
from kraft.v1 import controller_pb2 as cpb

from .test_controller import CLUSTER, activate_broker, started, until


async def _serve(servicer: ControllerServicer) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    add_controller_service(server, servicer)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.parametrize("through_a_starting_controller", [False, True])
async def test_alter_partition_commits_the_isr_and_answers_the_new_partition(
    through_a_starting_controller: bool,
) -> None:
    raft, controller = await started(ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000))
    raft.elect()
    await until(lambda: controller.is_active)
    server, target = await _serve(ControllerServicer(controller))
    # A controller that is still starting answers NOT_CONTROLLER without a hint: the client moves on.
    starting_server, starting_target = await _serve(ControllerServicer(None))
    voters = [(2, starting_target), (1, target)] if through_a_starting_controller else [(1, target)]
    client = ControllerClient(voters)
    try:
        epochs = {b: await activate_broker(controller, b) for b in (1, 2, 3)}
        created = await controller.create_topics(
            cpb.CreateTopicsRequest(
                cluster_id=CLUSTER,
                topics=[
                    cpb.CreatableTopic(
                        name="t",
                        num_partitions=-1,
                        replication_factor=-1,
                        assignments=[cpb.ReplicaAssignment(partition=0, broker_ids=[1, 2, 3])],
                    )
                ],
            )
        )
        topic_id = created.topics[0].topic_id
        before = controller.committed.partition(topic_id, 0)
        assert before is not None and before.leader == 1
        request = cpb.AlterPartitionRequest(
            cluster_id=CLUSTER,
            broker_id=1,
            broker_epoch=epochs[1],
            partitions=[
                cpb.AlterPartitionRequest.PartitionData(
                    topic_id=topic_id,
                    partition=0,
                    leader_epoch=before.leader_epoch,
                    partition_epoch=before.partition_epoch,
                    new_isr=[
                        cpb.AlterPartitionRequest.IsrMember(broker_id=b, broker_epoch=epochs[b])
                        for b in (1, 2)
                    ],
                )
            ],
        )
        response = await client.alter_partition(request, timeout_s=5.0)
        assert response.error_code == ErrorCode.NONE
        [result] = response.partitions
        assert result.error_code == ErrorCode.NONE and list(result.isr) == [1, 2]
        after = controller.committed.partition(topic_id, 0)  # answered only once committed
        assert after is not None and tuple(after.isr) == (1, 2) and after.leader == 1
        assert result.partition_epoch == after.partition_epoch == before.partition_epoch + 1
        # The same proposal again is now stale (compare-and-set on the partition epoch).
        again = await client.alter_partition(request, timeout_s=5.0)
        assert again.partitions[0].error_code in (
            ErrorCode.FENCED_LEADER_EPOCH,  # kraft bumps the leader epoch with every change
            ErrorCode.INVALID_UPDATE_VERSION,
        )
    finally:
        await client.close()
        await server.stop(None)
        await starting_server.stop(None)
        await controller.stop()

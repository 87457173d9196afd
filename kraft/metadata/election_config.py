"""The topic-level settings a partition election depends on, as the controller resolves them (pure).

- ``min.insync.replicas`` (KIP-966: the ISR size below which the eligible leader replicas are kept): the
  topic's config, else the dynamic cluster-wide broker default (``kraft config alter --entity-type
  brokers --entity-default``), else the controller's own ``min.insync.replicas``; capped at the
  partition's replication factor where it is used (Kafka's effective min ISR: a minimum above it
  could never be met);
- ``unclean.leader.election.enable``: the topic's config, else the dynamic cluster-wide default, else the
  controller's own (default false).

The controller cannot see a broker's .properties, so a per-broker static value does not apply here; the
cluster-wide dynamic default is what every node agrees on (it is in the metadata log).
"""

from __future__ import annotations

from kraft.metadata.image import MetadataImage

MIN_INSYNC_REPLICAS = "min.insync.replicas"
UNCLEAN_LEADER_ELECTION_ENABLE = "unclean.leader.election.enable"

# ElectLeadersRequest.election_type: Kafka's ElectionType values (KIP-460).
PREFERRED_ELECTION = 0
UNCLEAN_ELECTION = 1


def _topic_or_cluster(image: MetadataImage, topic_name: str, name: str) -> str | None:
    return image.topic_or_cluster_config(topic_name, name)


def min_isr_for(image: MetadataImage, topic_name: str, default: int) -> int:
    """Uncapped: :mod:`kraft.metadata.partition_change` caps it at each partition's replica count."""
    value = _topic_or_cluster(image, topic_name, MIN_INSYNC_REPLICAS)
    if value is not None:
        try:
            return max(1, int(value))
        except ValueError:  # validated when written; a bad value keeps the default
            pass
    return max(1, default)


def unclean_election_for(image: MetadataImage, topic_name: str, default: bool) -> bool:
    value = _topic_or_cluster(image, topic_name, UNCLEAN_LEADER_ELECTION_ENABLE)
    if value is None:
        return default
    return value.strip().lower() == "true"

"""qpid-flow plugin: count the backlog RabbitMQ holds in flow control.

Reads each queue's exact ready count over AMQP 0-9-1 (passive ``queue.declare``) on a
worker thread and hands it to the destination on the reactor thread. Entry point:
``[project.entry-points.qpid_flow] rabbitmq_depth = "qpid_flow_rabbitmq_depth:plugin"``.
"""

from qpid_flow_rabbitmq_depth.addresses import queue_name
from qpid_flow_rabbitmq_depth.plugin import RabbitMQDepth
from qpid_flow_rabbitmq_depth.reader import BrokerUnavailable, DepthReader, PikaDepthReader
from qpid_flow_rabbitmq_depth.settings import Settings, check_settings, parse_settings
from qpid_flow_rabbitmq_depth.worker import DepthWorker

__version__ = "0.1.0"

plugin = RabbitMQDepth()

__all__ = [
    "BrokerUnavailable",
    "DepthReader",
    "DepthWorker",
    "PikaDepthReader",
    "RabbitMQDepth",
    "Settings",
    "check_settings",
    "parse_settings",
    "plugin",
    "queue_name",
]

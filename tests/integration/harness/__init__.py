"""Reusable pieces of the integration test harness (real brokers, real processes, real clients).

Nothing here mocks AMQP: every helper starts or talks to a real process over a real socket.
"""

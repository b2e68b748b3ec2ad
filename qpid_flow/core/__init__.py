"""The Proton-free core: messages, producers and consumers as plain values, destinations
and their queues, the registry of destinations, memory accounting, local transactions and
the standalone backend. Decisions live here and are unit-tested on values."""

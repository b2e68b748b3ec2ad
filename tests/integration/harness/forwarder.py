"""A TCP port that carries each connection to a broker's port: a broker that comes up when
the test says (down when qpid-flow started), and, with ``answer_delay``, slow to say its
first word on each connection."""

from __future__ import annotations

import socket
import threading
import time


class Forwarder:
    def __init__(self, port: int, broker_port: int, answer_delay: float = 0.0) -> None:
        self._broker_port = broker_port
        self._answer_delay = answer_delay
        self._listener = socket.create_server(("127.0.0.1", port))
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            broker = socket.create_connection(("127.0.0.1", self._broker_port))
            self._sockets += [client, broker]
            threading.Thread(target=self._pump, args=(client, broker, 0.0), daemon=True).start()
            threading.Thread(target=self._pump, args=(broker, client, self._answer_delay), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, first_delay: float) -> None:
        try:
            delay = first_delay
            while data := source.recv(65536):
                if delay:
                    time.sleep(delay)
                    delay = 0.0
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()

"""A line-echo server on asyncore, for tests and local tools."""
import asyncore
import socket


class EchoHandler(asyncore.dispatcher_with_send):
    def handle_read(self):
        data = self.recv(8192)
        if data:
            self.send(data.upper())


class EchoServer(asyncore.dispatcher):
    def __init__(self, host="127.0.0.1", port=0):
        asyncore.dispatcher.__init__(self)
        self.create_socket(socket.AF_INET, socket.SOCK_STREAM)
        self.set_reuse_addr()
        self.bind((host, port))
        self.listen(5)

    @property
    def port(self):
        return self.socket.getsockname()[1]

    def handle_accepted(self, sock, addr):
        EchoHandler(sock)


def serve_once(server, timeout=0.05, rounds=50):
    asyncore.loop(timeout=timeout, count=rounds)

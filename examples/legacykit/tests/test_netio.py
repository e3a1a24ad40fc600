import socket
import threading

from legacykit import netio


def test_echo_server_upper_cases():
    server = netio.EchoServer()
    port = server.port
    result = {}

    def client():
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"hello")
            result["data"] = s.recv(100)

    t = threading.Thread(target=client)
    t.start()
    netio.serve_once(server, timeout=0.05, rounds=100)
    t.join(5)
    server.close()
    assert result.get("data") == b"HELLO"

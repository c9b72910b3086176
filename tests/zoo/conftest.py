"""Fixtures of the zoo's tests: a local HTTP server (stopped after each test) and a tiny checkpoint."""

import pytest

from .serving import Server, checkpoint_bytes


@pytest.fixture
def serve():
    servers = []

    def start(files, **kwargs):
        servers.append(Server(files, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture(scope="module")
def payload():
    return checkpoint_bytes()

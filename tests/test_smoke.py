import httpx

from tests.servers import RunningServer


def test_example_server_is_ready(example_server: RunningServer) -> None:
    response = httpx.get(f"{example_server.http_url}/v2/health/ready")
    assert response.status_code == 200

"""The oracle chain through Spark Connect (issue 9): pyspark's bundled Connect server as its own
JVM, and a client interpreter that never starts a JVM; mapInArrow writers, Arrow frames and
`toArrow` all go through the server."""

from pathlib import Path

import pytest

from tests.system.cluster import ConnectServer, connect_server, run_chain_scenario


@pytest.fixture
def server(tmp_path: Path):
    with connect_server(tmp_path / "spark", master="local[2]") as s:
        yield s


def test_chain_through_spark_connect_equals_pandas(server: ConnectServer, tmp_path: Path) -> None:
    scratch = tmp_path / "client"
    scratch.mkdir()
    result = run_chain_scenario(server.url, scratch)

    assert result["error"] is None, result["error"]
    assert result["problems"] == []
    assert result["spark_query_equal"] and result["spark_query_rows"] > 0
    assert result["delta_spark_equal"] and result["delta_spark_rows"] > 0
    assert result["exit_code"] == 0
    runs = result["runs"]
    assert runs and {status for _, status in runs} == {"SUCCESS"}, runs

    session = result["session"]
    assert session["connect"] and not session["client_jvm"]
    assert session["master"] == "local[2]"  # the server's, read over the connection
    assert result["session_after"]["app_id"] == session["app_id"]
    assert not result["session_after"]["client_jvm"]
    assert server.process.process.poll() is None, server.process.tail()

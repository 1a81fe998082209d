"""The oracle chain on a real Spark standalone cluster (issue 9): a master and one worker, each its
own JVM started from the installed pyspark, and a driver in a separate interpreter, so executors
share nothing with the driver but the warehouse URI."""

from pathlib import Path

import pytest

from tests.system.cluster import StandaloneCluster, run_chain_scenario, standalone_cluster


@pytest.fixture
def cluster(tmp_path: Path):
    with standalone_cluster(tmp_path / "spark", cores=2, memory="1g") as c:
        yield c


def test_chain_on_standalone_cluster_equals_pandas(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    scratch = tmp_path / "driver"
    scratch.mkdir()
    warehouse = (tmp_path / "ware house").as_uri()  # executors write through the URI
    result = run_chain_scenario(cluster.master_url, scratch, warehouse=warehouse)

    assert result["error"] is None, result["error"]
    assert result["problems"] == []
    assert result["spark_query_equal"] and result["spark_query_rows"] > 0
    assert result["delta_spark_equal"] and result["delta_spark_rows"] > 0
    assert result["exit_code"] == 0
    runs = result["runs"]
    assert runs and {status for _, status in runs} == {"SUCCESS"}, runs

    session = result["session"]
    assert not session["connect"] and session["master"] == cluster.master_url
    assert result["session_after"]["app_id"] == session["app_id"]
    # The master ran the application on its worker's executors, and it has ended.
    status = cluster.status()
    apps = {a["id"]: a for a in status["activeapps"] + status["completedapps"]}
    assert session["app_id"] in apps, sorted(apps)
    assert apps[session["app_id"]]["state"] == "FINISHED"
    assert status["aliveworkers"] == 1
    assert list((tmp_path / "ware house" / "rollups" / "energy_yearly").rglob("*.parquet"))
